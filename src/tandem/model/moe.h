// Mixture-of-experts feed-forward layers (qwen2moe, qwen3moe, deepseek2, jamba): the router, top-k selection,
// the routed SwiGLU experts and the shared expert.
//
// Rows are grouped by expert: each expert that any row of a call chose runs one matrix product over the rows
// routed to it, reading only its own weights. Every matmul row's result depends only on that row
// (kernels/matmul.h), and each row sums its experts' outputs in the order of its top-k slots, so a row gets
// the same bits alone, in a verify window or in a prefill batch.
//
// Calls of up to a verify window's rows (decode, windows) run the gate and up products of all chosen experts
// and of the shared expert as tasks of one parallel region, then all down products in a second one;
// prefill-sized calls run each expert's products in regions of their own (MoeFfn::run says why). Both give
// the same bits.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "tandem/kernels/matmul.h"
#include "tandem/model/expert_residency.h"
#include "tandem/model/model.h"
#include "tandem/util/thread_pool.h"

namespace tandem::model {

// Bounds the routed experts of a layer (real models have up to a few hundred), so route() keeps its
// scratch on the stack.
inline constexpr int64_t kMaxExperts = 1024;

// Reads the MoE hyperparameters common to the families (expert_count, expert_used_count,
// expert_feed_forward_length, expert_gating_func, expert_weights_norm, expert_weights_scale,
// expert_group_count, expert_group_used_count) into c.moe, with their ranges checked. The family sets the
// shared expert's width and the leading dense layers itself. `n_ff_expert_fallback`: the experts' width when
// expert_feed_forward_length is absent (jamba's files give none: its experts are feed_forward_length wide);
// without one the key is required.
void read_moe_hparams(const ArchReader& r, Config& c,
                      std::optional<int64_t> n_ff_expert_fallback = std::nullopt);

// Binds layer `layer`'s router, experts and shared expert (named as in llama.cpp's GGUF files:
// ffn_gate_inp, ffn_{gate,up,down}_exps, exp_probs_b, ffn_gate_inp_shexp, ffn_{gate,up,down}_shexp).
void bind_moe_layer(const ArchReader& r, const Config& c, int64_t layer, MoeWeights& w);

// The expert bytes of a model's MoE layers: what one token reads (the router, the shared expert and
// n_expert_used routed experts per layer; Model::weight_bytes_per_token() counts the same) against all.
struct ExpertBytes {
  int64_t moe_layers = 0;
  size_t per_expert = 0;     // one routed expert's gate, up and down matrices (the widest layer's)
  size_t routed_all = 0;     // every routed expert of every MoE layer
  size_t routed_chosen = 0;  // n_expert_used routed experts per MoE layer
  size_t shared = 0;         // shared experts, their gates and the routers, every MoE layer
};
ExpertBytes expert_bytes(const Model& model);

// Picks the experts of one row from its router logits.
//   logits: [n_expert] router output; bias: [n_expert] selection bias or null (V3)
//   experts: [n_expert_used] chosen expert ids, best first (ties: the lower id); weights: [n_expert_used]
//   scores: [n_expert] scratch
// Scores are softmax or sigmoid of the logits; selection ranks score + bias among the eligible groups;
// weights are the chosen experts' scores (without the bias), normalised to sum 1 when norm_top_k, times
// weights_scale. Returns the gap between the last chosen and the best unchosen selection score (a measure of
// how near the routing is to a tie; +inf when every expert is chosen).
float route(const MoeConfig& m, const float* logits, const float* bias, int32_t* experts, float* weights,
            float* scores);

// How MoeFfn::run schedules the experts' products. The results are the same bits either way.
enum class ExpertSchedule {
  kAuto,       // calls of up to kernels::kMaxWindowRows rows in two regions per layer, larger per expert
  kPerExpert,  // every call per expert (for tests that compare the two)
};

// The workspace of the MoE layers of one forward, allocated once for `max_rows` rows.
class MoeFfn {
 public:
  MoeFfn() = default;
  MoeFfn(const Config& c, int64_t max_rows);

