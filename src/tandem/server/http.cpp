#include "tandem/server/http.h"

#include <httplib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <functional>
#include <mutex>
#include <optional>
#include <random>

#include "tandem/sampling/token_mask.h"
#include "tandem/server/chat_page.h"
#include "tandem/server/embeddings_api.h"
#include "tandem/server/openai_api.h"
#include "tandem/server/peer_watch.h"
#include "tandem/server/sse.h"
#include "tandem/server/text_assembler.h"
#include "tandem/server/tool_calls.h"
#include "tandem/util/error.h"

namespace tandem::server {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr const char* kJson = "application/json";

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string random_hex(size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::random_device rd;
  std::string s;
  for (size_t i = 0; i < n; ++i) s += kDigits[rd() % 16];
  return s;
}

uint64_t random_seed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

// A client hears kCancelled only when the server cut its request short (the drain timeout, or a stop): a
// client that cancels hears nothing more, and a stop sequence reports "stop". kError and kDrained become
// error responses before a finish reason is needed.
const char* finish_reason(engine::Finish f) {
  switch (f) {
    case engine::Finish::kStop:
      return "stop";
    case engine::Finish::kLength:
      return "length";
    case engine::Finish::kCancelled:
    case engine::Finish::kError:
    case engine::Finish::kDrained:
      break;
  }
  return "cancelled";
}

// Whether the reply is parsed for tool calls: a chat with tools it may call.
bool parses_tool_calls(const CompletionRequest& r) {
  return r.chat && !r.tools.empty() && r.tool_choice != ToolChoice::kNone;
}

// How a chat reply is read (chat_reply.h). prompt: the rendered prompt, which may open a reasoning block.
ReplyOptions reply_options(const CompletionRequest& r, ToolFormat format, std::string_view prompt) {
  ReplyOptions o;
  // Functionary's replies always open with a recipient line (">>>all" for text), tools or not.
  o.tools = parses_tool_calls(r) || (r.chat && format == ToolFormat::kFunctionaryV3);
  o.format = format;
  o.reasoning = r.chat && r.reasoning_format == ReasoningFormat::kDeepSeek && !r.grammar;
  o.reasoning_open = o.reasoning && prompt_opens_reasoning(prompt);
  return o;
}

// How often a non-streamed request looks at its client while it waits for tokens.
constexpr std::chrono::milliseconds kPeerInterval(20);

}  // namespace

struct HttpServer::Impl {
  Impl(engine::Scheduler* s, engine::EmbeddingBatcher* e, const tokenizer::Tokenizer& t,
       const ChatTemplate& c, Metrics& m, ServerOptions o)
      : scheduler(s),
        embedder(e),
        tok(t),
        chat(c),
        metrics(m),
        options(std::move(o)),
        svr(options.connections) {
    limits.model_name = options.model_name;
    limits.n_vocab = tok.n_vocab();
    limits.max_json_depth = options.max_json_depth;
    limits.max_json_elements = options.max_json_elements;
    limits.tool_format =
        detect_tool_format(chat.source(), [&](std::string_view text) { return tok.token_id(text) >= 0; });
    limits.reasoning_format = options.reasoning_format;
    embed_limits.api = limits;
    embed_limits.dim = embedder ? embedder->dim() : 0;
    embed_limits.truncatable_dims = options.truncatable_dims;
  }

  engine::Scheduler* scheduler;        // null: no generation
  engine::EmbeddingBatcher* embedder;  // null: no embeddings
  const tokenizer::Tokenizer& tok;
  const ChatTemplate& chat;
  Metrics& metrics;
  ServerOptions options;
  ApiLimits limits;
  EmbeddingLimits embed_limits;
  LimitedServer svr;
  std::atomic<bool> draining{false};
  std::atomic<bool> is_ready{false};
  int port = -1;
  std::once_flag trie_once;
  std::shared_ptr<const sampling::TokenTrie> trie;  // the vocabulary for grammar masks, built on first use

