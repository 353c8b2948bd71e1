// tandem serve: the OpenAI-compatible HTTP server over the continuous-batching scheduler and the embedding
// batcher (an encoder-only model gets the batcher alone).
#include <pthread.h>
#include <sys/resource.h>

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "tandem/cli/commands.h"
#include "tandem/cli/common.h"
#include "tandem/cli/spec_common.h"
#include "tandem/engine/cache_pool.h"
#include "tandem/engine/embed_batcher.h"
#include "tandem/engine/scheduler.h"
#include "tandem/model/encoder.h"
#include "tandem/model/graph.h"
#include "tandem/model/session.h"
#include "tandem/server/chat_template.h"
#include "tandem/server/http.h"
#include "tandem/server/metrics.h"
#include "tandem/speculative/calibration.h"
#include "tandem/speculative/dflash_draft.h"
#include "tandem/speculative/draft_model.h"
#include "tandem/speculative/eagle_draft.h"
#include "tandem/speculative/mtp_draft.h"
#include "tandem/speculative/ngram.h"
#include "tandem/speculative/tree_budget.h"
#include "tandem/tokenizer/tokenizer.h"
#include "tandem/util/error.h"
#include "tandem/util/thread_pool.h"

namespace tandem::cli {
namespace {

struct ServeOptions {
  ModelOptions model;
  std::string draft_model, draft, drafter;
  std::string host = "127.0.0.1";
  int port = 8080;
  int parallel = 4;
  int queue = 64;
  int64_t rows = 64;
  int max_draft = 0;
  int tree_nodes = 0;
  speculative::GateSettings gate;
  std::string api_key, alias, replica_name;
  std::string chat_template;  // --chat-template FILE: overrides the model file's
  std::string reasoning_format = "deepseek";
  double drain_seconds = 30;
  server::ConnectionLimits connections;
  double idle_seconds = 5, request_seconds = 30, write_seconds = 10;
  int max_json_depth = 64;
  size_t max_json_elements = 1u << 18;
  int64_t embed_rows = 2048;
  int embed_threads = 1;
  std::vector<int64_t> truncatable_dims;
  std::string expert_budget;
};

std::chrono::milliseconds to_ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

// SIGINT and SIGTERM are blocked in every thread and taken by one watcher thread with sigwait(), so no
// handler runs asynchronously and no global flag is needed.
class SignalWatcher {
 public:
  SignalWatcher() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set_, &previous_);
  }
  ~SignalWatcher() {
    join();
    pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
  }
  // Waits for the watcher to finish its reaction to a signal; without one, ends it quietly.
  void join() {
    if (!thread_.joinable()) return;
    if (!fired_.load()) {
      quiet_.store(true);
      pthread_kill(thread_.native_handle(), SIGTERM);  // wakes sigwait
    }
    thread_.join();
  }
  template <typename Fn>
  void start(Fn on_signal) {
    thread_ = std::thread([this, on_signal] {
      int sig = 0;
      sigwait(&set_, &sig);
      fired_.store(true);
      if (!quiet_.load()) on_signal(sig);
    });
  }

 private:
  sigset_t set_{}, previous_{};
  std::thread thread_;
  std::atomic<bool> quiet_{false}, fired_{false};
};

// Each connection holds a descriptor; the soft limit is raised toward the hard one when the connections, the
// model files and the listening socket would not fit (1024, a common soft limit, is too few for 512).
void ensure_descriptors(size_t max_connections) {
  const rlim_t need = static_cast<rlim_t>(max_connections) + 64;
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur >= need) return;
  if (lim.rlim_max != RLIM_INFINITY && lim.rlim_max < need)
    throw Error("--max-connections " + std::to_string(max_connections) + " needs " + std::to_string(need) +
                " file descriptors, but this process may open at most " + std::to_string(lim.rlim_max) +
                " (ulimit -Hn): lower --max-connections or raise the limit");
  lim.rlim_cur = need;
  if (::setrlimit(RLIMIT_NOFILE, &lim) != 0)
    throw Error("cannot raise the open-file limit to " + std::to_string(need) + " for --max-connections " +
                std::to_string(max_connections) + ": lower --max-connections or raise ulimit -n");
}

