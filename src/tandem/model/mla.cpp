#include "tandem/model/mla.h"

#include <algorithm>
#include <string>

#include "tandem/kernels/ops.h"

namespace tandem::model {

MlaProjection::MlaProjection(const Config& c, int64_t max_rows)
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
  kvn_.resize(rows * static_cast<size_t>(kv_lora_));
  kvb_.resize(rows * static_cast<size_t>(n_head_ * (head_dim_ - n_rot_ + head_dim_v_)));
}

void MlaProjection::run(const MlaWeights& w, const float* x, int64_t R, const float* cs, float* q, float* k,
                        float* v, ThreadPool& pool, kernels::MatmulScratch& scratch) {
  const int64_t nope = head_dim_ - n_rot_, kv_a = kv_lora_ + n_rot_, kv_b = nope + head_dim_v_;
  if (q_lora_ > 0) {
    const kernels::MatmulOut outs[] = {{&w.wq_a, qa_.data()}, {&w.wkv_a, kva_.data()}};
    kernels::matmul_group(outs, x, R, pool, scratch);
    for (int64_t r = 0; r < R; ++r)
      kernels::rms_norm(qa_.data() + r * q_lora_, w.q_a_norm.data, qa_.data() + r * q_lora_, q_lora_, eps_);
    kernels::matmul(w.wq_b, qa_.data(), R, q, pool, scratch);
  } else {
    const kernels::MatmulOut outs[] = {{&w.wq, q}, {&w.wkv_a, kva_.data()}};
    kernels::matmul_group(outs, x, R, pool, scratch);
  }
  for (int64_t r = 0; r < R; ++r)
    kernels::rms_norm(kva_.data() + r * kv_a, w.kv_a_norm.data, kvn_.data() + r * kv_lora_, kv_lora_, eps_);
  kernels::matmul(w.wkv_b, kvn_.data(), R, kvb_.data(), pool, scratch);
  for (int64_t r = 0; r < R; ++r) {
    const float* rc = cs + r * n_rot_;
    float* k_rot = kva_.data() + r * kv_a + kv_lora_;  // shared by every head
    kernels::rope_apply(k_rot, n_rot_, rc, /*neox=*/false);
    for (int64_t h = 0; h < n_head_; ++h) {
      float* qh = q + (r * n_head_ + h) * head_dim_;
      kernels::rope_apply(qh + nope, n_rot_, rc, /*neox=*/false);
      const float* src = kvb_.data() + (r * n_head_ + h) * kv_b;
      float* kh = k + (r * n_head_ + h) * head_dim_;
      std::copy_n(src, nope, kh);
      std::copy_n(k_rot, n_rot_, kh + nope);
      std::copy_n(src + nope, head_dim_v_, v + (r * n_head_ + h) * head_dim_v_);
    }
  }
}

}  // namespace tandem::model
