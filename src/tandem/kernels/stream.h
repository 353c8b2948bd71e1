// Memory read bandwidth, measured with the thread team the model runs on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tandem/util/thread_pool.h"

namespace tandem::kernels {

// How the read kernel streams: plain loads (the hardware prefetchers alone), or the same loads with each
// cache line also prefetched into L2 kStreamL2Ahead bytes ahead, or into L1 that far ahead and into L2 twice
// as far (as the AMX target's row tiles prefetch). Which form reads fastest has changed between builds on one
// machine (performance.md), so the probe keeps every form.
enum class StreamForm { kPlain, kPrefetchL2, kPrefetchL1L2 };
inline constexpr StreamForm kStreamForms[] = {StreamForm::kPlain, StreamForm::kPrefetchL2,
                                              StreamForm::kPrefetchL1L2};
inline constexpr size_t kStreamL2Ahead = 6144;

// Reads `bytes` at `data` with every thread of `pool` (contiguous equal shares, the target's widest vectors
// into independent accumulators), `passes` times in each form, and returns the best pass in GB/s (1e9 bytes
// per second): a pass's rate is the best of its forms, so the roofline fractions are taken against the
// fastest read this code knows. With `rates`, each pass's rate is appended to it, in order.
double measure_read_bandwidth(const uint8_t* data, size_t bytes, ThreadPool& pool, int passes,
                              std::vector<double>* rates = nullptr);

// XOR of the 64-bit words of [data, data + bytes) (whole words; any alignment): the streaming read kernel
// (Highway, dispatched to the widest target) in either form, and its scalar reference.
uint64_t stream_xor(const uint8_t* data, size_t bytes, StreamForm form = StreamForm::kPlain);
uint64_t stream_xor_reference(const uint8_t* data, size_t bytes);

}  // namespace tandem::kernels
