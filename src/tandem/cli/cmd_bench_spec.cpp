// tandem bench-spec: plain and speculative decoding of the same prompts in one run, interleaved prompt by
// prompt, with the speed of each, their ratio, the acceptance (in all and by draft position), and the gate's
// depth histogram.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tandem/cli/commands.h"
#include "tandem/cli/common.h"
#include "tandem/cli/spec_common.h"
#include "tandem/engine/generate.h"
#include "tandem/sampling/rng.h"
#include "tandem/speculative/calibration.h"
#include "tandem/speculative/replay.h"
#include "tandem/tokenizer/tokenizer.h"
#include "tandem/util/error.h"

namespace tandem::cli {
namespace {

const char* const kDefaultPrompts[] = {
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.",
    "Tom and his dog went to the beach. They saw a big red boat and",
    "The sun was shining and the birds were singing. Mia wanted to",
    "One day, a little bird found a shiny stone in the garden. The bird",
};

// One prompt per line: a JSON object with "prompt_ids" (or "prompt", text), else the line itself as text.
std::vector<std::vector<int32_t>> read_prompts(const std::string& path, const tokenizer::Tokenizer* tok,
                                               int64_t n_vocab) {
  std::vector<std::string> texts;
  std::vector<std::vector<int32_t>> prompts;
  if (path.empty()) {
    texts.assign(std::begin(kDefaultPrompts), std::end(kDefaultPrompts));
  } else {
    std::istringstream in(read_text_file(path));
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      if (line.front() == '{') {
        const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
        if (j.is_object() && j.contains("prompt_ids")) {
          prompts.push_back(j["prompt_ids"].get<std::vector<int32_t>>());
          continue;
        }
        if (j.is_object() && j.contains("prompt")) {
          texts.push_back(j["prompt"].get<std::string>());
          continue;
        }
      }
      texts.push_back(line);
    }
  }
  for (const auto& text : texts) {
    if (tok) {
      prompts.push_back(tok->encode(text, true, false));
    } else {
      // No usable tokenizer in the file (random-weight benchmark models): fixed pseudo-random ids instead.
      std::vector<int32_t> ids;
      for (size_t i = 0; i < 16; ++i)
        ids.push_back(static_cast<int32_t>(sampling::mix64(prompts.size() * 1000 + i) %
                                           static_cast<uint64_t>(n_vocab)));
      prompts.push_back(std::move(ids));
    }
  }
  for (const auto& p : prompts) {
    if (p.empty()) throw Error("an empty prompt in " + (path.empty() ? std::string("the defaults") : path));
    for (int32_t id : p)
      if (id < 0 || id >= n_vocab)
        throw Error("prompt token id " + std::to_string(id) + " is outside the vocabulary");
  }
  if (prompts.empty()) throw Error("no prompts in " + path);
  return prompts;
}

}  // namespace

