// Forward and backward of the row-wise layers the hidden-state drafters use: linear maps, RMSNorm, embedding
// lookup, rotary embedding, the SwiGLU activation and residual adds. Activations are row-major [rows, width]
// f32. A backward takes what its forward read (the layer's saved activations, kept by the caller) and the
// gradient of the output; it adds parameter gradients into Param::grad (when the parameter trains) and
// writes, or adds into, the gradient of the input. Multi-head attention is in attention.h, the output head
// and its loss in loss.h.
#pragma once

#include <cstdint>

#include "tandem/train/param.h"

namespace tandem::train {

// y = x W^T (+ b)
//   w: [out, in]; b: [out] or null; x: [rows, in]; y: [rows, out]
void linear_forward(const Param& w, const Param* b, const float* x, int64_t rows, float* y, Compute& c);
// dx (+)= dy W (skipped when dx is null); dW += dy^T x and db += sum_r dy[r] when they train.
void linear_backward(Param& w, Param* b, const float* x, const float* dy, int64_t rows, float* dx,
                     bool accumulate_dx, Compute& c);

// y[r] = x[r] / rms(x[r]) * g, rms = sqrt(mean(x^2) + eps); inv_rms[r] = 1 / rms(x[r]) is saved.
//   g: [n]; x, y: [rows, n]; inv_rms: [rows]
void rmsnorm_forward(const Param& g, float eps, const float* x, int64_t rows, float* y, float* inv_rms,
                     Compute& c);
void rmsnorm_backward(Param& g, const float* x, const float* inv_rms, const float* dy, int64_t rows,
                      float* dx, bool accumulate_dx, Compute& c);

// y[r] = table[ids[r]]   table: [vocab, n]; y: [rows, n]. Throws tandem::Error naming the first id out of
// range.
void embedding_forward(const Param& table, const int32_t* ids, int64_t rows, float* y);
// table.grad[ids[r]] += dy[r] in row order (nothing when the table is frozen).
void embedding_backward(Param& table, const int32_t* ids, const float* dy, int64_t rows);

// Rotary position embedding. Pairs are (2i, 2i+1) in kInterleaved (GGUF Llama) and (i, i + hd/2) in kHalves
// (NeoX, Qwen); pair i turns by pos * theta^(-2i/hd).
enum class RopeLayout { kInterleaved, kHalves };
struct Rope {
  int64_t head_dim = 0;  // even
  float theta = 10000.0f;
  RopeLayout layout = RopeLayout::kInterleaved;
};
// In place on x: [rows, n_heads * head_dim] at positions pos: [rows].
void rope_forward(const Rope& rope, float* x, int64_t rows, int64_t n_heads, const int32_t* pos, Compute& c);
// The gradient through the rotation (its transpose: the turn back), in place on dx.
void rope_backward(const Rope& rope, float* dx, int64_t rows, int64_t n_heads, const int32_t* pos,
                   Compute& c);

// out = silu(gate) * up, element by element over n values.
void swiglu_forward(const float* gate, const float* up, int64_t n, float* out, Compute& c);
// dgate = dout * up * silu'(gate), dup = dout * silu(gate) (overwritten).
void swiglu_backward(const float* gate, const float* up, const float* dout, int64_t n, float* dgate,
                     float* dup, Compute& c);

// dst[i] += src[i] over n values (residual adds and their gradients).
void add_into(float* dst, const float* src, int64_t n, Compute& c);

}  // namespace tandem::train
