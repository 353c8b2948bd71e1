#include "tandem/sampling/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>
#include <sstream>
#include <string>

#include "tandem/util/error.h"

namespace tandem::sampling {

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

template <typename T>
[[noreturn]] void bad_param(const char* name, T value, const char* expected) {
  std::ostringstream msg;
  msg << "sampling parameter " << name << " must be " << expected << " (got " << value << ")";
  throw Error(msg.str());
}

// Largest logit, ignoring NaN. Eight independent lanes let the compiler vectorize the reduction.
float max_of(std::span<const float> logits) {
  constexpr size_t kLanes = 8;
  float lanes[kLanes];
  std::fill(std::begin(lanes), std::end(lanes), -kInf);
  const float* x = logits.data();
  const size_t n = logits.size();
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) lanes[j] = x[i + j] > lanes[j] ? x[i + j] : lanes[j];
  }
  float max_logit = -kInf;
  for (float lane : lanes) max_logit = lane > max_logit ? lane : max_logit;
  for (; i < n; ++i) max_logit = x[i] > max_logit ? x[i] : max_logit;
  return max_logit;
}

// Rejects NaN and +inf (which have no meaningful softmax) and returns the largest logit.
float checked_max(std::span<const float> logits) {
  int bad = 0;
  for (float x : logits) bad |= !(x <= std::numeric_limits<float>::max());
  if (bad) {
    for (size_t i = 0; i < logits.size(); ++i) {
      if (std::isnan(logits[i]) || logits[i] == kInf) {
        throw Error("sampling: logit of token " + std::to_string(i) + " is " +
                    (std::isnan(logits[i]) ? "nan" : "+inf") + "; logits must be finite or -inf");
      }
    }
  }
  const float max_logit = max_of(logits);
  if (max_logit == -kInf) throw Error("sampling: every logit is -inf, so no token can be sampled");
  return max_logit;
}

// Strict weak order of token ids: higher logit first, lower id first on equal logits.
struct RanksHigher {
  const float* logits;
  bool operator()(int32_t a, int32_t b) const {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  }
};

// Octave of a weight in [0, 1]: e such that w is in [2^-e, 2^(1-e)); subnormals and 0 land in the last one.
int octave_of(float w) {
  return 127 - static_cast<int>(std::bit_cast<uint32_t>(w) >> 23);
}

}  // namespace

void validate(const Params& p) {
  if (!(p.temperature >= 0.0f) || std::isinf(p.temperature)) {
    bad_param("temperature", p.temperature, "finite and >= 0 (0 is greedy)");
  }
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) bad_param("top_p", p.top_p, "in (0, 1] (1 disables it)");
  if (!(p.min_p <= 1.0f)) bad_param("min_p", p.min_p, "<= 1 (0 disables it)");
  if (!(p.repeat_penalty > 0.0f) || std::isinf(p.repeat_penalty)) {
    bad_param("repeat_penalty", p.repeat_penalty, "finite and > 0 (1 disables it)");
  }
  if (p.repeat_last_n < -1) {
    bad_param("repeat_last_n", p.repeat_last_n, ">= -1 (0 disables penalties, -1 covers the whole history)");
  }
  if (!std::isfinite(p.presence_penalty)) bad_param("presence_penalty", p.presence_penalty, "finite");
  if (!std::isfinite(p.frequency_penalty)) bad_param("frequency_penalty", p.frequency_penalty, "finite");
}

float Distribution::prob_of(int32_t id) const {
  auto it = std::lower_bound(ids.begin(), ids.end(), id);
  if (it == ids.end() || *it != id) return 0.0f;
  return probs[static_cast<size_t>(it - ids.begin())];
}

void Distribution::clear() {
  ids.clear();
  probs.clear();
}

void residual(const Distribution& p, const Distribution& q, Distribution& out) {
  out.clear();
  double sum = 0.0;
  size_t j = 0;
  for (size_t i = 0; i < p.ids.size(); ++i) {
    const int32_t id = p.ids[i];
    while (j < q.ids.size() && q.ids[j] < id) ++j;
    const float q_prob = (j < q.ids.size() && q.ids[j] == id) ? q.probs[j] : 0.0f;
    const float excess = p.probs[i] - q_prob;
    if (excess > 0.0f) {
      out.ids.push_back(id);
      out.probs.push_back(excess);
      sum += excess;
    }
  }
  if (!(sum > 0.0)) {
    out.ids.assign(p.ids.begin(), p.ids.end());
    out.probs.assign(p.probs.begin(), p.probs.end());
    return;
  }
  for (float& prob : out.probs) prob = static_cast<float>(prob / sum);
}

Sampler::Sampler(Params params) : params_(params) {
  validate(params_);
}

