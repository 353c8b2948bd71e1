// Attention and activation kernels (Highway, runtime dispatch): scores, value accumulation, softmax, SiLU,
// RMS norm, dimension-major key blocks and the f16 store against formulas in double precision, the scalar
// reference and separate calls, on every Highway target the machine supports. Single-threaded, so that the
// ARM check runs them under qemu-user.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "hwy/highway.h"
#include "hwy/targets.h"
#include "tandem/kernels/float_kernels.h"
#include "tandem/kernels/key_blocks.h"
#include "tandem/kernels/ops.h"
#include "tandem/tensor/fp16.h"
#include "test_util.h"

namespace {

using namespace tandem;
using namespace tandem::kernels;

// Attention primitives: |ds| <= 1e-5 * sum |q k| + 1e-6 against double sums; accumulate likewise per element.
TEST(Kernels, AttentionPrimitivesMatchScalarOnEveryHighwayTarget) {
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int64_t dim : {1, 40, 64, 67, 128}) {
    const int64_t n = 9;
    std::vector<float> q(static_cast<size_t>(dim) + 1), kf(static_cast<size_t>(n * dim) + 1),
        p(static_cast<size_t>(n));
    std::vector<uint16_t> kh(static_cast<size_t>(n * dim) + 1);
    for (auto& v : q) v = dist(rng);
    for (size_t i = 0; i < kf.size(); ++i) {
      kh[i] = f32_to_fp16(dist(rng));
      kf[i] = fp16_to_f32(kh[i]);
    }
    for (auto& v : p) v = std::fabs(dist(rng));
    tandem::testing::for_each_hwy_target([&] {
      std::vector<float> s16(static_cast<size_t>(n)), s32(static_cast<size_t>(n));
      std::vector<float> a16(static_cast<size_t>(dim), 0.5f), a32(static_cast<size_t>(dim), 0.5f);
      dots_f16(q.data() + 1, kh.data() + 1, n, dim, s16.data());
      dots_f32(q.data() + 1, kf.data() + 1, n, dim, s32.data());
      accumulate_f16(p.data(), kh.data() + 1, n, dim, a16.data());
      accumulate_f32(p.data(), kf.data() + 1, n, dim, a32.data());
      for (int64_t j = 0; j < n; ++j) {
        double exact = 0, mag = 0;
        for (int64_t d = 0; d < dim; ++d) {
          exact +=
              static_cast<double>(q[static_cast<size_t>(1 + d)]) * kf[static_cast<size_t>(1 + j * dim + d)];
          mag += std::fabs(q[static_cast<size_t>(1 + d)] * kf[static_cast<size_t>(1 + j * dim + d)]);
        }
        EXPECT_NEAR(s16[static_cast<size_t>(j)], exact, 1e-5 * mag + 1e-6);
        EXPECT_NEAR(s32[static_cast<size_t>(j)], exact, 1e-5 * mag + 1e-6);
      }
      for (int64_t d = 0; d < dim; ++d) {
        double exact = 0.5, mag = 0.5;
        for (int64_t j = 0; j < n; ++j) {
          exact += static_cast<double>(p[static_cast<size_t>(j)]) * kf[static_cast<size_t>(1 + j * dim + d)];
          mag += std::fabs(p[static_cast<size_t>(j)] * kf[static_cast<size_t>(1 + j * dim + d)]);
        }
        EXPECT_NEAR(a16[static_cast<size_t>(d)], exact, 1e-5 * mag + 1e-6);
        EXPECT_NEAR(a32[static_cast<size_t>(d)], exact, 1e-5 * mag + 1e-6);
      }
    });
  }
}

