#include "tandem/model/mla.h"

#include <algorithm>
#include <string>

#include "tandem/kernels/ops.h"
#include "tandem/kernels/quant_layout.h"
#include "tandem/tensor/quant.h"

namespace tandem::model {

MlaProjection::MlaProjection(const Config& c, int64_t max_rows, int threads)
    : n_head_(c.n_head),
      head_dim_(c.head_dim),
      head_dim_v_(c.head_dim_v),
      n_rot_(c.n_rot),
      q_lora_(c.mla.q_lora_rank),
      kv_lora_(c.mla.kv_lora_rank),
      eps_(c.norm_eps) {
  const auto rows = static_cast<size_t>(max_rows);
  qa_.resize(rows * static_cast<size_t>(std::max<int64_t>(q_lora_, 1)));
  kva_.resize(rows * static_cast<size_t>(kv_lora_ + n_rot_));
  qf_.resize(rows * static_cast<size_t>(n_head_ * head_dim_));
  row_.resize(static_cast<size_t>(threads * kv_lora_));
  latent_q8_.resize(row_bytes(DType::Q8_0, kv_lora_));
}

void MlaProjection::project(const MlaWeights& w, const float* x, int64_t R, const float* cs, float* q,
                            float* k, ThreadPool& pool, kernels::MatmulScratch& scratch) {
  const int64_t nope = head_dim_ - n_rot_, kv_a = kv_lora_ + n_rot_, kv_b = nope + head_dim_v_;
  const bool round_latent = kernels::is_quantized_weight(w.wkv_b.type);
  if (q_lora_ > 0) {
    const kernels::MatmulOut outs[] = {{&w.wq_a, qa_.data()}, {&w.wkv_a, kva_.data()}};
    kernels::matmul_group(outs, x, R, pool, scratch);
    for (int64_t r = 0; r < R; ++r)
      kernels::rms_norm(qa_.data() + r * q_lora_, w.q_a_norm.data, qa_.data() + r * q_lora_, q_lora_, eps_);
    kernels::matmul(w.wq_b, qa_.data(), R, qf_.data(), pool, scratch);
  } else {
    const kernels::MatmulOut outs[] = {{&w.wq, qf_.data()}, {&w.wkv_a, kva_.data()}};
    kernels::matmul_group(outs, x, R, pool, scratch);
  }
  for (int64_t r = 0; r < R; ++r) {
    const float* rc = cs + r * n_rot_;
    float* kr = k + r * kv_a;
    kernels::rms_norm(kva_.data() + r * kv_a, w.kv_a_norm.data, kr, kv_lora_, eps_);
    if (round_latent) {
      quantize_row(DType::Q8_0, kr, latent_q8_.data(), kv_lora_);
      dequantize_row(DType::Q8_0, latent_q8_.data(), kr, kv_lora_);
    }
    std::copy_n(kva_.data() + r * kv_a + kv_lora_, n_rot_, kr + kv_lora_);
    kernels::rope_apply(kr + kv_lora_, n_rot_, rc, /*neox=*/false);
    for (int64_t h = 0; h < n_head_; ++h) {
      float* qh = qf_.data() + (r * n_head_ + h) * head_dim_;
      kernels::rope_apply(qh + nope, n_rot_, rc, /*neox=*/false);
      float* qa = q + (r * n_head_ + h) * kv_a;
      std::fill_n(qa, kv_lora_, 0.0f);
      std::copy_n(qh + nope, n_rot_, qa + kv_lora_);
    }
  }
  // q_latent[h] = sum_i q_nope[h][i] * W_k[h][i], over the key rows of attn_kv_b, each dequantized once per
  // call; every row accumulates in the order of i, whatever the batch. One task per head.
  pool.parallel_for(n_head_, 1, [&](int64_t h0, int64_t h1, int thread) {
    float* row = row_.data() + static_cast<size_t>(thread) * static_cast<size_t>(kv_lora_);
    for (int64_t h = h0; h < h1; ++h)
      for (int64_t i = 0; i < nope; ++i) {
        dequantize_row(w.wkv_b.type, w.wkv_b.row(h * kv_b + i), row, kv_lora_);
        for (int64_t r = 0; r < R; ++r) {
          const float qi = qf_[static_cast<size_t>((r * n_head_ + h) * head_dim_ + i)];
          float* qa = q + (r * n_head_ + h) * kv_a;
          for (int64_t j = 0; j < kv_lora_; ++j) qa[j] += qi * row[j];
        }
      }
  });
}

void MlaProjection::expand(const MlaWeights& w, const float* latent, int64_t R, float* out,
                           ThreadPool& pool) {
  const int64_t nope = head_dim_ - n_rot_, kv_b = nope + head_dim_v_;
  pool.parallel_for(n_head_, 1, [&](int64_t h0, int64_t h1, int thread) {
    float* row = row_.data() + static_cast<size_t>(thread) * static_cast<size_t>(kv_lora_);
    for (int64_t h = h0; h < h1; ++h)
      for (int64_t j = 0; j < head_dim_v_; ++j) {
        dequantize_row(w.wkv_b.type, w.wkv_b.row(h * kv_b + nope + j), row, kv_lora_);
        for (int64_t r = 0; r < R; ++r)
          out[(r * n_head_ + h) * head_dim_v_ + j] =
              kernels::dot_f32(row, latent + (r * n_head_ + h) * kv_lora_, kv_lora_);
      }
  });
}

}  // namespace tandem::model
