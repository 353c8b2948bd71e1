// tandem bench-serve: plain and speculative serving of the same workload in one run, through the scheduler
// that `tandem serve` runs (without HTTP), at several numbers of concurrent streams. For each stream count
// the two modes alternate, --repeats times each, on the same greedy requests; each run reports aggregate and
// per-stream tok/s, time to first token (p50 / p99), acceptance, tokens per target forward and tokens per
// second of the process's CPU time; the summary keeps each mode's median run by aggregate tok/s and the
// median of the paired speed-ups, by wall time and by CPU time (on a machine shared with other work the
// latter is the steadier).
//
// --draft replay --accept X proposes each request's own greedy continuation (from the first plain run),
// corrupting each proposed token with probability 1 - X: a drafter of known acceptance, so the serving
// overhead is measured apart from any drafter's quality. --draft ngram and --draft-model FILE are real
// drafters.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

#include "tandem/cli/commands.h"
#include "tandem/cli/common.h"
#include "tandem/cli/spec_common.h"
#include "tandem/engine/cache_pool.h"
#include "tandem/engine/scheduler.h"
#include "tandem/model/graph.h"
#include "tandem/sampling/rng.h"
#include "tandem/speculative/calibration.h"
#include "tandem/speculative/draft_model.h"
#include "tandem/speculative/ngram.h"
#include "tandem/speculative/replay.h"
#include "tandem/util/error.h"
#include "tandem/util/thread_pool.h"

namespace tandem::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct BenchServeOptions {
  ModelOptions model;
  std::string draft, draft_model;
  double accept = 0.8;
  std::vector<int> streams = {1, 2, 4, 8};
  int prompt_tokens = 32;
  int max_tokens = 64;
  int max_draft = 6;
  int repeats = 3;
  int64_t rows = 64;
  uint64_t seed = 0;
  bool json = false;
};

// Replays each request's reference continuation, found by its prompt (speculative::ReplaySource).
class ReplayByPrompt final : public speculative::DraftSource {
 public:
  ReplayByPrompt(const std::map<std::vector<int32_t>, std::vector<int32_t>>& references, double accept,
                 int64_t n_vocab, uint64_t seed)
      : references_(references), replay_(accept, n_vocab, seed) {}
  std::string_view kind() const override { return replay_.kind(); }
  void begin(std::span<const int32_t> prompt, const speculative::DraftSettings& settings) override {
    const auto it = references_.find(std::vector<int32_t>(prompt.begin(), prompt.end()));
    if (it == references_.end()) throw Error("bench-serve: no reference continuation for a prompt");
    replay_.set_reference(it->second);
    replay_.begin(prompt, settings);
  }
  void propose(std::span<const int32_t> committed, int max_depth, speculative::Draft& out) override {
    replay_.propose(committed, max_depth, out);
  }
  void accept(std::span<const int32_t> committed, int n_accepted) override {
    replay_.accept(committed, n_accepted);
  }

 private:
  const std::map<std::vector<int32_t>, std::vector<int32_t>>& references_;
  speculative::ReplaySource replay_;
};

struct RunResult {
  double seconds = 0, aggregate_tps = 0, stream_tps = 0, ttft_p50 = 0, ttft_p99 = 0;
  double acceptance = 0, tokens_per_forward = 0;
  double cpu_seconds = 0, cpu_tps = 0;  // the process's CPU time over the run, and tokens per CPU second
  uint64_t generated = 0;
  std::vector<std::vector<int32_t>> outputs;  // by stream
};

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double at = q * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<size_t>(at);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (at - static_cast<double>(lo));
}

// Distinct prompts per stream and repeat (no prefix is shared, so no run reuses another's cache).
std::vector<int32_t> make_prompt(int stream, int length, uint64_t seed, int64_t n_vocab) {
  std::vector<int32_t> p;
  for (int i = 0; i < length; ++i)
    p.push_back(static_cast<int32_t>(
        sampling::mix64(seed * 1000003 + static_cast<uint64_t>(stream) * 7919 + static_cast<uint64_t>(i)) %
        static_cast<uint64_t>(n_vocab)));
  return p;
}

// CPU time of every thread of the process. On a machine shared with other work, wall time also counts the
// time the threads waited for a core; CPU time counts the work done (and the pool's spinning).
double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