// Grouped attention primitives (several query heads sharing a KV head) give each query the bits of a separate
// call, and a row's score the bits it has in any split of the rows, on every Highway target.
TEST(Kernels, GroupedAttentionPrimitivesEqualSeparateCalls) {
  std::mt19937 rng(8);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  // 168: several register blocks of dims, and a tail; 520: groups of more than 8 queries weigh the f16 rows
  // converted in pieces of fewer rows than the runs hold.
  for (int64_t dim : {1, 40, 64, 67, 168, 520}) {
    for (int64_t G : {1, 3, 8, 11}) {
      const int64_t n = 13, qs = dim + 3, ss = n + 2;
      std::vector<float> q(static_cast<size_t>(G * qs)), kf(static_cast<size_t>(n * dim)),
          p(static_cast<size_t>(G * ss));
      std::vector<uint16_t> kh(kf.size());
      for (auto& v : q) v = dist(rng);
      for (auto& v : p) v = std::fabs(dist(rng));
      for (size_t i = 0; i < kf.size(); ++i) {
        kh[i] = f32_to_fp16(dist(rng));
        kf[i] = fp16_to_f32(kh[i]);
      }
      tandem::testing::for_each_hwy_target([&] {
        std::vector<float> g16(static_cast<size_t>(G * ss), 7.0f), g32(g16), one16(g16), one32(g16);
        std::vector<float> a16(static_cast<size_t>(G * dim), 0.25f), a32(a16), b16(a16), b32(a16);
        dots_group_f16(q.data(), G, qs, kh.data(), n, dim, g16.data(), ss);
        dots_group_f32(q.data(), G, qs, kf.data(), n, dim, g32.data(), ss);
        accumulate_group_f16(p.data(), G, ss, kh.data(), n, dim, a16.data(), dim);
        accumulate_group_f32(p.data(), G, ss, kf.data(), n, dim, a32.data(), dim);
        for (int64_t h = 0; h < G; ++h) {
          dots_f16(q.data() + h * qs, kh.data(), n, dim, one16.data() + h * ss);
          dots_f32(q.data() + h * qs, kf.data(), n, dim, one32.data() + h * ss);
          accumulate_f16(p.data() + h * ss, kh.data(), n, dim, b16.data() + h * dim);
          accumulate_f32(p.data() + h * ss, kf.data(), n, dim, b32.data() + h * dim);
        }
        // A score does not depend on the rows computed beside it: rows split over two calls give the same.
        std::vector<float> split16(one16), split32(one32);
        for (int64_t h = 0; h < G; ++h) {
          dots_f16(q.data() + h * qs, kh.data(), 5, dim, split16.data() + h * ss);
          dots_f16(q.data() + h * qs, kh.data() + 5 * dim, n - 5, dim, split16.data() + h * ss + 5);
          dots_f32(q.data() + h * qs, kf.data(), 5, dim, split32.data() + h * ss);
          dots_f32(q.data() + h * qs, kf.data() + 5 * dim, n - 5, dim, split32.data() + h * ss + 5);
        }
        EXPECT_EQ(split16, one16) << "dim=" << dim << " G=" << G;
        EXPECT_EQ(split32, one32) << "dim=" << dim << " G=" << G;
        EXPECT_EQ(g16, one16) << "dim=" << dim << " G=" << G;
        EXPECT_EQ(g32, one32) << "dim=" << dim << " G=" << G;
        EXPECT_EQ(a16, b16) << "dim=" << dim << " G=" << G;
        EXPECT_EQ(a32, b32) << "dim=" << dim << " G=" << G;
        // The rows in runs (stored apart, each weighted from its own offset) in one call: the bits of the
        // grouped call over the rows in order.
        std::vector<uint16_t> kh_runs(kh.size() + static_cast<size_t>(7 * dim));
        std::vector<float> kf_runs(kh_runs.size());
        const int64_t cuts[] = {0, 4, 5, 13};  // runs of 4, 1 and 8 rows, stored 3 rows apart
        std::vector<ValueRun> r16, r32;
        for (int k = 0; k < 3; ++k) {
          const int64_t at = (cuts[k] + 3 * k) * dim, len = cuts[k + 1] - cuts[k];
          std::copy_n(kh.begin() + cuts[k] * dim, len * dim, kh_runs.begin() + at);
          std::copy_n(kf.begin() + cuts[k] * dim, len * dim, kf_runs.begin() + at);
          r16.push_back({reinterpret_cast<const uint8_t*>(kh_runs.data() + at), len, cuts[k]});
          r32.push_back({reinterpret_cast<const uint8_t*>(kf_runs.data() + at), len, cuts[k]});
        }
        std::vector<float> c16(static_cast<size_t>(G * dim), 0.25f), c32(c16);
        accumulate_runs_f16(p.data(), G, ss, r16.data(), 3, dim, c16.data(), dim);
        accumulate_runs_f32(p.data(), G, ss, r32.data(), 3, dim, c32.data(), dim);
        EXPECT_EQ(c16, a16) << "dim=" << dim << " G=" << G;
        EXPECT_EQ(c32, a32) << "dim=" << dim << " G=" << G;
      });
    }
  }
}

