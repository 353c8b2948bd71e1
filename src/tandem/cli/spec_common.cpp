#include "tandem/cli/spec_common.h"

#include <algorithm>

#include "tandem/sampling/json_schema.h"
#include "tandem/speculative/dflash_draft.h"
#include "tandem/speculative/draft_model.h"
#include "tandem/speculative/eagle_draft.h"
#include "tandem/speculative/mtp_draft.h"
#include "tandem/speculative/ngram.h"
#include "tandem/speculative/replay.h"
#include "tandem/util/error.h"

namespace tandem::cli {

void add_spec_options(CLI::App& cmd, SpecFlags& f, bool with_replay) {
  cmd.add_option("--draft-model", f.draft_model,
                 "Speculative decoding with this draft model (any GGUF with the target's vocabulary)");
  cmd.add_option("--drafter", f.drafter,
                 "Speculative decoding with a drafter made by `tandem train-drafter` for this target");
  cmd.add_option("--draft", f.draft,
                 with_replay
                     ? "Speculative decoding without a draft model: ngram (lookup in the prompt and output), "
                       "mtp (the checkpoint's own next-token-prediction layer, where the file has one) or "
                       "replay (the target's own greedy output, corrupted at rate 1 - --accept)"
                     : "Speculative decoding without a draft model: ngram (lookup in the prompt and output) "
                       "or mtp (the checkpoint's own next-token-prediction layer, where the file has one)");
  cmd.add_option("--draft-max", f.draft_max, "Tokens drafted per round at most (default 8)");
  cmd.add_option("--draft-min", f.draft_min, "Shortest proposal worth verifying (default 1)");
  cmd.add_flag("--no-gate", f.no_gate,
               "Always draft --draft-max tokens instead of letting the adaptive gate choose");
  cmd.add_option("--tree-nodes", f.tree_nodes,
                 "Draft a token tree of at most N nodes each round (--draft-model, --drafter and --draft "
                 "ngram branch where they are unsure), verified in one forward; --draft-max bounds "
                 "its depth; each round verifies the drafter's best nodes that pay on the calibrated costs, "
                 "all N with --no-gate (default 0: chains)");
  cmd.add_option("--ngram-min", f.ngram_min, "Shortest n-gram looked up by --draft ngram (default 2)");
  cmd.add_option("--ngram-max", f.ngram_max, "Longest n-gram looked up by --draft ngram (default 4)");
  if (with_replay)
    cmd.add_option("--accept", f.accept, "Acceptance rate of --draft replay, in [0, 1] (default 0.8)");
  add_gate_options(cmd, f.gate);
}

void add_gate_options(CLI::App& cmd, speculative::GateSettings& g) {
  const auto option = [&cmd](const char* name, auto& value, const char* help) {
    cmd.add_option(name, value, help)->group("Adaptive gate (docs/speculative.md)");
  };
  option("--gate-prior-accepted", g.prior_accepted,
         "Accepted count every draft position starts from (default 3)");
  option("--gate-prior-rejected", g.prior_rejected,
         "Rejected count every draft position starts from (default 2: a 60% prior over 5 rounds)");
  option("--gate-decay", g.decay,
         "Factor a position's counts keep per round that observes it, in (0, 1] (default 0.9)");
  option("--gate-idle-decay", g.idle_decay,
         "Factor every count keeps per round without drafts, in (0, 1] (default 0.98)");
  option("--gate-margin", g.margin,
         "Relative gain over a plain step a round must promise to draft (default 0.05)");
  option("--gate-probe-interval", g.probe_interval,
         "Rounds without drafts before a probe, doubling after each idle probe (default 8)");
  option("--gate-max-probe-interval", g.max_probe_interval, "Longest interval between probes (default 128)");
  option("--gate-probe-depth", g.probe_depth, "Tokens a probe drafts (default 4)");
  option("--gate-timing-weight", g.timing_weight,
         "Weight of the newest timed forward in each row count's mean time, in (0, 1] (default 0.1)");
  option("--gate-timing-samples", g.timing_samples,
         "Timed forwards of one row and of r rows before their ratio replaces the calibrated cost of r rows "
         "(default 4)");
}

void check_gate_options(const speculative::GateSettings& gate) {
  try {
    speculative::Gate(gate, speculative::CostModel::linear(0.25, 0.0), 1);
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + " (check the --gate-* flags)");
  }
}

