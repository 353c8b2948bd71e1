#include "tandem/model/moe.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "tandem/kernels/ops.h"
#include "tandem/util/error.h"

namespace tandem::model {
namespace {

// The index of the highest value among v[i] for eligible i (ties: the lower index); -1 when none is left.
int64_t best_of(const float* v, const uint8_t* taken, int64_t n) {
  int64_t best = -1;
  for (int64_t i = 0; i < n; ++i)
    if (!taken[i] && (best < 0 || v[i] > v[best])) best = i;
  return best;
}

// Output rows per task tile of run_products: whole 16-row tiles, as row_range takes matrices in row tiles.
// (Results do not depend on it: every output row is computed alone.)
constexpr int64_t kUnitRows = 16;

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace

float route(const MoeConfig& m, const float* logits, const float* bias, int32_t* experts, float* weights,
            float* scores) {
  const int64_t n = m.n_expert, k = m.n_expert_used;
  if (m.gating == ExpertGating::kSoftmax) {
    const float mx = *std::max_element(logits, logits + n);
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      scores[i] = std::exp(logits[i] - mx);
      sum += scores[i];
    }
    const auto inv = static_cast<float>(1.0 / sum);
    for (int64_t i = 0; i < n; ++i) scores[i] *= inv;
  } else {
    for (int64_t i = 0; i < n; ++i) scores[i] = 1.0f / (1.0f + std::exp(-logits[i]));
  }
  // Selection scores and the experts ruled out (taken or in a group not chosen), on the stack: n_expert is
  // bounded by kMaxExperts.
  float sel[kMaxExperts];
  uint8_t out[kMaxExperts] = {};
  for (int64_t i = 0; i < n; ++i) sel[i] = scores[i] + (bias ? bias[i] : 0.0f);
  if (m.n_group > 1 && m.n_group_used < m.n_group) {
    const int64_t per = n / m.n_group;
    float group_score[kMaxExperts];
    uint8_t group_out[kMaxExperts] = {};
    for (int64_t g = 0; g < m.n_group; ++g) {
      // The sum of the group's two best selection scores (its one score when the group has one expert).
      float first = -std::numeric_limits<float>::infinity(), second = per > 1 ? first : 0.0f;
      for (int64_t i = g * per; i < (g + 1) * per; ++i) {
        if (sel[i] > first) {
          second = first;
          first = sel[i];
        } else if (sel[i] > second) {
          second = sel[i];
        }
      }
      group_score[g] = first + second;
    }
    uint8_t kept[kMaxExperts] = {};
    for (int64_t j = 0; j < m.n_group_used; ++j) {
      const int64_t g = best_of(group_score, group_out, m.n_group);
      group_out[g] = 1;
      kept[g] = 1;
    }
    for (int64_t i = 0; i < n; ++i) out[i] = kept[i / per] ? 0 : 1;
  }
  double sum = 0;
  for (int64_t j = 0; j < k; ++j) {
    const int64_t e = best_of(sel, out, n);
    out[e] = 1;
    experts[j] = static_cast<int32_t>(e);
    weights[j] = scores[e];
    sum += scores[e];
  }
  const int64_t next = best_of(sel, out, n);
  const float gap = next < 0 ? std::numeric_limits<float>::infinity() : sel[experts[k - 1]] - sel[next];
  const float scale = m.norm_top_k ? static_cast<float>(m.weights_scale / sum) : m.weights_scale;
  for (int64_t j = 0; j < k; ++j) weights[j] *= scale;
  return gap;
}

MoeFfn::MoeFfn(const Config& c, int64_t max_rows) : m_(c.moe), n_embd_(c.n_embd) {
  const MoeConfig& m = c.moe;
  const auto rows = static_cast<size_t>(max_rows), k = static_cast<size_t>(m.n_expert_used);
  const auto embd = static_cast<size_t>(c.n_embd);
  const auto ff = static_cast<size_t>(std::max(m.n_ff_expert, m.n_ff_shared));
  logits_.resize(rows * static_cast<size_t>(m.n_expert));
  scores_.resize(static_cast<size_t>(m.n_expert));
  chosen_.resize(rows * k);
  weights_.resize(rows * k);
  gaps_.resize(rows);
  offsets_.resize(static_cast<size_t>(m.n_expert) + 1);
  slots_.resize(rows * k);
  xe_.resize(rows * embd);
  gate_.resize(rows * ff);
  up_.resize(rows * ff);
  ye_.resize(rows * embd);
  slot_out_.resize(rows * k * embd);
  shared_out_.resize(rows * embd);
  const auto few = static_cast<size_t>(std::min(max_rows, kernels::kMaxWindowRows));
  const auto f = static_cast<size_t>(m.n_ff_expert);
  xs_.resize(few * k * embd);
  gs_.resize(few * k * f);
  us_.resize(few * k * f);
  ys_.resize(few * k * embd);
  // Two products per chosen expert (at most few * k of them) and two of the shared expert.
  const size_t products = 2 * std::min(few * k, static_cast<size_t>(m.n_expert)) + 2;
  products_.reserve(products);
  first_unit_.reserve(products + 1);
}

void MoeFfn::run(const MoeWeights& w, float* x, int64_t n, ThreadPool& pool, kernels::MatmulScratch& scratch,
                 ExpertResidency* residency, int64_t layer) {
  const int64_t E = m_.n_expert, K = m_.n_expert_used, D = n_embd_;
  kernels::matmul(w.router, x, n, logits_.data(), pool, scratch);
  for (int64_t r = 0; r < n; ++r)
    gaps_[static_cast<size_t>(r)] = route(m_, logits_.data() + r * E, w.selection_bias.data,
                                          chosen_.data() + r * K, weights_.data() + r * K, scores_.data());

  // Group the (row, slot) pairs by expert, rows in order within each expert (a counting sort).
  std::fill(offsets_.begin(), offsets_.end(), 0);
  for (int64_t s = 0; s < n * K; ++s) ++offsets_[static_cast<size_t>(chosen_[static_cast<size_t>(s)]) + 1];
  for (int64_t e = 0; e < E; ++e) offsets_[static_cast<size_t>(e) + 1] += offsets_[static_cast<size_t>(e)];
  for (int64_t s = 0; s < n * K; ++s) {
    const auto e = static_cast<size_t>(chosen_[static_cast<size_t>(s)]);
    // offsets_[e] advances to the next free entry; restored below.
    slots_[static_cast<size_t>(offsets_[e]++)] = s;
  }
  for (int64_t e = E; e > 0; --e) offsets_[static_cast<size_t>(e)] = offsets_[static_cast<size_t>(e) - 1];
  offsets_[0] = 0;

  // A call of few rows gives each expert a row or two, so each expert's products are small: a parallel
  // region for each (a fork, a join and the activations quantized again) is paid twice per chosen expert and
  // twice for the shared one, each for little work. Run as tasks of two regions, they pay it twice a layer.
  // That holds up to windows of kMaxWindowRows rows: 6 slots of each of 16 rows over 64 experts still leave
  // each chosen expert a row or two. Prefill-sized calls keep a region per expert: there each expert gets
  // enough rows for its own region to pay, its rows are quantized once for all threads and meet the direct
  // kernels' widest passes, where tasks would quantize them again for every task and take them
  // kOwnActivationRows at a time (matmul_on_thread).
  if (schedule_ == ExpertSchedule::kAuto && n <= kernels::kMaxWindowRows)
    run_together(w, x, n, pool, scratch, residency, layer);
  else
    run_per_expert(w, x, n, pool, scratch, residency, layer);

  for (int64_t r = 0; r < n; ++r) {
    float* o = x + r * D;
    const bool gated = !w.shared_gate_inp.empty();
    const float g = gated ? 1.0f / (1.0f + std::exp(-kernels::dot_f32(o, w.shared_gate_inp.data, D))) : 1.0f;
    std::fill_n(o, D, 0.0f);
    for (int64_t j = 0; j < K; ++j) {
      const float wj = weights_[static_cast<size_t>(r * K + j)];
      const float* y = slot_out_.data() + (r * K + j) * D;
      for (int64_t i = 0; i < D; ++i) o[i] += wj * y[i];
    }
    if (w.shared_gate.empty()) continue;
    const float* sh = shared_out_.data() + r * D;
    if (gated) {
      for (int64_t i = 0; i < D; ++i) o[i] += g * sh[i];
    } else {
      kernels::add_in_place(o, sh, D);
    }
  }
}

void MoeFfn::run_per_expert(const MoeWeights& w, const float* x, int64_t n, ThreadPool& pool,
                            kernels::MatmulScratch& scratch, ExpertResidency* residency, int64_t layer) {
  const int64_t E = m_.n_expert, K = m_.n_expert_used, D = n_embd_, F = m_.n_ff_expert;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t first = offsets_[static_cast<size_t>(e)],
                  count = offsets_[static_cast<size_t>(e) + 1] - first;
    if (count == 0) continue;
    for (int64_t i = 0; i < count; ++i)
      std::copy_n(x + (slots_[static_cast<size_t>(first + i)] / K) * D, D, xe_.data() + i * D);
    const auto i_e = static_cast<size_t>(e);
    const ExpertViews file{w.gate[i_e], w.up[i_e], w.down[i_e]};
    const ExpertViews& v = residency ? residency->views(layer, e) : file;
    if (residency) residency->record(layer, e);
    const kernels::MatmulOut gate_up[] = {{&v.gate, gate_.data()}, {&v.up, up_.data()}};
    kernels::matmul_group(gate_up, xe_.data(), count, pool, scratch);
    for (int64_t i = 0; i < count; ++i)
      kernels::swiglu(gate_.data() + i * F, up_.data() + i * F, gate_.data() + i * F, F);
    kernels::matmul(v.down, gate_.data(), count, ye_.data(), pool, scratch);
    for (int64_t i = 0; i < count; ++i)
      std::copy_n(ye_.data() + i * D, D, slot_out_.data() + slots_[static_cast<size_t>(first + i)] * D);
  }