  const std::shared_ptr<const sampling::TokenTrie>& token_trie() {
    std::call_once(trie_once, [&] { trie = sampling::TokenTrie::build(tok); });
    return trie;
  }

  void log(const httplib::Request& req, int status, const std::string& detail) const {
    std::fprintf(stderr, "serve: %s %s %d%s%s\n", req.method.c_str(), req.path.c_str(), status,
                 detail.empty() ? "" : " ", detail.c_str());
  }

  // Error responses close their connection: a request refused before its body was read leaves that body
  // unread, and it must not be taken for the next request.
  void send_error(const httplib::Request& req, httplib::Response& res, const ApiError& e,
                  const std::string& endpoint) {
    res.status = e.status;
    if (!res.has_header("Connection")) res.set_header("Connection", "close");
    svr.close_after_response();
    res.set_content(dump(e.to_json()), kJson);
    metrics.request(endpoint, e.status);
    log(req, e.status, e.type + ": " + e.what());
  }

  // Runs a handler, turning every exception into an error response: the server never dies of a request.
  template <typename Fn>
  void guarded(const httplib::Request& req, httplib::Response& res, const std::string& endpoint, Fn&& fn) {
    try {
      fn();
    } catch (const ApiError& e) {
      send_error(req, res, e, endpoint);
    } catch (const std::exception& e) {
      send_error(req, res, ApiError(500, "server_error", std::string("internal error: ") + e.what()),
                 endpoint);
    }
  }

  std::string new_call_id() const { return new_tool_call_id(limits.tool_format, random_hex); }

  void routes();
  void generation(const httplib::Request& req, httplib::Response& res, bool chat_api);
  void embeddings(const httplib::Request& req, httplib::Response& res);
  ApiError shutting_down(httplib::Response& res) const;
  ApiError busy(httplib::Response& res) const;
  // reply: how the reply to r is read, which depends on the rendered prompt.
  engine::Request engine_request(const CompletionRequest& r, std::vector<std::string>& stops,
                                 ReplyOptions& reply);
  // peer: the connection's watch, when its socket was found; a client that leaves cancels the request.
  void respond_whole(const CompletionRequest& r, const std::shared_ptr<engine::Stream>& stream,
                     std::vector<std::string> stops, const ReplyOptions& reply, Clock::time_point t0,
                     const httplib::Request& req, httplib::Response& res, const std::string& endpoint,
                     PeerWatch* peer);
  void respond_stream(const CompletionRequest& r, std::shared_ptr<engine::Stream> stream,
                      std::vector<std::string> stops, const ReplyOptions& reply, Clock::time_point t0,
                      const httplib::Request& req, httplib::Response& res, const std::string& endpoint);
};

