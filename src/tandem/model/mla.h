// Multi-head latent attention (deepseek2): the projections that turn a layer's normed input into per-head
// queries, keys and values. Keys and values are expanded from the latent here (head_dim and head_dim_v
// wide, one KV head per query head), so the attention over the cache is the standard one.
#pragma once

#include <cstdint>
#include <vector>

#include "tandem/kernels/matmul.h"
#include "tandem/model/model.h"
#include "tandem/util/thread_pool.h"

namespace tandem::model {

// Binds layer `layer`'s latent attention tensors (attn_q or attn_q_a / attn_q_a_norm / attn_q_b, whichever
// the file holds; attn_kv_a_mqa, attn_kv_a_norm, attn_kv_b).
void bind_mla_layer(const ArchReader& r, const Config& c, int64_t layer, MlaWeights& w);

class MlaProjection {
 public:
  MlaProjection() = default;
  MlaProjection(const Config& c, int64_t max_rows);

  // For R rows of normed input x [R, n_embd] at the rotary angles cs [R, n_rot] (kernels::rope_angles):
  //   q: [R, n_head * head_dim]; k: [R, n_head * head_dim] (each head: its nope part, then the shared
  //   rotary part); v: [R, n_head * head_dim_v]. Rotary parts rotated (normal layout).
  void run(const MlaWeights& w, const float* x, int64_t R, const float* cs, float* q, float* k, float* v,
           ThreadPool& pool, kernels::MatmulScratch& scratch);

 private:
  int64_t n_head_ = 0, head_dim_ = 0, head_dim_v_ = 0, n_rot_ = 0, q_lora_ = 0, kv_lora_ = 0;
  float eps_ = 0;
  std::vector<float> qa_;   // [max_rows, q_lora_rank]
  std::vector<float> kva_;  // [max_rows, kv_lora_rank + n_rot]
  std::vector<float> kvn_;  // [max_rows, kv_lora_rank] the normed latent
  std::vector<float> kvb_;  // [max_rows, n_head * (head_dim - n_rot + head_dim_v)]
};

}  // namespace tandem::model
