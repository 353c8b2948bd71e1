#include "tandem/kernels/peak.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <vector>

#include "tandem/kernels/matmul.h"
#include "tandem/kernels/quant_layout.h"
#include "tandem/util/error.h"

namespace tandem::kernels {
namespace {

// One thread's probe operands and sums, a cache line apart from the next thread's.
struct alignas(64) ProbeData {
  std::array<uint8_t, 64> u;
  std::array<int8_t, 64 * kDotProbeChains> s;
  std::array<uint32_t, kDotProbeChains> sums;
};

}  // namespace

uint32_t dot_probe_reference(const uint8_t* u, const int8_t* s, int64_t iterations) {
  int64_t dot = 0;
  for (int i = 0; i < 64; ++i) dot += int64_t{u[i]} * s[i];
  return static_cast<uint32_t>(static_cast<uint64_t>(iterations) * static_cast<uint64_t>(dot));
}

double measure_dot_peak(ThreadPool& pool, Target t, int passes) {
  const QuantKernels& qk = quant_kernels(t);
  std::vector<ProbeData> data(static_cast<size_t>(pool.size()));
  for (size_t k = 0; k < data.size(); ++k) {
    for (int i = 0; i < 64; ++i) data[k].u[i] = static_cast<uint8_t>((i * 37 + k) % 64);
    for (int i = 0; i < 64 * kDotProbeChains; ++i)
      data[k].s[i] = static_cast<int8_t>((i * 91 + 7 * k) % 256 - 128);
  }
  auto run = [&](int64_t iterations) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.run([&](int thread) {
      ProbeData& d = data[static_cast<size_t>(thread)];
      qk.dot_probe(d.u.data(), d.s.data(), iterations, d.sums.data());
    });
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  // Steps for about 20 ms per pass, from a short timed run.
  int64_t iterations = 1 << 12;
  const double first = run(iterations);
  iterations = std::clamp<int64_t>(
      static_cast<int64_t>(static_cast<double>(iterations) * 0.02 / std::max(first, 1e-6)), iterations,
      int64_t{1} << 30);
  double best = 0;
  for (int p = 0; p < passes; ++p) {
    const double s = run(iterations);
    const double macs =
        static_cast<double>(pool.size()) * kDotProbeChains * 64.0 * static_cast<double>(iterations);
    best = std::max(best, macs / s / 1e9);
  }
  for (const ProbeData& d : data)
    for (int c = 0; c < kDotProbeChains; ++c)
      TANDEM_CHECK(d.sums[c] == dot_probe_reference(d.u.data(), d.s.data() + 64 * c, iterations),
                   "dot throughput probe: wrong sums");
  return best;
}

}  // namespace tandem::kernels
