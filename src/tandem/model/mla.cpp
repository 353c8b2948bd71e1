#include "tandem/model/mla.h"

#include <algorithm>
#include <string>

#include "tandem/kernels/ops.h"
#include "tandem/kernels/quant_layout.h"
#include "tandem/kernels/repack.h"
#include "tandem/tensor/fp16.h"
#include "tandem/tensor/quant.h"
#include "tandem/util/error.h"

namespace tandem::model {

namespace {

// Rows of one task of the per-head products: a head's rows of a call are split into runs of this many, so
// that a prefill batch spreads over more threads than there are heads. (Results do not depend on it.)
constexpr int64_t kRowsPerTask = kernels::kPrefillChunk;

// The copies' layout (make_mla_copies): the transposed keys, then from a 64-byte boundary the values. A
// split file's float tensors are multiplied as they are: they take no bytes.
struct CopyLayout {
  DType key_type = DType::F32;
  size_t key_bytes = 0, value_at = 0, value_bytes = 0;
};

bool is_float(DType t) {
  return t == DType::F32 || t == DType::F16;
}

CopyLayout copy_layout(const Config& c, const MlaWeights& w) {
  const int64_t nope = c.head_dim - c.n_rot;
  const DType keys = w.split() ? w.wk_b.type : w.wkv_b.type, values = w.split() ? w.wv_b.type : w.wkv_b.type;
  CopyLayout l;
  l.key_type = keys == DType::F32 ? DType::F32 : DType::F16;
  if (!w.split() || !is_float(keys))
    l.key_bytes = static_cast<size_t>(c.n_head * c.mla.kv_lora_rank) * row_bytes(l.key_type, nope);
  l.value_at = (l.key_bytes + 63) / 64 * 64;
  if (kernels::is_quantized_weight(values))
    l.value_bytes = static_cast<size_t>(c.n_head * c.head_dim_v) * row_bytes(DType::F16, c.mla.kv_lora_rank);
  return l;
}

// Row r of `m` (in any form) dequantized into `row`, through `file_row` [m.row_bytes].
void read_row(const MatrixView& m, int64_t r, std::vector<uint8_t>& file_row, float* row) {
  kernels::file_form_row(m, r, file_row.data());
  dequantize_row(m.type, file_row.data(), row, m.cols);
}

// `cols` values as F16 at dst.
void store_f16(const float* row_values, int64_t cols, uint8_t* dst) {
  auto* out = reinterpret_cast<uint16_t*>(dst);
  for (int64_t j = 0; j < cols; ++j) out[j] = f32_to_fp16(row_values[j]);
}

// The split form's copies (quantized tensors only; the float ones are views of the file's).
void make_split_copies(const Config& c, MlaWeights& w, const CopyLayout& layout, uint8_t* out) {
  const int64_t nope = c.head_dim - c.n_rot, L = c.mla.kv_lora_rank;
  TANDEM_CHECK(w.wk_b.rows == c.n_head * L && w.wk_b.cols == nope, "attn_k_b has an unexpected shape");
  TANDEM_CHECK(w.wv_b.rows == c.n_head * c.head_dim_v && w.wv_b.cols == L,
               "attn_v_b has an unexpected shape");
  std::vector<uint8_t> file_row(std::max(w.wk_b.row_bytes, w.wv_b.row_bytes));
  std::vector<float> row(static_cast<size_t>(std::max(nope, L)));
  if (layout.key_bytes == 0) {
    w.wk_t = w.wk_b;
  } else {
    // At load only: attn_k_b's rows are already the transposed keys; only their type changes.
    w.wk_t = MatrixView{};
    w.wk_t.type = DType::F16;
    w.wk_t.rows = c.n_head * L;
    w.wk_t.cols = nope;
    w.wk_t.row_bytes = row_bytes(DType::F16, nope);
    w.wk_t.data = out;
    for (int64_t r = 0; r < w.wk_t.rows; ++r) {
      read_row(w.wk_b, r, file_row, row.data());
      store_f16(row.data(), nope, out + static_cast<size_t>(r) * w.wk_t.row_bytes);
    }
  }
  if (layout.value_bytes == 0) {
    w.wv = w.wv_b;
    return;
  }
  w.wv = MatrixView{};
  w.wv.type = DType::F16;
  w.wv.rows = c.n_head * c.head_dim_v;
  w.wv.cols = L;
  w.wv.row_bytes = row_bytes(DType::F16, L);
  w.wv.data = out + layout.value_at;
  for (int64_t r = 0; r < w.wv.rows; ++r) {
    read_row(w.wv_b, r, file_row, row.data());
    store_f16(row.data(), L, out + layout.value_at + static_cast<size_t>(r) * w.wv.row_bytes);
  }
}

}  // namespace

bool mla_rounds_latent(const MlaWeights& w) {
  if (!w.split()) return kernels::is_quantized_weight(w.wkv_b.type);
  return kernels::is_quantized_weight(w.wk_b.type) || kernels::is_quantized_weight(w.wv_b.type);
}

size_t mla_copy_bytes(const Config& c, const MlaWeights& w) {
  const CopyLayout l = copy_layout(c, w);
  return (l.value_at + l.value_bytes + 63) / 64 * 64;
}

void make_mla_copies(const Config& c, MlaWeights& w, uint8_t* out) {
  const CopyLayout layout = copy_layout(c, w);
  if (w.split()) return make_split_copies(c, w, layout, out);
  const int64_t nope = c.head_dim - c.n_rot, kv_b = nope + c.head_dim_v, L = c.mla.kv_lora_rank;
  TANDEM_CHECK(w.wkv_b.rows == c.n_head * kv_b && w.wkv_b.cols == L, "attn_kv_b has an unexpected shape");
  MatrixView& k = w.wk_t;
  k = MatrixView{};
  k.type = layout.key_type;
  k.rows = c.n_head * L;
  k.cols = nope;
  k.row_bytes = row_bytes(k.type, nope);
  k.data = out;
  MatrixView& v = w.wv;
  v = MatrixView{};
  if (layout.value_bytes > 0) {
    v.type = DType::F16;
    v.rows = c.n_head * c.head_dim_v;
    v.cols = L;
    v.row_bytes = row_bytes(DType::F16, L);
    v.data = out + layout.value_at;
  }
  // At load only: one row of attn_kv_b at a time in the file's form, dequantized.
  std::vector<uint8_t> file_row(w.wkv_b.row_bytes);
  std::vector<float> row(static_cast<size_t>(L));
  for (int64_t h = 0; h < c.n_head; ++h)
    for (int64_t i = 0; i < kv_b; ++i) {
      if (i >= nope && v.empty()) continue;
      read_row(w.wkv_b, h * kv_b + i, file_row, row.data());
      if (i >= nope) {
        store_f16(row.data(), L,
                  out + layout.value_at + static_cast<size_t>(h * c.head_dim_v + i - nope) * v.row_bytes);
        continue;
      }
      for (int64_t j = 0; j < L; ++j) {
        uint8_t* dst = out + static_cast<size_t>(h * L + j) * k.row_bytes;
        if (k.type == DType::F32)
          reinterpret_cast<float*>(dst)[i] = row[static_cast<size_t>(j)];
        else
          reinterpret_cast<uint16_t*>(dst)[i] = f32_to_fp16(row[static_cast<size_t>(j)]);
      }
    }
}

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
  qf_.resize(rows * static_cast<size_t>(n_head_ * head_dim_));
  latent_q8_.resize(row_bytes(DType::Q8_0, kv_lora_));
}

