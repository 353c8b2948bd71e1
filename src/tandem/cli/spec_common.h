// Speculative-decoding flags and setup shared by `tandem run` and `tandem bench-spec` (`tandem serve` takes
// the gate options).
#pragma once

#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "tandem/cli/common.h"
#include "tandem/engine/generate_speculative.h"
#include "tandem/model/model.h"
#include "tandem/model/session.h"
#include "tandem/sampling/token_mask.h"
#include "tandem/speculative/calibration.h"
#include "tandem/speculative/draft_source.h"
#include "tandem/tokenizer/tokenizer.h"

namespace tandem::cli {

struct SpecFlags {
  std::string draft_model;  // --draft-model FILE
  std::string drafter;      // --drafter FILE (tandem train-drafter)
  std::string draft;        // --draft ngram | mtp | replay
  int draft_max = 8;
  int draft_min = 1;
  bool no_gate = false;
  int ngram_min = 2, ngram_max = 4;
  double accept = 0.8;             // --accept, replay only
  speculative::GateSettings gate;  // --gate-*
  int tree_nodes = 0;              // --tree-nodes: 0 chains, else the token tree's node budget

  bool enabled() const { return !draft_model.empty() || !drafter.empty() || !draft.empty(); }
};

// Adds --draft-model, --drafter, --draft, --draft-max, --draft-min, --no-gate, --ngram-min/--ngram-max,
// --tree-nodes, the
// gate's settings (add_gate_options) and, with with_replay, --accept (the replay drafter is for benchmarks
// only).
void add_spec_options(CLI::App& cmd, SpecFlags& flags, bool with_replay);

// Adds the adaptive gate's settings (speculative/gate.h) as --gate-prior-accepted, --gate-prior-rejected,
// --gate-decay, --gate-idle-decay, --gate-margin, --gate-probe-interval, --gate-max-probe-interval and
// --gate-probe-depth, in their own --help group.
void add_gate_options(CLI::App& cmd, speculative::GateSettings& gate);

// Throws tandem::Error naming the --gate-* flags when the settings are invalid (Gate's own checks).
void check_gate_options(const speculative::GateSettings& gate);

// A drafter built from the flags, with the gate's cost model read from the calibration cache (or, when the
// target has no entry, a default linear model, and a note on stderr saying how to calibrate).
struct SpecSetup {
  std::unique_ptr<model::Model> draft_model;
  std::unique_ptr<speculative::DraftSource> source;
  engine::SpecOptions options;  // draft_max, draft_min, use_gate, costs; the caller fills `generate`
  bool calibrated = false;
};

// target_options: the target's flags (its file for the calibration key; the draft model loads as the target
// did, --mmap or --no-mmap). calibrate_if_missing: measure now and store the entry when the cache has none
// (benchmarks); otherwise fall back to the default costs.
SpecSetup make_spec_setup(const SpecFlags& flags, const model::Model& target,
                          const ModelOptions& target_options, ThreadPool& pool,
                          const model::SessionOptions& session_options, bool calibrate_if_missing);

// Constrained output for the single-sequence commands (docs/structured-output.md).
struct GrammarFlags {
  std::string json_schema;  // --json-schema FILE
  std::string grammar;      // --grammar json

  bool enabled() const { return !json_schema.empty() || !grammar.empty(); }
};

// Adds --json-schema and --grammar.
void add_grammar_options(CLI::App& cmd, GrammarFlags& flags);

// The output grammar's matcher at its start, or nothing when neither flag is given. Throws tandem::Error
// naming the flag: both given, an unknown --grammar, an unreadable file or a schema the compiler refuses
// (with its place in the schema).
std::optional<sampling::GrammarMatcher> make_output_grammar(const GrammarFlags& flags,
                                                            const tokenizer::Tokenizer& tokenizer);

// The end-of-run report: acceptance rate, mean accepted length, tokens per target forward, tok/s.
void print_spec_report(std::FILE* out, const engine::SpecStats& stats);

}  // namespace tandem::cli
