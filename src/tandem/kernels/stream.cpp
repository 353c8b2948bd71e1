#include "tandem/kernels/stream.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

namespace tandem::kernels {

uint64_t stream_xor(const uint8_t* data, size_t bytes) {
  uint64_t acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (size_t i = 0; i + 64 <= bytes; i += 64) {
    uint64_t w[8];
    std::memcpy(w, data + i, 64);
    for (int j = 0; j < 8; ++j) acc[j] ^= w[j];
  }
  return acc[0] ^ acc[1] ^ acc[2] ^ acc[3] ^ acc[4] ^ acc[5] ^ acc[6] ^ acc[7];
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