  if (!w.shared_gate.empty()) {
    const int64_t S = m_.n_ff_shared;
    const kernels::MatmulOut gate_up[] = {{&w.shared_gate, gate_.data()}, {&w.shared_up, up_.data()}};
    kernels::matmul_group(gate_up, x, n, pool, scratch);
    for (int64_t r = 0; r < n; ++r)
      kernels::swiglu(gate_.data() + r * S, up_.data() + r * S, gate_.data() + r * S, S);
    kernels::matmul(w.shared_down, gate_.data(), n, shared_out_.data(), pool, scratch);
  }
}

void MoeFfn::run_together(const MoeWeights& w, const float* x, int64_t n, ThreadPool& pool,
                          kernels::MatmulScratch& scratch, ExpertResidency* residency, int64_t layer) {
  const int64_t E = m_.n_expert, K = m_.n_expert_used, D = n_embd_, F = m_.n_ff_expert, S = m_.n_ff_shared;
  const auto views = [&](int64_t e) {
    const auto i_e = static_cast<size_t>(e);
    return residency ? residency->views(layer, e) : ExpertViews{w.gate[i_e], w.up[i_e], w.down[i_e]};
  };
  // Each expert's rows at its entries of slots_ (p = first .. first + count - 1), then its gate and up
  // products over them; the shared expert's over all rows.
  products_.clear();
  for (int64_t e = 0; e < E; ++e) {
    const int64_t first = offsets_[static_cast<size_t>(e)],
                  count = offsets_[static_cast<size_t>(e) + 1] - first;
    if (count == 0) continue;
    for (int64_t p = first; p < first + count; ++p)
      std::copy_n(x + (slots_[static_cast<size_t>(p)] / K) * D, D, xs_.data() + p * D);
    const ExpertViews v = views(e);
    if (residency) residency->record(layer, e);
    products_.push_back({v.gate, xs_.data() + first * D, D, count, gs_.data() + first * F, F, 0});
    products_.push_back({v.up, xs_.data() + first * D, D, count, us_.data() + first * F, F, 0});
  }
  const bool shared = !w.shared_gate.empty();
  if (shared) {
    products_.push_back({w.shared_gate, x, D, n, gate_.data(), S, 0});
    products_.push_back({w.shared_up, x, D, n, up_.data(), S, 0});
  }
  run_products(pool, scratch);

  for (int64_t p = 0; p < n * K; ++p)
    kernels::swiglu(gs_.data() + p * F, us_.data() + p * F, gs_.data() + p * F, F);
  if (shared)
    for (int64_t r = 0; r < n; ++r)
      kernels::swiglu(gate_.data() + r * S, up_.data() + r * S, gate_.data() + r * S, S);

  products_.clear();
  for (int64_t e = 0; e < E; ++e) {
    const int64_t first = offsets_[static_cast<size_t>(e)],
                  count = offsets_[static_cast<size_t>(e) + 1] - first;
    if (count == 0) continue;
    products_.push_back({views(e).down, gs_.data() + first * F, F, count, ys_.data() + first * D, D, 0});
  }
  if (shared) products_.push_back({w.shared_down, gate_.data(), S, n, shared_out_.data(), D, 0});
  run_products(pool, scratch);

  for (int64_t p = 0; p < n * K; ++p)
    std::copy_n(ys_.data() + p * D, D, slot_out_.data() + slots_[static_cast<size_t>(p)] * D);
}

