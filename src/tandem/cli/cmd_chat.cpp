// tandem chat: an interactive conversation with a model in the terminal (docs/cli.md, "chat").
//
// Each turn renders the whole conversation with the model's chat template and evaluates only the tokens
// after the longest prefix the session's cache already holds, so earlier turns are not recomputed. Replies
// stream to stdout; the turn's figures go to stderr. Input is read line by line from stdin, a terminal or
// not: a line ending in a backslash continues on the next, and a line holding only """ opens a block that
// the next such line closes. Lines starting with / are commands (/help lists them).
//
// Ctrl-C (SIGINT) during a reply stops the reply, which stays in the history as far as it went; at the
// prompt it ends the session, as Ctrl-D (end of input) does.
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tandem/cli/commands.h"
#include "tandem/cli/common.h"
#include "tandem/cli/spec_common.h"
#include "tandem/engine/generate.h"
#include "tandem/engine/generate_speculative.h"
#include "tandem/server/chat_template.h"
#include "tandem/server/text_assembler.h"
#include "tandem/tokenizer/tokenizer.h"
#include "tandem/util/error.h"

namespace tandem::cli {
namespace {

// Set by the SIGINT handler and cleared by the chat loop; the handler also writes a byte to the wake pipe, so
// a reader waiting at the prompt sees a Ctrl-C that came just before it began to wait. A signal handler can
// reach nothing but static storage, and lock-free atomics and write(2) are all it may use.
std::atomic<bool> interrupted{false};
std::atomic<int> wake_fd{-1};
static_assert(std::atomic<bool>::is_always_lock_free && std::atomic<int>::is_always_lock_free);

extern "C" void on_interrupt(int) {
  interrupted.store(true, std::memory_order_relaxed);
  const int fd = wake_fd.load(std::memory_order_relaxed);
  if (fd >= 0) {
    const int saved = errno;
    [[maybe_unused]] const ssize_t n = ::write(fd, "!", 1);
    errno = saved;
  }
}

// Installs on_interrupt and its wake pipe; returns the pipe's reading end.
int install_interrupt_handler() {
  int fds[2];
  if (::pipe(fds) != 0) throw Error("could not create the pipe the Ctrl-C handler wakes the prompt with");
  for (int fd : fds) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  wake_fd.store(fds[1]);
  struct sigaction sa = {};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;
  if (sigaction(SIGINT, &sa, nullptr) != 0) throw Error("could not install the Ctrl-C handler");
  return fds[0];
}

// Lines from a file descriptor through poll(2) and read(2), woken by Ctrl-C (stdio would retry the read).
class LineReader {
 public:
  enum class Status { kLine, kEnd, kInterrupted };

  // wake: the interrupt handler's pipe (install_interrupt_handler).
  LineReader(int fd, int wake) : fd_(fd), wake_(wake) {}