// glibc raises its mmap threshold after the first large free (up to 32 MiB) and its trim threshold with it,
// so request bodies of a few MiB then come from per-thread arenas whose free tops malloc_trim() does not
// return, and stay resident after the requests end. Fixed thresholds keep large blocks in their own mappings
// (returned when freed) and arena tops trimmed.
void bound_allocator_retention() {
#ifdef __GLIBC__
  ::mallopt(M_MMAP_THRESHOLD, 256 << 10);
  ::mallopt(M_TRIM_THRESHOLD, 1 << 20);
#endif
}

// One request of one token through the scheduler before the server calls itself ready: with the weights
// mapped lazily, the first forward is what reads them from disk, and it starts the thread pool. Returns false
// when a drain refused or cut it; throws when the forward failed.
bool warm_up(engine::Scheduler& scheduler, const tokenizer::Tokenizer& tok) {
  engine::Request r;
  r.prompt = {std::max<int32_t>(tok.bos_id(), 0)};
  r.max_tokens = 1;
  r.sampling.temperature = 0;
  engine::Scheduler::Admit admit{};
  std::string why;
  std::shared_ptr<engine::Stream> stream = scheduler.submit(std::move(r), admit, &why);
  if (admit == engine::Scheduler::Admit::kDraining) return false;
  if (!stream) throw Error("the warm-up request was refused: " + why);
  engine::Event ev;
  while (!stream->next(ev, std::chrono::milliseconds(100)) || ev.kind == engine::Event::Kind::kToken) {
  }
  if (ev.finish == engine::Finish::kError) throw Error("the warm-up forward failed: " + ev.error);
  return ev.finish != engine::Finish::kDrained && ev.finish != engine::Finish::kCancelled;
}

// One embedding of one token before an encoder-only server calls itself ready (see warm_up). Returns false
// when a drain refused it.
bool warm_up_embeddings(engine::EmbeddingBatcher& embeddings, const tokenizer::Tokenizer& tok) {
  std::vector<float> out;
  return embeddings.embed({{std::max<int32_t>(tok.bos_id(), 0)}}, out) ==
         engine::EmbeddingBatcher::Admit::kOk;
}

// Drafters that are costly to build (an EAGLE-3 drafter holds f32 copies of the target's embedding and head)
// are built once per running slot and lent to sequences: a lent source forwards every call to its pooled one
// (a batched proposal to the pooled sources of its requests) and gives it back when its sequence ends. The
// scheduler's thread is the only user.
class SourceLender {
 public:
  explicit SourceLender(std::vector<std::unique_ptr<speculative::DraftSource>> sources)
      : free_(std::move(sources)) {
    requests_.reserve(free_.size());
  }

  // Null when every source is lent (the scheduler runs at most as many sequences as there are sources).
  std::unique_ptr<speculative::DraftSource> lend() {
    if (free_.empty()) return nullptr;
    std::unique_ptr<speculative::DraftSource> s = std::move(free_.back());
    free_.pop_back();
    return std::make_unique<Lent>(*this, std::move(s));
  }

 private:
  class Lent final : public speculative::DraftSource {
   public:
    Lent(SourceLender& owner, std::unique_ptr<speculative::DraftSource> s)
        : owner_(owner), s_(std::move(s)) {}
    ~Lent() override { owner_.free_.push_back(std::move(s_)); }
    Lent(const Lent&) = delete;
    Lent& operator=(const Lent&) = delete;
    std::string_view kind() const override { return s_->kind(); }
    void begin(std::span<const int32_t> prompt, const speculative::DraftSettings& settings) override {
      s_->begin(prompt, settings);
    }
    void propose(std::span<const int32_t> committed, int max_depth, speculative::Draft& out) override {
      s_->propose(committed, max_depth, out);
    }
    void propose_tree(std::span<const int32_t> committed, int max_nodes, int max_depth,
                      speculative::Draft& out) override {
      s_->propose_tree(committed, max_nodes, max_depth, out);
    }
    bool follows_tree_rows() const override { return s_->follows_tree_rows(); }
    void on_tree_kept(int64_t base, std::span<const int32_t> rows) override { s_->on_tree_kept(base, rows); }
    void accept(std::span<const int32_t> committed, int n_accepted) override {
      s_->accept(committed, n_accepted);
    }
    const void* batch_group() const override { return s_->batch_group(); }
    // The requests' sources are lent ones of the same group (only they return the pooled sources' group).
    void propose_batch(std::span<const speculative::DraftRequest> requests) override {
      auto& pooled = owner_.requests_;
      pooled.clear();
      for (const speculative::DraftRequest& r : requests)
        pooled.push_back({static_cast<Lent&>(*r.source).s_.get(), r.committed, r.max_depth, r.out});
      s_->propose_batch(pooled);
    }
    std::span<const int64_t> target_layers() const override { return s_->target_layers(); }
    void on_target_hidden(int64_t layer, std::span<const float> hidden, int64_t n_rows,
                          int64_t first_pos) override {
      s_->on_target_hidden(layer, hidden, n_rows, first_pos);
    }