TEST(Kernels, SiluMulMatchesTheScalarFormula) {
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 4.0f);
  for (int64_t n : {1, 7, 16, 33, 5632}) {
    std::vector<float> g(static_cast<size_t>(n)), u(g.size()), out(g.size());
    for (auto& v : g) v = dist(rng);
    for (auto& v : u) v = dist(rng);
    g[0] = -300.0f;  // exp(-g) overflows: the result is -0 either way
    if (n > 1) g[1] = 120.0f;
    silu_mul(g.data(), u.data(), out.data(), n);
    for (size_t i = 0; i < g.size(); ++i) {
      const double want = static_cast<double>(g[i]) / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i];
      EXPECT_NEAR(out[i], want, 4e-7 * std::fabs(want) + 1e-30) << "n=" << n << " i=" << i;
    }
  }
}

// rms_norm against the formula with one running double sum: lengths with and without a tail past the eight
// partial sums, with and without weights; in place, the same bits.
TEST(Kernels, RmsNormMatchesTheFormula) {
  std::mt19937 rng(12);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  for (int64_t n : {1, 5, 8, 13, 64, 2048, 2053}) {
    std::vector<float> x(static_cast<size_t>(n)), w(x.size()), y(x.size()), z(x.size());
    for (auto& v : x) v = dist(rng);
    for (auto& v : w) v = dist(rng);
    double sum = 0;
    for (float v : x) sum += static_cast<double>(v) * v;
    const double scale = 1.0 / std::sqrt(sum / static_cast<double>(n) + 1e-5);
    rms_norm(x.data(), w.data(), y.data(), n, 1e-5f);
    rms_norm(x.data(), nullptr, z.data(), n, 1e-5f);
    for (size_t i = 0; i < x.size(); ++i) {
      const double want = x[i] * scale;
      EXPECT_NEAR(z[i], want, 1e-6 * std::fabs(want) + 1e-30) << "n=" << n << " i=" << i;
      EXPECT_NEAR(y[i], want * w[i], 1e-6 * std::fabs(want * w[i]) + 1e-30) << "n=" << n << " i=" << i;
    }
    std::vector<float> in_place = x;
    rms_norm(in_place.data(), w.data(), in_place.data(), n, 1e-5f);
    EXPECT_EQ(in_place, y) << "n=" << n;
  }
}

// Attention softmax against the formula in double precision, with and without soft-capping, on every Highway
// target; tails of every length and a large spread of scores (exponentials that underflow to zero).
TEST(Kernels, SoftmaxMatchesTheFormulaOnEveryHighwayTarget) {
  std::mt19937 rng(13);
  std::normal_distribution<float> dist(0.0f, 6.0f);
  for (int64_t n : {1, 2, 15, 16, 17, 100, 263, 1024}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (auto& v : x) v = dist(rng);
    x[0] = -400.0f;
    for (float cap : {0.0f, 50.0f}) {
      const float scale = 0.125f;
      std::vector<double> want(x.size());
      double max = -INFINITY, sum = 0;
      for (size_t j = 0; j < x.size(); ++j) {
        const double v = static_cast<double>(x[j]) * scale;
        want[j] = cap > 0 ? cap * std::tanh(v / cap) : v;
        max = std::max(max, want[j]);
      }
      for (auto& w : want) sum += (w = std::exp(w - max));
      for (auto& w : want) w /= sum;
      tandem::testing::for_each_hwy_target([&] {
        std::vector<float> got = x;
        softmax(got.data(), n, scale, cap);
        for (size_t j = 0; j < x.size(); ++j)
          ASSERT_NEAR(got[j], want[j], 2e-6 * want[j] + 1e-30) << "n=" << n << " cap=" << cap << " j=" << j;
      });
    }
  }
}