  // x[r] = sum over row r's chosen experts of weight * expert(x[r]) (in slot order) + the shared expert,
  // in place. x: [n, n_embd], the normed input. scratch: made for pool and the widest expert.
  // residency (may be null): the routed experts are read through it and their reads counted there;
  // `layer` is w's layer.
  void run(const MoeWeights& w, float* x, int64_t n, ThreadPool& pool, kernels::MatmulScratch& scratch,
           ExpertResidency* residency = nullptr, int64_t layer = 0);

  // The experts each row of the last run chose: [n, n_expert_used], and the routing gap of each row
  // (route()). For tests and diagnostics.
  const int32_t* chosen() const { return chosen_.data(); }
  const float* gaps() const { return gaps_.data(); }

  void set_schedule(ExpertSchedule s) { schedule_ = s; }

  // The work (input rows times output rows, summed over the tiles) in each of `threads` threads' initial
  // shares of the last parallel region of the last two-region run, as ThreadPool::parallel_for_stealing
  // deals them out before any stealing. For tests of the split.
  std::vector<int64_t> initial_shares(int threads) const;

 private:
  // One product of a few-row call: y = x w^T over `rows` rows, run by output rows in tasks (run_products).
  struct Product {
    MatrixView w;
    const float* x;
    int64_t x_stride;
    int64_t rows;
    float* y;
    int64_t y_stride;
    uint64_t call;  // matmul_on_thread's: shared by the products of one input (run_products)
  };
  // The routed experts' and the shared expert's products of a call of at most kernels::kMaxWindowRows rows,
  // in two parallel regions (gate and up, then down), into slot_out_ and shared_out_.
  void run_together(const MoeWeights& w, const float* x, int64_t n, ThreadPool& pool,
                    kernels::MatmulScratch& scratch, ExpertResidency* residency, int64_t layer);
  // The same, one expert at a time in regions of their own.
  void run_per_expert(const MoeWeights& w, const float* x, int64_t n, ThreadPool& pool,
                      kernels::MatmulScratch& scratch, ExpertResidency* residency, int64_t layer);
  // products_ as the tasks of one parallel region.
  void run_products(ThreadPool& pool, kernels::MatmulScratch& scratch);
  // Fills first_unit_ for products_: each tile of kUnitRows output rows weighs its product's rows in units.
  // Returns the units of all products.
  int64_t weigh_products();
  // The tiles [first, last) of product i whose first unit lies in [u0, u1).
  struct TileRange {
    int64_t first, last;
  };
  TileRange tiles_starting_in(size_t i, int64_t u0, int64_t u1) const;

  MoeConfig m_;
  ExpertSchedule schedule_ = ExpertSchedule::kAuto;
  int64_t n_embd_ = 0;
  std::vector<float> logits_;      // [max_rows, n_expert]
  std::vector<float> scores_;      // [n_expert]
  std::vector<int32_t> chosen_;    // [max_rows, n_expert_used]
  std::vector<float> weights_;     // [max_rows, n_expert_used]
  std::vector<float> gaps_;        // [max_rows]
  std::vector<int64_t> offsets_;   // [n_expert + 1]: each expert's first entry in slots_
  std::vector<int64_t> slots_;     // [max_rows * n_expert_used]: row * n_expert_used + slot, by expert
  std::vector<float> xe_;          // [max_rows, n_embd] the rows routed to one expert
  std::vector<float> gate_, up_;   // [max_rows, max(n_ff_expert, n_ff_shared)]
  std::vector<float> ye_;          // [max_rows, n_embd] one expert's output rows
  std::vector<float> slot_out_;    // [max_rows * n_expert_used, n_embd] each slot's expert output
  std::vector<float> shared_out_;  // [max_rows, n_embd]
  // run_together's, for few = min(max_rows, kMaxWindowRows) rows, each expert's rows at its entries of
  // slots_:
  std::vector<float> xs_;            // [few * n_expert_used, n_embd] the routed rows
  std::vector<float> gs_, us_;       // [few * n_expert_used, n_ff_expert] their gate and up outputs
  std::vector<float> ys_;            // [few * n_expert_used, n_embd] their down outputs
  std::vector<Product> products_;    // one region's products (capacity reserved)
  std::vector<int64_t> first_unit_;  // [products_.size() + 1] each product's first task unit (weigh_products)
};

}  // namespace tandem::model
