// Token sampling: composable transforms from raw logits to a sparse probability distribution, and draws
// from such distributions with counter-based randomness (rng.h).
//
// The transforms run in this fixed order, each seeing the output of the one before:
//   1. Penalties, over the window: the last repeat_last_n tokens of the history. For each distinct token
//      in the window, with `count` its number of occurrences there:
//        repetition:           logit = logit > 0 ? logit / repeat_penalty : logit * repeat_penalty
//        presence, frequency:  logit -= presence_penalty * (count > 0) + frequency_penalty * count
//   2. Temperature: logit / temperature. temperature == 0 is greedy: the argmax of the penalized logits
//      (lowest id on ties) gets probability 1, and steps 3-5 do not apply.
//   3. Top-k: keep the top_k highest logits (lowest id on ties).
//   4. Top-p: softmax over the survivors, then keep the smallest highest-probability prefix with mass
//      >= top_p.
//   5. Min-p: keep the tokens whose probability is >= min_p * (the largest probability).
//   The survivors are renormalized to sum to 1.
//
// Speculative sampling uses distribution() for the target (p) and the drafter (q) over the same
// vocabulary, then draw() from p, from q, or from residual(p, q) = normalize(max(0, p - q)).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "tandem/sampling/rng.h"

namespace tandem::sampling {

// Sampling parameters; validate() checks each range below.
struct Params {
  float temperature = 0.8f;        // >= 0; 0 is greedy
  int top_k = 40;                  // <= 0 disables
  float top_p = 0.95f;             // in (0, 1]; 1 disables
  float min_p = 0.05f;             // <= 1; <= 0 disables
  float repeat_penalty = 1.0f;     // > 0; 1 disables
  int repeat_last_n = 64;          // penalty window; 0 disables penalties, -1 is the whole history
  float presence_penalty = 0.0f;   // finite; 0 disables
  float frequency_penalty = 0.0f;  // finite; 0 disables
  uint64_t seed = 0;               // first part of every random key
};

// Throws tandem::Error naming the first bad parameter and the accepted range.
void validate(const Params& params);

// A sparse probability distribution over token ids: the tokens with probability > 0.
struct Distribution {
  std::vector<int32_t> ids;  // (n_kept) strictly ascending token ids
  std::vector<float> probs;  // (n_kept) probability of ids[i], > 0, summing to 1 up to float rounding

  // Probability of `id`, 0 when absent. Binary search: O(log n_kept).
  float prob_of(int32_t id) const;
  // Empties the distribution, keeping its capacity.
  void clear();
  size_t size() const { return ids.size(); }
};

// out = normalize(max(0, p - q)): the distribution a speculative step samples from after rejecting a drafted
// token. p and q must follow Distribution's contract (ascending ids); O(|p| + |q|). When p - q has no
// positive mass (p == q up to rounding, where a rejection cannot occur) out is a copy of p. `out` must not
// alias p or q.
void residual(const Distribution& p, const Distribution& q, Distribution& out);

// Holds the parameters and the scratch buffers of one sampling pipeline. distribution() and sample() write
// the scratch, so one Sampler must not be used by two threads at once; draw() is const and thread-safe.
// Scratch grows to the largest vocabulary seen and is then reused: steady-state calls do not allocate.
class Sampler {
 public:
  // Validates `params` (throws tandem::Error on a bad one).
  explicit Sampler(Params params);

  // logits: (n_vocab) raw logits, not modified; finite or -inf (a NaN or +inf throws tandem::Error).
  // history: tokens generated or seen so far, each in [0, n_vocab); only the penalty window is read.
  // Writes the distribution after all transforms into `out`, reusing its capacity; greedy gives a single id
  // with probability 1. Throws tandem::Error when every logit is -inf.
  void distribution(std::span<const float> logits, std::span<const int32_t> history, Distribution& out);

  // Draws one token from `d` (non-empty) by inverse CDF over its ids in order, with the uniform number
  // keyed by (params().seed, sequence, position, draw_index). `d` need not sum to 1: the draw scales by
  // its sum.
  int32_t draw(const Distribution& d, uint64_t sequence, uint64_t position, uint32_t draw_index = 0) const;

  // distribution() followed by draw() with draw_index 0.
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history, uint64_t sequence,
                 uint64_t position);

  const Params& params() const { return params_; }

 private:
  // Returns whether any logit changed.
  bool apply_penalties(std::span<const int32_t> history);
  // Fills order_[0, k) with the top-k ids by descending logit (lowest id on ties) and weights_ for them;
  // returns how many of them have a weight > 0.
  size_t select_top_k(size_t k, float max_logit);
  // Fills weights_ for every id and returns their sum; with by_octave, also fills mass_by_octave_.
  double weigh_all(float max_logit, bool by_octave);
  // For top-p without top-k: fills order_ with a prefix of the descending order that the cut needs.
  size_t select_top_p_candidates(double total_weight);
  // Fills order_ (ascending ids) with every id whose weight is >= threshold and > 0; returns their count.
  size_t collect_above(float threshold);
  void sort_by_logit(size_t n);
  // Length of the top-p prefix of order_[0, n); reached tells whether its mass got to top_p.
  size_t top_p_cut(size_t n, double total_weight, bool& reached) const;
  // Writes order_[0, n) and their renormalized weights; sorts them by id first unless they already are.
  void write_output(size_t n, bool ids_ascending, Distribution& out);

  Params params_;
  std::vector<float> logits_;    // (n_vocab) penalized logits
  std::vector<float> weights_;   // (n_vocab) exp((logit - max_logit) / temperature) by id; 1 at the max
  std::vector<int32_t> order_;   // (n_vocab) candidate ids; sorted by descending logit where a cut needs it
  std::vector<int32_t> window_;  // (penalty window) sorted copy of the window's tokens
  // Weight mass by binary order of magnitude: [e] sums the weights in [2^-e, 2^(1-e)); [kOctaves - 1] also
  // holds the subnormals.
  static constexpr int kOctaves = 128;
  double mass_by_octave_[kOctaves] = {};
  Distribution sample_scratch_;  // sample()'s distribution
};

// Index of the largest logit; the lowest index wins ties, NaN never wins. `logits` must be non-empty.
int32_t argmax(std::span<const float> logits);

// out[i] = log softmax(logits)[i], computed in double (for logprob reporting). Needs out.size() ==
// logits.size() > 0. Throws tandem::Error on a NaN or +inf logit, or when every logit is -inf.
void log_softmax(std::span<const float> logits, std::span<double> out);

}  // namespace tandem::sampling
