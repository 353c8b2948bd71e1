// KV codecs: round-trip error bounds per type, orthogonal rotations, attention reads (dots / accumulate) that
// match the decoded rows, row results independent of how many rows one call covers (and of how many
// window rows share a pass, attend_rows), and the rotation's benefit on vectors with an outlier channel.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "tandem/cache/attention.h"
#include "tandem/cache/kv_cache.h"
#include "tandem/cache/kv_codec.h"
#include "tandem/tensor/fp16.h"
#include "tandem/util/error.h"

namespace {

using tandem::cache::HeadRotation;
using tandem::cache::KeyAnchor;
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
  EXPECT_EQ(tandem::cache::kv_q8_block_size(64), 32);
  EXPECT_EQ(tandem::cache::kv_q8_block_size(8), 4);
  EXPECT_EQ(tandem::cache::kv_q8_block_size(32), 16);
}

TEST(KvCodec, RowBytes) {
  EXPECT_EQ(KvCodec::create(KvType::kF32, 64, 1, 1)->row_bytes(), 256u);
  EXPECT_EQ(KvCodec::create(KvType::kF16, 64, 1, 1)->row_bytes(), 128u);
  EXPECT_EQ(KvCodec::create(KvType::kQ8_0, 64, 1, 1)->row_bytes(), 68u);  // 2 x (2 + 32)
  EXPECT_EQ(KvCodec::create(KvType::kQ8_0, 8, 1, 1)->row_bytes(), 12u);   // 2 x (2 + 4)
  EXPECT_EQ(KvCodec::create(KvType::kQ4, 64, 1, 1)->row_bytes(), 36u);    // 2 x (2 + 16)
  EXPECT_EQ(KvCodec::create(KvType::kQ4R, 8, 1, 1)->row_bytes(), 6u);     // 2 + 4
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
        float amax = 0;
        for (float v : x) amax = std::max(amax, std::fabs(v));
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
              // Half a step, or a whole one for the side opposite the largest element (7 steps of 8).
              ASSERT_LE(err, amax / 8.0f * 1.01f + 1e-3f * amax) << dim;
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

// Every codec of keys: rows written into a block (encode_in_block, in any order) score as the rows on their
// own do, bit for bit, over any run of the block and any group of queries; the f16 keys' dimension-major
// block holds element i of row p at i * B + p.
TEST(KvCodec, KeyBlocksScoreAsTheirRows) {
  for (int64_t dim : {8, 64, 48}) {
    for (KvType t : kTypes) {
      auto codec = KvCodec::create(t, dim, 2, 7, /*keys=*/true);
      for (int64_t B : {16, 8, 5}) {
        const size_t rb = codec->row_bytes();
        std::vector<uint8_t> rows(rb * static_cast<size_t>(B)), block(rb * static_cast<size_t>(B), 0xFF);
        const auto xs = gaussian(static_cast<size_t>(B * dim), 5);
        for (int64_t j = B - 1; j >= 0; --j) {
          codec->encode(xs.data() + j * dim, 1, rows.data() + static_cast<size_t>(j) * rb);
          codec->encode_in_block(xs.data() + j * dim, 1, block.data(), B, j);
        }
        if (t == KvType::kF16)
          for (int64_t j = 0; j < B; ++j)
            for (int64_t i = 0; i < dim; ++i) {
              uint16_t got;
              std::memcpy(&got, block.data() + 2 * (i * B + j), 2);
              ASSERT_EQ(got, tandem::f32_to_fp16(xs[static_cast<size_t>(j * dim + i)]));
            }
        const int64_t G = 3, ps = codec->prepared_size();
        const auto q = gaussian(static_cast<size_t>(G * dim), 6);
        std::vector<float> prepared(static_cast<size_t>(G * ps));
        for (int64_t h = 0; h < G; ++h) codec->prepare_query(q.data() + h * dim, 1, prepared.data() + h * ps);
        std::vector<float> want(static_cast<size_t>(G * B));
        codec->dots_group(prepared.data(), G, ps, rows.data(), B, want.data(), B);
        for (int64_t off = 0; off < B; ++off)
          for (int64_t n = 1; off + n <= B; n += 3) {
            std::vector<float> got(static_cast<size_t>(G * n));
            codec->dots_in_block(prepared.data(), G, ps, block.data(), B, off, n, got.data(), n);
            for (int64_t h = 0; h < G; ++h)
              for (int64_t j = 0; j < n; ++j)
                ASSERT_EQ(got[static_cast<size_t>(h * n + j)], want[static_cast<size_t>(h * B + off + j)])
                    << kv_type_name(t) << " dim " << dim << " B " << B << " off " << off << " n " << n;
          }
      }
    }
  }
}

// Every codec of keys: a run of a block's rows decoded in one call (a latent cache's values) has the bits of
// decoding its rows one at a time, for any run and a row stride wider than the rows.
TEST(KvCodec, BlockRowRunsDecodeAsTheirRows) {
  for (int64_t dim : {8, 64, 48}) {
    for (KvType t : kTypes) {
      auto codec = KvCodec::create(t, dim, 2, 7, /*keys=*/true);
      for (int64_t B : {16, 8, 5}) {
        std::vector<uint8_t> block(codec->row_bytes() * static_cast<size_t>(B));
        const auto xs = gaussian(static_cast<size_t>(B * dim), 9);
        for (int64_t j = 0; j < B; ++j) codec->encode_in_block(xs.data() + j * dim, 1, block.data(), B, j);
        std::vector<float> want(static_cast<size_t>(B * dim));
        for (int64_t j = 0; j < B; ++j) codec->decode_in_block(block.data(), 1, B, j, want.data() + j * dim);
        const int64_t stride = dim + 3;
        for (int64_t off = 0; off < B; ++off)
          for (int64_t n = 1; off + n <= B; n += 2) {
            std::vector<float> got(static_cast<size_t>(n * stride), -1.0f);
            codec->decode_rows_in_block(block.data(), 1, B, off, n, got.data(), stride);
            for (int64_t r = 0; r < n; ++r)
              ASSERT_EQ(
                  std::memcmp(got.data() + r * stride, want.data() + (off + r) * dim, sizeof(float) * dim), 0)
                  << kv_type_name(t) << " dim " << dim << " B " << B << " off " << off << " n " << n;
          }
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

// Keys with a large offset shared by every row (as in real models' low-frequency RoPE channels): scores from
// anchored rows plus q·anchor equal q·k within the codec's tolerance on the residual, far closer than the
// same codec on the raw keys.
TEST(KvCodec, AnchoredScoresEqualQueryDotKey) {
  for (int64_t dim : {8, 64}) {
    for (KvType t : {KvType::kQ8_0, KvType::kQ4, KvType::kQ4R}) {
      auto codec = KvCodec::create(t, dim, 1, 5);
      KeyAnchor anchor(dim);
      const int64_t n = 16;
      auto keys = gaussian(static_cast<size_t>(n * dim), 21);
      for (int64_t j = 0; j < n; ++j) keys[j * dim + 2] += -17.0f, keys[j * dim + 3] += 23.0f;
      const auto q = gaussian(static_cast<size_t>(dim), 22);
      std::vector<uint8_t> a(anchor.bytes()), raw(codec->row_bytes() * n), anchored(codec->row_bytes() * n);
      anchor.set(keys.data(), a.data());
      std::vector<float> residual(static_cast<size_t>(dim));
      for (int64_t j = 0; j < n; ++j) {
        codec->encode(keys.data() + j * dim, 0, raw.data() + j * codec->row_bytes());
        anchor.subtract(a.data(), keys.data() + j * dim, residual.data());
        codec->encode(residual.data(), 0, anchored.data() + j * codec->row_bytes());
      }
      std::vector<float> prepared(static_cast<size_t>(codec->prepared_size())), s_raw(n), s_anc(n);
      codec->prepare_query(q.data(), 0, prepared.data());
      codec->dots(prepared.data(), raw.data(), n, s_raw.data());
      codec->dots(prepared.data(), anchored.data(), n, s_anc.data());
      const float qa = anchor.dot(q.data(), a.data());
      double e_raw = 0, e_anc = 0, qnorm = 0;
      for (float v : q) qnorm += double(v) * v;
      for (int64_t j = 0; j < n; ++j) {
        double ref = 0, rnorm = 0;
        for (int64_t i = 0; i < dim; ++i) {
          ref += double(q[i]) * keys[j * dim + i];
          const double r = keys[j * dim + i] - keys[i];
          rnorm += r * r;
        }
        // Per element the residual's error is at most its largest magnitude / 8 (4-bit) or / 254 (8-bit);
        // bound the score's error by that step times |q|, with room for the rotation.
        const double step = std::sqrt(rnorm) / (t == KvType::kQ8_0 ? 254.0 : 7.0);
        EXPECT_NEAR(s_anc[j] + qa, ref, step * std::sqrt(qnorm) + 1e-3 * std::fabs(ref))
            << kv_type_name(t) << " dim " << dim << " row " << j;
        e_raw += (s_raw[j] - ref) * (s_raw[j] - ref);
        e_anc += (s_anc[j] + qa - ref) * (s_anc[j] + qa - ref);
      }
      EXPECT_LT(e_anc, 0.25 * e_raw) << kv_type_name(t) << " dim " << dim;
    }
  }
}

// The same through a cache and attend(): each block's anchor is its first key in f16, f16 and f32 caches
// have none, and attention over anchored rows matches exact attention.
TEST(KvCodec, CacheAnchorsEachBlockAtItsFirstKey) {
  tandem::cache::Geometry c;
  c.n_layer = 1;
  c.n_head_kv = 2;
  c.head_dim = c.head_dim_v = 8;
  for (KvType t : kTypes) {
    tandem::cache::KvCache cache(c, 64, t);
    const KeyAnchor* anchor = cache.store().key_anchor();
    ASSERT_EQ(anchor != nullptr, tandem::cache::kv_type_anchors_keys(t)) << kv_type_name(t);
    const int64_t n = 40, width = c.n_head_kv * c.head_dim;
    auto k = gaussian(static_cast<size_t>(n * width), 31);
    const auto v = gaussian(static_cast<size_t>(n * width), 32);
    for (int64_t j = 0; j < n; ++j) k[j * width + 3] += 20.0f;
    cache.prepare_append(0, n);
    for (int64_t j = 0; j < n; ++j) cache.store(0, j, k.data() + j * width, v.data() + j * width);
    const int64_t B = cache.store().block_size();
    if (anchor) {
      for (int64_t pos = 0; pos < n; pos += B)
        for (int64_t h = 0; h < c.n_head_kv; ++h) {
          const uint8_t* a = cache.pool_of(0).anchor(cache.block_of(0, pos), 0, h);
          for (int64_t i = 0; i < c.head_dim; ++i) {
            uint16_t bits;
            std::memcpy(&bits, a + 2 * i, 2);
            EXPECT_EQ(bits, tandem::f32_to_fp16(k[pos * width + h * c.head_dim + i]));
          }
        }
    }
    const auto q = gaussian(static_cast<size_t>(c.head_dim), 33);
    std::vector<float> scores(n), out(static_cast<size_t>(c.head_dim));
    const tandem::cache::AttentionParams params{0.35f, 0.0f};
    for (int64_t h = 0; h < c.n_head_kv; ++h) {
      const int64_t first = 5;
      tandem::cache::attend(cache, 0, h, q.data(), first, n - 1, params, scores.data(), out.data());
      std::vector<double> p(static_cast<size_t>(n - first));
      double mx = -1e30, sum = 0;
      for (int64_t j = first; j < n; ++j) {
        double s = 0;
        for (int64_t i = 0; i < c.head_dim; ++i) s += double(q[i]) * k[j * width + h * c.head_dim + i];
        p[j - first] = s * params.scale;
        mx = std::max(mx, p[j - first]);
      }
      for (double& x : p) sum += (x = std::exp(x - mx));
      const double tol = t == KvType::kQ4 || t == KvType::kQ4R ? 0.25 : 0.02;
      for (int64_t i = 0; i < c.head_dim; ++i) {
        double ref = 0;
        for (int64_t j = first; j < n; ++j) ref += p[j - first] / sum * v[j * width + h * c.head_dim + i];
        EXPECT_NEAR(out[i], ref, tol) << kv_type_name(t) << " head " << h;
      }
    }
  }
}

// A window's rows attended together (attend_rows: consecutive positions, row i up to last + i) give each row
// and head the bits of attend() alone, in one pass or several (more queries than one pass holds, or more
// heads than it holds), with first > 0 and spans across block boundaries, for every cache type.
TEST(KvCodec, WindowRowsAttendTogetherAsAlone) {
  for (const int n_q : {3, 8, 70}) {
    tandem::cache::Geometry c;
    c.n_layer = 1;
    c.n_head_kv = 1;
    c.head_dim = c.head_dim_v = 32;
    for (KvType t : kTypes) {
      tandem::cache::KvCache cache(c, 96, t);
      const int64_t n = 90, dim = c.head_dim;
      const auto k = gaussian(static_cast<size_t>(n * dim), 41);
      const auto v = gaussian(static_cast<size_t>(n * dim), 42);
      cache.prepare_append(0, n);
      for (int64_t j = 0; j < n; ++j) cache.store(0, j, k.data() + j * dim, v.data() + j * dim);
      const tandem::cache::AttentionParams params{0.2f, 0.0f};
      for (const int64_t rows : {1, 5, 12}) {
        const int64_t first = 3, last = n - rows;
        const auto q = gaussian(static_cast<size_t>(rows * n_q * dim), 43);
        std::vector<float> scores(static_cast<size_t>(tandem::cache::kMaxWindowQueries * n)),
            together(q.size()), alone(static_cast<size_t>(dim));
        tandem::cache::attend_rows(cache, 0, 0, q.data(), rows, n_q, {n_q * dim, dim, n_q * dim, dim}, first,
                                   last, params, scores.data(), n, together.data());
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t h = 0; h < n_q; ++h) {
            const int64_t at = (i * n_q + h) * dim;
            tandem::cache::attend(cache, 0, 0, q.data() + at, first, last + i, params, scores.data(),
                                  alone.data());
            ASSERT_EQ(std::memcmp(alone.data(), together.data() + at, sizeof(float) * dim), 0)
                << kv_type_name(t) << " heads " << n_q << " rows " << rows << " row " << i << " head " << h;
          }
      }
    }
  }
}

TEST(KvCodec, RejectsOversizedHeads) {
  EXPECT_THROW(KvCodec::create(KvType::kF16, tandem::cache::kMaxHeadDim + 2, 1, 0), tandem::Error);
}

}  // namespace