int64_t MoeFfn::weigh_products() {
  first_unit_.clear();
  int64_t units = 0;
  for (const Product& p : products_) {
    first_unit_.push_back(units);
    units += ceil_div(p.w.rows, kUnitRows) * p.rows;
  }
  first_unit_.push_back(units);
  return units;
}

MoeFfn::TileRange MoeFfn::tiles_starting_in(size_t i, int64_t u0, int64_t u1) const {
  const int64_t first = first_unit_[i], rows = products_[i].rows;
  // Tile t of product i starts at unit first + t * rows.
  return {ceil_div(std::max(u0, first) - first, rows),
          ceil_div(std::min(u1, first_unit_[i + 1]) - first, rows)};
}

void MoeFfn::run_products(ThreadPool& pool, kernels::MatmulScratch& scratch) {
  // The tiles of kUnitRows output rows of all products end to end, each weighing its product's rows (a
  // tile's multiply-adds are its output rows times its input rows: in a window the shared expert's tiles
  // carry every row, a routed expert's a row or two), shared out as matmul_group shares its units: each
  // thread streams a contiguous run of units, then steals from the others' tails, and runs the tiles that
  // start in the units it takes. A task computes its tiles of a product as a matrix of its own (row_range)
  // on its thread; matmul_on_thread gives every row the bits matmul() gives it.
  // Products of one input (an expert's gate and up) share a call number, so a thread quantizes each input
  // once for all its tasks of it (matmul_on_thread).
  const Product* prev = nullptr;
  for (Product& p : products_) {
    const bool same_input = prev && prev->x == p.x && prev->x_stride == p.x_stride && prev->rows == p.rows &&
                            prev->w.cols == p.w.cols && prev->w.type == p.w.type && prev->w.form == p.w.form;
    p.call = same_input ? prev->call : scratch.next_call();
    prev = &p;
  }
  const int64_t units = weigh_products();
  pool.parallel_for_stealing(units, 1, [&](int64_t u0, int64_t u1, int thread) {
    // The last product that starts at or before u0, then on while products start before u1.
    auto i = static_cast<size_t>(std::upper_bound(first_unit_.begin(), first_unit_.end() - 1, u0) -
                                 first_unit_.begin() - 1);
    for (; i < products_.size() && first_unit_[i] < u1; ++i) {
      const TileRange t = tiles_starting_in(i, u0, u1);
      if (t.first >= t.last) continue;
      const Product& p = products_[i];
      const int64_t o0 = t.first * kUnitRows, o1 = std::min(p.w.rows, t.last * kUnitRows);
      kernels::matmul_on_thread(p.w.row_range(o0, o1 - o0), p.x, p.x_stride, p.rows, p.y + o0, p.y_stride,
                                scratch, thread, p.call);
    }
  });
}

std::vector<int64_t> MoeFfn::initial_shares(int threads) const {
  std::vector<int64_t> work(static_cast<size_t>(threads), 0);
  const int64_t units = first_unit_.empty() ? 0 : first_unit_.back();
  for (int t = 0; t < threads; ++t) {
    // parallel_for_stealing's initial share of thread t.
    const int64_t u0 = t * units / threads, u1 = (t + 1) * units / threads;
    for (size_t i = 0; i < products_.size(); ++i) {
      const TileRange r = tiles_starting_in(i, u0, u1);
      const Product& p = products_[i];
      for (int64_t k = r.first; k < r.last; ++k)
        work[static_cast<size_t>(t)] += p.rows * (std::min(p.w.rows, (k + 1) * kUnitRows) - k * kUnitRows);
    }
  }
  return work;
}

}  // namespace tandem::model