  // The next line without its newline (and a trailing carriage return).
  Status read_line(std::string& line) {
    for (;;) {
      const size_t nl = buffer_.find('\n');
      if (nl != std::string::npos) {
        line.assign(buffer_, 0, nl);
        buffer_.erase(0, nl + 1);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        return Status::kLine;
      }
      if (ended_) {
        if (buffer_.empty()) return Status::kEnd;
        line = std::move(buffer_);
        buffer_.clear();
        return Status::kLine;
      }
      pollfd fds[2] = {{fd_, POLLIN, 0}, {wake_, POLLIN, 0}};
      if (::poll(fds, 2, -1) < 0 && errno != EINTR) {
        ended_ = true;
        continue;
      }
      if (fds[1].revents & POLLIN) {
        char drain[64];
        while (::read(wake_, drain, sizeof drain) > 0) {
        }
      }
      if (interrupted.exchange(false)) return Status::kInterrupted;
      if (!(fds[0].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char chunk[4096];
      const ssize_t n = ::read(fd_, chunk, sizeof chunk);
      if (n > 0) {
        buffer_.append(chunk, static_cast<size_t>(n));
      } else if (n == 0) {
        ended_ = true;
      } else if (errno == EINTR) {
        if (interrupted.exchange(false)) return Status::kInterrupted;
      } else {
        ended_ = true;
      }
    }
  }

 private:
  int fd_;
  int wake_;
  std::string buffer_;
  bool ended_ = false;
};

struct Opts {
  ModelOptions model;
  std::string system;
  std::string chat_template;
  int64_t n_predict = -1;
  sampling::Params sampling;
  bool seed_given = false;
  SpecFlags spec;
  std::string expert_budget;
};

constexpr const char* kHelp =
    "commands:\n"
    "  /help           this list\n"
    "  /clear          forget the conversation (the system message stays)\n"
    "  /system TEXT    set the system message (empty TEXT removes it)\n"
    "  /save FILE      write the conversation as a JSON array of {role, content} messages\n"
    "  /load FILE      replace the conversation with one written by /save\n"
    "  /exit           leave (as Ctrl-D does)\n"
    "input: a line ending in \\ continues on the next; a line holding only \"\"\" opens a block that the "
    "next\n"
    "such line closes; start a message with // to send a leading /.\n"
    "Ctrl-C stops a reply; at the prompt it leaves.\n";

std::vector<server::ChatMessage> load_messages(const std::string& path) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(read_text_file(path));
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + " is not JSON (" + e.what() + "); /load reads what /save wrote");
  }
  if (!doc.is_array()) throw Error(path + ": expected a JSON array of {\"role\", \"content\"} messages");
  std::vector<server::ChatMessage> out;
  for (size_t i = 0; i < doc.size(); ++i) {
    const nlohmann::json& m = doc[i];
    const std::string where = path + ": message " + std::to_string(i);
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
        !m["content"].is_string())
      throw Error(where + " needs a string \"role\" and a string \"content\"");
    const std::string role = m["role"];
    if (role != "system" && role != "user" && role != "assistant")
      throw Error(where + " has role '" + role + "': expected system, user or assistant");
    server::ChatMessage msg;
    msg.role = role;
    msg.content = m["content"];
    out.push_back(std::move(msg));
  }
  return out;
}

void save_messages(const std::string& path, const std::vector<server::ChatMessage>& messages) {
  nlohmann::json doc = nlohmann::json::array();
  for (const auto& m : messages) doc.push_back({{"role", m.role}, {"content", m.content}});
  std::ofstream out(path);
  out << doc.dump(2) << '\n';
  if (!out) throw Error("could not write " + path);
}

class Chat {
 public:
  Chat(const Opts& o, model::Model& model, const tokenizer::Tokenizer& tok, ThreadPool& pool,
       const model::SessionOptions& so, const server::ChatTemplate& templ)
      : o_(o),
        tok_(tok),
        templ_(templ),
        session_(model, pool, so),
        residency_(make_expert_residency(o.expert_budget, model)) {
    session_.forward().set_expert_residency(residency_.get());
    if (o.spec.enabled()) spec_.emplace(make_spec_setup(o.spec, model, o.model, pool, so, false));
    if (!o.system.empty()) set_system(o.system);
  }

  int64_t n_ctx() const { return session_.n_ctx(); }

  void set_system(const std::string& text) {
    if (!messages_.empty() && messages_.front().role == "system") messages_.erase(messages_.begin());
    if (text.empty()) return;
    server::ChatMessage m;
    m.role = "system";
    m.content = text;
    messages_.insert(messages_.begin(), std::move(m));
  }

  void clear() {
    const bool keep_system = !messages_.empty() && messages_.front().role == "system";
    messages_.resize(keep_system ? 1 : 0);
  }

  std::vector<server::ChatMessage>& messages() { return messages_; }