   private:
    SourceLender& owner_;
    std::unique_ptr<speculative::DraftSource> s_;
  };
  std::vector<std::unique_ptr<speculative::DraftSource>> free_;
  std::vector<speculative::DraftRequest> requests_;  // a batched proposal's requests to the pooled sources
};

void serve(const ServeOptions& o) {
  if (!o.draft.empty() && o.draft != "ngram" && o.draft != "mtp")
    throw Error("--draft takes 'ngram' or 'mtp' (or use --draft-model FILE or --drafter FILE)");
  std::signal(SIGPIPE, SIG_IGN);  // a client that disconnects must not end the process
  ensure_descriptors(o.connections.max_connections);
  bound_allocator_retention();
  SignalWatcher signals;  // before any thread starts, so that all inherit the mask
  auto model = model::Model::load(o.model.model_path, o.model.load_mode());
  // The scheduler's forwards read the routed experts through it (the calibration and a decoder's
  // embeddings, on forwards of their own, read the file's); /metrics shows its counters.
  const std::unique_ptr<model::ExpertResidency> residency = make_expert_residency(o.expert_budget, *model);
  auto tok = tokenizer::Tokenizer::from_gguf(model->file());
  const int64_t n_ctx = model::default_context(*model, o.model.n_ctx);
  std::string source;
  if (auto t = model->file().get_string("tokenizer.chat_template")) source = std::string(*t);
  auto text_of = [&](int32_t id, const char* fallback) {
    return id >= 0 ? std::string(tok->token_text(id)) : std::string(fallback);
  };
  std::string problem;
  const server::ChatTemplate chat =
      !o.chat_template.empty()
          ? server::ChatTemplate::interpret(read_text_file(o.chat_template), text_of(tok->bos_id(), "<s>"),
                                            text_of(tok->eos_id(), "</s>"))
          : server::ChatTemplate::load(source, text_of(tok->bos_id(), "<s>"), text_of(tok->eos_id(), "</s>"),
                                       &problem);
  if (!problem.empty())
    std::fprintf(stderr, "note: the model's chat template does not parse (%s); using the %s format instead\n",
                 problem.c_str(), std::string(chat.name()).c_str());

  ThreadPool pool(o.model.resolved_threads());
  const model::Config& config = model->config();
  // An encoder-only model has no generation: no graph, caches or scheduler, and the batcher has the pool.
  // A decoder's embeddings run beside generation on a pool of their own, so neither waits for the other.
  const bool encoder = config.encoder;
  std::unique_ptr<ThreadPool> embed_pool;
  if (!encoder) embed_pool = std::make_unique<ThreadPool>(o.embed_threads);
  ThreadPool& embed_threads = encoder ? pool : *embed_pool;
  const int64_t embed_ctx = encoder ? config.n_ctx_train : n_ctx;
  engine::EmbeddingBatcherOptions eo;
  eo.max_rows = o.embed_rows;
  eo.max_waiting = o.parallel + o.queue;  // as many as generation admits, running and queued
  for (const int64_t d : o.truncatable_dims)
    if (d >= config.n_embd)
      throw Error("--matryoshka-dims " + std::to_string(d) + " is not below the model's embedding width " +
                  std::to_string(config.n_embd));
  engine::EmbeddingBatcher embeddings(
      [&] {
        return std::make_unique<model::Embedder>(*model, embed_threads, o.embed_rows, encoder ? 0 : n_ctx);
      },
      config.n_embd, embed_ctx, eo);

  std::unique_ptr<model::Graph> graph;
  std::unique_ptr<engine::SlotCachePool> caches;
  std::unique_ptr<engine::Scheduler> scheduler;
  engine::SchedulerOptions so;
  so.max_running = o.parallel;
  so.max_waiting = o.queue;
  so.max_rows = o.rows;
  const bool speculate = !o.draft.empty() || !o.draft_model.empty() || !o.drafter.empty();
  if (encoder && speculate)
    throw Error("--draft, --draft-model and --drafter speed up generation, but '" + o.model.model_path +
                "' is an encoder (" + config.arch + ") that makes embeddings only; drop them");
  so.max_draft = speculate ? (o.max_draft > 0 ? o.max_draft : 6) : 0;
  so.gate = o.gate;
  if (o.tree_nodes > 0) {
    if (!speculate)
      throw Error(
          "--tree-nodes drafts token trees: pass --draft-model FILE, --drafter FILE or --draft ngram with "
          "it");
    speculative::check_tree_target(config.kv_geometry(), o.model.resolved_kv_type());
    so.tree_nodes = o.tree_nodes;
  }
  std::unique_ptr<model::Model> draft;
  std::unique_ptr<speculative::DraftModelBatch> draft_batch;
  std::unique_ptr<speculative::EagleDraftBatch> eagle_batch;
  std::unique_ptr<speculative::DflashDraftBatch> dflash_batch;
  std::unique_ptr<SourceLender> lender;
  std::vector<std::unique_ptr<speculative::DraftSource>> slot_sources;  // one per running slot, to lend
  engine::DraftFactory drafts;
  std::string draft_hash;
  if (!o.draft_model.empty()) {
    draft = model::Model::load(o.draft_model, o.model.load_mode());
    speculative::check_same_vocabulary(*model, *draft);
    draft_hash = speculative::file_fingerprint(o.draft_model);
    // One drafter forward proposes for every sequence that drafts in an iteration.
    draft_batch = std::make_unique<speculative::DraftModelBatch>(*draft, pool, o.parallel, o.rows);
    model::SessionOptions dso{n_ctx, o.model.resolved_kv_type(), 16};
    drafts = [&, dso] {
      return std::make_unique<speculative::DraftModelSource>(*draft, *model, pool, dso, draft_batch.get());
    };
  } else if (!o.drafter.empty()) {
    const std::string target_hash = speculative::file_fingerprint(o.model.model_path);
    const train::DrafterInfo info = train::load_drafter(o.drafter, {});
    const bool dflash = info.kind == speculative::kDflashKind;
    // One drafter forward per drafting step proposes for every sequence that drafts in an iteration.
    if (dflash)
      dflash_batch = std::make_unique<speculative::DflashDraftBatch>(speculative::dflash_config_of(info),
                                                                     pool, o.parallel, n_ctx, o.rows);
    else
      eagle_batch = std::make_unique<speculative::EagleDraftBatch>(speculative::eagle_config_of(info), pool,
                                                                   o.parallel, n_ctx, o.rows);
    for (int i = 0; i < o.parallel; ++i)
      if (dflash)
        slot_sources.push_back(speculative::DflashDraftSource::load(o.drafter, *model, target_hash, pool,
                                                                    n_ctx, dflash_batch.get()));
      else
        slot_sources.push_back(speculative::EagleDraftSource::load(o.drafter, *model, target_hash, pool,
                                                                   n_ctx, eagle_batch.get()));
  } else if (o.draft == "mtp") {
    // The MTP layer's workspace and cache, once per running slot.
    speculative::check_has_mtp(*model, o.model.model_path);
    for (int i = 0; i < o.parallel; ++i)
      slot_sources.push_back(std::make_unique<speculative::MtpDraftSource>(*model, pool, n_ctx));
  } else if (o.draft == "ngram") {
    drafts = [] { return std::make_unique<speculative::NgramSource>(); };
  }
  if (!slot_sources.empty()) {
    // A drafter that cannot follow a tree round's rows (the MTP layer) is refused here, not request by
    // request.
    if (o.tree_nodes > 0) speculative::check_tree_source(*slot_sources.front());
    lender = std::make_unique<SourceLender>(std::move(slot_sources));
    drafts = [&] { return lender->lend(); };
  }
  if (speculate) {
    // The gate prices each round against the forward it joins, from the forwards' live timings and, for row
    // counts not yet timed, the verify costs measured on this machine (measured now and cached when missing).
    const std::string cache_path = speculative::calibration_file_path();
    auto cal = speculative::cached_calibration(o.model.model_path, pool.size());
    // Up to the widest forward the scheduler runs: its windows are priced on the rows the forward already
    // carries, which with many streams reach far past one sequence's window.
    speculative::CalibrateOptions co;
    co.max_rows = static_cast<int>(std::min<int64_t>(o.rows, co.max_rows));
    const bool narrow =
        cal && static_cast<int>(cal->verify.size()) - 1 < speculative::calibrated_rows(*model, co);
    if (!cal || narrow || (draft && !cal->draft_per_token.count(draft_hash))) {
      std::fprintf(stderr, "serve: calibrating verify costs on this machine (cached in %s)...\n",
                   cache_path.c_str());
      co.repeats = 3;
      cal = speculative::calibrate(*model, o.model.model_path, draft.get(), o.draft_model, pool, co);
      try {
        speculative::store_calibration(cache_path, *cal);
      } catch (const Error& e) {
        std::fprintf(stderr, "note: %s; the calibration is used for this run only\n", e.what());
      }
    }
    so.costs = cal->cost_model(draft_hash);
  }

  const tokenizer::Tokenizer& tk = *tok;
  if (!encoder) {
    graph =
        std::make_unique<model::Graph>(*model, pool, model::GraphOptions{std::max<int64_t>(o.rows, 16), 16});
    graph->set_expert_residency(residency.get());
    // Without speculation no sequence is rolled back: recurrent states then skip the rollback work.
    caches = std::make_unique<engine::SlotCachePool>(config, n_ctx, o.model.resolved_kv_type(), o.parallel,
                                                     /*rollback=*/speculate, so.max_draft + 1);
    scheduler = std::make_unique<engine::Scheduler>(
        *graph, *caches, [&tk](int32_t id) { return tk.is_eog(id); }, so, drafts);
  }
  server::Metrics metrics;
  server::ServerOptions http;
  http.host = o.host;
  http.port = o.port;
  http.api_key = o.api_key;
  http.replica_name = o.replica_name;
  http.connections = o.connections;
  http.connections.idle_timeout = to_ms(o.idle_seconds);
  http.connections.request_timeout = to_ms(o.request_seconds);
  http.connections.write_timeout = to_ms(o.write_seconds);
  http.max_json_depth = o.max_json_depth;
  http.max_json_elements = o.max_json_elements;
  http.reasoning_format = *server::reasoning_format_from(o.reasoning_format);
  http.model_name = !o.alias.empty() ? o.alias : std::filesystem::path(o.model.model_path).stem().string();
  http.truncatable_dims = o.truncatable_dims;
  http.model_kind = "an encoder (" + config.arch + ")";
  server::HttpServer srv(scheduler.get(), &embeddings, tk, chat, metrics, http);
  const int port = srv.bind();

  // Draining: new and queued requests get 503 with Retry-After at once (they never started, so a client can
  // retry elsewhere); running ones get the drain timeout, then are cut with finish_reason "cancelled".
  signals.start([&](int sig) {
    std::fprintf(stderr,
                 "serve: %s received: draining (new and queued requests get 503; running ones get %.0f s)\n",
                 sig == SIGINT ? "SIGINT" : "SIGTERM", o.drain_seconds);
    srv.begin_drain();
    if (scheduler) scheduler->drain();
    embeddings.drain();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(o.drain_seconds);
    while ((!embeddings.idle() || (scheduler && !scheduler->idle())) &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (scheduler) scheduler->stop();  // cuts what still runs; serve() returns once those answers are written
    srv.stop();
  });
  if (encoder)
    std::fprintf(stderr,
                 "serve: model '%s', an encoder (%s): embeddings only, context %lld, queue %d, %lld rows per "
                 "embedding batch\n",
                 http.model_name.c_str(), config.arch.c_str(), static_cast<long long>(embed_ctx), o.queue,
                 static_cast<long long>(o.embed_rows));
  else
    std::fprintf(stderr,
                 "serve: model '%s' (%s chat template), context %lld, %d parallel, queue %d, %lld rows per "
                 "forward, drafting %s\n",
                 http.model_name.c_str(), std::string(chat.name()).c_str(), static_cast<long long>(n_ctx),
                 o.parallel, o.queue, static_cast<long long>(o.rows),
                 speculate ? (draft    ? "with a draft model"
                              : lender ? (o.draft == "mtp" ? "with the checkpoint's MTP layer"
                                                           : "with a drafter that reads the target")
                                       : "by n-gram lookup")
                           : "off");
  if (residency)
    std::fprintf(
        stderr,
        "serve: expert budget %.1f MB: %lld of %lld routed experts resident at once, chosen from the "
        "routing counts as generation goes (/metrics shows the reads served resident)\n",
        static_cast<double>(residency->stats().budget_bytes) / 1e6,
        static_cast<long long>(residency->slots()), static_cast<long long>(residency->stats().experts));
  std::fprintf(stderr, "serve: replica '%s' warming up on %s:%d (/health answers 503 \"starting\")\n",
               srv.replica_name().c_str(), o.host.c_str(), port);
  // A failed warm-up leaves /health at "starting", so a balancer keeps sending elsewhere.
  std::thread warm([&] {
    try {
      // A signal that came first leaves the rest to the drain.
      if (!(scheduler ? warm_up(*scheduler, tk) : warm_up_embeddings(embeddings, tk))) return;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "serve: %s; /health stays 503 \"starting\"\n", e.what());
      return;
    }
    srv.ready();
    std::fprintf(stderr, "serve: listening on http://%s:%d\n", o.host.c_str(), port);
  });
  srv.serve();
  warm.join();
  signals.join();
  if (scheduler) scheduler->stop();
  embeddings.stop();
  std::fprintf(stderr, "serve: stopped\n");
}