SpecSetup make_spec_setup(const SpecFlags& f, const model::Model& target, const ModelOptions& target_options,
                          ThreadPool& pool, const model::SessionOptions& session_options,
                          bool calibrate_if_missing) {
  const std::string& target_path = target_options.model_path;
  if (!f.draft_model.empty() + !f.draft.empty() + !f.drafter.empty() > 1)
    throw Error("pass one of --draft-model, --drafter and --draft, not several");
  if (f.draft_max < 1) throw Error("--draft-max must be at least 1");
  if (f.tree_nodes < 0) throw Error("--tree-nodes must be 0 (chains) or a positive node budget");
  SpecSetup s;
  std::string draft_hash;
  if (!f.draft_model.empty()) {
    s.draft_model = model::Model::load(f.draft_model, target_options.load_mode());
    s.source = std::make_unique<speculative::DraftModelSource>(*s.draft_model, target, pool, session_options);
    draft_hash = speculative::file_fingerprint(f.draft_model);
  } else if (!f.drafter.empty() && train::load_drafter(f.drafter, {}).kind == speculative::kDflashKind) {
    s.source =
        speculative::DflashDraftSource::load(f.drafter, target, speculative::file_fingerprint(target_path),
                                             pool, model::default_context(target, session_options.n_ctx));
  } else if (!f.drafter.empty()) {
    s.source =
        speculative::EagleDraftSource::load(f.drafter, target, speculative::file_fingerprint(target_path),
                                            pool, model::default_context(target, session_options.n_ctx));
    draft_hash = speculative::eagle_cost_key(f.drafter);
  } else if (f.draft == "ngram") {
    s.source =
        std::make_unique<speculative::NgramSource>(speculative::NgramOptions{f.ngram_min, f.ngram_max});
  } else if (f.draft == "mtp") {
    speculative::check_has_mtp(target, target_path);
    s.source = std::make_unique<speculative::MtpDraftSource>(
        target, pool, model::default_context(target, session_options.n_ctx));
    draft_hash = speculative::mtp_cost_key(target_path);
  } else if (f.draft == "replay") {
    s.source = std::make_unique<speculative::ReplaySource>(f.accept, target.config().n_vocab);
  } else {
    throw Error("unknown --draft '" + f.draft + "': expected ngram or mtp" +
                std::string(" (or replay in bench-spec)"));
  }
  s.options.draft_max = f.draft_max;
  s.options.draft_min = f.draft_min;
  s.options.use_gate = !f.no_gate;
  s.options.tree_nodes = f.tree_nodes;
  check_gate_options(f.gate);
  s.options.gate = f.gate;

  const std::string cache_path = speculative::calibration_file_path();
  auto cal = speculative::cached_calibration(target_path, pool.size());
  const int widest = std::max(f.draft_max, f.tree_nodes) + 1;  // rows of the widest verify window
  const bool complete = cal && static_cast<int>(cal->verify.size()) > widest &&
                        (draft_hash.empty() || cal->draft_per_token.count(draft_hash));
  if (!complete && calibrate_if_missing) {
    std::fprintf(stderr, "calibrating verify costs on this machine (cached in %s)...\n", cache_path.c_str());
    speculative::CalibrateOptions co;
    co.max_rows = std::max(widest, cal ? static_cast<int>(cal->verify.size()) - 1 : 0);
    co.repeats = 3;
    cal = speculative::calibrate(target, target_path, s.draft_model.get(), f.draft_model, pool, co);
    if (auto* eagle = dynamic_cast<speculative::EagleDraftSource*>(s.source.get()))
      cal->draft_per_token[draft_hash] = speculative::measure_eagle_draft_cost(*eagle, cal->decode_seconds);
    if (auto* mtp = dynamic_cast<speculative::MtpDraftSource*>(s.source.get()))
      cal->draft_per_token[draft_hash] = speculative::measure_mtp_draft_cost(*mtp, cal->decode_seconds);
    speculative::store_calibration(cache_path, *cal);
  }
  // An EAGLE drafter, like an MTP layer, is one layer of the target's shape and its head: about two of its
  // n_layer layers.
  const double drafter_cost = 2.0 / static_cast<double>(std::max<int64_t>(2, target.config().n_layer));
  if (cal) {
    s.options.costs = cal->cost_model(draft_hash);
    s.calibrated = true;
    // A calibration made without the MTP layer (bench-spec measures it) charges the layer's estimate.
    if (f.draft == "mtp" && !cal->draft_per_token.count(draft_hash))
      s.options.costs.draft_per_token = drafter_cost;
  } else if (s.options.use_gate) {
    std::fprintf(
        stderr,
        "note: no calibration for this model, CPU and thread count; the gate assumes each extra verify "
        "row costs 0.25 of a decode step (run `tandem calibrate -m %s%s%s`)\n",
        target_path.c_str(), f.draft_model.empty() ? "" : " --draft-model ", f.draft_model.c_str());
    s.options.costs =
        speculative::CostModel::linear(0.25, !f.draft_model.empty()                   ? 0.5
                                             : !f.drafter.empty() || f.draft == "mtp" ? drafter_cost
                                                                                      : 0.0);
  }
  return s;
}