  // One turn: the user's message, then the streamed reply. The message is dropped again when the
  // conversation no longer fits the context.
  void reply(const std::string& text) {
    server::ChatMessage user;
    user.role = "user";
    user.content = text;
    messages_.push_back(std::move(user));
    const std::string rendered = templ_.render(messages_);
    // Most templates write the BOS themselves; the encoder must not add a second one then.
    const bool has_bos = tok_.bos_id() >= 0 && rendered.starts_with(tok_.token_text(tok_.bos_id()));
    const std::vector<int32_t> prompt = tok_.encode(rendered, !has_bos, /*parse_special=*/true);
    const auto n = static_cast<int64_t>(prompt.size());
    if (n + 1 >= session_.n_ctx()) {
      messages_.pop_back();
      throw Error("the conversation (" + std::to_string(n) +
                  " tokens with this message) no longer fits the " + std::to_string(session_.n_ctx()) +
                  "-token context: /clear it, or restart with a larger -c");
    }
    // Keep the cache's longest prefix of the new prompt; at least the prompt's last token is evaluated.
    size_t keep = 0;
    while (keep < cached_.size() && keep + 1 < prompt.size() && cached_[keep] == prompt[keep]) ++keep;
    // A recurrent state resumes only where it reaches: within its rollback depth, or at a snapshot.
    if (const cache::RecurrentState* st = session_.cache().recurrent())
      keep = static_cast<size_t>(st->reachable(static_cast<int64_t>(keep)));
    session_.truncate(static_cast<int64_t>(keep));
    cached_.resize(keep);

    engine::GenerateOptions go;
    const int64_t room = session_.n_ctx() - n;
    go.max_tokens = o_.n_predict < 0 ? room : std::min(o_.n_predict, room);
    go.sampling = o_.sampling;
    server::TextAssembler text_out(tok_, tokenizer::TextPosition::kStart, templ_.stop_sequences(), false);
    std::vector<server::Choice::Logprob> no_logprobs;
    std::string reply_text;
    std::vector<int32_t> generated;
    bool stopped_by_user = false;
    interrupted.store(false);
    auto on_token = [&](int32_t id) {
      generated.push_back(id);
      if (interrupted.exchange(false)) {
        stopped_by_user = true;
        return false;
      }
      if (tok_.is_eog(id)) return false;
      engine::TokenEvent ev;
      ev.id = id;
      const std::string piece = text_out.push(ev, no_logprobs);
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
      reply_text += piece;
      return !text_out.stopped();
    };
    auto is_eog = [&](int32_t id) { return tok_.is_eog(id); };
    engine::GenerateStats st;
    std::optional<engine::SpecStats> ss;
    try {
      if (spec_) {
        engine::SpecOptions so = spec_->options;
        so.generate = go;
        ss = engine::generate_speculative(session_, *spec_->source, prompt, so, on_token, is_eog);
        st = *ss;
      } else {
        st = engine::generate(session_, prompt, go, on_token, is_eog);
      }
    } catch (...) {
      session_.truncate(0);
      cached_.clear();
      messages_.pop_back();
      throw;
    }
    interrupted.store(false);  // a Ctrl-C as the reply ended stopped it; it does not leave the prompt
    if (!stopped_by_user) {
      const std::string rest = text_out.finish();
      std::fwrite(rest.data(), 1, rest.size(), stdout);
      reply_text += rest;
    }
    std::fputc('\n', stdout);
    std::fflush(stdout);

    // The session holds the prompt and the reply's tokens but the last.
    cached_.assign(prompt.begin(), prompt.end());
    cached_.insert(cached_.end(), generated.begin(), generated.end());
    cached_.resize(
        static_cast<size_t>(std::min<int64_t>(session_.length(), static_cast<int64_t>(cached_.size()))));
    server::ChatMessage assistant;
    assistant.role = "assistant";
    assistant.content = reply_text;
    messages_.push_back(std::move(assistant));

    std::fprintf(stderr, "[%lld tokens in %.2f s, %.1f tok/s; prompt %lld new tokens, %lld reused%s%s]\n",
                 static_cast<long long>(st.generated), st.generate_seconds,
                 st.generate_seconds > 0 ? st.generated / st.generate_seconds : 0.0,
                 static_cast<long long>(st.prompt_tokens), static_cast<long long>(keep),
                 stopped_by_user ? "; stopped" : "", st.stopped_by_context ? "; the context is full" : "");
    if (ss)
      std::fprintf(stderr,
                   "[speculative: acceptance %.1f%% (%lld of %lld drafts), %.2f tokens per target forward]\n",
                   100.0 * ss->acceptance(), static_cast<long long>(ss->accepted),
                   static_cast<long long>(ss->drafted), ss->tokens_per_forward());
    if (residency_)
      std::fprintf(stderr, "[expert budget %s]\n",
                   expert_residency_summary(residency_->stats(), "the conversation").c_str());
  }

