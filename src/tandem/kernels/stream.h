// Memory read bandwidth, measured with the thread team the model runs on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tandem/util/thread_pool.h"

namespace tandem::kernels {

// Reads `bytes` at `data` once with every thread of `pool` (contiguous equal shares, the target's widest
// vectors into independent accumulators), `passes` times, and returns the best rate in GB/s (1e9 bytes per
// second). With `rates`, each pass's rate is appended to it, in order.
double measure_read_bandwidth(const uint8_t* data, size_t bytes, ThreadPool& pool, int passes,
                              std::vector<double>* rates = nullptr);

// XOR of the 64-bit words of [data, data + bytes) (whole words; any alignment): the streaming read kernel
// (Highway, dispatched to the widest target), and its scalar reference.
uint64_t stream_xor(const uint8_t* data, size_t bytes);
uint64_t stream_xor_reference(const uint8_t* data, size_t bytes);

}  // namespace tandem::kernels
