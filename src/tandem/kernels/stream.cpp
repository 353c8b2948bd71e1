// The streaming read kernel of stream.h in Highway; this file is compiled once per SIMD target
// (foreach_target).
#include "tandem/kernels/stream.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tandem/kernels/stream.cpp"
// clang-format off
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace tandem::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The widest vectors of the target into four independent accumulators, each cache line also prefetched as
// kForm says (stream.h). Prefetches past the end read nothing: a prefetch never faults.
template <StreamForm kForm>
uint64_t StreamXorForm(const uint8_t* data, size_t bytes) {
  const hn::ScalableTag<uint64_t> d;
  const size_t n = hn::Lanes(d);
  const size_t words = bytes / 8;
  auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  size_t i = 0;
  const auto* words_at = reinterpret_cast<const uint64_t*>(data);  // LoadU: any alignment
  for (; i + 4 * n <= words; i += 4 * n) {
    const uintptr_t at = reinterpret_cast<uintptr_t>(data) + 8 * i + kStreamL2Ahead;
    if constexpr (kForm == StreamForm::kPrefetchL2) {
      for (size_t b = 0; b < 32 * n; b += 64) __builtin_prefetch(reinterpret_cast<const void*>(at + b), 0, 2);
    } else if constexpr (kForm == StreamForm::kPrefetchL1L2) {
      for (size_t b = 0; b < 32 * n; b += 64) {
        __builtin_prefetch(reinterpret_cast<const void*>(at + b), 0, 3);
        __builtin_prefetch(reinterpret_cast<const void*>(at + kStreamL2Ahead + b), 0, 2);
      }
    }
    a0 = hn::Xor(a0, hn::LoadU(d, words_at + i));
    a1 = hn::Xor(a1, hn::LoadU(d, words_at + i + n));
    a2 = hn::Xor(a2, hn::LoadU(d, words_at + i + 2 * n));
    a3 = hn::Xor(a3, hn::LoadU(d, words_at + i + 3 * n));
  }
  for (; i + n <= words; i += n) a0 = hn::Xor(a0, hn::LoadU(d, words_at + i));
  uint64_t lanes[HWY_LANES(uint64_t)];
  hn::StoreU(hn::Xor(hn::Xor(a0, a1), hn::Xor(a2, a3)), d, lanes);
  uint64_t r = 0;
  for (size_t j = 0; j < n; ++j) r ^= lanes[j];
  for (; i < words; ++i) {
    uint64_t w;
    std::memcpy(&w, data + 8 * i, 8);
    r ^= w;
  }
  return r;
}

uint64_t StreamXor(const uint8_t* data, size_t bytes) {
  return StreamXorForm<StreamForm::kPlain>(data, bytes);
}

uint64_t StreamXorPrefetch(const uint8_t* data, size_t bytes) {
  return StreamXorForm<StreamForm::kPrefetchL2>(data, bytes);
}

uint64_t StreamXorPrefetchL1L2(const uint8_t* data, size_t bytes) {
  return StreamXorForm<StreamForm::kPrefetchL1L2>(data, bytes);
}

}  // namespace HWY_NAMESPACE
}  // namespace tandem::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tandem::kernels {

HWY_EXPORT(StreamXor);
HWY_EXPORT(StreamXorPrefetch);
HWY_EXPORT(StreamXorPrefetchL1L2);

uint64_t stream_xor(const uint8_t* data, size_t bytes, StreamForm form) {
  switch (form) {
    case StreamForm::kPrefetchL2:
      return HWY_DYNAMIC_DISPATCH(StreamXorPrefetch)(data, bytes);
    case StreamForm::kPrefetchL1L2:
      return HWY_DYNAMIC_DISPATCH(StreamXorPrefetchL1L2)(data, bytes);
    default:
      return HWY_DYNAMIC_DISPATCH(StreamXor)(data, bytes);
  }
}

uint64_t stream_xor_reference(const uint8_t* data, size_t bytes) {
  uint64_t r = 0;
  for (size_t i = 0; i + 8 <= bytes; i += 8) {
    uint64_t w;
    std::memcpy(&w, data + i, 8);
    r ^= w;
  }
  return r;
}

double measure_read_bandwidth(const uint8_t* data, size_t bytes, ThreadPool& pool, int passes,
                              std::vector<double>* rates) {
  const size_t lines = bytes / 64;
  std::vector<uint64_t> sink(static_cast<size_t>(pool.size()) * 8, 0);  // one cache line per thread
  double best = 0;
  for (int p = 0; p < passes; ++p) {
    double rate = 0;
    for (const StreamForm form : kStreamForms) {
      const auto t0 = std::chrono::steady_clock::now();
      pool.parallel_for(static_cast<int64_t>(lines), 1024, [&](int64_t a, int64_t b, int t) {
        sink[static_cast<size_t>(t) * 8] ^=
            stream_xor(data + static_cast<size_t>(a) * 64, static_cast<size_t>(b - a) * 64, form);
      });
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      rate = std::max(rate, static_cast<double>(lines * 64) / s / 1e9);
    }
    if (rates) rates->push_back(rate);
    best = std::max(best, rate);
  }
  volatile uint64_t keep = 0;
  for (uint64_t v : sink) keep = keep ^ v;
  (void)keep;
  return best;
}

}  // namespace tandem::kernels
#endif
