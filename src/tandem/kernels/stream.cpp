#include "tandem/kernels/stream.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

namespace tandem::kernels {

uint64_t stream_xor(const uint8_t* data, size_t bytes) {
  // Four cache lines per step into independent accumulators, with a software prefetch well ahead (as the
  // matmul kernels do), so the figure is what a streaming kernel can actually reach, not one core's latency
  // bound.
  constexpr size_t kAhead = 3072;
  uint64_t acc[4][8] = {};
  size_t i = 0;
  for (; i + 256 <= bytes; i += 256) {
    __builtin_prefetch(data + i + kAhead);
    __builtin_prefetch(data + i + kAhead + 64);
    __builtin_prefetch(data + i + kAhead + 128);
    __builtin_prefetch(data + i + kAhead + 192);
    for (int l = 0; l < 4; ++l) {
      uint64_t w[8];
      std::memcpy(w, data + i + 64 * l, 64);
      for (int j = 0; j < 8; ++j) acc[l][j] ^= w[j];
    }
  }
  for (; i + 64 <= bytes; i += 64) {
    uint64_t w[8];
    std::memcpy(w, data + i, 64);
    for (int j = 0; j < 8; ++j) acc[0][j] ^= w[j];
  }
  uint64_t r = 0;
  for (const auto& a : acc)
    for (uint64_t v : a) r ^= v;
  return r;
}

double measure_read_bandwidth(const uint8_t* data, size_t bytes, ThreadPool& pool, int passes) {
  const size_t lines = bytes / 64;
  std::vector<uint64_t> sink(static_cast<size_t>(pool.size()) * 8, 0);  // one cache line per thread
  double best = 0;
  for (int p = 0; p < passes; ++p) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.parallel_for(static_cast<int64_t>(lines), 1024, [&](int64_t a, int64_t b, int t) {
      sink[static_cast<size_t>(t) * 8] ^=
          stream_xor(data + static_cast<size_t>(a) * 64, static_cast<size_t>(b - a) * 64);
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(lines * 64) / s / 1e9);
  }
  volatile uint64_t keep = 0;
  for (uint64_t v : sink) keep = keep ^ v;
  (void)keep;
  return best;
}

}  // namespace tandem::kernels
