// Q4_0 and Q8_0 in row tiles (repack.h) on the targets that read them (QuantKernels::row_tiles, the AMX
// target): activations in natural order, and the direct kernels' bits whatever window a row runs in.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "tandem/kernels/cpu_target.h"
#include "tandem/kernels/matmul.h"
#include "tandem/kernels/quant_layout.h"
#include "tandem/kernels/repack.h"
#include "tandem/tensor/quant.h"
#include "test_util.h"

namespace tandem::kernels {
namespace {

using testing::normal_floats;

// Every target quantizes activations into natural order with the scalar target's bits (codes in element
// order, block b's scale and sums in lane group b, the rest zero), including a partial last super-block.
TEST(RowTiles, NaturalActivationsMatchTheScalarTarget) {
  const QuantKernels& ref = quant_kernels(Target::kScalar);
  for (int64_t k : {288, 2048}) {
    const int64_t ns = super_count(k);
    const std::vector<float> x = normal_floats(k, 3);
    std::vector<ActSuper> want(static_cast<size_t>(ns));
    ref.quantize_row(x.data(), k, ActForm::kNatural, want.data());
    for (int64_t e = 0; e < k; ++e) {
      const ActSuper& s = want[static_cast<size_t>(e / kSuper)];
      const int j = static_cast<int>(e % kSuper / 32);
      ASSERT_NEAR(s.q[e % kSuper] * s.d[j], x[static_cast<size_t>(e)], 0.6f * s.d[j]) << e;  // d in f16
    }
    for (int j = k % kSuper == 0 ? 8 : static_cast<int>(k % kSuper / 32); j < kGroups; ++j)
      EXPECT_EQ(want.back().d[j], 0.0f);
    for (Target target : runnable_targets()) {
      SCOPED_TRACE(std::string(target_name(target)) + " k=" + std::to_string(k));
      std::vector<ActSuper> got(static_cast<size_t>(ns));
      std::memset(static_cast<void*>(got.data()), 0xAB, got.size() * sizeof(ActSuper));
      quant_kernels(target).quantize_row(x.data(), k, ActForm::kNatural, got.data());
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(ActSuper)));
    }
  }
}

// One row's result equals the dot product of the dequantized weights with the quantized activations (codes
// times block scales), summed in double, within the float-order tolerance; and every window and prefill pass
// of up to direct_max_rows rows (the vpdpbusd kernel's, tiles of 16 and a rest) gives each row those bits.
TEST(RowTiles, KernelsKeepTheirBitsAndMatchTheQuantizedProduct) {
  int tested = 0;
  for (Target target : runnable_targets()) {
    const QuantKernels& qk = quant_kernels(target);
    if (!qk.row_tiles) continue;
    for (DType t : {DType::Q4_0, DType::Q8_0})
      for (int64_t k : {288, 2048, 5632}) {
        SCOPED_TRACE(std::string(target_name(target)) + " " + std::string(dtype_name(t)) +
                     " k=" + std::to_string(k));
        const int64_t max_rows = qk.direct_max_rows(t, WeightForm::kRowTiles, k, false);
        ASSERT_EQ(max_rows, t == DType::Q4_0 ? 64 : kTileRows);  // Q4_0: prefill passes of 64 rows
        const int64_t n = 48, ns = super_count(k);
        const size_t rb = row_bytes(t, k);
        std::vector<uint8_t> w(rb * n);
        std::vector<float> deq(static_cast<size_t>(n * k));
        const std::vector<float> weights = normal_floats(n * k, 41);
        for (int64_t o = 0; o < n; ++o) {
          quantize_row(t, weights.data() + o * k, w.data() + o * rb, k);
          dequantize_row(t, w.data() + o * rb, deq.data() + o * k, k);
        }
        repack_rows(WeightForm::kRowTiles, t, k, w.data(), w.size());
        const std::vector<float> x = normal_floats(max_rows * k, 43);
        std::vector<ActSuper> act(static_cast<size_t>(ns * max_rows));
        for (int64_t r = 0; r < max_rows; ++r)
          qk.quantize_row(x.data() + r * k, k, ActForm::kNatural, act.data() + r * ns);
        std::vector<float> alone(static_cast<size_t>(max_rows * n));
        for (int64_t r = 0; r < max_rows; ++r)
          qk.direct_rows(t, WeightForm::kRowTiles, w.data(), static_cast<int64_t>(rb), n, k,
                         act.data() + r * ns, ns, 1, alone.data() + r * n, n, PrefetchReach::kNear);
        for (int64_t r = 0; r < max_rows; r += 7)
          for (int64_t o = 0; o < n; ++o) {
            double want = 0, mag = 0;
            for (int64_t i = 0; i < k; ++i) {
              const ActSuper& s = act[static_cast<size_t>(r * ns + i / kSuper)];
              const double p = static_cast<double>(deq[static_cast<size_t>(o * k + i)]) * s.q[i % kSuper] *
                               s.d[i % kSuper / 32];
              want += p;
              mag += std::fabs(p);
            }
            ASSERT_NEAR(alone[static_cast<size_t>(r * n + o)], want, 1e-5 * mag + 1e-6)
                << "r=" << r << " o=" << o;
          }
        for (int64_t rows = 1; rows <= max_rows; ++rows) {
          std::vector<float> got(static_cast<size_t>(rows * n), -1.0f);
          qk.direct_rows(t, WeightForm::kRowTiles, w.data(), static_cast<int64_t>(rb), n, k, act.data(), ns,
                         rows, got.data(), n, PrefetchReach::kFar);
          EXPECT_EQ(0, std::memcmp(got.data(), alone.data(), got.size() * sizeof(float))) << "rows=" << rows;
        }
        ++tested;
      }
  }
  if (tested == 0) GTEST_SKIP() << "no target here reads row tiles";
}

}  // namespace
}  // namespace tandem::kernels