// Scores so large that their scaled max is far from the exact product (scale 0.1, scores of 9e10 and 2e11:
// their roundings lie up to hundreds apart), positive and negative: the softmax still gives a distribution,
// largest where the score is, on every Highway target.
TEST(Kernels, SoftmaxOfHugeScoresStaysADistribution) {
  for (float base : {9e10f, 2e11f, -2e11f}) {
    std::vector<float> x(100);
    for (size_t j = 0; j < x.size(); ++j) x[j] = base + 65536.0f * static_cast<float>((j * 37) % 100);
    const auto top = std::max_element(x.begin(), x.end()) - x.begin();
    tandem::testing::for_each_hwy_target([&] {
      std::vector<float> got = x;
      softmax(got.data(), static_cast<int64_t>(got.size()), 0.1f, 0.0f);
      double sum = 0;
      for (float p : got) {
        ASSERT_TRUE(std::isfinite(p) && p >= 0.0f && p <= 1.0f) << "base=" << base << " p=" << p;
        sum += p;
      }
      EXPECT_NEAR(sum, 1.0, 1e-5) << "base=" << base;
      EXPECT_EQ(std::max_element(got.begin(), got.end()) - got.begin(), top) << "base=" << base;
    });
  }
}

}  // namespace

TEST(Kernels, DimMajorScoresMatchTheReferenceOnEveryHighwayTarget) {
  // Key blocks stored dimension-major: every target with fused multiply-add gives the scalar reference's
  // bits (others within 1e-5 relative) for any run of the block, group and head size, block sizes that are
  // and are not multiples of the vector included. Groups of more than one pass convert each vector of keys
  // once where the head fits the scratch (264 dimensions do not).
  std::mt19937 rng(9);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int64_t B : {16, 8, 32, 12}) {
    for (int64_t dim : {1, 7, 64, 80, 264}) {
      const int64_t G = 17;
      std::vector<float> q(static_cast<size_t>(G * dim));
      std::vector<uint16_t> block(static_cast<size_t>(dim * B));
      for (auto& v : q) v = dist(rng);
      for (auto& v : block) v = f32_to_fp16(dist(rng));
      for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
        hwy::SetSupportedTargetsForTest(target);
        const bool fma = (target & (HWY_SSSE3 | HWY_SSE4 | HWY_EMU128 | HWY_SCALAR)) == 0;
        for (const auto& [off, n] : std::vector<std::pair<int64_t, int64_t>>{
                 {0, B}, {3, B - 3}, {5, 1}, {B - 1, 1}, {2, std::min<int64_t>(9, B - 2)}}) {
          for (int64_t g : {int64_t{1}, int64_t{3}, int64_t{9}, G}) {
            std::vector<float> got(static_cast<size_t>(g * n)), want(static_cast<size_t>(g * n));
            dots_dim_major_f16(q.data(), g, dim, block.data(), B, off, n, dim, got.data(), n);
            dots_dim_major_f16_reference(q.data(), g, dim, block.data(), B, off, n, dim, want.data(), n);
            for (size_t i = 0; i < got.size(); ++i) {
              if (fma) {
                ASSERT_EQ(got[i], want[i]) << hwy::TargetName(target) << " B " << B << " dim " << dim
                                           << " off " << off << " n " << n << " G " << g << " i " << i;
              } else {
                ASSERT_NEAR(got[i], want[i], 1e-5 * (1 + std::fabs(want[i])));
              }
            }
          }
        }
        // The reference against a plain sum in double.
        std::vector<float> s(static_cast<size_t>(B));
        dots_dim_major_f16_reference(q.data(), 1, dim, block.data(), B, 0, B, dim, s.data(), B);
        for (int64_t p = 0; p < B; ++p) {
          double exact = 0, mag = 0;
          for (int64_t i = 0; i < dim; ++i) {
            const double t =
                double(q[static_cast<size_t>(i)]) * fp16_to_f32(block[static_cast<size_t>(i * B + p)]);
            exact += t, mag += std::fabs(t);
          }
          ASSERT_NEAR(s[static_cast<size_t>(p)], exact, 1e-5 * mag + 1e-6);
        }
      }
      hwy::SetSupportedTargetsForTest(0);
    }
  }
}