engine::Request HttpServer::Impl::engine_request(const CompletionRequest& r, std::vector<std::string>& stops,
                                                 ReplyOptions& reply) {
  engine::Request er;
  std::string param = r.chat ? "messages" : "prompt";
  if (r.chat) {
    const bool offer_tools = !r.tools.empty() && r.tool_choice != ToolChoice::kNone;
    const bool has_calls = std::any_of(r.messages.begin(), r.messages.end(),
                                       [](const ChatMessage& m) { return !m.tool_calls.empty(); });
    const std::string text =
        chat.renders_tools() ? chat.render(r.messages, offer_tools ? r.tools_json : std::string())
        : offer_tools || has_calls
            ? chat.render(tool_messages(r.messages, offer_tools ? r.tools : std::vector<ToolSpec>(),
                                        limits.tool_format))
            : chat.render(r.messages);
    reply = reply_options(r, limits.tool_format, text);
    // Most templates write the BOS themselves; the encoder must not add a second one then. A tokenizer that
    // adds no BOS keeps the template's.
    const bool has_bos = tok.bos_id() >= 0 && text.starts_with(tok.token_text(tok.bos_id()));
    er.prompt = tok.encode(text, /*add_special=*/!has_bos, /*parse_special=*/true);
    for (const std::string& s : chat.stop_sequences()) stops.push_back(s);
  } else if (!r.prompt_ids.empty()) {
    er.prompt = r.prompt_ids;
  } else {
    er.prompt = tok.encode(r.prompt, /*add_special=*/true, /*parse_special=*/true);
  }
  if (er.prompt.empty())
    throw bad_request(
        r.prompt.empty() && !r.chat
            ? "the prompt is empty and this model adds no BOS token to start a text from: give a "
              "non-empty prompt"
            : "the prompt encodes to no tokens",
        param);
  const int64_t n_ctx = scheduler->context();
  const auto n = static_cast<int64_t>(er.prompt.size());
  if (n >= n_ctx)
    throw ApiError(400, "invalid_request_error",
                   "This model's maximum context length is " + std::to_string(n_ctx) +
                       " tokens, but the prompt has " + std::to_string(n) +
                       " tokens, leaving no room for a completion",
                   param, "context_length_exceeded");
  const int64_t room = n_ctx - n;
  if (r.max_tokens && *r.max_tokens > room)
    throw ApiError(400, "invalid_request_error",
                   "This model's maximum context length is " + std::to_string(n_ctx) +
                       " tokens; the prompt has " + std::to_string(n) + " tokens and max_tokens asks for " +
                       std::to_string(*r.max_tokens) + " more",
                   "max_tokens", "context_length_exceeded");
  er.max_tokens = r.max_tokens ? *r.max_tokens : (r.chat ? room : std::min<int64_t>(16, room));
  sampling::Params& p = er.sampling;
  p.temperature = static_cast<float>(r.temperature);
  p.top_p = static_cast<float>(r.top_p);
  p.top_k = 0;
  p.min_p = 0;
  p.repeat_penalty = 1;
  p.repeat_last_n = -1;
  p.presence_penalty = static_cast<float>(r.presence_penalty);
  p.frequency_penalty = static_cast<float>(r.frequency_penalty);
  p.seed = r.seed ? *r.seed : random_seed();
  er.top_logprobs = r.top_logprobs;
  er.stop_at_eog = !r.ignore_eos;
  if (r.grammar) {
    er.grammar.emplace(r.grammar, token_trie());
    // The first mask of a new grammar is its most expensive: computed here, it keeps the scheduler's
    // thread (and every other running request) from waiting on it.
    sampling::TokenMask first;
    er.grammar->fill_mask(first);
  }
  return er;
}

void HttpServer::Impl::generation(const httplib::Request& req, httplib::Response& res, bool chat_api) {
  const auto t0 = Clock::now();
  const std::string endpoint = chat_api ? "/v1/chat/completions" : "/v1/completions";
  std::optional<PeerWatch> peer;
  if (const socket_t sock = svr.current_socket(); sock != INVALID_SOCKET) peer.emplace(sock);
  guarded(req, res, endpoint, [&] {
    if (!scheduler)
      throw ApiError(400, "invalid_request_error",
                     "the model '" + options.model_name + "' is " + options.model_kind +
                         ": it makes embeddings only; use POST /v1/embeddings",
                     {}, "embeddings_only");
    CompletionRequest r = parse_request(req.body, chat_api, limits);
    if (draining.load()) throw shutting_down(res);
    std::vector<std::string> stops = r.stop;
    ReplyOptions reply;
    engine::Request er = engine_request(r, stops, reply);
    engine::Scheduler::Admit admit{};
    std::string why;
    std::shared_ptr<engine::Stream> stream = scheduler->submit(std::move(er), admit, &why);
    if (admit == engine::Scheduler::Admit::kQueueFull) throw busy(res);
    if (admit == engine::Scheduler::Admit::kDraining) throw shutting_down(res);
    if (admit == engine::Scheduler::Admit::kInvalid) throw bad_request(why);
    if (r.stream)
      respond_stream(r, std::move(stream), std::move(stops), reply, t0, req, res, endpoint);
    else
      respond_whole(r, stream, std::move(stops), reply, t0, req, res, endpoint, peer ? &*peer : nullptr);
  });
}

