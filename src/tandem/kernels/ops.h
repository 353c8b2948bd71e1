// Row-wise operations of a decoder forward: normalization, rotary embedding, activations. Scalar code with a
// fixed operation order, so a row's result never depends on the other rows of its batch.
#pragma once

#include <cstdint>

namespace tandem::kernels {

// The sum of term(i) for i < n in eight interleaved partial sums (term i into sum i % 8, the tail after the
// last whole eight into sums 0..), combined pairwise: an order that depends only on n, the same on every
// target, which compilers keep in vector registers (with one running sum, each add waits on the one
// before).
template <typename Acc, typename Term>
inline Acc interleaved_sum8(int64_t n, Term term) {
  Acc acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += term(i + j);
  for (int j = 0; i < n; ++i, ++j) acc[j] += term(i);
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

// y = x / sqrt(mean(x^2) + eps) * w   (w may be null: no scaling). x and y may alias. Sum of squares in
// double, in eight interleaved partial sums combined pairwise (the same order on every target).
void rms_norm(const float* x, const float* w, float* y, int64_t n, float eps);

// y = (x - mean(x)) / sqrt(var(x) + eps) * w + b   (encoders' LayerNorm; w and b may be null: none). x and y
// may alias. Mean and variance in double, each summed in interleaved_sum8 order.
void layer_norm(const float* x, const float* w, const float* b, float* y, int64_t n, float eps);

// Rotary position embedding, in place. Rotates the first n_rot dims of a head vector:
//   normal layout: pairs (x[2i], x[2i+1]);  NeoX layout: pairs (x[i], x[i + n_rot/2]).
// inv_freq[i] (i < n_rot/2) is the angle per position of pair i (base^(-2i/n_rot) / freq_factor_i / scale).
// rope_angles computes the cosines and sines of one position once (cs[2i] = cos, cs[2i + 1] = sin of pair i,
// angles in double; n_rot floats); rope_apply rotates any number of head vectors with them.
void rope_angles(int64_t n_rot, const float* inv_freq, int64_t pos, float* cs);
void rope_apply(float* x, int64_t n_rot, const float* cs, bool neox);

// out[i] = silu(gate[i]) * up[i] (vectorized: float_kernels.h silu_mul)
void swiglu(const float* gate, const float* up, float* out, int64_t n);
// out[i] = gelu_tanh(gate[i]) * up[i]  (the tanh approximation, as gemma uses)
void geglu(const float* gate, const float* up, float* out, int64_t n);

// x[i] = gelu_tanh(x[i]), in place (the tanh approximation, as the reference's encoders use): vectorized
// (float_kernels.h gelu_tanh), and its scalar reference with the library's tanh.
void gelu(float* x, int64_t n);
void gelu_reference(float* x, int64_t n);

// x[i] = cap * tanh(x[i] / cap)
void soft_cap(float* x, int64_t n, float cap);

// y[i] += x[i]
void add_in_place(float* y, const float* x, int64_t n);

}  // namespace tandem::kernels