 private:
  const Opts& o_;
  const tokenizer::Tokenizer& tok_;
  const server::ChatTemplate& templ_;
  model::Session session_;
  std::unique_ptr<model::ExpertResidency> residency_;  // --expert-budget; read by session_'s forwards
  std::optional<SpecSetup> spec_;
  std::vector<server::ChatMessage> messages_;
  std::vector<int32_t> cached_;  // the tokens the session's cache holds
};

// Reads one message: a line, continued while it ends in a backslash, or a """ block. Commands are single
// lines. kInterrupted when Ctrl-C came before the message was complete.
LineReader::Status read_message(LineReader& in, bool tty, std::string& message) {
  auto prompt = [tty](const char* text) {
    if (tty) {
      std::fputs(text, stdout);
      std::fflush(stdout);
    }
  };
  std::string line;
  prompt("> ");
  LineReader::Status s = in.read_line(line);
  if (s != LineReader::Status::kLine) return s;
  message.clear();
  if (line == "\"\"\"") {
    for (;;) {
      prompt("... ");
      s = in.read_line(line);
      if (s == LineReader::Status::kInterrupted) return s;
      if (s == LineReader::Status::kEnd || line == "\"\"\"") break;
      if (!message.empty()) message += '\n';
      message += line;
    }
    return LineReader::Status::kLine;
  }
  while (!line.empty() && line.back() == '\\') {
    line.pop_back();
    message += line;
    message += '\n';
    prompt("... ");
    s = in.read_line(line);
    if (s == LineReader::Status::kInterrupted) return s;
    if (s == LineReader::Status::kEnd) {
      line.clear();
      break;
    }
  }
  message += line;
  return LineReader::Status::kLine;
}