ApiError HttpServer::Impl::shutting_down(httplib::Response& res) const {
  res.set_header("Retry-After", std::to_string(options.retry_after_seconds));
  return ApiError(503, "server_error",
                  "the server is shutting down; retry on another server or after it restarts", {},
                  "server_shutting_down");
}

ApiError HttpServer::Impl::busy(httplib::Response& res) const {
  res.set_header("Retry-After", std::to_string(options.retry_after_seconds));
  return ApiError(503, "server_error", "the server is busy: every running slot and queue place is taken", {},
                  "server_overloaded");
}

void HttpServer::Impl::embeddings(const httplib::Request& req, httplib::Response& res) {
  const auto t0 = Clock::now();
  const std::string endpoint = "/v1/embeddings";
  guarded(req, res, endpoint, [&] {
    if (!embedder)
      throw ApiError(400, "invalid_request_error",
                     "the model '" + options.model_name + "' does not make embeddings on this server", {},
                     "embeddings_unsupported");
    EmbeddingRequest r = parse_embedding_request(req.body, embed_limits);
    if (draining.load()) throw shutting_down(res);
    std::vector<std::vector<int32_t>> inputs = std::move(r.token_ids);
    for (const std::string& text : r.texts)
      inputs.push_back(tok.encode(text, /*add_special=*/true, /*parse_special=*/false));
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].empty()) {  // a tokenizer that adds no special tokens, and text that gives none
        const std::string at = inputs.size() == 1 ? "input" : "input[" + std::to_string(i) + "]";
        throw bad_request("'" + at + "' encodes to no tokens; give it text the model's vocabulary covers",
                          at);
      }
    fit_to_context(inputs, embedder->max_tokens(), r.truncate);
    int64_t tokens = 0;
    for (const auto& ids : inputs) tokens += static_cast<int64_t>(ids.size());
    const auto n = static_cast<int64_t>(inputs.size());
    std::vector<float> out;
    const engine::EmbeddingBatcher::Admit admit = embedder->embed(std::move(inputs), out);
    if (admit == engine::EmbeddingBatcher::Admit::kQueueFull) throw busy(res);
    if (admit == engine::EmbeddingBatcher::Admit::kDraining) throw shutting_down(res);
    const int64_t width = r.dimensions.value_or(embedder->dim());
    truncate_embeddings(out, n, embedder->dim(), width);
    res.status = 200;
    res.set_content(embedding_response(r.model, out, n, width, r.base64, tokens), kJson);
    metrics.request(endpoint, 200);
    char detail[96];
    std::snprintf(detail, sizeof detail, "%lld inputs, %lld tokens %.3fs", static_cast<long long>(n),
                  static_cast<long long>(tokens), seconds_since(t0));
    log(req, 200, detail);
  });
}

