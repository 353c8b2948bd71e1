// tandem bench: decode, prefill and verify-window speed of a model on this machine, against the memory
// bandwidth measured in the same run with the same threads.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tandem/cli/commands.h"
#include "tandem/cli/common.h"
#include "tandem/kernels/cpu_target.h"
#include "tandem/kernels/peak.h"
#include "tandem/kernels/prefetch_tuner.h"
#include "tandem/kernels/stream.h"
#include "tandem/model/expert_residency.h"
#include "tandem/model/moe.h"
#include "tandem/model/session.h"
#include "tandem/speculative/calibration.h"
#include "tandem/util/error.h"

namespace tandem::cli {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Peak resident set size in MiB (VmHWM, reported in KiB), 0 when unknown. The JSON key keeps the name
// peak_rss_mb.
double peak_rss_mb() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return 0;
}

void progress(const char* what) {
  std::fprintf(stderr, "\rbench: %-48s", what), std::fflush(stderr);
}

// Token ids that exist in every vocabulary: cycle through the first ids past the specials.
std::vector<int32_t> tokens(int64_t n, int64_t n_vocab, int64_t salt) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    t[static_cast<size_t>(i)] = static_cast<int32_t>(3 + (i * 7 + salt) % (n_vocab - 3));
  return t;
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "bench",
      "Measure memory read bandwidth, decode tok/s and its roofline fraction (against the best probe pass, "
      "and against the probe passes beside rounds of decode steps), prefill tok/s (64 and 512 tokens), the "
      "verify cost curve cost(n)/cost(1) with its floor from the measured int8 multiply-add peak, where "
      "decode steps and verify windows spend their time (matrix products, attention, the rest), and peak "
      "RSS. -c sets the context decode and verify run at (default 256).");
  struct Opts {
    ModelOptions model;
    bool json = false;
    int decode_tokens = 64;
    int reps = 5;
    std::string expert_budget;
  };
  auto o = std::make_shared<Opts>();
  add_model_options(*cmd, o->model);
  cmd->add_flag("--json", o->json, "Print one JSON object as the last line of stdout");
  cmd->add_option("--decode-tokens", o->decode_tokens,
                  "Decode steps to time (default 64; decode tok/s is their count over their total time)");
  cmd->add_option("--reps", o->reps, "Repetitions of each verify width and prefill (default 5)");
  add_expert_budget_option(*cmd, o->expert_budget);
  cmd->callback([o] {
    if (o->decode_tokens < 1 || o->reps < 1) throw Error("--decode-tokens and --reps must be positive");
    const int64_t ctx = o->model.n_ctx > 0 ? o->model.n_ctx : 256;
    progress("loading");
    auto model = model::Model::load(o->model.model_path, o->model.load_mode());
    const auto& c = model->config();
    const int threads = o->model.resolved_threads();
    ThreadPool pool(threads);
    model::SessionOptions so;
    so.n_ctx = std::max<int64_t>(ctx + o->decode_tokens + 16, 512);
    so.kv_type = o->model.resolved_kv_type();
    so.batch = 512;
    // Decode and prefill as plain generation runs them: never rolled back (the steps return to the context's
    // end, a recurrent state's snapshot). Verify windows are timed as speculation runs them, with rollback;
    // only a recurrent state needs a sequence of its own for that.
    so.rollback = false;
    model::Session session(*model, pool, so);
    const std::unique_ptr<model::ExpertResidency> residency = make_expert_residency(o->expert_budget, *model);
    session.forward().set_expert_residency(residency.get());
    std::optional<model::Session> windows_session;
    if (c.kv_geometry().has_recurrent()) {
      model::SessionOptions wo = so;
      wo.rollback = true;
      windows_session.emplace(*model, pool, wo);
      windows_session->forward().set_expert_residency(residency.get());
    }
    model::Session& windows = windows_session ? *windows_session : session;

    // Bandwidth: stream the mapped weights themselves when they are much larger than any cache (they are
    // resident anyway, so the peak RSS does not grow); otherwise a temporary buffer.
    progress("memory bandwidth");
    const auto& tensors = model->file().tensors();
    const uint8_t* lo = nullptr;
    const uint8_t* hi = nullptr;
    for (const auto& t : tensors) {
      if (!lo || t.data < lo) lo = t.data;
      if (!hi || t.data + t.bytes > hi) hi = t.data + t.bytes;
    }
    const size_t file_span = lo ? static_cast<size_t>(hi - lo) & ~size_t{63} : 0;
    // Measured before and again right after decode (best of both): the machine is shared, and a pass slowed
    // by a neighbour must not make the roofline fraction look better than it is.
    std::vector<uint8_t> small_model_buf;
    if (file_span < (size_t{256} << 20)) small_model_buf.assign(size_t{512} << 20, 1);
    // Every pass's rate is kept: their spread shows how much the machine's bandwidth moved during the run.
    std::vector<double> bandwidth_passes;
    auto probe = [&](int passes, std::vector<double>* rates) {
      return file_span >= (size_t{256} << 20)
                 ? kernels::measure_read_bandwidth(lo, file_span, pool, passes, rates)
                 : kernels::measure_read_bandwidth(small_model_buf.data(), small_model_buf.size(), pool,
                                                   passes, rates);
    };
    auto measure_bandwidth = [&] { return probe(5, &bandwidth_passes); };
    double bandwidth = measure_bandwidth();
    // The compute bound of windows: the kernels' multiply-add instructions at full rate on every thread.
    progress("int8 multiply-add peak");
    const kernels::Target target_used = kernels::best_target();
    const double dot_peak = kernels::measure_dot_peak(pool, target_used, 5);
    const double macs_per_token = static_cast<double>(model->quantized_macs_per_token());

    // Warm-up and context: fill `ctx` positions.
    progress("warm-up and context fill");
    session.eval(tokens(ctx, c.n_vocab, 0));
    const int64_t base = session.length();

    progress("decode");
    std::vector<double> steps;
    session.eval(tokens(1, c.n_vocab, 1));  // warm the 1-row path
    session.truncate(base);
    // How many timed steps the decode kernels' prefetch tuner ran with the far reach
    // (kernels/prefetch_tuner.h).
    const kernels::PrefetchTuner& tuner = session.forward().reach_tuner();
    const int64_t far_before = tuner.forwards(kernels::PrefetchReach::kFar);
    const model::ResidencyStats residency_before = residency ? residency->stats() : model::ResidencyStats{};
    for (int i = 0; i < o->decode_tokens; ++i) {
      const auto t = tokens(1, c.n_vocab, 100 + i);
      const auto t0 = Clock::now();
      session.eval(t);
      steps.push_back(seconds_since(t0));
    }
    const int64_t far_steps = tuner.forwards(kernels::PrefetchReach::kFar) - far_before;
    // The decode steps' expert reads (the context fill before them trained the residency).
    model::ResidencyStats residency_decode = residency ? residency->stats() : model::ResidencyStats{};
    residency_decode.bytes_read -= residency_before.bytes_read;
    residency_decode.resident_bytes_read -= residency_before.resident_bytes_read;
    residency_decode.reads -= residency_before.reads;
    residency_decode.resident_reads -= residency_before.resident_reads;
    session.truncate(base);
    bandwidth = std::max(bandwidth, measure_bandwidth());
    // Steps over their total time, as a user's generation sees them: a median would hide the machine's
    // periodic stalls (see gguf/mapped_file.h), which a whole generation pays.
    double decode_total = 0.0;
    for (double s : steps) decode_total += s;
    const double decode_tps = static_cast<double>(steps.size()) / decode_total;
    const double decode_median_tps = 1.0 / median(steps);
    // The cache's own encoded bytes (a latent cache's are the latent's, not the expanded keys and values).
    const double kv_token_bytes = static_cast<double>(session.cache().bytes_per_token());
    const double kv_bytes = kv_token_bytes * static_cast<double>(ctx);
    // A recurrent layer reads its state and writes the next one every token.
    const auto state_bytes = static_cast<double>(cache::recurrent_state_bytes(c.kv_geometry()));
    const double bytes_per_token =
        static_cast<double>(model->weight_bytes_per_token()) + kv_bytes + 2 * state_bytes;
    const double roofline = decode_tps * bytes_per_token / (bandwidth * 1e9);

    // Decode beside the bandwidth: where the machine's memory moves between states within seconds, the
    // probe's best pass and the timed steps may come from different states. Rounds of a few decode steps
    // each between two probe passes: each round's bytes per second over the mean of the passes around it,
    // and the median over the rounds (how fast decode streams against what a read loop gets right then).
    progress("decode beside the bandwidth");
    std::vector<double> beside, beside_passes;
    model::PhaseTimes decode_parts;
    session.forward().set_phase_times(&decode_parts);
    {
      constexpr int kRounds = 9, kStepsPerRound = 6;
      double before = probe(1, &beside_passes);
      for (int r = 0; r < kRounds; ++r) {
        double round_s = 0;
        for (int i = 0; i < kStepsPerRound; ++i) {
          const auto t = tokens(1, c.n_vocab, 300 + kStepsPerRound * r + i);
          const auto t0 = Clock::now();
          session.eval(t);
          round_s += seconds_since(t0);
        }
        session.truncate(base);
        const double after = probe(1, &beside_passes);
        const double rate = kStepsPerRound * bytes_per_token / round_s / 1e9;
        beside.push_back(rate / (0.5 * (before + after)));
        before = after;
      }
    }
    session.forward().set_phase_times(nullptr);
    const double decode_beside = median(beside);

    progress("verify windows");
    if (windows_session) {
      windows.eval(tokens(ctx, c.n_vocab, 0));
      windows.eval(tokens(1, c.n_vocab, 1));  // as the decode session: the state at `base` is a snapshot
      windows.truncate(base);
    }
    // Each width timed right after a one-row forward, the median of the paired ratios (as calibrate does):
    // widths timed one after another drifted with the machine's speed against the one-row time.
    const int widths[] = {1, 2, 3, 4, 5, 6, 8, 12, 16};
    // Where each width's forwards spend their time (timed forwards only, not the warm-up).
    std::array<model::PhaseTimes, std::size(widths)> width_parts{};
    bool time_parts = false;
    const auto run_rows = [&](int n) {
      const auto at = static_cast<size_t>(std::find(std::begin(widths), std::end(widths), n) - widths);
      if (time_parts) windows.forward().set_phase_times(&width_parts[at]);
      windows.eval(tokens(n, c.n_vocab, 7 * n), /*all_logits=*/true);
      windows.forward().set_phase_times(nullptr);
      windows.truncate(base);
    };
    for (int n : widths) run_rows(n);  // warm every width
    time_parts = true;
    std::vector<double> one_row;
    const std::vector<double> costs = speculative::paired_window_costs(
        run_rows, std::span<const int>(widths).subspan(1), o->reps, &one_row);
    const double one_row_s = median(one_row);

    auto prefill = [&](int64_t n) {
      std::vector<double> t;
      const auto ids = tokens(n, c.n_vocab, 11);
      const int reps = n > 128 ? std::max(1, o->reps / 2) : o->reps;
      for (int r = 0; r < reps; ++r) {
        session.truncate(0);
        const auto t0 = Clock::now();
        session.eval(ids);
        t.push_back(seconds_since(t0));
      }
      session.truncate(0);
      return static_cast<double>(n) / median(t);
    };
    progress("prefill 64");
    const double p64 = prefill(64);
    progress("prefill 512");
    const double p512 = prefill(512);
    const double rss = peak_rss_mb();
    std::fprintf(stderr, "\r%-56s\r", "");

    const std::string target(kernels::target_name(target_used));
    std::printf("model            %s\n", o->model.model_path.c_str());
    std::printf("threads          %d  (kernels: %s)\n", threads, target.c_str());
    std::printf("bandwidth        %.2f GB/s  (best of %zu passes; median %.2f, slowest %.2f)\n", bandwidth,
                bandwidth_passes.size(), median(bandwidth_passes),
                *std::min_element(bandwidth_passes.begin(), bandwidth_passes.end()));
    std::printf("weights          %s\n",
                model->file().copied() ? "copied into memory" : "mapped from the file");
    std::printf(
        "decode           %.2f tok/s at context %lld  (median step %.2f tok/s; %.1f MB read per token; "
        "%lld of %zu steps prefetching far)\n",
        decode_tps, static_cast<long long>(ctx), decode_median_tps, bytes_per_token / 1e6,
        static_cast<long long>(far_steps), steps.size());
    if (state_bytes > 0)
      std::printf(
          "recurrent state  %.1f KiB per state, %.2f MiB per sequence without rollback (plain decoding), "
          "%.2f MiB with rollback depth %lld (speculation: %lld states, the one before a verify window of up "
          "to %lld rows and one per row)\n",
          state_bytes / 1024.0, static_cast<double>(session.cache().recurrent()->bytes()) / 1048576.0,
          static_cast<double>(windows.cache().recurrent()->bytes()) / 1048576.0,
          static_cast<long long>(windows.cache().recurrent()->depth()),
          static_cast<long long>(cache::RecurrentState::slots(windows.cache().recurrent()->depth())),
          static_cast<long long>(cache::RecurrentState::window_rows(windows.cache().recurrent()->depth())));
    std::printf("kv cache         %.0f bytes per token (%s)", kv_token_bytes,
                std::string(cache::kv_type_name(so.kv_type)).c_str());
    if (c.mla.kv_lora_rank > 0)
      std::printf("; latent: expanded f16 keys and values would take %zu (1/%.1f)",
                  c.expanded_kv_bytes_per_token(),
                  static_cast<double>(c.expanded_kv_bytes_per_token()) / kv_token_bytes);
    std::printf("\n");
    const model::ExpertBytes experts = model::expert_bytes(*model);
    if (experts.moe_layers > 0)
      std::printf(
          "experts          top %lld of %lld: %.1f MB of routed experts read per token of %.1f MB (shared "
          "experts and routers %.1f MB)\n",
          static_cast<long long>(c.moe.n_expert_used), static_cast<long long>(c.moe.n_expert),
          static_cast<double>(experts.routed_chosen) / 1e6, static_cast<double>(experts.routed_all) / 1e6,
          static_cast<double>(experts.shared) / 1e6);
    if (residency)
      std::printf("expert budget    %s\n", expert_residency_summary(residency_decode, "decode").c_str());
    std::printf(
        "roofline         %.3f  (against the passes beside each round of steps: median %.3f, %.3f-%.3f)\n",
        roofline, decode_beside, *std::min_element(beside.begin(), beside.end()),
        *std::max_element(beside.begin(), beside.end()));
    // A model with float weights only has no int8 multiply-adds to bound: no floor then (not a floor of 0).
    const bool has_floor = macs_per_token > 0;
    if (has_floor) {
      std::printf(
          "int8 peak        %.1f GMAC/s  (%.3g G multiply-adds per token: at least %.2f ms per row)\n",
          dot_peak, macs_per_token / 1e9, 1e3 * macs_per_token / (dot_peak * 1e9));
    } else {
      std::printf(
          "int8 peak        %.1f GMAC/s  (float weights: no int8 matrix products, so no verify floor)\n",
          dot_peak);
    }
    std::printf("prefill          %.1f tok/s (64)  %.1f tok/s (512)\n", p64, p512);
    std::printf("verify cost      ");
    nlohmann::json verify = nlohmann::json::object();
    for (size_t i = 0; i < std::size(widths); ++i) {
      const double cost = i == 0 ? 1.0 : costs[i - 1];
      std::printf("%d:%.2f ", widths[i], cost);
      verify[std::to_string(widths[i])] = cost;
    }
    // The least cost(n) the peak allows at the measured one-row time: n rows' multiply-adds at full rate.
    nlohmann::json floor = has_floor ? nlohmann::json::object() : nlohmann::json();
    if (has_floor) {
      std::printf("\nverify floor     ");
      for (int n : widths) {
        const double f = static_cast<double>(n) * macs_per_token / (dot_peak * 1e9) / one_row_s;
        std::printf("%d:%.2f ", n, f);
        floor[std::to_string(n)] = f;
      }
    }
    // Milliseconds per forward in the matrix products, attention and the rest.
    const auto parts_ms = [](const model::PhaseTimes& t) {
      const double n = static_cast<double>(std::max<int64_t>(1, t.forwards));
      return std::array<double, 3>{1e3 * t.matmul_s / n, 1e3 * t.attention_s / n,
                                   1e3 * (t.total_s - t.matmul_s - t.attention_s) / n};
    };
    const auto decode_ms = parts_ms(decode_parts);
    const double decode_forward_ms = decode_ms[0] + decode_ms[1] + decode_ms[2];
    std::printf("\ndecode parts     matrix products %.3f, attention %.3f, the rest %.3f of a step\n",
                decode_ms[0] / decode_forward_ms, decode_ms[1] / decode_forward_ms,
                decode_ms[2] / decode_forward_ms);
    std::printf("verify parts ms  ");
    nlohmann::json verify_parts = nlohmann::json::object();
    for (size_t i = 0; i < std::size(widths); ++i) {
      const auto ms = parts_ms(width_parts[i]);
      std::printf("%d:%.1f/%.1f/%.1f ", widths[i], ms[0], ms[1], ms[2]);
      verify_parts[std::to_string(widths[i])] = {{"matmul", ms[0]}, {"attention", ms[1]}, {"other", ms[2]}};
    }
    std::printf(" (matrix products/attention/rest)\npeak RSS         %.1f MiB\n", rss);
    if (o->json) {
      nlohmann::json j;
      j["model"] = o->model.model_path;
      j["threads"] = threads;
      j["kernels"] = target;
      j["context"] = ctx;
      j["bandwidth_gbs"] = bandwidth;
      j["bandwidth_passes_gbs"] = bandwidth_passes;
      j["decode_tps"] = decode_tps;
      j["decode_median_tps"] = decode_median_tps;
      j["decode_far_prefetch_steps"] = far_steps;
      j["weights"] = model->file().copied() ? "copied" : "mapped";
      j["roofline_fraction"] = roofline;
      j["roofline_beside"] = decode_beside;
      j["roofline_beside_rounds"] = beside;
      j["roofline_beside_passes_gbs"] = beside_passes;
      j["bytes_per_token"] = bytes_per_token;
      j["kv_bytes_per_token"] = kv_token_bytes;
      if (c.mla.kv_lora_rank > 0) j["kv_expanded_f16_bytes_per_token"] = c.expanded_kv_bytes_per_token();
      if (experts.moe_layers > 0) {
        j["expert_bytes_read_per_token"] = experts.routed_chosen;
        j["expert_bytes_all"] = experts.routed_all;
        if (residency) {
          j["expert_budget_bytes"] = residency_decode.budget_bytes;
          j["expert_resident_bytes"] = residency_decode.resident_bytes;
          j["expert_reads_served_resident"] = residency_decode.served_resident();
        }
      }
      if (state_bytes > 0) {
        j["recurrent_state_bytes_per_sequence"] = static_cast<double>(session.cache().recurrent()->bytes());
        j["recurrent_state_bytes_per_sequence_rollback"] =
            static_cast<double>(windows.cache().recurrent()->bytes());
      }
      j["prefill64_tps"] = p64;
      j["prefill512_tps"] = p512;
      j["verify_cost"] = verify;
      j["dot_peak_gmacs"] = dot_peak;
      j["macs_per_token"] = macs_per_token;
      j["verify_cost_floor"] = floor;
      j["decode_parts"] = {{"matmul", decode_ms[0] / decode_forward_ms},
                           {"attention", decode_ms[1] / decode_forward_ms},
                           {"other", decode_ms[2] / decode_forward_ms}};
      j["verify_parts_ms"] = verify_parts;
      j["peak_rss_mb"] = rss;
      std::printf("%s\n", j.dump().c_str());
    }
  });
}

}  // namespace tandem::cli