bool Sampler::apply_penalties(std::span<const int32_t> history) {
  const Params& p = params_;
  if (p.repeat_last_n == 0 || history.empty()) return false;
  if (p.repeat_penalty == 1.0f && p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f) return false;
  const size_t window =
      p.repeat_last_n < 0 ? history.size() : std::min(history.size(), static_cast<size_t>(p.repeat_last_n));
  window_.assign(history.end() - static_cast<std::ptrdiff_t>(window), history.end());
  std::sort(window_.begin(), window_.end());
  const size_t n_vocab = logits_.size();
  for (size_t i = 0; i < window_.size();) {
    const int32_t id = window_[i];
    size_t count = 0;
    while (i < window_.size() && window_[i] == id) ++i, ++count;
    if (id < 0 || static_cast<size_t>(id) >= n_vocab) {
      throw Error("sampling: history token id " + std::to_string(id) + " is outside the vocabulary of " +
                  std::to_string(n_vocab) + " tokens");
    }
    float& logit = logits_[static_cast<size_t>(id)];
    if (p.repeat_penalty != 1.0f) logit = logit > 0.0f ? logit / p.repeat_penalty : logit * p.repeat_penalty;
    logit -= p.presence_penalty + p.frequency_penalty * static_cast<float>(count);
  }
  return true;
}

void Sampler::sort_by_logit(size_t n) {
  std::sort(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(n), RanksHigher{logits_.data()});
}

size_t Sampler::select_top_k(size_t k, float max_logit) {
  const size_t n_vocab = logits_.size();
  const float* logits = logits_.data();
  const RanksHigher ranks_higher{logits};
  const auto k_end = order_.begin() + static_cast<std::ptrdiff_t>(k);
  if (k * 8 > n_vocab) {
    std::iota(order_.begin(), order_.end(), 0);
    std::nth_element(order_.begin(), k_end, order_.end(), ranks_higher);
  } else {
    // One pass keeping the best k so far in a heap whose top is the worst of them. Ids arrive in ascending
    // order, so a later id loses ties and only a strictly higher logit displaces the top.
    std::iota(order_.begin(), k_end, 0);
    std::make_heap(order_.begin(), k_end, ranks_higher);
    float entry = logits[order_[0]];
    for (size_t id = k; id < n_vocab; ++id) {
      if (logits[id] > entry) {
        std::pop_heap(order_.begin(), k_end, ranks_higher);
        order_[k - 1] = static_cast<int32_t>(id);
        std::push_heap(order_.begin(), k_end, ranks_higher);
        entry = logits[order_[0]];
      }
    }
  }
  sort_by_logit(k);
  const float temperature = params_.temperature;
  size_t n = 0;
  for (size_t i = 0; i < k; ++i) {
    const auto id = static_cast<size_t>(order_[i]);
    weights_[id] = std::exp((logits_[id] - max_logit) / temperature);
    if (weights_[id] > 0.0f) n = i + 1;  // weights do not increase along order_, so this trims the zeros
  }
  return n;
}

double Sampler::weigh_all(float max_logit, bool by_octave) {
  const float temperature = params_.temperature;
  const size_t n_vocab = logits_.size();
  for (size_t id = 0; id < n_vocab; ++id) weights_[id] = std::exp((logits_[id] - max_logit) / temperature);
  double total = 0.0;
  if (!by_octave) {
    for (size_t id = 0; id < n_vocab; ++id) total += weights_[id];
    return total;
  }
  // Neighbouring weights often share an octave; spreading them over four tables keeps the additions
  // independent instead of waiting on each other through memory.
  constexpr size_t kTables = 4;
  double mass[kTables][kOctaves] = {};
  size_t id = 0;
  for (; id + kTables <= n_vocab; id += kTables) {
    for (size_t t = 0; t < kTables; ++t) mass[t][octave_of(weights_[id + t])] += weights_[id + t];
  }
  for (; id < n_vocab; ++id) mass[0][octave_of(weights_[id])] += weights_[id];
  for (int octave = 0; octave < kOctaves; ++octave) {
    double sum = 0.0;
    for (size_t t = 0; t < kTables; ++t) sum += mass[t][octave];
    mass_by_octave_[octave] = sum;
    total += sum;
  }
  return total;
}

size_t Sampler::collect_above(float threshold) {
  // Only weights > 0 count, so a threshold of 0 becomes the smallest positive float. Branch-free: few tokens
  // pass, at unpredictable places.
  threshold = std::max(threshold, std::numeric_limits<float>::denorm_min());
  size_t n = 0;
  for (size_t id = 0; id < weights_.size(); ++id) {
    order_[n] = static_cast<int32_t>(id);
    n += weights_[id] >= threshold;
  }
  return n;
}

size_t Sampler::select_top_p_candidates(double total_weight) {
  // The top-p prefix lies within the tokens above any weight threshold whose mass reaches top_p, so sort only
  // those: start from the highest octave boundary that gets there. With min-p on, tokens below min_p are
  // dropped after top-p anyway, so they need not be collected either.
  const Params& p = params_;
  const double target = static_cast<double>(p.top_p) * total_weight;
  int octave = 0;
  for (double mass = 0.0; octave < kOctaves - 1; ++octave) {
    mass += mass_by_octave_[octave];
    if (mass >= target) break;
  }
  for (;; ++octave) {
    const float boundary = octave >= kOctaves - 1 ? 0.0f : std::ldexp(1.0f, -octave);
    const bool covers_min_p = p.min_p > 0.0f && p.min_p >= boundary;
    const size_t n = collect_above(std::max(boundary, p.min_p));
    sort_by_logit(n);
    bool reached = false;
    const size_t cut = top_p_cut(n, total_weight, reached);
    // Not reached (rounding at the boundary): take one more octave, unless nothing is left below.
    if (reached || covers_min_p || boundary == 0.0f) return cut;
  }
}

