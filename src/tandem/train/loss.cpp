#include "tandem/train/loss.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "tandem/kernels/float_kernels.h"
#include "tandem/train/linalg.h"
#include "tandem/util/error.h"

namespace tandem::train {
namespace {

// Rows per chunk of logits.
constexpr int64_t kChunkRows = 64;
// The smallest drafter mass the left-over outcome is given: keeps its loss finite when every token outside
// the top k underflows.
constexpr double kMinRestMass = 1e-37;

std::string where(int64_t r, int64_t e) {
  return "row " + std::to_string(r) + ", entry " + std::to_string(e);
}

bool bad(float x) {
  return !std::isfinite(x) || x < 0;
}

}  // namespace

void validate_targets(const SoftTargets& t, int64_t vocab) {
  if (t.probs == nullptr) throw Error("soft targets need probabilities");
  if (t.ids == nullptr && t.top_k != vocab)
    throw Error("full soft targets list every id: top_k must be the vocabulary size " +
                std::to_string(vocab) + " (got " + std::to_string(t.top_k) + ")");
  if (t.top_k <= 0 || t.top_k > vocab)
    throw Error("soft targets need 1 to " + std::to_string(vocab) + " entries per row (got " +
                std::to_string(t.top_k) + ")");
  std::vector<int64_t> seen(static_cast<size_t>(vocab), -1);  // the last row that listed each id
  for (int64_t r = 0; r < t.rows; ++r) {
    for (int64_t e = 0; e < t.top_k; ++e) {
      if (bad(t.probs[r * t.top_k + e]))
        throw Error("soft target probability at " + where(r, e) + " is negative or not finite");
      if (t.ids == nullptr) continue;
      const int32_t id = t.ids[r * t.top_k + e];
      if (id == -1) {
        if (t.probs[r * t.top_k + e] != 0)
          throw Error("soft target entry at " + where(r, e) + " is unused (id -1) but has a probability");
        continue;
      }
      if (id < 0 || id >= vocab)
        throw Error("soft target id " + std::to_string(id) + " at " + where(r, e) +
                    " is outside the vocabulary of " + std::to_string(vocab));
      if (seen[static_cast<size_t>(id)] == r)
        throw Error("soft target id " + std::to_string(id) + " appears twice in row " + std::to_string(r));
      seen[static_cast<size_t>(id)] = r;
    }
    if (t.rest != nullptr && bad(t.rest[r]))
      throw Error("soft target left-over mass at row " + std::to_string(r) + " is negative or not finite");
    if (t.rest != nullptr && t.ids == nullptr && t.rest[r] != 0)
      throw Error("full soft targets leave no mass over, but row " + std::to_string(r) + " has " +
                  std::to_string(t.rest[r]));
    if (t.weight != nullptr && bad(t.weight[r]))
      throw Error("loss weight at row " + std::to_string(r) + " is negative or not finite");
  }
}

LossStats head_soft_cross_entropy(Param& head, const float* h, const SoftTargets& t, float* dh, Compute& c) {
  const int64_t V = head.rows, n = head.cols, K = t.top_k;
  validate_targets(t, V);
  LossStats stats;
  for (int64_t r = 0; r < t.rows; ++r) stats.counted += (t.mask == nullptr || t.mask[r] != 0) ? 1 : 0;
  const double norm = stats.counted > 0 ? 1.0 / static_cast<double>(stats.counted) : 0.0;
  const bool grads = dh != nullptr;

  for (int64_t r0 = 0; r0 < t.rows; r0 += kChunkRows) {
    const int64_t cr = std::min(kChunkRows, t.rows - r0);
    float* z = c.scratch.get(3, cr * V + 2 * cr);  // [cr, V] logits, then probabilities, then dL/dz
    float* row_loss = z + cr * V;                  // [cr] weighted, 0 where masked
    float* row_agree = row_loss + cr;              // [cr]
    matmul_xwt(h + r0 * n, cr, n, head.value.data(), V, z, c);
    c.pool.parallel_for(cr, 4, [&](int64_t a, int64_t b, int) {
      for (int64_t lr = a; lr < b; ++lr) {
        const int64_t r = r0 + lr;
        float* zr = z + lr * V;
        const int32_t* ids = t.ids != nullptr ? t.ids + r * K : nullptr;
        const float* p = t.probs + r * K;
        const float rest = t.rest != nullptr ? t.rest[r] : 0.0f;
        const bool counted = t.mask == nullptr || t.mask[r] != 0;
        const double coef = counted ? (t.weight != nullptr ? t.weight[r] : 1.0) * norm : 0.0;

        // log q_i = z_i - zmax + log q_arg, from the logits before they turn into probabilities.
        const int64_t arg = std::max_element(zr, zr + V) - zr;
        const double zmax = zr[arg];
        double loss = 0, listed = 0;
        int64_t best = 0;
        for (int64_t e = 0; e < K; ++e) {
          const int64_t id = ids != nullptr ? ids[e] : e;
          if (id < 0) continue;  // an unused entry
          loss -= static_cast<double>(p[e]) * (zr[id] - zmax);
          listed += p[e];
          if (p[e] > p[best] || (ids != nullptr && ids[best] < 0)) best = e;
        }
        kernels::softmax(zr, V, 1.0f, 0.0f);
        loss -= listed * std::log(static_cast<double>(zr[arg]));
        const double total = listed + rest;  // the target's whole mass

        if (ids == nullptr) {  // every id listed: dz_j = q_j S - p_j
          for (int64_t j = 0; grads && j < V; ++j) zr[j] = static_cast<float>(coef * (zr[j] * total - p[j]));
        } else {
          // The listed ids are marked by negating their probabilities (q >= 0), so that the left-over mass
          // is summed over exactly the other tokens (no cancellation when it is small) and the pass over all
          // tokens below leaves the listed ones alone.
          for (int64_t e = 0; e < K; ++e)
            if (ids[e] >= 0) zr[ids[e]] = -zr[ids[e]];
          double rest_q = 0;
          if (rest > 0) {
            for (int64_t j = 0; j < V; ++j) rest_q += std::max(zr[j], 0.0f);
            rest_q = std::max(rest_q, kMinRestMass);
            loss -= rest * std::log(rest_q);
          }
          if (grads) {
            // Outside the top k: dz_j = q_j (S - r / Q_rest); listed: dz_i = q_i S - p_i.
            const double factor = coef * (total - (rest > 0 ? rest / rest_q : 0.0));
            for (int64_t j = 0; j < V; ++j)
              if (!(zr[j] < 0)) zr[j] = static_cast<float>(zr[j] * factor);
            for (int64_t e = 0; e < K; ++e) {
              if (ids[e] < 0) continue;
              const double q = -static_cast<double>(zr[ids[e]]);
              zr[ids[e]] = static_cast<float>(coef * (q * total - p[e]));
            }
          }
        }
        row_loss[lr] = counted ? static_cast<float>(loss * (t.weight != nullptr ? t.weight[r] : 1.0)) : 0.0f;
        row_agree[lr] = counted && (ids != nullptr ? ids[best] : best) == arg ? 1.0f : 0.0f;  // -1 never
      }
    });
    for (int64_t lr = 0; lr < cr; ++lr) {
      stats.loss += row_loss[lr];
      stats.agree += row_agree[lr] != 0 ? 1 : 0;
    }
    if (dh != nullptr) matmul_dyw(z, cr, V, head.value.data(), n, dh + r0 * n, false, c);
    if (grads && head.trainable()) matmul_dyt_x(z, cr, V, h + r0 * n, n, head.grad.data(), c);
  }
  stats.loss *= norm;
  return stats;
}

}  // namespace tandem::train
