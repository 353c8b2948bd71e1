#include "tandem/speculative/gate.h"

#include <algorithm>
#include <limits>

#include "tandem/speculative/cost_curve.h"
#include "tandem/speculative/verify.h"
#include "tandem/util/error.h"

namespace tandem::speculative {

double CostModel::verify_cost(int rows) const {
  if (rows <= 1) return 1.0;
  const int n = static_cast<int>(verify.size()) - 1;  // largest measured row count
  if (rows <= n) return verify[static_cast<size_t>(rows)];
  if (n < 2) return static_cast<double>(rows);  // nothing measured beyond one row: assume linear
  const int from = extrapolate_from >= 1 && extrapolate_from < n ? extrapolate_from : n - 1;
  const double rise = verify[static_cast<size_t>(n)] - verify[static_cast<size_t>(from)];
  const double slope = std::max(0.0, rise / static_cast<double>(n - from));
  return verify[static_cast<size_t>(n)] + slope * (rows - n);
}

double CostModel::round_cost(int depth, int batch) const {
  if (batch <= 1) return verify_cost(depth + 1) + depth * draft_per_token;
  const double base = verify_cost(batch);
  return 1.0 + batch * (verify_cost(batch + depth) - base + depth * draft_per_token) / base;
}

CostModel CostModel::linear(double per_row, double draft_per_token, int max_rows) {
  CostModel c;
  c.verify.assign(static_cast<size_t>(max_rows) + 1, 1.0);
  for (int r = 1; r <= max_rows; ++r) c.verify[static_cast<size_t>(r)] = 1.0 + per_row * (r - 1);
  c.draft_per_token = draft_per_token;
  return c;
}

Gate::Gate(const GateSettings& s, CostModel costs, int max_depth, int min_depth)
    : settings_(s), costs_(std::move(costs)), max_depth_(max_depth), min_depth_(min_depth) {
  if (max_depth < 1) throw Error("the gate's maximum draft depth must be at least 1");
  if (min_depth < 1 || min_depth > max_depth)
    throw Error("the minimum draft depth must be between 1 and the maximum (" + std::to_string(max_depth) +
                ")");
  if (!(s.prior_accepted >= 0) || !(s.prior_rejected >= 0) || !(s.prior_accepted + s.prior_rejected > 0))
    throw Error("the gate's prior counts must be >= 0 and not both 0");
  if (!(s.decay > 0 && s.decay <= 1) || !(s.idle_decay > 0 && s.idle_decay <= 1))
    throw Error("the gate's decay and idle decay must be in (0, 1]");
  if (!(s.margin >= 0)) throw Error("the gate's margin must be >= 0");
  if (s.probe_interval < 1 || s.max_probe_interval < s.probe_interval)
    throw Error("the gate's probe interval must be >= 1 and <= its maximum");
  if (s.probe_depth < 1) throw Error("the gate's probe depth must be at least 1");
  if (!(s.timing_weight > 0 && s.timing_weight <= 1) || s.timing_samples < 1)
    throw Error("the gate's timing weight must be in (0, 1] and its timing samples at least 1");
  // Row counts a round alone can take, 1..max_depth + 1, each with its own entry so that a measured ratio
  // can take its place (in a batch the gate does not time its forwards).
  const size_t rows = static_cast<size_t>(max_depth) + 2;
  if (costs_.verify.size() < rows) {
    std::vector<double> verify(rows, 1.0);
    for (size_t r = 1; r < rows; ++r) verify[r] = costs_.verify_cost(static_cast<int>(r));
    costs_.verify = std::move(verify);
  }
  calibrated_ = costs_.verify;
  fit_.reserve(rows);
  fit_sums_.reserve(rows);
  fit_sizes_.reserve(rows);
  mean_seconds_.assign(rows, 0.0);
  timings_.assign(rows, 0);
  accepted_.assign(static_cast<size_t>(max_depth), s.prior_accepted);
  rejected_.assign(static_cast<size_t>(max_depth), s.prior_rejected);
  prior_weight_.assign(static_cast<size_t>(max_depth), s.prior_accepted + s.prior_rejected);
  interval_ = s.probe_interval;
}

double Gate::prior_acceptance() const {
  return settings_.prior_accepted / (settings_.prior_accepted + settings_.prior_rejected);
}

double Gate::estimate(size_t i, double before) const {
  const double w = prior_weight_[i];
  // The observations alone (the counts less the prior's share, which has decayed with them); that share
  // stands for `before`, the estimate of the position before (the prior's ratio for the first).
  const double seen_accepted = std::max(0.0, accepted_[i] - w * prior_acceptance());
  const double seen = std::max(0.0, accepted_[i] + rejected_[i] - w);
  // Counts that decayed to nothing keep the estimate (uniform decay never changes a ratio).
  return seen + w > 1e-12 ? (seen_accepted + w * before) / (seen + w) : before;
}

double Gate::acceptance(int position) const {
  double p = prior_acceptance();
  for (size_t i = 0; i < static_cast<size_t>(position); ++i) p = estimate(i, p);
  return p;
}

double Gate::expected_rate(int depth, int batch) const {
  double expected = 1.0, chain = 1.0, p = prior_acceptance();
  for (size_t i = 0; i < static_cast<size_t>(depth); ++i) {
    p = estimate(i, p);
    chain *= p;
    expected += chain;
  }
  return expected / costs_.round_cost(depth, batch);
}

template <typename Cost>
int Gate::best_depth_by(int top, Cost cost) const {
  top = std::min(max_depth_, top);
  int best = 0;
  double best_rate = 1.0 + settings_.margin;
  double expected = 1.0, chain = 1.0, p = prior_acceptance();
  for (int d = 1; d <= top; ++d) {
    p = estimate(static_cast<size_t>(d - 1), p);
    chain *= p;
    expected += chain;
    if (d < min_depth_) continue;
    const double rate = expected / cost(d);
    if (rate >= best_rate) {
      best_rate = rate;
      best = d;
    }
  }
  return best;
}

int Gate::best_depth(int limit, int batch) const {
  return best_depth_by(limit, [&](int d) { return costs_.round_cost(d, batch); });
}

int Gate::best_priced_depth(std::span<const double> round_cost) const {
  const int top = static_cast<int>(round_cost.size()) - 1;
  return best_depth_by(top, [&](int d) { return round_cost[static_cast<size_t>(d)]; });
}

Gate::Decision Gate::decide(int limit, int batch) {
  return decided(best_depth(limit, batch));
}

Gate::Decision Gate::decide_priced(std::span<const double> round_cost) {
  return decided(best_priced_depth(round_cost));
}

Gate::Decision Gate::decided(int depth) {
  Decision decision;
  decision.depth = depth;
  if (decision.depth > 0) {
    idle_rounds_ = 0;
    interval_ = settings_.probe_interval;
    return decision;
  }
  if (++idle_rounds_ >= interval_) {
    idle_rounds_ = 0;
    decision.probe = true;
    // The next probe is due only if this one leaves the gate idle, so it comes after twice the wait.
    interval_ = std::min(settings_.max_probe_interval, interval_ * 2);
  }
  return decision;
}

void Gate::record(std::span<const double> outcomes) {
  const size_t n = std::min(outcomes.size(), accepted_.size());
  for (size_t i = 0; i < n; ++i) {
    const double a = std::clamp(outcomes[i], 0.0, 1.0);
    accepted_[i] = accepted_[i] * settings_.decay + a;
    rejected_[i] = rejected_[i] * settings_.decay + (1.0 - a);
    prior_weight_[i] *= settings_.decay;
  }
}

void Gate::record_round(int drafted, int accepted) {
  const int observed = std::min(drafted, accepted + 1);
  for (int i = 0; i < observed && i < max_depth_; ++i) {
    const double a = i < accepted ? 1.0 : 0.0;
    accepted_[static_cast<size_t>(i)] = accepted_[static_cast<size_t>(i)] * settings_.decay + a;
    rejected_[static_cast<size_t>(i)] = rejected_[static_cast<size_t>(i)] * settings_.decay + (1.0 - a);
    prior_weight_[static_cast<size_t>(i)] *= settings_.decay;
  }
}

void Gate::record_idle() {
  for (double& a : accepted_) a *= settings_.idle_decay;
  for (double& r : rejected_) r *= settings_.idle_decay;
  for (double& w : prior_weight_) w *= settings_.idle_decay;
}

void Gate::record_forward(int rows, double seconds) {
  if (rows < 1 || static_cast<size_t>(rows) >= mean_seconds_.size() || !(seconds > 0)) return;
  const auto r = static_cast<size_t>(rows);
  double& mean = mean_seconds_[r];
  // A stall (a page fault, another process) counts at most as three times the mean.
  mean = timings_[r] == 0 ? seconds : mean + settings_.timing_weight * (std::min(seconds, 3 * mean) - mean);
  ++timings_[r];
  if (timings_[1] < settings_.timing_samples) return;
  const auto timed = [&](size_t n) {
    return n == 1 || (n < mean_seconds_.size() && timings_[n] >= settings_.timing_samples);
  };
  fit_.clear();
  for (size_t n = 1; n < mean_seconds_.size(); ++n)
    if (timed(n)) fit_.push_back(n == 1 ? 1.0 : std::max(1.0, mean_seconds_[n] / mean_seconds_[1]));
  make_nondecreasing(fit_, fit_sums_, fit_sizes_);
  // Rebuilt from the calibrated curve each time, so a ratio that once dipped leaves no trace once its
  // timings recover. Right to left: a calibrated entry no higher than the next timed ratio; then left to
  // right: no lower than the entry before (the timed ones already are).
  double above = std::numeric_limits<double>::infinity();
  size_t next_fit = fit_.size();
  for (size_t n = costs_.verify.size() - 1; n >= 1; --n) {
    if (timed(n)) {
      above = fit_[--next_fit];
      costs_.verify[n] = above;
    } else {
      costs_.verify[n] = std::min(calibrated_[n], above);
    }
  }
  for (size_t n = 2; n < costs_.verify.size(); ++n)
    costs_.verify[n] = std::max(costs_.verify[n], costs_.verify[n - 1]);
}

void Probe::start() {
  next_ = 0;
  outcomes_.clear();
  outcomes_.reserve(draft_.tokens.size());
  active_ = !draft_.tokens.empty();
}

void Probe::observe(int32_t token, const sampling::Distribution* p, Gate& gate) {
  if (!active_) return;
  if (!p) {
    active_ = false;
    return;
  }
  const size_t i = next_++;
  const int32_t x = draft_.tokens[i];
  const sampling::Distribution* q = draft_.sampled && i < draft_.q.size() ? &draft_.q[i] : nullptr;
  outcomes_.push_back(acceptance_probability(x, *p, q));
  if (token != x || next_ == draft_.tokens.size()) {
    gate.record(outcomes_);
    active_ = false;
  }
}

BatchCosts::BatchCosts(CostModel calibrated, int max_rows, double weight, int samples)
    : calibrated_(std::move(calibrated)), weight_(weight), samples_(samples) {
  if (max_rows < 1) throw Error("a batched forward holds at least one row");
  if (!(weight > 0 && weight <= 1) || samples < 1)
    throw Error("the forward timing weight must be in (0, 1] and its samples at least 1");
  mean_.assign(static_cast<size_t>(max_rows) + 1, 0.0);
  count_.assign(static_cast<size_t>(max_rows) + 1, 0);
}

void BatchCosts::record(int rows, double seconds) {
  if (rows < 1 || static_cast<size_t>(rows) >= mean_.size() || !(seconds > 0)) return;
  const auto r = static_cast<size_t>(rows);
  double& mean = mean_[r];
  mean = count_[r] == 0 ? seconds : mean + weight_ * (std::min(seconds, 3 * mean) - mean);
  ++count_[r];
}

bool BatchCosts::measured(int rows) const {
  return rows >= 1 && static_cast<size_t>(rows) < count_.size() &&
         count_[static_cast<size_t>(rows)] >= samples_;
}

double BatchCosts::ratio(int rows, int base) const {
  if (rows == base) return 1.0;
  if (measured(rows) && measured(base))
    return mean_[static_cast<size_t>(rows)] / mean_[static_cast<size_t>(base)];
  if (calibrated_.verify.size() >= 2) return calibrated_.verify_cost(rows) / calibrated_.verify_cost(base);
  // Nothing known: priced as free, so that the forward is tried and timed (a row count is priced from its
  // timings after `samples` of them).
  return 1.0;
}

double BatchCosts::round_cost(int depth, int base_rows, int sharing) const {
  base_rows = std::max(1, base_rows);
  const double drafting = depth * calibrated_.draft_per_token / ratio(base_rows, 1);
  return rows_cost(depth, base_rows, sharing) + std::max(1, sharing) * drafting;
}

double BatchCosts::rows_cost(int rows, int base_rows, int sharing) const {
  base_rows = std::max(1, base_rows);
  sharing = std::max(1, sharing);
  // More rows never make a forward faster: a noisy mean that says so counts as no slowdown.
  const double slowdown = std::max(0.0, ratio(base_rows + rows, base_rows) - 1.0);
  return 1.0 + sharing * slowdown;
}

}  // namespace tandem::speculative
