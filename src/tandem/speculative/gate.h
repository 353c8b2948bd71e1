// The adaptive draft gate: decides, round by round, how many tokens to draft (0: a plain step) from what the
// drafter has been accepting and what a verify window costs on this machine.
//
// Model. Every draft position i = 1..max_depth keeps accepted and rejected counts (a_i, r_i), starting from
// the prior (prior_accepted, prior_rejected); a_i / (a_i + r_i) estimates the chance p_i that draft i is
// accepted given that drafts 1..i-1 were. Beyond the first position, the prior's share of the counts (its
// weight, decayed with them) stands for the estimate of the position before instead of the prior's ratio:
// a position the gate has not drafted to lately is assumed to accept like the one before it, not like the
// prior, so the gate can find out that drafting one deeper pays (with a fixed prior it never would, since it
// only observes the positions it drafts). The expected tokens of a round drafting d are
//   E(d) = 1 + sum_{k=1..d} prod_{i=1..k} p_i
// (the target always adds one token), and its cost, in units of one plain decode step, is
//   C(d) = verify_cost(d + 1 rows) + d * draft_cost_per_token   (CostModel, from calibration.h).
// The gate drafts the depth d >= min_depth that maximises E(d) / C(d), but only when that rate exceeds a
// plain step's (1 token per unit) by the margin: E(d) / C(d) >= 1 + margin.
//
// Learning. A verified round that drafted d and accepted k observes positions 1..min(k + 1, d): each observed
// position's counts are multiplied by `decay`, then positions 1..k gain an acceptance and position k + 1
// (when k < d) a rejection. A round without drafts multiplies every count by `idle_decay`, which keeps the
// estimated rates but lightens the evidence, so the next observation moves them more.
//
// Probes. After `probe_interval` rounds without drafts the gate asks for a probe: the drafter proposes
// `probe_depth` tokens that are not verified; the loop compares them with the tokens the target then produces
// in plain steps and reports the outcome through record() (fractional acceptance probabilities when
// sampling). Each probe that still leaves the gate drafting nothing doubles the interval, up to
// max_probe_interval; a decision to draft resets it.
//
// Measured costs. The calibrated costs were measured once, at one moment of the machine; its state moves
// them (when memory is contended one row slows and windows stay compute-bound, so every ratio drops). A
// loop that times its target forwards reports them (record_forward): each row count keeps a running mean of
// its seconds per forward (weight `timing_weight` for the newest), and once one row and r rows both have
// `timing_samples` timings, verify_cost(r) is their ratio instead of the calibrated one. Row counts not
// timed keep the calibration's ratio, and so does every row count while plain rounds are too few to time one
// row. The mix is kept non-decreasing in the rows: timings of neighbouring row counts are noisy and taken at
// different moments, and a dip would make a deeper round look cheaper than a shallower one. The timed ratios
// (one row counting as 1) are fitted by make_nondecreasing (cost_curve.h), and each calibrated entry between
// two timed row counts is clamped between their fitted ratios (the timings describe the machine now, the
// calibration another moment), then raised to at least the entry before it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "tandem/speculative/draft_source.h"

namespace tandem::speculative {

// Defaults chosen for a CPU target: a prior of 60% acceptance weighing 5 rounds, evidence that halves in
// about 7 rounds, and a probe every 8 idle rounds backing off to one per 128.
struct GateSettings {
  double prior_accepted = 3.0;
  double prior_rejected = 2.0;
  double decay = 0.9;        // kept by an observed position's counts per round
  double idle_decay = 0.98;  // kept by every count per round without drafts
  double margin = 0.05;      // required relative gain over a plain step
  int probe_interval = 8;    // idle rounds before the first probe
  int max_probe_interval = 128;
  int probe_depth = 4;
  double timing_weight = 0.1;  // of the newest forward in a row count's mean time
  int timing_samples = 4;      // timings of one row and of r rows before their ratio replaces verify[r]
};

// What a round costs, in units of one plain (one-row) target decode step.
struct CostModel {
  // verify[r] = cost of a target forward over r rows (index 0 unused, verify[1] == 1). Rows past the end are
  // extrapolated linearly along the last measured segment: the line through verify[extrapolate_from] and the
  // last entry (never decreasing), or through the last two entries when extrapolate_from is 0 or out of
  // range. A calibrated curve is dense between sparse measured widths (calibration.h), and the last two
  // entries of such a curve lie on its last measured segment anyway; extrapolate_from keeps that segment when
  // the entries are extended or replaced by timings.
  std::vector<double> verify;
  int extrapolate_from = 0;
  double draft_per_token = 0.0;  // drafter cost of one proposed token