// Names go into a response header as they are: letters, digits and . _ : - only, at most 64.
CLI::Validator replica_name_check() {
  return CLI::Validator(
      [](const std::string& name) -> std::string {
        const bool ok =
            !name.empty() && name.size() <= 64 &&
            name.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-") ==
                std::string::npos;
        return ok ? "" : "use 1 to 64 letters, digits, '.', '_', ':' or '-'";
      },
      "NAME");
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("serve",
                         "Serve the OpenAI API (/v1/completions, /v1/chat/completions, /v1/embeddings, "
                         "/v1/models, /health, /metrics) with continuous batching");
  auto o = std::make_shared<ServeOptions>();
  add_model_options(*cmd, o->model);
  cmd->add_option("--host", o->host, "Address to listen on (default 127.0.0.1: this machine only)");
  cmd->add_option("--port", o->port, "Port (default 8080; 0 picks a free one)")->check(CLI::Range(0, 65535));
  cmd->add_option("--parallel", o->parallel, "Sequences generating at once (default 4)")
      ->check(CLI::Range(1, 256));
  cmd->add_option("--queue", o->queue, "Requests waiting beyond those; more get 503 (default 64)")
      ->check(CLI::Range(0, 4096));
  cmd->add_option("--rows", o->rows, "Rows per forward: decode rows plus prompt chunks (default 64)")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--api-key", o->api_key,
                  "Require 'Authorization: Bearer KEY' on every route but /health and the chat page at /");
  cmd->add_option("--alias", o->alias, "Model name clients use (default: the file name without .gguf)");
  cmd->add_option("--replica-name", o->replica_name,
                  "Name sent in every response's X-Tandem-Replica header (default HOSTNAME:PORT)")
      ->check(replica_name_check());
  cmd->add_option("--chat-template", o->chat_template,
                  "Jinja chat template file to use instead of the model's tokenizer.chat_template")
      ->check(CLI::ExistingFile);
  cmd->add_option(
         "--reasoning-format", o->reasoning_format,
         "Chat replies' <think> blocks: deepseek moves them to reasoning_content (default), none keeps "
         "them in the content; a request's reasoning_format overrides")
      ->check(CLI::IsMember({"none", "deepseek"}));
  cmd->add_option("--drain-timeout", o->drain_seconds,
                  "Seconds running requests get after SIGTERM; queued ones get 503 at once (default 30)")
      ->check(CLI::Range(0.0, 86400.0));
  // Bounds on what one client can make the server spend (see docs/server.md, Limits).
  cmd->add_option("--max-body", o->connections.max_body_bytes,
                  "Largest request body in bytes, chunked or not; larger get 413 (default 4 MiB)")
      ->check(CLI::Range(size_t{1} << 10, size_t{1} << 30));
  cmd->add_option("--max-json-depth", o->max_json_depth,
                  "Deepest nesting of arrays and objects in a request body; deeper get 400 (default 64)")
      ->check(CLI::Range(4, 10000));
  cmd->add_option("--max-json-elements", o->max_json_elements,
                  "Most JSON values in a request body; more get 400 (default 262144)")
      ->check(CLI::Range(size_t{16}, size_t{1} << 30));
  cmd->add_option("--max-headers", o->connections.max_headers,
                  "Most header fields in a request; more get 431 (default 100)")
      ->check(CLI::Range(size_t{8}, size_t{10000}));
  cmd->add_option("--max-header-bytes", o->connections.max_header_bytes,
                  "Largest request line and headers together, in bytes; larger get 431 (default 64 KiB)")
      ->check(CLI::Range(size_t{1} << 10, size_t{1} << 24));
  cmd->add_option("--max-connections", o->connections.max_connections,
                  "Connections open at once, each with its own thread; more get 503 (default 512)")
      ->check(CLI::Range(size_t{1}, size_t{65536}));
  cmd->add_option("--idle-timeout", o->idle_seconds,
                  "Seconds a connection may wait for its next request before it is closed (default 5)")
      ->check(CLI::Range(0.05, 3600.0));
  cmd->add_option("--request-timeout", o->request_seconds,
                  "Seconds a request's headers and body have to arrive; slower get 408 (default 30)")
      ->check(CLI::Range(0.05, 3600.0));
  cmd->add_option("--write-timeout", o->write_seconds,
                  "Seconds a client may take no response bytes before it is dropped (default 10)")
      ->check(CLI::Range(0.05, 3600.0));
  auto* dm = cmd->add_option("--draft-model", o->draft_model, "Draft model for speculative decoding");
  auto* dr =
      cmd->add_option("--drafter", o->drafter, "Drafter trained by `tandem train-drafter`")->excludes(dm);
  cmd->add_option("--draft", o->draft,
                  "Draft source: ngram, or mtp (the checkpoint's own next-token-prediction layer)")
      ->excludes(dm)
      ->excludes(dr);
  cmd->add_option("--max-draft", o->max_draft, "Deepest drafted window per sequence (default 6 with a draft)")
      ->check(CLI::Range(0, 15));
  cmd->add_option(
         "--tree-nodes", o->tree_nodes,
         "Draft a token tree of at most N nodes per sequence and round (--draft-model, --drafter "
         "(EAGLE-3, DFlash) and --draft ngram branch where they are unsure; --draft mtp drafts chains "
         "only), verified with the rest of the batch in one forward; --max-draft bounds its depth; "
         "each round verifies the drafter's best nodes that pay for the rows they add (default 0: "
         "chains)")
      ->check(CLI::Range(0, 255));
  add_gate_options(*cmd, o->gate);
  cmd->add_option("--embed-rows", o->embed_rows,
                  "/v1/embeddings: tokens of queued requests embedded together in one batch (default 2048)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--embed-threads", o->embed_threads,
                  "/v1/embeddings from a decoder: threads of its own beside generation's (default 1); an "
                  "encoder-only model uses -t")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--matryoshka-dims", o->truncatable_dims,
                  "/v1/embeddings: widths below the model's that 'dimensions' may ask for, for models "
                  "trained to be cut (comma-separated; default: none)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  add_expert_budget_option(*cmd, o->expert_budget);
  cmd->callback([o] {
    if (o->parallel > o->rows)
      throw Error("--rows must be at least --parallel (one decode row per sequence)");
    // Each running or queued request holds a connection; the rest answer /health and new requests.
    if (o->connections.max_connections < static_cast<size_t>(o->parallel + o->queue) + 8)
      throw Error("--max-connections must be at least --parallel + --queue + 8 (" +
                  std::to_string(o->parallel + o->queue + 8) + "): each running or queued request holds one");
    check_gate_options(o->gate);
    serve(*o);
  });
}

}  // namespace tandem::cli