void add_bench_spec_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "bench-spec",
      "Compare plain and speculative decoding of the same prompts: tok/s of each, speed-up "
      "(and the ideal one for the acceptance), acceptance in all and by draft position, and the gate's depth "
      "histogram");
  struct Opts {
    ModelOptions model;
    SpecFlags spec;
    std::string prompts;
    int64_t n_tokens = 64;
    bool json = false;
    sampling::Params sampling;
    std::string cost_model;  // --cost-model: a calibrated model file whose verify costs price the windows too
    int cost_threads = 0;    // --cost-threads: the threads of its calibration entry (0: -t)
    std::string expert_budget;
  };
  auto o = std::make_shared<Opts>();
  o->sampling.temperature = 0.0f;
  add_model_options(*cmd, o->model);
  add_spec_options(*cmd, o->spec, /*with_replay=*/true);
  cmd->add_option("--prompts", o->prompts, "Prompts, one per line: text, or JSON with prompt_ids or prompt");
  cmd->add_option("-n,--n-predict", o->n_tokens, "Tokens generated per prompt (default 64)");
  cmd->add_flag("--json", o->json, "End stdout with one JSON object of the results");
  cmd->add_option(
      "--cost-model", o->cost_model,
      "Also price the verify windows at the costs `tandem calibrate` stored for this model file "
      "(this machine): the expected speed-up for a larger target drafted alike; the gate and tree "
      "budgets plan with them too");
  cmd->add_option("--cost-threads", o->cost_threads,
                  "Threads of the --cost-model calibration to use (default: -t)");
  add_expert_budget_option(*cmd, o->expert_budget);
  cmd->add_option("--temp", o->sampling.temperature, "Temperature (default 0: greedy)");
  cmd->add_option("--top-k", o->sampling.top_k, "Top-k (default 40; <= 0 disables)");
  cmd->add_option("--top-p", o->sampling.top_p, "Top-p (default 0.95; 1 disables)");
  cmd->add_option("--min-p", o->sampling.min_p, "Min-p (default 0.05; 0 disables)");
  cmd->add_option("--seed", o->sampling.seed,
                  "Sampling seed, and the seed of --draft replay's corruptions (default 0)");
  cmd->callback([o] {
    if (!o->spec.enabled())
      throw Error("bench-spec needs a drafter: --draft-model FILE, --draft ngram or --draft replay");
    if (o->n_tokens < 1) throw Error("-n must be at least 1");
    sampling::validate(o->sampling);
    auto target = model::Model::load(o->model.model_path, o->model.load_mode());
    const std::unique_ptr<model::ExpertResidency> residency =
        make_expert_residency(o->expert_budget, *target);
    std::unique_ptr<tokenizer::Tokenizer> tok;
    try {
      tok = tokenizer::Tokenizer::from_gguf(target->file());
    } catch (const Error&) {
    }
    const auto prompts = read_prompts(o->prompts, tok.get(), target->config().n_vocab);
    ThreadPool pool(o->model.resolved_threads());
    model::SessionOptions so;
    so.n_ctx = o->model.n_ctx;
    so.kv_type = o->model.resolved_kv_type();
    so.batch = o->model.batch;
    const int verify_rows = 1 + (o->spec.tree_nodes > 0 ? o->spec.tree_nodes : o->spec.draft_max);
    so.verify_rows = verify_rows;
    std::optional<speculative::Calibration> priced;
    if (!o->cost_model.empty()) {
      const int threads = o->cost_threads > 0 ? o->cost_threads : pool.size();
      priced = speculative::cached_calibration(o->cost_model, threads);
      if (!priced || static_cast<int>(priced->verify.size()) <= verify_rows)
        throw Error("--cost-model: " + speculative::calibration_file_path() + " holds no costs of " +
                    o->cost_model + " with " + std::to_string(threads) + " threads up to " +
                    std::to_string(verify_rows) + " rows on this machine; run `tandem calibrate -m " +
                    o->cost_model + " -t " + std::to_string(threads) + " --max-rows " +
                    std::to_string(verify_rows) + "` first");
    }
    SpecSetup setup = make_spec_setup(o->spec, *target, o->model, pool, so, /*calibrate_if_missing=*/true);
    // The larger target's costs decide what a round drafts, as they would if it were generating.
    const speculative::CostModel own_costs = setup.options.costs;
    if (priced) setup.options.costs = priced->cost_model();
    auto* replay = dynamic_cast<speculative::ReplaySource*>(setup.source.get());
    if (replay) replay->set_seed(o->sampling.seed);
    setup.options.generate.max_tokens = o->n_tokens;
    setup.options.generate.sampling = o->sampling;
    const engine::EogFn is_eog = [&](int32_t t) { return tok && tok->is_eog(t); };

    model::Session session(*target, pool, so);
    session.forward().set_expert_residency(residency.get());
    // Plain decoding as `run` does it without a drafter: a recurrent state set up without rollback skips the
    // work that keeps rollbacks within reach, so the baseline gets a sequence of its own.
    std::optional<model::Session> plain_session;
    if (target->config().kv_geometry().has_recurrent()) {
      model::SessionOptions po = so;
      po.rollback = false;
      plain_session.emplace(*target, pool, po);
      plain_session->forward().set_expert_residency(residency.get());
    }
    model::Session& plain = plain_session ? *plain_session : session;
    {  // warm up: page the weights in and wake the thread team
      const std::vector<int32_t> warm(prompts[0].begin(), prompts[0].end());
      session.eval(warm);
      session.truncate(0);
    }
    engine::GenerateStats plain_total;
    engine::SpecStats spec_total;
    int64_t mismatches = 0;
    for (const auto& prompt : prompts) {
      std::vector<int32_t> plain_out, spec_out;
      plain.truncate(0);
      const auto ps = engine::generate(
          plain, prompt, setup.options.generate, [&](int32_t t) { return plain_out.push_back(t), true; },
          is_eog);
      plain_total.generated += ps.generated;
      plain_total.generate_seconds += ps.generate_seconds;
      if (replay) {
        std::vector<int32_t> reference(prompt.begin(), prompt.end());
        reference.insert(reference.end(), plain_out.begin(), plain_out.end());
        replay->set_reference(std::move(reference));
      }
      session.truncate(0);
      spec_total.add(engine::generate_speculative(
          session, *setup.source, prompt, setup.options,
          [&](int32_t t) { return spec_out.push_back(t), true; }, is_eog));
      if (o->sampling.temperature <= 0.0f && spec_out != plain_out) ++mismatches;
    }
    const double plain_tps = plain_total.generated / std::max(1e-9, plain_total.generate_seconds);
    const double spec_tps = spec_total.tokens_per_second();
    // The ideal: expected tokens per round over the calibrated round cost, at the depth that maximises it
    // (the gate's choice; depth draft_max with --no-gate).
    const int d_max = o->spec.draft_max;
    const double alpha = replay ? o->spec.accept : spec_total.acceptance();
    const auto ideal_at = [&](int depth) {
      const double expected = alpha >= 1.0 ? depth + 1.0 : (1.0 - std::pow(alpha, depth + 1)) / (1.0 - alpha);
      return expected / setup.options.costs.round_cost(depth);
    };
    int d = d_max;
    if (setup.options.use_gate)
      for (int depth = 1; depth < d_max; ++depth)
        if (ideal_at(depth) > ideal_at(d)) d = depth;
    const double ideal = ideal_at(d);

    std::printf(
        "prompts %zu, %lld tokens each, %d threads, drafter %s, draft max %d, gate %s, tree nodes %d\n",
        prompts.size(), static_cast<long long>(o->n_tokens), pool.size(),
        std::string(setup.source->kind()).c_str(), d_max, setup.options.use_gate ? "on" : "off",
        o->spec.tree_nodes);
    std::printf("plain:       %lld tokens in %.3f s, %.2f tok/s\n",
                static_cast<long long>(plain_total.generated), plain_total.generate_seconds, plain_tps);
    std::printf("speculative: %lld tokens in %.3f s, %.2f tok/s\n",
                static_cast<long long>(spec_total.generated), spec_total.generate_seconds, spec_tps);
    std::printf("speed-up %.3fx; ideal for acceptance %.2f at depth %d (%s) with round cost %.3f: %.3fx\n",
                spec_tps / plain_tps, alpha, d,
                setup.options.use_gate ? "the best for the calibrated costs" : "fixed by --no-gate",
                setup.options.costs.round_cost(d), ideal);
    print_spec_report(stdout, spec_total);
    // As `tandem info DRAFTER.gguf` prints the held-out curve from training: entry k is the fraction of the
    // verify rounds that drafted k or more tokens in which the first k were all accepted.
    const std::vector<double> by_position = spec_total.acceptance_by_position();
    std::printf("acceptance by draft position (first k drafts all accepted):");
    if (by_position.empty()) std::printf(" none drafted");
    for (double a : by_position) std::printf(" %.3f", a);
    std::printf("\n");
    // The expected speed-up over plain decoding on a cost curve: the tokens generated over the summed cost of
    // the forwards that generated them (a plain step costs 1; a window of k rows, tree or chain, cost(k)).
    const auto expected_at = [&](const speculative::CostModel& costs) {
      double cost = 0.0;
      for (size_t k = 1; k < spec_total.rows_histogram.size(); ++k)
        cost += static_cast<double>(spec_total.rows_histogram[k]) * costs.verify_cost(static_cast<int>(k));
      return cost > 0.0 ? static_cast<double>(spec_total.generated) / cost : 0.0;
    };
    const auto print_curve = [&](const char* label, const speculative::CostModel& costs) {
      std::printf("%s", label);
      for (int k = 1; k <= verify_rows; ++k) std::printf(" %d:%.3f", k, costs.verify_cost(k));
      std::printf("\n");
    };
    const double nodes_per_round =
        spec_total.rounds > 0 ? static_cast<double>(spec_total.drafted) / spec_total.rounds : 0.0;
    std::printf("target forwards by rows (1: a plain step):");
    for (size_t k = 1; k < spec_total.rows_histogram.size(); ++k)
      if (spec_total.rows_histogram[k] > 0)
        std::printf(" %zu:%lld", k, static_cast<long long>(spec_total.rows_histogram[k]));
    std::printf("\n");
    print_curve("verify cost curve (a forward of k rows / one row):", own_costs);
    const double expected = expected_at(own_costs);
    std::printf(
        "%s: %.2f nodes verified per round, %.3f tokens per target forward, %.3fx expected at these costs\n",
        o->spec.tree_nodes > 0 ? "tree" : "chain", nodes_per_round, spec_total.tokens_per_forward(),
        expected);
    double priced_expected = 0.0;
    if (priced) {
      const std::string label = "verify cost curve of " + o->cost_model + ":";
      print_curve(label.c_str(), setup.options.costs);
      priced_expected = expected_at(setup.options.costs);
      std::printf("%.3fx expected at its costs\n", priced_expected);
    }
    if (residency)
      std::printf("expert budget: %s\n", expert_residency_summary(residency->stats(), "the target").c_str());
    if (mismatches > 0)
      std::printf("WARNING: greedy speculative output differed from plain output for %lld prompts\n",
                  static_cast<long long>(mismatches));
    if (o->json) {
      nlohmann::json j = {{"plain_tps", plain_tps},
                          {"spec_tps", spec_tps},
                          {"speedup", spec_tps / plain_tps},
                          {"ideal_speedup", ideal},
                          {"ideal_depth", d},
                          {"acceptance", spec_total.acceptance()},
                          {"mean_accepted", spec_total.mean_accepted()},
                          {"tokens_per_forward", spec_total.tokens_per_forward()},
                          {"depth_histogram", spec_total.depth_histogram},
                          {"acceptance_by_position", by_position},
                          {"rounds_by_position", spec_total.proposed_by_position},
                          {"tree_nodes", o->spec.tree_nodes},
                          {"tree_rounds", spec_total.tree_rounds},
                          {"nodes_per_round", nodes_per_round},
                          {"rows_histogram", spec_total.rows_histogram},
                          {"expected_speedup", expected},
                          {"greedy_mismatches", mismatches}};
      if (priced) j["expected_speedup_cost_model"] = priced_expected;
      std::printf("%s\n", j.dump().c_str());
    }
  });
}

}  // namespace tandem::cli