  double verify_cost(int rows) const;
  // A round of `depth` drafts for one sequence among `batch` sequences that each have a row in the same
  // forward (batch 1: alone). Alone, the window's cost. In a batch, the d extra rows (and the drafting) slow
  // the forward for every sequence in it, so the round is charged the batch's relative slowdown times the
  // batch: drafting pays only if 1 + B * (verify(B + d) - verify(B) + d * draft) / verify(B) <= E(d) tokens.
  // batch 1 gives verify(d + 1) + d * draft.
  double round_cost(int depth, int batch = 1) const;
  // A cost model without measurements: every extra row costs `per_row` of a decode step.
  static CostModel linear(double per_row, double draft_per_token, int max_rows = 17);
};

class Gate {
 public:
  // max_depth >= 1: the deepest round the gate plans; min_depth in [1, max_depth]: the shallowest one it
  // drafts.
  Gate(const GateSettings& settings, CostModel costs, int max_depth, int min_depth = 1);

  struct Decision {
    int depth = 0;       // tokens to draft and verify (0: a plain step)
    bool probe = false;  // depth == 0; draft settings().probe_depth tokens without verifying them
  };
  // The next round's plan; `limit` caps the depth (remaining tokens, context); `batch`: sequences with a row
  // in the same forward, this one included (CostModel::round_cost). Counts idle rounds for probes.
  Decision decide(int limit, int batch = 1);
  // As decide(), with the round's cost priced by the caller: round_cost[d] is the cost of drafting d (d = 1
  // .. round_cost.size() - 1, at most max_depth), in units of the plain step the sequence would take instead
  // (round_cost[0] unused). A batched driver prices rounds from the forward it is building (BatchCosts).
  Decision decide_priced(std::span<const double> round_cost);

  // Outcomes of observed draft positions 1..outcomes.size(): 1 accepted, 0 rejected, or a probability.
  void record(std::span<const double> outcomes);
  // A verified round: `drafted` tokens of which `accepted` were accepted.
  void record_round(int drafted, int accepted);
  // A round without drafts.
  void record_idle();
  // A target forward over `rows` rows (this sequence alone) took `seconds` (see "Measured costs" above).
  void record_forward(int rows, double seconds);

  // The expected rate E(d) / C(d) of drafting d (d = 0: 1, a plain step), and the acceptance estimate of
  // draft position i (1-based).
  double expected_rate(int depth, int batch = 1) const;
  double acceptance(int position) const;
  // The depth in [min_depth, min(max_depth, limit)] with the best expected rate, or 0 when none beats a plain
  // step by the margin.
  int best_depth(int limit, int batch = 1) const;
  // The depth in [min_depth, min(max_depth, round_cost.size() - 1)] with the best expected tokens per
  // round_cost[d], or 0 when none beats a plain step by the margin.
  int best_priced_depth(std::span<const double> round_cost) const;

  const GateSettings& settings() const { return settings_; }
  // The costs the gate plans with: the calibrated ones, with the measured ratios in place where there are.
  const CostModel& costs() const { return costs_; }
  int probe_interval() const { return interval_; }

 private:
  double prior_acceptance() const;
  // The best depth in [min_depth, min(max_depth, top)] when drafting d costs cost(d); 0 when none pays.
  template <typename Cost>
  int best_depth_by(int top, Cost cost) const;
  Decision decided(int depth);
  // The acceptance estimate of the position at index i, given `before`, the estimate of the one before it.
  double estimate(size_t i, double before) const;