void HttpServer::Impl::respond_whole(const CompletionRequest& r,
                                     const std::shared_ptr<engine::Stream>& stream,
                                     std::vector<std::string> stops, const ReplyOptions& reply,
                                     Clock::time_point t0, const httplib::Request& req,
                                     httplib::Response& res, const std::string& endpoint, PeerWatch* peer) {
  TextAssembler text(tok, text_position(r), std::move(stops), r.top_logprobs >= 0);
  Choice choice;
  choice.want_logprobs = r.top_logprobs >= 0;
  engine::Event ev;
  bool first = true;
  auto last_look = Clock::now();
  const auto client_left = [&] {
    if (!peer || Clock::now() - last_look < kPeerInterval) return false;
    last_look = Clock::now();
    return peer->check() == PeerWatch::State::kGone;
  };
  for (;;) {
    const bool got = stream->next(ev, kPeerInterval);
    if (client_left()) {
      // Queued or running, the sequence is freed within one iteration; nobody reads what follows.
      stream->cancel();
      res.status = 499;
      res.set_content(
          dump(ApiError(499, "invalid_request_error", "the client closed the connection").to_json()), kJson);
      metrics.request(endpoint, 499);
      log(req, 499, "client went away; cancelled");
      return;
    }
    if (!got) continue;
    if (ev.kind == engine::Event::Kind::kToken) {
      if (first) metrics.first_token(seconds_since(t0));
      first = false;
      choice.text += text.push(ev.token, choice.logprobs);
      if (text.stopped()) stream->cancel();  // the final event follows within one iteration
      continue;
    }
    break;
  }
  if (ev.finish == engine::Finish::kError)
    throw ApiError(500, "server_error", "generation failed: " + ev.error);
  if (ev.finish == engine::Finish::kDrained) {
    res.set_header("Retry-After", std::to_string(options.retry_after_seconds));
    throw ApiError(503, "server_error",
                   "the server is shutting down and never started this request; retry on another server or "
                   "after it restarts",
                   {}, "server_shutting_down");
  }
  choice.text += text.finish();
  choice.finish_reason = text.stopped() ? "stop" : finish_reason(ev.finish);
  if (r.chat) {
    ChatReply parsed = parse_chat_reply(choice.text, reply, [this] { return new_call_id(); });
    choice.text = std::move(parsed.content);
    choice.reasoning = std::move(parsed.reasoning);
    choice.tool_calls = std::move(parsed.calls);
    if (!choice.tool_calls.empty()) choice.finish_reason = "tool_calls";
  }
  const json body = response_json(r, (r.chat ? "chatcmpl-" : "cmpl-") + random_hex(24),
                                  static_cast<int64_t>(std::time(nullptr)), choice, ev.usage);
  res.status = 200;
  res.set_content(dump(body), kJson);
  metrics.request(endpoint, 200);
  char detail[96];
  std::snprintf(detail, sizeof detail, "%lld+%lld tokens %.2fs",
                static_cast<long long>(ev.usage.prompt_tokens),
                static_cast<long long>(ev.usage.completion_tokens), seconds_since(t0));
  log(req, 200, detail);
}

namespace {

// One SSE response in progress, shared by the content provider's calls.
struct SseState {
  SseState(const tokenizer::Tokenizer& tok, CompletionRequest req, std::shared_ptr<engine::Stream> s,
           std::vector<std::string> stops, const ReplyOptions& reply_options,
           std::function<std::string()> new_call_id)
      : r(std::move(req)),
        stream(std::move(s)),
        text(tok, text_position(r), std::move(stops), r.top_logprobs >= 0),
        reply(reply_options, std::move(new_call_id)) {}
  CompletionRequest r;
  std::shared_ptr<engine::Stream> stream;
  TextAssembler text;
  std::string id;
  int64_t created = 0;
  bool first_chunk = true, first_token = true, finish_sent = false;
  std::vector<Choice::Logprob> logprobs;
  // Chat: the reply split into reasoning, content and calls as it comes; text that may be a call is held
  // back until it is ruled out or parsed.
  ReplyStream reply;
};

}  // namespace

