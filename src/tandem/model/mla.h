// Multi-head latent attention (deepseek2) over a latent cache. Per token the cache holds only the normed
// KV latent c (kv_lora_rank) and the rotated rotary key part k_r (n_rot), as one KV head with key [c, k_r]
// whose value is its first kv_lora_rank elements, c, stored once (cache::Geometry::values_in_keys). The key
// and value up-projections of attn_kv_b are absorbed: each head's query becomes [W_k^T q_nope, q_rot], whose
// product with [c, k_r] is the head's q_nope · (W_k c) + q_rot · k_r, and the head's attention output in
// latent space is expanded by W_v afterwards. The attention between is the standard one, with every query
// head in the group of the single KV head.
//
// Both per-head products run through the matmul kernels (kernels/matmul.h), one task per head and run of
// rows, so every row has the same bits alone, in a verify window or in a batch. The absorption multiplies a
// copy made at load of each head's key rows transposed (MlaWeights::wk_t: F32 when attn_kv_b is F32, else
// F16, dequantized values rounded by at most 2^-11). The expansion multiplies the head's value rows, a row
// range of attn_kv_b where it is a float type, else of an F16 copy made at load (MlaWeights::wv): a
// quantized attn_kv_b would meet the heads' latent outputs rounded to 8 bits, a rounding the reference does
// not make there (it expands each cached latent, then averages), which moved more routing near-ties of the
// V3 Q8_0 golden past the tolerance.
//
// A quantized attn_kv_b multiplies 8-bit activations wherever it runs as a matrix product (here and in the
// reference): the expanded keys and values are W_k q8(c) and W_v q8(c), c rounded to Q8_0 blocks of 32. The
// absorbed form keeps that rounding point: the cached latent is q8(c) when attn_kv_b is quantized.
//
// Recent converters write the up-projection split per head instead (attn_k_b: {nope, kv_lora_rank, n_head},
// each head's key rows already transposed; attn_v_b: {kv_lora_rank, head_dim_v, n_head}, its value rows),
// and may leave attn_kv_b out. They hold the same values in the layouts the products want: a float attn_k_b
// (F32, F16) is MlaWeights::wk_t itself, a float attn_v_b is MlaWeights::wv itself (no copies); quantized
// ones are copied to F16 as above (BF16 keys too). The rounding rules stay those of the joined form: F16
// copies of quantized rows, and the cached latent rounded to q8(c) when the up-projection (either tensor) is
// quantized. Where a file holds both forms the split one is used (mla_bind.cpp says why). A float file gives
// the same bits in either form (an F16 attn_kv_b's keys copy to exactly attn_k_b's F16 values); a quantized
// one differs by its quantization blocks, which run along kv_lora_rank in attn_kv_b and attn_v_b but along
// the key's nope width in attn_k_b.
#pragma once

#include <cstdint>
#include <vector>

#include "tandem/kernels/matmul.h"
#include "tandem/model/model.h"
#include "tandem/util/thread_pool.h"

namespace tandem::model {

// Binds layer `layer`'s latent attention tensors (attn_q or attn_q_a / attn_q_a_norm / attn_q_b, whichever
// the file holds; attn_kv_a_mqa, attn_kv_a_norm; attn_k_b and attn_v_b where the file holds them, else
// attn_kv_b). A split tensor may have three dimensions (per head) or two (the heads' rows stacked).
void bind_mla_layer(const ArchReader& r, const Config& c, int64_t layer, MlaWeights& w);

// What a layer's products multiply, set at load: MlaWeights::wk_t, head h's key rows (W_k[h]: head_dim -
// n_rot rows of kv_lora_rank) transposed as its rows [h * kv_lora_rank, (h + 1) * kv_lora_rank): a copy of
// attn_kv_b's, F32 when it is F32, else F16; attn_k_b itself when it is F32 or F16, else its F16 copy. And
// MlaWeights::wv, the heads' value rows (head h's from row h * head_dim_v): an F16 copy of a quantized
// attn_kv_b's or attn_v_b's, attn_v_b itself when it is not quantized, empty for a float attn_kv_b (its own
// rows are multiplied). mla_copy_bytes: the copies' size; make_mla_copies writes them to out (64-byte
// aligned) and sets the views.
size_t mla_copy_bytes(const Config& c, const MlaWeights& w);
void make_mla_copies(const Config& c, MlaWeights& w, uint8_t* out);
// Whether the cached latent is rounded to Q8_0 blocks: the up-projection (attn_kv_b, or attn_k_b or
// attn_v_b) is quantized.
bool mla_rounds_latent(const MlaWeights& w);

class MlaProjection {
 public:
  MlaProjection() = default;
  MlaProjection(const Config& c, int64_t max_rows);

  // For R rows of normed input x [R, n_embd] at the rotary angles cs [R, n_rot] (kernels::rope_angles):
  //   q: [R, n_head * (kv_lora_rank + n_rot)] the absorbed queries; k: [R, kv_lora_rank + n_rot] each row's
  //   cache entry (its value is the first kv_lora_rank elements). Rotary parts rotated (normal layout).
  void project(const MlaWeights& w, const float* x, int64_t R, const float* cs, float* q, float* k,
               ThreadPool& pool, kernels::MatmulScratch& scratch);
  // The heads' attention outputs in latent space, latent: [R, n_head * kv_lora_rank], expanded to
  // out: [R, n_head * head_dim_v].
  void expand(const MlaWeights& w, const float* latent, int64_t R, float* out, ThreadPool& pool,
              kernels::MatmulScratch& scratch);

  // Widths of the absorbed query and the cache entry per head.
  int64_t key_width() const { return kv_lora_ + n_rot_; }

 private:
  int64_t n_head_ = 0, head_dim_ = 0, head_dim_v_ = 0, n_rot_ = 0, q_lora_ = 0, kv_lora_ = 0;
  float eps_ = 0;
  std::vector<float> qa_;           // [max_rows, q_lora_rank]
  std::vector<float> kva_;          // [max_rows, kv_lora_rank + n_rot]
  std::vector<float> qf_;           // [max_rows, n_head * head_dim] the queries before absorption
  std::vector<uint8_t> latent_q8_;  // one latent row as Q8_0 (see project())
};

}  // namespace tandem::model