void MlaProjection::project(const MlaWeights& w, const float* x, int64_t R, const float* cs, float* q,
                            float* k, ThreadPool& pool, kernels::MatmulScratch& scratch) {
  const int64_t nope = head_dim_ - n_rot_, kv_a = kv_lora_ + n_rot_;
  const bool round_latent = mla_rounds_latent(w);
  TANDEM_CHECK(!w.wk_t.empty(), "latent attention without its key copy (Model::from_file)");
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
      std::copy_n(qh + nope, n_rot_, q + (r * n_head_ + h) * kv_a + kv_lora_);
    }
  }
  // q_latent[h] = sum_i q_nope[h][i] * W_k[h][i] = W_k[h]^T q_nope[h]: the product of head h's absorbed
  // keys by the heads' nope parts of the queries (row stride n_head * head_dim), straight into q.
  const int64_t runs = (R + kRowsPerTask - 1) / kRowsPerTask;
  pool.parallel_for_stealing(n_head_ * runs, 1, [&](int64_t u0, int64_t u1, int thread) {
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t h = u / runs, r0 = (u % runs) * kRowsPerTask, nr = std::min(kRowsPerTask, R - r0);
      kernels::matmul_on_thread(w.wk_t.row_range(h * kv_lora_, kv_lora_),
                                qf_.data() + r0 * n_head_ * head_dim_ + h * head_dim_, n_head_ * head_dim_,
                                nr, q + (r0 * n_head_ + h) * kv_a, n_head_ * kv_a, scratch, thread);
    }
  });
}

void MlaProjection::expand(const MlaWeights& w, const float* latent, int64_t R, float* out, ThreadPool& pool,
                           kernels::MatmulScratch& scratch) {
  const int64_t nope = head_dim_ - n_rot_, kv_b = nope + head_dim_v_;
  // Head h's values: rows [h * kv_b + nope, (h + 1) * kv_b) of attn_kv_b, or rows [h * head_dim_v,
  // (h + 1) * head_dim_v) of attn_v_b or of the F16 copy of either; its latent outputs and its values lie at
  // a row stride of all the heads'.
  const bool copy = !w.wv.empty();
  TANDEM_CHECK(copy || !kernels::is_quantized_weight(w.wkv_b.type),
               "latent attention without its value copy (Model::from_file)");
  const MatrixView& values = copy ? w.wv : w.wkv_b;
  const int64_t first = copy ? 0 : nope, stride = copy ? head_dim_v_ : kv_b;
  for (int64_t h = 0; h < n_head_; ++h)
    TANDEM_CHECK(values.row_range_fits(h * stride + first, head_dim_v_), "value rows out of their matrix");
  const int64_t runs = (R + kRowsPerTask - 1) / kRowsPerTask;
  pool.parallel_for_stealing(n_head_ * runs, 1, [&](int64_t u0, int64_t u1, int thread) {
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t h = u / runs, r0 = (u % runs) * kRowsPerTask, nr = std::min(kRowsPerTask, R - r0);
      kernels::matmul_on_thread(values.row_range(h * stride + first, head_dim_v_),
                                latent + (r0 * n_head_ + h) * kv_lora_, n_head_ * kv_lora_, nr,
                                out + (r0 * n_head_ + h) * head_dim_v_, n_head_ * head_dim_v_, scratch,
                                thread);
    }
  });
}

}  // namespace tandem::model