RunResult run_once(model::Graph& graph, const model::Model& model, const BenchServeOptions& o, int n,
                   const std::vector<std::vector<int32_t>>& prompts, int max_draft,
                   const speculative::CostModel& costs, engine::DraftFactory drafts) {
  // Each sequence's positions: its prompt, its tokens and a window past them.
  const int64_t ctx = std::min<int64_t>(model::default_context(model, o.model.n_ctx),
                                        o.prompt_tokens + o.max_tokens + o.max_draft + 2);
  // Plain runs (no drafts) roll nothing back, as `serve` without speculation.
  engine::SlotCachePool caches(model.config(), ctx, o.model.resolved_kv_type(), n,
                               /*rollback=*/max_draft > 0, max_draft + 1);
  engine::SchedulerOptions so;
  so.max_running = n;
  so.max_waiting = n;
  so.max_rows = o.rows;
  so.max_draft = max_draft;
  so.costs = costs;
  engine::Scheduler scheduler(graph, caches, nullptr, so, std::move(drafts));
  std::vector<std::shared_ptr<engine::Stream>> streams;
  const double cpu_start = process_cpu_seconds();
  const auto start = Clock::now();
  for (int i = 0; i < n; ++i) {
    engine::Request r;
    r.prompt = prompts[static_cast<size_t>(i)];
    r.max_tokens = o.max_tokens;
    r.sampling.temperature = 0.0f;
    r.sequence_id = static_cast<uint64_t>(i);
    r.stop_at_eog = false;
    engine::Scheduler::Admit a{};
    std::string why;
    auto st = scheduler.submit(std::move(r), a, &why);
    if (!st) throw Error("bench-serve: a request was refused: " + why);
    streams.push_back(std::move(st));
  }
  // Each stream is read on its own thread, so a token's time is when the scheduler emitted it, not when a
  // reader got round to it.
  struct Reading {
    std::vector<int32_t> tokens;
    double first = -1, last = 0;
    std::string error;
  };
  std::vector<Reading> readings(streams.size());
  std::vector<std::thread> readers;
  for (size_t i = 0; i < streams.size(); ++i)
    readers.emplace_back([&, i] {
      Reading& r = readings[i];
      engine::Event ev;
      for (;;) {
        if (!streams[i]->next(ev, std::chrono::minutes(10))) {
          r.error = "a stream stalled for 10 minutes";
          return;
        }
        if (ev.kind != engine::Event::Kind::kToken) {
          if (ev.finish == engine::Finish::kError) r.error = ev.error;
          return;
        }
        const double t = std::chrono::duration<double>(Clock::now() - start).count();
        if (r.first < 0) r.first = t;
        r.last = t;
        r.tokens.push_back(ev.token.id);
      }
    });
  for (auto& t : readers) t.join();
  RunResult res;
  std::vector<double> ttft, per_stream;
  for (Reading& r : readings) {
    if (!r.error.empty()) throw Error("bench-serve: " + r.error);
    ttft.push_back(r.first);
    if (r.tokens.size() > 1 && r.last > r.first)
      per_stream.push_back(static_cast<double>(r.tokens.size() - 1) / (r.last - r.first));
    res.generated += r.tokens.size();
    res.outputs.push_back(std::move(r.tokens));
  }
  res.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  res.cpu_seconds = process_cpu_seconds() - cpu_start;
  scheduler.stop();
  const engine::SchedulerStats s = scheduler.stats();
  res.aggregate_tps = static_cast<double>(res.generated) / res.seconds;
  res.cpu_tps = res.cpu_seconds > 0 ? static_cast<double>(res.generated) / res.cpu_seconds : 0.0;
  res.stream_tps = percentile(per_stream, 0.5);
  res.ttft_p50 = percentile(ttft, 0.5);
  res.ttft_p99 = percentile(ttft, 0.99);
  res.acceptance = s.drafted > 0 ? static_cast<double>(s.accepted) / static_cast<double>(s.drafted) : 0.0;
  res.tokens_per_forward =
      s.steps > 0 ? static_cast<double>(s.generated_tokens) / static_cast<double>(s.steps) : 0;
  return res;
}

// Greedy serving is deterministic: every run of a workload, plain or speculative, gives the same tokens.
void expect_same(const RunResult& run, const RunResult& reference, const char* mode) {
  for (size_t i = 0; i < run.outputs.size(); ++i)
    if (run.outputs[i] != reference.outputs[i])
      throw Error("bench-serve: stream " + std::to_string(i) + "'s " + mode +
                  " output differs from the first plain run's (greedy output must not change)");
}

nlohmann::json to_json(const RunResult& r) {
  return {{"aggregate_tps", r.aggregate_tps},
          {"stream_tps", r.stream_tps},
          {"ttft_p50_s", r.ttft_p50},
          {"ttft_p99_s", r.ttft_p99},
          {"acceptance", r.acceptance},
          {"tokens_per_forward", r.tokens_per_forward},
          {"seconds", r.seconds},
          {"cpu_seconds", r.cpu_seconds},
          {"cpu_tps", r.cpu_tps}};
}