  GateSettings settings_;
  CostModel costs_;
  std::vector<double> calibrated_;  // costs_.verify before any timing replaced an entry
  std::vector<double> fit_;         // the timed ratios in row order, then fitted; reserved once
  std::vector<double> fit_sums_;    // make_nondecreasing()'s workspace, reserved once
  std::vector<size_t> fit_sizes_;
  std::vector<double> mean_seconds_;  // [rows]: running mean of the timed forwards over that many rows
  std::vector<int> timings_;          // [rows]: how many were timed
  int max_depth_, min_depth_;
  std::vector<double> accepted_, rejected_;  // [max_depth], position i at index i - 1
  std::vector<double> prior_weight_;         // [max_depth]: the prior's share of accepted_ + rejected_
  int idle_rounds_ = 0;
  int interval_;  // idle rounds before the next probe
};

// A probe in flight: a proposal the gate asked for while it drafted nothing, left unverified and compared
// with the tokens the target then commits in plain steps. Each plain step scores the draft at its position as
// a verify round would have (the probability of accepting it), stopping at the first draft the text did not
// follow; the scores go to Gate::record(), so a drafter whose acceptance recovers makes the gate draft again.
class Probe {
 public:
  // The proposal to fill before start().
  Draft& draft() { return draft_; }
  // Starts watching draft() (an empty one is not watched).
  void start();
  bool active() const { return active_; }
  // A verified round observes the drafter directly: the probe is dropped.
  void cancel() { active_ = false; }
  // A plain step committed `token`, drawn from the target's p (null: a round that was not a plain step, which
  // ends the probe unscored).
  void observe(int32_t token, const sampling::Distribution* p, Gate& gate);

 private:
  Draft draft_;
  size_t next_ = 0;
  std::vector<double> outcomes_;  // [draft positions], reserved on start
  bool active_ = false;
};

// Forward costs of a batched driver (engine::Scheduler), by the total rows of the forward: every forward it
// runs is timed and each row count keeps a running mean of its seconds (weight `weight` for the newest, a
// stall counting at most three times the mean). The time of r rows relative to b rows is the ratio of their
// means once both have `samples` timings; before that, the calibrated curve's ratio (CostModel::verify_cost,
// measured on this machine by `tandem calibrate`), or, without a calibration, 1: an untimed row count is
// tried, and so timed, rather than guessed at. So the gate prices a verify window by what adding its rows
// costs the forward this step already carries, at the batch's current size and on the machine's current
// state.
class BatchCosts {
 public:
  // max_rows: the widest forward timed.
  BatchCosts(CostModel calibrated, int max_rows, double weight = 0.1, int samples = 4);

  void record(int rows, double seconds);
  // Time of a forward of `rows` rows over one of `base` rows (both >= 1).
  double ratio(int rows, int base) const;
  // Whether `rows` has enough timings to replace the calibration.
  bool measured(int rows) const;
  // The cost of drafting `depth` tokens for one sequence when the forward already carries `base_rows` rows
  // and `sharing` sequences (this one included) wait for it, in units of that sequence's plain step: its own
  // step, plus the forward's relative slowdown (the window's extra rows and the drafting) charged once per
  // waiting sequence: 1 + sharing * (ratio(base + depth, base) - 1 + depth * draft_per_token / ratio(base,
  // 1)).
  double round_cost(int depth, int base_rows, int sharing) const;
  // round_cost() without the drafting: what `rows` more rows cost (a draft tree's nodes, drafted already),
  // 1 + sharing * (ratio(base + rows, base) - 1).
  double rows_cost(int rows, int base_rows, int sharing) const;
  const CostModel& calibrated() const { return calibrated_; }

 private:
  CostModel calibrated_;
  double weight_;
  int samples_;
  std::vector<double> mean_;  // [rows]
  std::vector<int> count_;    // [rows]
};

}  // namespace tandem::speculative