void HttpServer::Impl::respond_stream(const CompletionRequest& r, std::shared_ptr<engine::Stream> stream,
                                      std::vector<std::string> stops, const ReplyOptions& reply,
                                      Clock::time_point t0, const httplib::Request& req,
                                      httplib::Response& res, const std::string& endpoint) {
  auto st = std::make_shared<SseState>(tok, r, std::move(stream), std::move(stops), reply,
                                       [this] { return new_call_id(); });
  st->id = (r.chat ? "chatcmpl-" : "cmpl-") + random_hex(24);
  st->created = static_cast<int64_t>(std::time(nullptr));
  metrics.request(endpoint, 200);
  log(req, 200, "streaming");
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  auto provider = [this, st, t0](size_t, httplib::DataSink& sink) -> bool {
    const auto cancel = [&] {
      st->stream->cancel();
      return false;
    };
    engine::Event ev;
    // Wait for the next event, watching for a client that went away meanwhile.
    while (!st->stream->next(ev, std::chrono::milliseconds(50)))
      if (!sink.is_writable()) return cancel();
    std::string out;
    auto chunk = [&](const std::string& delta, const std::string& finish, const std::string& reasoning = {}) {
      out +=
          sse_event(dump(chunk_json(st->r, st->id, st->created, delta, st->logprobs, st->r.top_logprobs >= 0,
                                    finish, st->first_chunk && st->r.chat, reasoning)));
      st->first_chunk = false;
      st->logprobs.clear();
    };
    // Chat: what of `delta` goes out now as reasoning and as content, and the calls it completed.
    auto split = [&](const std::string& delta) -> ReplyStream::Delta {
      if (!st->r.chat) return {{}, delta, {}};
      return st->reply.push(delta);
    };
    auto calls = [&](const std::vector<ChatToolCall>& done) {
      if (done.empty()) return;
      out += sse_event(dump(
          tool_calls_chunk_json(st->r, st->id, st->created, done, st->reply.calls_sent() - done.size())));
    };
    // The last chunks: held-back reasoning and content, the calls, and the finish reason.
    auto close = [&](const std::string& rest, std::string finish) {
      if (st->r.chat) {
        const ReplyStream::Delta d = st->reply.push(rest);
        if (!d.reasoning.empty() || !d.content.empty()) chunk(d.content, "", d.reasoning);
        calls(d.calls);
        const ChatReply end = st->reply.finish();
        if (!end.reasoning.empty() || !end.content.empty()) chunk(end.content, "", end.reasoning);
        calls(end.calls);
        if (st->reply.calls_sent() > 0) finish = "tool_calls";
      } else if (!rest.empty()) {
        chunk(rest, "");
      }
      chunk("", finish);
    };
    if (st->first_chunk && st->r.chat) chunk("", "");  // the role comes first, as OpenAI sends it
    bool done = false;
    do {
      if (ev.kind == engine::Event::Kind::kToken) {
        if (st->first_token) metrics.first_token(seconds_since(t0));
        st->first_token = false;
        if (st->finish_sent) continue;
        const ReplyStream::Delta delta = split(st->text.push(ev.token, st->logprobs));
        if (!delta.content.empty() || !delta.reasoning.empty() || !st->logprobs.empty())
          chunk(delta.content, "", delta.reasoning);
        calls(delta.calls);
        if (st->text.stopped()) {
          st->stream->cancel();
          close("", "stop");
          st->finish_sent = true;
        }
        continue;
      }
      done = true;
      if (ev.finish == engine::Finish::kError) {
        ApiError e(500, "server_error", "generation failed: " + ev.error);
        out += sse_event(dump(e.to_json()));
      } else if (ev.finish == engine::Finish::kDrained) {
        // The 200 went out when the stream opened: the refusal is an error event, and SSE's own retry
        // field carries what Retry-After would (in milliseconds).
        ApiError e(503, "server_error",
                   "the server is shutting down and never started this request; retry on another server or "
                   "after it restarts",
                   {}, "server_shutting_down");
        out += "retry: " + std::to_string(options.retry_after_seconds * 1000) + "\n" +
               sse_event(dump(e.to_json()));
      } else if (!st->finish_sent) {
        close(st->text.finish(), finish_reason(ev.finish));
      }
      if (st->r.include_usage) out += sse_event(dump(usage_chunk_json(st->r, st->id, st->created, ev.usage)));
      out += sse_done();
    } while (!done && st->stream->next(ev, std::chrono::milliseconds(0)));
    if (!out.empty() && !sink.write(out.data(), out.size())) return cancel();
    if (done) sink.done();
    return true;
  };
  res.set_chunked_content_provider("text/event-stream", provider, [st](bool success) {
    if (!success) st->stream->cancel();
  });
}