size_t Sampler::top_p_cut(size_t n, double total_weight, bool& reached) const {
  reached = false;
  if (params_.top_p >= 1.0f) return n;
  const double target = static_cast<double>(params_.top_p) * total_weight;
  double cumulative = 0.0;
  for (size_t i = 0; i < n; ++i) {
    cumulative += weights_[static_cast<size_t>(order_[i])];
    if (cumulative >= target) {
      reached = true;
      return i + 1;
    }
  }
  return n;
}

void Sampler::write_output(size_t n, bool ids_ascending, Distribution& out) {
  if (!ids_ascending) std::sort(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(n));
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) sum += weights_[static_cast<size_t>(order_[i])];
  for (size_t i = 0; i < n; ++i) {
    out.ids.push_back(order_[i]);
    out.probs.push_back(static_cast<float>(weights_[static_cast<size_t>(order_[i])] / sum));
  }
}

void Sampler::distribution(std::span<const float> logits, std::span<const int32_t> history,
                           Distribution& out) {
  out.clear();
  const size_t n_vocab = logits.size();
  if (n_vocab == 0) throw Error("sampling: the logits are empty");
  if (n_vocab > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    throw Error("sampling: a vocabulary of " + std::to_string(n_vocab) + " tokens does not fit int32 ids");
  }
  logits_.assign(logits.begin(), logits.end());
  float max_logit = checked_max(logits_);
  if (apply_penalties(history)) max_logit = checked_max(logits_);

  const Params& p = params_;
  if (p.temperature <= 0.0f) {
    const auto first_max = std::find(logits_.begin(), logits_.end(), max_logit);
    out.ids.push_back(static_cast<int32_t>(first_max - logits_.begin()));
    out.probs.push_back(1.0f);
    return;
  }
  weights_.resize(n_vocab);
  order_.resize(n_vocab);

  size_t n = 0;  // candidates in order_[0, n), by descending logit
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < n_vocab) {
    n = select_top_k(static_cast<size_t>(p.top_k), max_logit);
    double total = 0.0;
    for (size_t i = 0; i < n; ++i) total += weights_[static_cast<size_t>(order_[i])];
    bool reached = false;
    n = top_p_cut(n, total, reached);
  } else {
    const double total = weigh_all(max_logit, /*by_octave=*/p.top_p < 1.0f);
    if (p.top_p >= 1.0f) {
      // No cut needs an order: min-p is a plain threshold on the weights (the largest weight is 1).
      n = collect_above(p.min_p);
      write_output(n, /*ids_ascending=*/true, out);
      return;
    }
    n = select_top_p_candidates(total);
  }
  if (p.min_p > 0.0f) {
    while (n > 1 && weights_[static_cast<size_t>(order_[n - 1])] < p.min_p) --n;
  }
  write_output(n, /*ids_ascending=*/false, out);
}

int32_t Sampler::draw(const Distribution& d, uint64_t sequence, uint64_t position,
                      uint32_t draw_index) const {
  TANDEM_CHECK(!d.ids.empty() && d.ids.size() == d.probs.size(), "draw needs a non-empty distribution");
  double total = 0.0;
  for (float prob : d.probs) total += prob;
  const double target = uniform(params_.seed, sequence, position, draw_index) * total;
  double cumulative = 0.0;
  for (size_t i = 0; i < d.probs.size(); ++i) {
    cumulative += d.probs[i];
    if (target < cumulative) return d.ids[i];
  }
  // Rounding left target at or past the sum: take the last token that has any probability.
  for (size_t i = d.probs.size(); i-- > 0;) {
    if (d.probs[i] > 0.0f) return d.ids[i];
  }
  return d.ids.back();
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history, uint64_t sequence,
                        uint64_t position) {
  distribution(logits, history, sample_scratch_);
  return draw(sample_scratch_, sequence, position, 0);
}

int32_t argmax(std::span<const float> logits) {
  TANDEM_CHECK(!logits.empty(), "argmax of empty logits");
  const float max_logit = max_of(logits);
  const auto it = std::find(logits.begin(), logits.end(), max_logit);
  return it == logits.end() ? 0 : static_cast<int32_t>(it - logits.begin());  // end: all NaN
}

void log_softmax(std::span<const float> logits, std::span<double> out) {
  TANDEM_CHECK(!logits.empty() && out.size() == logits.size(),
               "log_softmax needs out.size() == logits.size()");
  const double max_logit = checked_max(logits);
  double sum = 0.0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - max_logit);
  const double log_norm = max_logit + std::log(sum);
  for (size_t i = 0; i < logits.size(); ++i) out[i] = static_cast<double>(logits[i]) - log_norm;
}

}  // namespace tandem::sampling