// The f16 KV store (f32_to_f16) against the scalar reference, bit for bit, on every Highway target: every
// half value, its f32 neighbours and the midpoints to the next half (ties both ways), overflow to infinity,
// f32 subnormals, NaNs with assorted payloads and signs, and random bit patterns; lengths that leave a tail
// after whole vectors, written at an odd byte offset.
TEST(Kernels, F32ToF16MatchesTheScalarConversionOnEveryHighwayTarget) {
  std::vector<float> xs;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = fp16_to_f32(static_cast<uint16_t>(h));
    xs.push_back(f);
    xs.push_back(std::nextafter(f, 0.0f));
    xs.push_back(std::nextafter(f, std::copysign(HUGE_VALF, f)));
    if ((h & 0x7C00) != 0x7C00 && (h & 0x7FFF) != 0x7BFF) {
      const float mid = 0.5f * (f + fp16_to_f32(static_cast<uint16_t>(h + 1)));  // exact in f32
      xs.push_back(mid);
      xs.push_back(std::nextafter(mid, 0.0f));
      xs.push_back(std::nextafter(mid, std::copysign(HUGE_VALF, mid)));
    }
  }
  for (uint32_t bits : {0x477FEFFFu, 0x477FF000u, 0x477FFFFFu, 0x7F7FFFFFu, 0x00000001u, 0x007FFFFFu,
                        0x33000000u, 0x33000001u, 0x32FFFFFFu, 0x7F800001u, 0x7FBFFFFFu, 0x7FC00000u,
                        0x7FFFFFFFu, 0xFF800001u, 0xFFC00001u, 0xFFFFE000u}) {
    xs.push_back(bits_to_f32(bits));
    xs.push_back(bits_to_f32(bits ^ 0x80000000u));
  }
  std::mt19937 rng(11);
  for (int i = 0; i < (1 << 18); ++i) xs.push_back(bits_to_f32(static_cast<uint32_t>(rng())));
  std::vector<uint16_t> want(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) want[i] = f32_to_fp16(xs[i]);

  std::vector<uint8_t> out(2 * xs.size() + 1);
  tandem::testing::for_each_hwy_target([&] {
    std::fill(out.begin(), out.end(), uint8_t{0xA5});
    f32_to_f16(xs.data(), static_cast<int64_t>(xs.size()), out.data() + 1);
    for (size_t i = 0; i < xs.size(); ++i) {
      uint16_t got;
      std::memcpy(&got, out.data() + 1 + 2 * i, 2);
      ASSERT_EQ(got, want[i]) << "element " << i << " bits " << std::hex << f32_to_bits(xs[i]);
    }
    for (int64_t n : {0, 1, 7, 15, 17, 33}) {
      std::fill(out.begin(), out.end(), uint8_t{0xA5});
      f32_to_f16(xs.data() + 5, n, out.data());
      for (int64_t i = 0; i < n; ++i) {
        uint16_t got;
        std::memcpy(&got, out.data() + 2 * i, 2);
        ASSERT_EQ(got, want[static_cast<size_t>(5 + i)]) << "n " << n << " element " << i;
      }
      EXPECT_EQ(out[static_cast<size_t>(2 * n)], 0xA5) << "n " << n << ": wrote past the end";
    }
  });
}
