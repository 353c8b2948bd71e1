// The two per-token steps of a Mamba-1 layer over a range of channels [i0, i1): the causal depthwise
// convolution and the selective scan. Each channel is independent of the others, so a forward splits the
// channels across threads and runs the rows of a sequence in order inside each split; a window of rows gives
// the bits of the same rows decoded one at a time (every row is the same call on the same inputs).
// A step may update its state in place (state_out == state_in: every element is read before it is written),
// or write it elsewhere; the two buffers must not partly overlap.
// Everything indexed by channel is laid out channel-minor, so that vectors run over the channels.
#pragma once

#include <cstdint>

namespace tandem::kernels {

struct SsmConvArgs {
  int64_t d_inner = 0, d_conv = 0;
  const float* state_in = nullptr;  // [d_conv - 1, d_inner]: the previous inputs, oldest first
  float* state_out = nullptr;  // [d_conv - 1, d_inner]: state_in shifted by x (state_in itself, or apart)
  const float* x = nullptr;    // [d_inner] this token's input
  const float* w = nullptr;    // [d_conv, d_inner]: the oldest input's weights first
  const float* b = nullptr;    // [d_inner]
  float* y = nullptr;          // [d_inner] silu(convolution + b)
};

struct SsmScanArgs {
  int64_t d_inner = 0, d_state = 0;
  const float* state_in = nullptr;  // [d_state, d_inner]
  float* state_out = nullptr;       // [d_state, d_inner] (state_in itself, or apart)
  const float* x = nullptr;         // [d_inner] the convolution's output
  const float* dt = nullptr;        // [d_inner] the time step before softplus (dt projection + bias)
  const float* a = nullptr;         // [d_state, d_inner] A = -exp(A_log)
  const float* b = nullptr;         // [d_state]
  const float* c = nullptr;         // [d_state]
  const float* d = nullptr;         // [d_inner] skip weight
  const float* z = nullptr;         // [d_inner] gate
  float* y = nullptr;               // [d_inner] (C·state + D x) * silu(z)
};

// Softplus as the reference computes it: x above 20 is returned as is.
float ssm_softplus(float x);

// The steps the forward calls: vectorised over the channels (Highway, dispatched once per call).
void ssm_conv_step(const SsmConvArgs& a, int64_t i0, int64_t i1);
void ssm_scan_step(const SsmScanArgs& a, int64_t i0, int64_t i1);

// Scalar references, the order of operations written out plainly.
void ssm_conv_step_ref(const SsmConvArgs& a, int64_t i0, int64_t i1);
void ssm_scan_step_ref(const SsmScanArgs& a, int64_t i0, int64_t i1);

}  // namespace tandem::kernels
