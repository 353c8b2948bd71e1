// The machine's integer multiply-add throughput with the instructions the quantized kernels use: the compute
// bound of a verify window, as measure_read_bandwidth (stream.h) gives the memory bound of decode. A window
// of n rows multiplies every weight by n activations, so it takes at least n * (multiply-adds per token) /
// this rate, however its weights are read.
#pragma once

#include <cstdint>

#include "tandem/kernels/cpu_target.h"
#include "tandem/util/thread_pool.h"

namespace tandem::kernels {

// 8-bit multiply-adds per second (1e9 units) of every thread of `pool` running target t's throughput probe
// (QuantKernels::dot_probe) at once, best of `passes` passes of about 20 ms each. Checks the probe's sums
// against dot_probe_reference.
double measure_dot_peak(ThreadPool& pool, Target t, int passes);

// What QuantKernels::dot_probe computes for one chain: iterations * sum(u[i] * s[i], i < 64) modulo 2^32.
uint32_t dot_probe_reference(const uint8_t* u, const int8_t* s, int64_t iterations);

}  // namespace tandem::kernels