void bench_serve(const BenchServeOptions& o) {
  const int kinds = !o.draft.empty() + !o.draft_model.empty();
  if (kinds != 1)
    throw Error("bench-serve needs one drafter: --draft replay, --draft ngram or --draft-model FILE");
  if (!o.draft.empty() && o.draft != "replay" && o.draft != "ngram")
    throw Error("--draft takes replay or ngram (or use --draft-model FILE)");
  auto model = model::Model::load(o.model.model_path, o.model.load_mode());
  const int64_t n_vocab = model->config().n_vocab;
  const int max_streams = *std::max_element(o.streams.begin(), o.streams.end());
  ThreadPool pool(o.model.resolved_threads());
  model::Graph graph(*model, pool, model::GraphOptions{std::max<int64_t>(o.rows, 16), 16});

  std::unique_ptr<model::Model> draft;
  std::string draft_hash;
  if (!o.draft_model.empty()) {
    draft = model::Model::load(o.draft_model, o.model.load_mode());
    speculative::check_same_vocabulary(*model, *draft);
    draft_hash = speculative::file_fingerprint(o.draft_model);
  }
  const std::string cache_path = speculative::calibration_file_path();
  auto cal = speculative::cached_calibration(o.model.model_path, pool.size());
  // Up to the widest forward the scheduler runs, as serve does.
  speculative::CalibrateOptions co;
  co.max_rows = static_cast<int>(std::min<int64_t>(o.rows, co.max_rows));
  const bool narrow =
      cal && static_cast<int>(cal->verify.size()) - 1 < speculative::calibrated_rows(*model, co);
  if (!cal || narrow || (draft && !cal->draft_per_token.count(draft_hash))) {
    std::fprintf(stderr, "calibrating verify costs on this machine (cached in %s)...\n", cache_path.c_str());
    co.repeats = 3;
    cal = speculative::calibrate(*model, o.model.model_path, draft.get(), o.draft_model, pool, co);
    speculative::store_calibration(cache_path, *cal);
  }
  const speculative::CostModel costs = cal->cost_model(draft_hash);
  std::unique_ptr<speculative::DraftModelBatch> batch;
  if (draft) batch = std::make_unique<speculative::DraftModelBatch>(*draft, pool, max_streams, o.rows);
  const model::SessionOptions dso{model::default_context(*model, o.model.n_ctx), o.model.resolved_kv_type(),
                                  16};

  nlohmann::json rows = nlohmann::json::array();
  std::printf("%7s %5s %10s %10s %9s %9s %7s %9s %10s %8s %8s\n", "streams", "mode", "agg tok/s",
              "strm tok/s", "ttft p50", "ttft p99", "accept", "tok/fwd", "tok/cpu-s", "speed-up", "by cpu");
  for (int n : o.streams) {
    std::vector<RunResult> plain, spec;
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < n; ++i)
      prompts.push_back(make_prompt(i, o.prompt_tokens, o.seed * 131 + static_cast<uint64_t>(n), n_vocab));
    // The first plain run's greedy outputs are the replay drafter's references and every run's expected
    // output; after it the order alternates, so drift in the machine's load falls on both modes alike.
    std::map<std::vector<int32_t>, std::vector<int32_t>> references;
    uint64_t drafters = 0;  // each replay drafter corrupts with its own draws
    engine::DraftFactory drafts;
    if (o.draft == "replay")
      drafts = [&] {
        return std::make_unique<ReplayByPrompt>(references, o.accept, n_vocab, o.seed * 7919 + drafters++);
      };
    else if (o.draft == "ngram")
      drafts = [] { return std::make_unique<speculative::NgramSource>(); };
    else
      drafts = [&] {
        return std::make_unique<speculative::DraftModelSource>(*draft, *model, pool, dso, batch.get());
      };
    auto run_plain = [&] {
      plain.push_back(run_once(graph, *model, o, n, prompts, 0, costs, {}));
      if (references.empty())
        for (int i = 0; i < n; ++i) {
          std::vector<int32_t> full = prompts[static_cast<size_t>(i)];
          const auto& out = plain.back().outputs[static_cast<size_t>(i)];
          full.insert(full.end(), out.begin(), out.end());
          references.emplace(prompts[static_cast<size_t>(i)], std::move(full));
        }
      else
        expect_same(plain.back(), plain.front(), "plain");
    };
    auto run_spec = [&] {
      spec.push_back(run_once(graph, *model, o, n, prompts, o.max_draft, costs, drafts));
      expect_same(spec.back(), plain.front(), "speculative");
    };
    for (int rep = 0; rep < o.repeats; ++rep) {
      if (rep % 2 == 0) {
        run_plain();
        run_spec();
      } else {
        run_spec();
        run_plain();
      }
    }
    auto median = [](std::vector<RunResult>& v) {
      std::sort(v.begin(), v.end(),
                [](const RunResult& a, const RunResult& b) { return a.aggregate_tps < b.aggregate_tps; });
      return v[v.size() / 2];
    };
    std::vector<double> ratios, cpu_ratios;
    for (size_t i = 0; i < plain.size(); ++i) {
      ratios.push_back(spec[i].aggregate_tps / plain[i].aggregate_tps);
      cpu_ratios.push_back(spec[i].cpu_tps / plain[i].cpu_tps);
    }
    const double ratio = percentile(ratios, 0.5), cpu_ratio = percentile(cpu_ratios, 0.5);
    const RunResult p = median(plain), s = median(spec);
    auto line = [&](const char* mode, const RunResult& r, bool speedups) {
      std::printf("%7d %5s %10.2f %10.2f %8.3fs %8.3fs %7.3f %9.2f %10.2f", n, mode, r.aggregate_tps,
                  r.stream_tps, r.ttft_p50, r.ttft_p99, r.acceptance, r.tokens_per_forward, r.cpu_tps);
      if (speedups)
        std::printf(" %7.3fx %7.3fx\n", ratio, cpu_ratio);
      else
        std::printf("\n");
    };
    line("plain", p, false);
    line("spec", s, true);
    std::fflush(stdout);
    rows.push_back({{"streams", n},
                    {"plain", to_json(p)},
                    {"spec", to_json(s)},
                    {"speedup_median", ratio},
                    {"speedups", ratios},
                    {"cpu_speedup_median", cpu_ratio},
                    {"cpu_speedups", cpu_ratios}});
  }
  if (o.json) {
    nlohmann::json j = {{"model", o.model.model_path},
                        {"draft", o.draft.empty() ? "model" : o.draft},
                        {"accept", o.draft == "replay" ? nlohmann::json(o.accept) : nlohmann::json(nullptr)},
                        {"threads", pool.size()},
                        {"prompt_tokens", o.prompt_tokens},
                        {"max_tokens", o.max_tokens},
                        {"max_draft", o.max_draft},
                        {"repeats", o.repeats},
                        {"results", rows}};
    std::printf("%s\n", j.dump().c_str());
  }
}

}  // namespace

