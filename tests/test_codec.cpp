// KV codecs: round-trip error bounds per type, orthogonal rotations, attention reads (dots / accumulate) that
// match the decoded rows, row results independent of how many rows one call covers, and the rotation's
// benefit on vectors with an outlier channel.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "tandem/cache/attention.h"
#include "tandem/cache/kv_codec.h"
#include "tandem/tensor/fp16.h"
#include "tandem/util/error.h"

namespace {

using tandem::cache::HeadRotation;
using tandem::cache::KvCodec;
using tandem::cache::KvType;

const KvType kTypes[] = {KvType::kF32, KvType::kF16, KvType::kQ8_0, KvType::kQ4, KvType::kQ4R};

std::vector<float> gaussian(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

double sq_err(const float* a, const float* b, int64_t n) {
  double e = 0;
  for (int64_t i = 0; i < n; ++i) e += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  return e;
}

TEST(KvCodec, NamesRoundTrip) {
  for (KvType t : kTypes) EXPECT_EQ(tandem::cache::kv_type_from_name(tandem::cache::kv_type_name(t)), t);
  EXPECT_THROW(tandem::cache::kv_type_from_name("q5"), tandem::Error);
}

TEST(KvCodec, BlockSizes) {
  EXPECT_EQ(tandem::cache::kv_block_size(64), 32);
  EXPECT_EQ(tandem::cache::kv_block_size(8), 8);
  EXPECT_EQ(tandem::cache::kv_block_size(80), 20);
  EXPECT_THROW(tandem::cache::kv_block_size(7), tandem::Error);
}

TEST(KvCodec, RowBytes) {
  EXPECT_EQ(KvCodec::create(KvType::kF32, 64, 1, 1)->row_bytes(), 256u);
  EXPECT_EQ(KvCodec::create(KvType::kF16, 64, 1, 1)->row_bytes(), 128u);
  EXPECT_EQ(KvCodec::create(KvType::kQ8_0, 64, 1, 1)->row_bytes(), 68u);  // 2 x (2 + 32)
  EXPECT_EQ(KvCodec::create(KvType::kQ4, 64, 1, 1)->row_bytes(), 40u);    // 2 x (4 + 16)
  EXPECT_EQ(KvCodec::create(KvType::kQ4R, 8, 1, 1)->row_bytes(), 8u);     // 4 + 4
}

TEST(KvCodec, RoundTripErrorBounds) {
  for (int64_t dim : {8, 64, 96}) {
    for (KvType t : kTypes) {
      auto codec = KvCodec::create(t, dim, 2, 42);
      std::vector<uint8_t> row(codec->row_bytes());
      std::vector<float> back(static_cast<size_t>(dim));
      for (uint32_t trial = 0; trial < 20; ++trial) {
        const auto x = gaussian(static_cast<size_t>(dim), trial + 100 * static_cast<uint32_t>(dim), 2.0f);
        codec->encode(x.data(), 1, row.data());
        codec->decode(row.data(), 1, back.data());
        float amax = 0, lo = x[0], hi = x[0];
        for (float v : x) amax = std::max(amax, std::fabs(v)), lo = std::min(lo, v), hi = std::max(hi, v);
        for (int64_t i = 0; i < dim; ++i) {
          const float err = std::fabs(back[static_cast<size_t>(i)] - x[static_cast<size_t>(i)]);
          switch (t) {
            case KvType::kF32:
              ASSERT_EQ(err, 0.0f);
              break;
            case KvType::kF16:
              ASSERT_EQ(back[static_cast<size_t>(i)],
                        tandem::fp16_to_f32(tandem::f32_to_fp16(x[static_cast<size_t>(i)])));
              break;
            case KvType::kQ8_0:
              ASSERT_LE(err, amax / 127.0f * 0.51f + 1e-6f) << dim;
              break;
            case KvType::kQ4:
              ASSERT_LE(err, (hi - lo) / 15.0f * 0.52f + 1e-3f * amax) << dim;
              break;
            case KvType::kQ4R:
              break;  // bounded in the rotated domain; see the relative check below
          }
        }
        if (t == KvType::kQ4R) {
          double norm = 0;
          for (float v : x) norm += double(v) * v;
          EXPECT_LT(sq_err(back.data(), x.data(), dim), 0.02 * norm) << dim;
        }
      }
    }
  }
}

TEST(KvCodec, RotationsAreOrthogonal) {
  for (int64_t dim : {8, 64, 128, 48, 80}) {
    HeadRotation r(dim, 3, 9);
    EXPECT_EQ(r.hadamard(), (dim & (dim - 1)) == 0);
    const auto x = gaussian(static_cast<size_t>(dim), 5);
    std::vector<float> y(x.size()), z(x.size());
    for (int64_t h = 0; h < 3; ++h) {
      r.rotate(x.data(), h, y.data());
      double nx = 0, ny = 0;
      for (size_t i = 0; i < x.size(); ++i) nx += double(x[i]) * x[i], ny += double(y[i]) * y[i];
      EXPECT_NEAR(nx, ny, 1e-4 * nx) << dim;
      r.unrotate(y.data(), h, z.data());
      EXPECT_LT(sq_err(x.data(), z.data(), dim), 1e-9 * nx) << dim;
    }
    // Different heads get different rotations.
    std::vector<float> y1(x.size());
    r.rotate(x.data(), 0, y.data());
    r.rotate(x.data(), 1, y1.data());
    EXPECT_GT(sq_err(y.data(), y1.data(), dim), 1e-3);
  }
}

// dots / accumulate / finish_values against the decoded rows, and bit-identical whether rows are read one by
// one or all at once.
TEST(KvCodec, AttentionReadsMatchDecodedRows) {
  for (int64_t dim : {8, 64, 48}) {
    for (KvType t : kTypes) {
      auto codec = KvCodec::create(t, dim, 2, 7);
      const int64_t n = 13;
      std::vector<uint8_t> rows(codec->row_bytes() * n);
      std::vector<float> decoded(static_cast<size_t>(n * dim));
      const auto xs = gaussian(static_cast<size_t>(n * dim), 3);
      for (int64_t j = 0; j < n; ++j) {
        codec->encode(xs.data() + j * dim, 1, rows.data() + j * codec->row_bytes());
        codec->decode(rows.data() + j * codec->row_bytes(), 1, decoded.data() + j * dim);
      }
      const auto q = gaussian(static_cast<size_t>(dim), 4);
      std::vector<float> prepared(static_cast<size_t>(codec->prepared_size()));
      codec->prepare_query(q.data(), 1, prepared.data());
      std::vector<float> s_all(n), s_one(n);
      codec->dots(prepared.data(), rows.data(), n, s_all.data());
      for (int64_t j = 0; j < n; ++j)
        codec->dots(prepared.data(), rows.data() + j * codec->row_bytes(), 1, &s_one[j]);
      EXPECT_EQ(std::memcmp(s_all.data(), s_one.data(), sizeof(float) * n), 0);
      for (int64_t j = 0; j < n; ++j) {
        double ref = 0;
        for (int64_t i = 0; i < dim; ++i) ref += double(q[i]) * decoded[j * dim + i];
        EXPECT_NEAR(s_all[j], ref, 1e-4 * (1 + std::fabs(ref))) << kv_type_name(t) << " dim " << dim;
      }
      std::vector<float> p(n);
      for (int64_t j = 0; j < n; ++j) p[j] = 1.0f / static_cast<float>(j + 2);
      std::vector<float> acc(static_cast<size_t>(dim), 0.0f), out(static_cast<size_t>(dim));
      codec->accumulate(p.data(), rows.data(), n, acc.data());
      codec->finish_values(acc.data(), 1, out.data());
      for (int64_t i = 0; i < dim; ++i) {
        double ref = 0;
        for (int64_t j = 0; j < n; ++j) ref += double(p[j]) * decoded[j * dim + i];
        EXPECT_NEAR(out[i], ref, 1e-4 * (1 + std::fabs(ref))) << kv_type_name(t) << " dim " << dim;
      }
    }
  }
}

// Keys whose energy sits in one channel (as RoPE'd keys often do): the rotation spreads it, so 4-bit blocks
// fit the rest far better.
TEST(KvCodec, RotationHelpsWithOutlierChannels) {
  for (int64_t dim : {64, 128}) {
    auto q4 = KvCodec::create(KvType::kQ4, dim, 1, 3);
    auto q4r = KvCodec::create(KvType::kQ4R, dim, 1, 3);
    std::vector<uint8_t> row(q4->row_bytes());
    std::vector<float> back(static_cast<size_t>(dim));
    double e4 = 0, e4r = 0;
    for (uint32_t trial = 0; trial < 50; ++trial) {
      auto x = gaussian(static_cast<size_t>(dim), trial);
      x[5] = 25.0f;
      x[17] = -18.0f;
      q4->encode(x.data(), 0, row.data());
      q4->decode(row.data(), 0, back.data());
      e4 += sq_err(back.data(), x.data(), dim);
      q4r->encode(x.data(), 0, row.data());
      q4r->decode(row.data(), 0, back.data());
      e4r += sq_err(back.data(), x.data(), dim);
    }
    EXPECT_LT(e4r, 0.5 * e4) << "dim " << dim << ": q4 " << e4 << " q4r " << e4r;
  }
}

TEST(KvCodec, RejectsOversizedHeads) {
  EXPECT_THROW(KvCodec::create(KvType::kF16, tandem::cache::kMaxHeadDim + 2, 1, 0), tandem::Error);
}

}  // namespace