void run_chat(Opts& o) {
  if (o.model.model_path.empty()) o.model.model_path = default_model_path();
  if (!o.seed_given) o.sampling.seed = std::random_device{}();
  sampling::validate(o.sampling);
  auto model = model::Model::load(o.model.model_path, o.model.load_mode());
  if (model->config().encoder)
    throw Error(o.model.model_path + " is an encoder (embeddings only); chat needs a decoder");
  auto tok = tokenizer::Tokenizer::from_gguf(model->file());
  std::string source;
  if (auto t = model->file().get_string("tokenizer.chat_template")) source = std::string(*t);
  auto text_of = [&](int32_t id, const char* fallback) {
    return id >= 0 ? std::string(tok->token_text(id)) : std::string(fallback);
  };
  std::string problem;
  const server::ChatTemplate templ =
      !o.chat_template.empty()
          ? server::ChatTemplate::interpret(read_text_file(o.chat_template), text_of(tok->bos_id(), "<s>"),
                                            text_of(tok->eos_id(), "</s>"))
          : server::ChatTemplate::load(source, text_of(tok->bos_id(), "<s>"), text_of(tok->eos_id(), "</s>"),
                                       &problem);
  if (!problem.empty())
    std::fprintf(stderr, "note: the model's chat template does not parse (%s); using the %s format instead\n",
                 problem.c_str(), std::string(templ.name()).c_str());
  ThreadPool pool(o.model.resolved_threads());
  model::SessionOptions so;
  so.n_ctx = o.model.n_ctx;
  so.kv_type = o.model.resolved_kv_type();
  so.batch = o.model.batch;
  // Rollback stays on without a drafter too: the next turn's prompt usually leaves the cached tokens a few
  // tokens before the reply's end (the template renders the reply's ending its own way), and a recurrent
  // state without rollback could only resume at its last snapshot, re-reading the conversation each turn.
  so.rollback = true;
  // A recurrent state keeps a verify window's row states only for a drafter's rounds.
  so.verify_rows = o.spec.enabled() ? o.spec.draft_max + 1 : 1;
  Chat chat(o, *model, *tok, pool, so, templ);
  const bool tty = ::isatty(0) != 0;
  std::fprintf(
      stderr, "chat with %s (%s template, context %lld, %d threads, seed %llu); /help lists commands\n",
      o.model.model_path.c_str(), std::string(templ.name()).c_str(), static_cast<long long>(chat.n_ctx()),
      pool.size(), static_cast<unsigned long long>(o.sampling.seed));
  LineReader in(0, install_interrupt_handler());
  std::string message;
  for (;;) {
    const LineReader::Status s = read_message(in, tty, message);
    if (s != LineReader::Status::kLine) {
      if (tty) std::fputc('\n', stdout);
      break;
    }
    if (message.empty()) continue;
    try {
      if (message.starts_with("//")) {
        chat.reply(message.substr(1));
      } else if (message.starts_with("/")) {
        const size_t space = message.find(' ');
        const std::string command = message.substr(0, space);
        const std::string arg = space == std::string::npos ? std::string() : message.substr(space + 1);
        if (command == "/help") {
          std::fputs(kHelp, stdout);
        } else if (command == "/exit" || command == "/quit") {
          break;
        } else if (command == "/clear") {
          chat.clear();
          std::fprintf(stderr, "(conversation cleared)\n");
        } else if (command == "/system") {
          chat.set_system(arg);
          std::fprintf(stderr, arg.empty() ? "(system message removed)\n" : "(system message set)\n");
        } else if (command == "/save") {
          if (arg.empty()) throw Error("/save needs a file name: /save FILE");
          save_messages(arg, chat.messages());
          std::fprintf(stderr, "(%zu messages saved to %s)\n", chat.messages().size(), arg.c_str());
        } else if (command == "/load") {
          if (arg.empty()) throw Error("/load needs a file name: /load FILE");
          chat.messages() = load_messages(arg);
          std::fprintf(stderr, "(%zu messages loaded from %s)\n", chat.messages().size(), arg.c_str());
        } else {
          throw Error("unknown command " + command + "; /help lists the commands");
        }
      } else {
        chat.reply(message);
      }
    } catch (const Error& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
    }
    std::fflush(stdout);
  }
}

}  // namespace

void add_chat_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("chat", "Chat with a model in the terminal (its own chat template)");
  auto o = std::make_shared<Opts>();
  add_model_options(*cmd, o->model, /*model_required=*/false);
  cmd->add_option("-s,--system", o->system, "System message to start the conversation with");
  cmd->add_option("--chat-template", o->chat_template, "A Jinja chat template to use instead of the model's");
  cmd->add_option("-n,--n-predict", o->n_predict,
                  "Tokens per reply at most (default -1: until the model ends it or the context is full)");
  add_sampling_options(*cmd, o->sampling, o->seed_given);
  add_spec_options(*cmd, o->spec, /*with_replay=*/false);
  add_expert_budget_option(*cmd, o->expert_budget);
  cmd->callback([o] { run_chat(*o); });
}

}  // namespace tandem::cli