void add_bench_serve_command(CLI::App& app) {
  auto o = std::make_shared<BenchServeOptions>();
  auto* cmd = app.add_subcommand(
      "bench-serve",
      "Plain and speculative serving of the same greedy workload at 1, 2, 4 and 8 concurrent streams: "
      "aggregate and per-stream tok/s, time to first token, acceptance, tokens per target forward");
  add_model_options(*cmd, o->model);
  cmd->add_option("--draft", o->draft, "Drafter: replay (fixed acceptance, see --accept) or ngram");
  cmd->add_option("--draft-model", o->draft_model, "Draft model (same vocabulary as the target)");
  cmd->add_option("--accept", o->accept, "Acceptance of --draft replay (default 0.8)")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--streams", o->streams, "Concurrent stream counts, comma separated (default 1,2,4,8)")
      ->delimiter(',')
      ->check(CLI::Range(1, 64));
  cmd->add_option("--prompt-tokens", o->prompt_tokens, "Prompt tokens per stream (default 32)")
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--max-tokens", o->max_tokens, "Tokens generated per stream (default 64)")
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--max-draft", o->max_draft, "Deepest drafted window per sequence (default 6)")
      ->check(CLI::Range(1, 15));
  cmd->add_option("--repeats", o->repeats, "Runs of each mode per stream count, alternated (default 3)")
      ->check(CLI::Range(1, 100));
  cmd->add_option("--rows", o->rows, "Rows per forward (default 64)")->check(CLI::Range(1, 4096));
  cmd->add_option("--seed", o->seed, "Seed of the prompts and of replay's corruptions (default 0)");
  cmd->add_flag("--json", o->json, "End stdout with one JSON object of the results");
  cmd->callback([o] {
    if (o->rows < *std::max_element(o->streams.begin(), o->streams.end()))
      throw Error("--rows must be at least the largest --streams (one decode row per stream)");
    bench_serve(*o);
  });
}

}  // namespace tandem::cli