void add_grammar_options(CLI::App& cmd, GrammarFlags& f) {
  cmd.add_option(
      "--json-schema", f.json_schema,
      "Constrain the output to JSON matching the JSON Schema in this file (docs/structured-output.md)");
  cmd.add_option("--grammar", f.grammar,
                 "Constrain the output to a built-in grammar: json (any JSON object)");
}

std::optional<sampling::GrammarMatcher> make_output_grammar(const GrammarFlags& f,
                                                            const tokenizer::Tokenizer& tokenizer) {
  if (!f.enabled()) return std::nullopt;
  if (!f.json_schema.empty() && !f.grammar.empty())
    throw Error("pass one of --json-schema and --grammar, not both");
  std::shared_ptr<const sampling::Grammar> grammar;
  if (!f.grammar.empty()) {
    if (f.grammar != "json") throw Error("unknown --grammar '" + f.grammar + "': expected json");
    grammar = std::make_shared<const sampling::Grammar>(sampling::json_object_grammar());
  } else {
    const std::string text = read_text_file(f.json_schema);
    try {
      grammar = std::make_shared<const sampling::Grammar>(sampling::grammar_from_json_schema(text));
    } catch (const Error& e) {
      throw Error("--json-schema " + f.json_schema + ": " + e.what());
    }
  }
  return sampling::GrammarMatcher(std::move(grammar), sampling::TokenTrie::build(tokenizer));
}

void print_spec_report(std::FILE* out, const engine::SpecStats& st) {
  std::fprintf(
      out,
      "speculative: %lld drafted, %lld accepted (acceptance %.1f%%), mean accepted length %.2f over %lld "
      "rounds, %.2f tokens per target forward (%lld forwards), %.1f tok/s\n",
      static_cast<long long>(st.drafted), static_cast<long long>(st.accepted), 100.0 * st.acceptance(),
      st.mean_accepted(), static_cast<long long>(st.rounds), st.tokens_per_forward(),
      static_cast<long long>(st.target_forwards), st.tokens_per_second());
  if (st.tree_rounds > 0)
    std::fprintf(out, "token trees: %lld rounds, %.2f nodes verified per round\n",
                 static_cast<long long>(st.tree_rounds),
                 st.rounds > 0 ? static_cast<double>(st.drafted) / st.rounds : 0.0);
  std::fprintf(out, st.tree_rounds > 0 ? "tree depth histogram (target forwards by the tree's depth):"
                                       : "draft depth histogram (target forwards by drafts verified):");
  for (size_t d = 0; d < st.depth_histogram.size(); ++d)
    if (st.depth_histogram[d] > 0)
      std::fprintf(out, " %zu:%lld", d, static_cast<long long>(st.depth_histogram[d]));
  std::fprintf(out, "\n");
}

}  // namespace tandem::cli
