// Float kernels written once with Highway and dispatched at run time to the best target the CPU supports
// (AVX2, AVX-512, NEON, ...): dot products of F32/F16/BF16 weight rows with f32 activation rows, and the
// attention primitives over f32/f16 cache rows. Each row's reduction order is fixed (it never depends on the
// other rows).
#pragma once

#include <cstdint>

#include "tandem/tensor/dtype.h"

namespace tandem::kernels {

// For each weight row o in [o0, o1) (row o at w + o * w_row_bytes, k elements of `type`: F32, F16 or BF16)
// and each activation row r < n_rows (x + r * x_stride, k floats): y[r * y_stride + o] = dot(W[o], x[r]).
void float_matmul_rows(DType type, const uint8_t* w, size_t w_row_bytes, int64_t o0, int64_t o1, int64_t k,
                       const float* x, int64_t x_stride, int64_t n_rows, float* y, int64_t y_stride);

// Attention primitives over n consecutive cache rows of `dim` elements (f16 bits or f32):
//   s[j] = dot(q, row j);   acc[d] += p[j] * row j[d] (j in order).
void dots_f16(const float* q, const uint16_t* rows, int64_t n, int64_t dim, float* s);
void dots_f32(const float* q, const float* rows, int64_t n, int64_t dim, float* s);
void accumulate_f16(const float* p, const uint16_t* rows, int64_t n, int64_t dim, float* acc);
void accumulate_f32(const float* p, const float* rows, int64_t n, int64_t dim, float* acc);

// The same for G queries over the same rows (query h at q + h * q_stride, its scores at s + h * s_stride;
// weights p + h * p_stride, accumulator acc + h * acc_stride): each row is loaded once for all queries, and
// every query's result is bit-identical to a separate dots_* / accumulate_* call.
void dots_group_f16(const float* q, int64_t G, int64_t q_stride, const uint16_t* rows, int64_t n, int64_t dim,
                    float* s, int64_t s_stride);
void dots_group_f32(const float* q, int64_t G, int64_t q_stride, const float* rows, int64_t n, int64_t dim,
                    float* s, int64_t s_stride);
void accumulate_group_f16(const float* p, int64_t G, int64_t p_stride, const uint16_t* rows, int64_t n,
                          int64_t dim, float* acc, int64_t acc_stride);
void accumulate_group_f32(const float* p, int64_t G, int64_t p_stride, const float* rows, int64_t n,
                          int64_t dim, float* acc, int64_t acc_stride);

// A run of n consecutive value rows (f16 bits or f32, dim elements each) and where their weights start: row j
// of the run is weighted by p[h * p_stride + p_offset + j] for query h.
struct ValueRun {
  const uint8_t* rows;
  int64_t n;
  int64_t p_offset;
};

// accumulate_group_* over several runs, in order: the same bits as one call per run (each element's additions
// run in row order either way), with the sums held in registers across the runs (the blocks of a paged
// cache).
void accumulate_runs_f16(const float* p, int64_t G, int64_t p_stride, const ValueRun* runs, int64_t n_runs,
                         int64_t dim, float* acc, int64_t acc_stride);
void accumulate_runs_f32(const float* p, int64_t G, int64_t p_stride, const ValueRun* runs, int64_t n_runs,
                         int64_t dim, float* acc, int64_t acc_stride);

// The f16 bits of n floats into out (2n bytes, any alignment, host byte order): fp16.h's f32_to_fp16 bits
// (round to nearest even; every NaN becomes its sign and 0x7E00), in hardware where the target converts
// (F16C on x86-64 from AVX2 on, NEON), else element by element. The f16 KV cache's store.
void f32_to_f16(const float* x, int64_t n, uint8_t* out);

// out[i] = silu(gate[i]) * up[i] = gate[i] / (1 + exp(-gate[i])) * up[i], with a vectorized exp (within one
// ulp of the library's; -gate is capped at 88, where the result is already 0 to single precision). Element
// by element, so a row's result never depends on the others. out may alias gate.
void silu_mul(const float* gate, const float* up, float* out, int64_t n);

// x[i] = gelu_tanh(x[i]) = x / (1 + exp(-2 sqrt(2/pi) (x + 0.044715 x^3))), in place, with a vectorized exp
// (the exponent capped at 88). Element by element. ops.h gelu_reference is its scalar reference.
void gelu_tanh(float* x, int64_t n);

// Softmax of n > 0 attention scores in place: s_j = scale * x[j] (soft-capped to cap * tanh(s_j / cap) when
// cap > 0), then x[j] = exp(s_j - max s) / sum exp(s - max s), with vectorized exp and tanh (float sums in
// vector lanes). Depends only on the row itself.
void softmax(float* x, int64_t n, float scale, float softcap);

}  // namespace tandem::kernels