void HttpServer::Impl::routes() {
  svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    res.set_header("X-Tandem-Replica", options.replica_name);
    if (std::optional<ApiError> e = svr.limit_error()) {  // too many headers
      send_error(req, res, *e, req.path);
      return httplib::Server::HandlerResponse::Handled;
    }
    // The chat page loads without the key: it holds no data, and asks for the key to call /v1/*.
    if (options.api_key.empty() || req.path == "/health" || req.path == "/")
      return httplib::Server::HandlerResponse::Unhandled;
    if (req.get_header_value("Authorization") == "Bearer " + options.api_key)
      return httplib::Server::HandlerResponse::Unhandled;
    send_error(req, res,
               ApiError(401, "invalid_request_error",
                        "Incorrect or missing API key: send it as 'Authorization: Bearer KEY'", {},
                        "invalid_api_key"),
               req.path);
    return httplib::Server::HandlerResponse::Handled;
  });
  // Errors httplib answers itself (unknown route, body too large, unreadable request) get an error object
  // too; responses that already carry one are left alone.
  svr.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req,
                                                                    httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    if (std::optional<ApiError> e = svr.limit_error()) {  // a limit or the deadline stopped the reading
      send_error(req, res, *e, req.path);
      return httplib::Server::HandlerResponse::Handled;
    }
    std::string msg = "request failed";
    std::string code;
    if (res.status == 404) {
      msg = "Unknown route: " + req.method + " " + req.path;
      code = "unknown_url";
    } else if (res.status == 413) {
      msg = "The request body is larger than the limit of " +
            std::to_string(options.connections.max_body_bytes) + " bytes (--max-body)";
      code = "request_too_large";
    } else if (res.status == 400) {
      msg = "Malformed HTTP request";
    }
    ApiError e(res.status, res.status == 404 ? "not_found_error" : "invalid_request_error", msg, {}, code);
    res.set_content(dump(e.to_json()), kJson);
    res.set_header("Connection", "close");
    svr.close_after_response();
    metrics.request(res.status == 404 ? "unknown" : req.path, res.status);
    log(req, res.status, msg);
    return httplib::Server::HandlerResponse::Handled;
  }));
  svr.set_exception_handler([this](const httplib::Request& req, httplib::Response& res, std::exception_ptr) {
    send_error(req, res, ApiError(500, "server_error", "internal error"), req.path);
  });

  // A chunked body is read up to twice the limit (chunk framing is not body); the limit itself holds here.
  auto bounded = [this](const char* endpoint, auto handle) {
    return [this, endpoint, handle](const httplib::Request& req, httplib::Response& res) {
      if (req.body.size() > options.connections.max_body_bytes)
        return send_error(
            req, res,
            ApiError(413, "invalid_request_error",
                     "The request body is larger than the limit of " +
                         std::to_string(options.connections.max_body_bytes) + " bytes (--max-body)",
                     {}, "request_too_large"),
            endpoint);
      handle(req, res);
    };
  };
  svr.Post("/v1/completions",
           bounded("/v1/completions", [this](const auto& req, auto& res) { generation(req, res, false); }));
  svr.Post("/v1/chat/completions", bounded("/v1/chat/completions", [this](const auto& req, auto& res) {
             generation(req, res, true);
           }));
  svr.Post("/v1/embeddings",
           bounded("/v1/embeddings", [this](const auto& req, auto& res) { embeddings(req, res); }));
  svr.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    json model = {{"id", options.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "tandem"}};
    res.set_content(dump(json{{"object", "list"}, {"data", json::array({model})}}), kJson);
    metrics.request("/v1/models", 200);
    (void)req;
  });
  // Draining outranks the rest: a balancer must stop sending for good, not wait for a free slot. Busy: the
  // generation queue or the embedding queue is full (a request to it would get 503 now); the body then
  // carries both queues' depths and bounds, so a balancer that routes the two apart can tell which.
  svr.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    const bool generation_full = scheduler && scheduler->saturated();
    const bool embeddings_full = embedder && embedder->saturated();
    const char* state = draining.load()                      ? "draining"
                        : !is_ready.load()                   ? "starting"
                        : generation_full || embeddings_full ? "busy"
                                                             : "ok";
    res.status = std::string_view(state) == "ok" ? 200 : 503;
    if (res.status != 200) res.set_header("Retry-After", std::to_string(options.retry_after_seconds));
    json body{{"status", state}, {"replica", options.replica_name}};
    if (std::string_view(state) == "busy") {
      json queues = json::object();
      if (scheduler) {
        const engine::SchedulerStats st = scheduler->stats();
        queues["generation"] = {{"full", generation_full},
                                {"running", st.running - st.finishing},
                                {"waiting", st.waiting},
                                {"max_running", scheduler->options().max_running},
                                {"max_waiting", scheduler->options().max_waiting}};
      }
      if (embedder)
        queues["embeddings"] = {{"full", embeddings_full},
                                {"waiting", embedder->stats().waiting},
                                {"max_waiting", embedder->options().max_waiting}};
      body["queues"] = std::move(queues);
    }
    res.set_content(dump(body), kJson);
    metrics.request("/health", res.status);
  });
  svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    metrics.request("/metrics", 200);
    res.set_content(metrics.render(scheduler ? scheduler->stats() : engine::SchedulerStats{},
                                   embedder ? embedder->stats() : engine::EmbeddingStats{}),
                    "text/plain; version=0.0.4");
  });
  svr.Get("/", [this](const httplib::Request&, httplib::Response& res) {
    metrics.request("/", 200);
    res.set_header("Content-Security-Policy", kChatPagePolicy);
    res.set_header("X-Content-Type-Options", "nosniff");
    const std::string_view page = chat_page();
    res.set_content(page.data(), page.size(), "text/html; charset=utf-8");
  });
  // A known route with the wrong method: 405 naming the allowed one.
  struct Route {
    const char* path;
    const char* allowed;
  };
  for (Route route : {Route{"/v1/completions", "POST"}, Route{"/v1/chat/completions", "POST"},
                      Route{"/v1/embeddings", "POST"}, Route{"/v1/models", "GET"}, Route{"/health", "GET"},
                      Route{"/metrics", "GET"}, Route{"/", "GET"}}) {
    auto wrong = [this, route](const httplib::Request& req, httplib::Response& res) {
      res.set_header("Allow", route.allowed);
      send_error(req, res,
                 ApiError(405, "invalid_request_error",
                          std::string("Method ") + req.method + " is not allowed on " + route.path +
                              " (use " + route.allowed + ")",
                          {}, "method_not_allowed"),
                 route.path);
    };
    if (std::string(route.allowed) == "POST")
      svr.Get(route.path, wrong);
    else
      svr.Post(route.path, wrong);
    svr.Put(route.path, wrong);
    svr.Patch(route.path, wrong);
    svr.Delete(route.path, wrong);
  }
}

HttpServer::HttpServer(engine::Scheduler* scheduler, engine::EmbeddingBatcher* embeddings,
                       const tokenizer::Tokenizer& tokenizer, const ChatTemplate& chat, Metrics& metrics,
                       ServerOptions options)
    : impl_(std::make_unique<Impl>(scheduler, embeddings, tokenizer, chat, metrics, std::move(options))) {
  TANDEM_CHECK(scheduler || embeddings, "a server needs a scheduler or an embedding batcher");
  // SO_REUSEADDR only: the library's default, SO_REUSEPORT, let a second server bind a port one was already
  // listening on, and the two then shared its connections without a word.
  impl_->svr.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  impl_->routes();
}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
  Impl& m = *impl_;
  if (m.options.port == 0) {
    m.port = m.svr.bind_to_any_port(m.options.host);
  } else {
    m.port = m.svr.bind_to_port(m.options.host, m.options.port) ? m.options.port : -1;
  }
  if (m.port < 0)
    throw Error("cannot listen on " + m.options.host + ":" + std::to_string(m.options.port) +
                " (address in use, or not a local address?)");
  m.svr.widen_backlog();
  if (m.options.replica_name.empty()) {
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
    m.options.replica_name = std::string(host[0] ? host : "localhost") + ":" + std::to_string(m.port);
  }
  return m.port;
}

void HttpServer::serve() {
  impl_->svr.listen_after_bind();
}
void HttpServer::ready() {
  impl_->is_ready.store(true);
}
void HttpServer::begin_drain() {
  impl_->draining.store(true);
}
void HttpServer::stop() {
  impl_->svr.stop();
}
int HttpServer::port() const {
  return impl_->port;
}
const std::string& HttpServer::replica_name() const {
  return impl_->options.replica_name;
}

}  // namespace tandem::server
