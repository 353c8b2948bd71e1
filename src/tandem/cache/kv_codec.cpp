#include "tandem/cache/kv_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "tandem/kernels/float_kernels.h"
#include "tandem/kernels/key_blocks.h"
#include "tandem/kernels/ops.h"
#include "tandem/tensor/fp16.h"
#include "tandem/util/error.h"

namespace tandem::cache {

KvType kv_type_from_name(std::string_view name) {
  if (name == "f32") return KvType::kF32;
  if (name == "f16") return KvType::kF16;
  if (name == "q8_0") return KvType::kQ8_0;
  if (name == "q4") return KvType::kQ4;
  if (name == "q4r") return KvType::kQ4R;
  throw Error("unknown KV cache type '" + std::string(name) + "' (expected f16, f32, q8_0, q4 or q4r)");
}

std::string_view kv_type_name(KvType type) {
  switch (type) {
    case KvType::kF32:
      return "f32";
    case KvType::kF16:
      return "f16";
    case KvType::kQ8_0:
      return "q8_0";
    case KvType::kQ4:
      return "q4";
    case KvType::kQ4R:
      return "q4r";
  }
  return "?";
}

int64_t kv_block_size(int64_t dim) {
  if (dim > 0 && dim % 32 == 0) return 32;
  for (int64_t b = 30; b >= 2; b -= 2)
    if (dim % b == 0) return b;
  throw Error("a quantized KV cache needs a head size with an even divisor of at most 32 (head size " +
              std::to_string(dim) + "); use --kv-type f16");
}

int64_t kv_q8_block_size(int64_t dim) {
  const int64_t b = kv_block_size(dim);
  return b == dim && b % 2 == 0 ? b / 2 : b;
}

Q4Format q4_format(int64_t dim) {
  return Q4Format{true, kv_block_size(dim)};
}

bool kv_type_anchors_keys(KvType type) {
  return type == KvType::kQ8_0 || type == KvType::kQ4 || type == KvType::kQ4R;
}

namespace {

// f16 -> f32 for every half value, built once and read-only afterwards.
const float* half_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (uint32_t i = 0; i < 65536; ++i) t[i] = fp16_to_f32(static_cast<uint16_t>(i));
    return t;
  }();
  return table.data();
}

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
void store_u16(uint8_t* p, uint16_t v) {
  std::memcpy(p, &v, 2);
}

// Sums of products in interleaved_sum8's fixed order (it depends only on n).
template <typename Elem, typename Load>
float dot8(const float* q, const Elem* x, int64_t n, Load load) {
  return kernels::interleaved_sum8<float>(n, [&](int64_t i) { return q[i] * load(x[i]); });
}

class F32Codec final : public KvCodec {
 public:
  explicit F32Codec(int64_t dim) : KvCodec(KvType::kF32, dim, static_cast<size_t>(dim) * 4, dim) {}
  void encode(const float* x, int64_t, uint8_t* row) const override {
    std::memcpy(row, x, static_cast<size_t>(dim()) * 4);
  }
  void decode(const uint8_t* row, int64_t, float* x) const override {
    std::memcpy(x, row, static_cast<size_t>(dim()) * 4);
  }
  void prepare_query(const float* q, int64_t, float* prepared) const override {
    std::copy_n(q, dim(), prepared);
  }
  // The SIMD attention primitives (one dispatch per block of rows); each row's reduction order is fixed.
  void dots(const float* q, const uint8_t* rows, int64_t n, float* s) const override {
    kernels::dots_f32(q, reinterpret_cast<const float*>(rows), n, dim(), s);
  }
  void accumulate(const float* p, const uint8_t* rows, int64_t n, float* acc) const override {
    kernels::accumulate_f32(p, reinterpret_cast<const float*>(rows), n, dim(), acc);
  }
  void dots_group(const float* q, int64_t G, int64_t q_stride, const uint8_t* rows, int64_t n, float* s,
                  int64_t s_stride) const override {
    kernels::dots_group_f32(q, G, q_stride, reinterpret_cast<const float*>(rows), n, dim(), s, s_stride);
  }
  void accumulate_group(const float* p, int64_t G, int64_t p_stride, const uint8_t* rows, int64_t n,
                        float* acc, int64_t acc_stride) const override {
    kernels::accumulate_group_f32(p, G, p_stride, reinterpret_cast<const float*>(rows), n, dim(), acc,
                                  acc_stride);
  }
  void accumulate_runs(const float* p, int64_t G, int64_t p_stride, const kernels::ValueRun* runs,
                       int64_t n_runs, float* acc, int64_t acc_stride) const override {
    kernels::accumulate_runs_f32(p, G, p_stride, runs, n_runs, dim(), acc, acc_stride);
  }
  void finish_values(const float* acc, int64_t, float* out) const override { std::copy_n(acc, dim(), out); }
};

class F16Codec final : public KvCodec {
 public:
  explicit F16Codec(int64_t dim)
      : KvCodec(KvType::kF16, dim, static_cast<size_t>(dim) * 2, dim), table_(half_table()) {}
  void encode(const float* x, int64_t, uint8_t* row) const override { kernels::f32_to_f16(x, dim(), row); }
  void decode(const uint8_t* row, int64_t, float* x) const override {
    for (int64_t i = 0; i < dim(); ++i) x[i] = table_[load_u16(row + 2 * i)];
  }
  void prepare_query(const float* q, int64_t, float* prepared) const override {
    std::copy_n(q, dim(), prepared);
  }
  void dots(const float* q, const uint8_t* rows, int64_t n, float* s) const override {
    kernels::dots_f16(q, reinterpret_cast<const uint16_t*>(rows), n, dim(), s);
  }
  void accumulate(const float* p, const uint8_t* rows, int64_t n, float* acc) const override {
    kernels::accumulate_f16(p, reinterpret_cast<const uint16_t*>(rows), n, dim(), acc);
  }
  void dots_group(const float* q, int64_t G, int64_t q_stride, const uint8_t* rows, int64_t n, float* s,
                  int64_t s_stride) const override {
    kernels::dots_group_f16(q, G, q_stride, reinterpret_cast<const uint16_t*>(rows), n, dim(), s, s_stride);
  }
  void accumulate_group(const float* p, int64_t G, int64_t p_stride, const uint8_t* rows, int64_t n,
                        float* acc, int64_t acc_stride) const override {
    kernels::accumulate_group_f16(p, G, p_stride, reinterpret_cast<const uint16_t*>(rows), n, dim(), acc,
                                  acc_stride);
  }
  void accumulate_runs(const float* p, int64_t G, int64_t p_stride, const kernels::ValueRun* runs,
                       int64_t n_runs, float* acc, int64_t acc_stride) const override {
    kernels::accumulate_runs_f16(p, G, p_stride, runs, n_runs, dim(), acc, acc_stride);
  }
  void finish_values(const float* acc, int64_t, float* out) const override { std::copy_n(acc, dim(), out); }

 private:
  const float* table_;
};

// The f16 codec of a cache's keys: blocks dimension-major (element i of row p at i * block_rows + p), scored
// by kernels::dots_dim_major_f16 without a horizontal sum per score (faster than row-major f16 keys' grouped
// scores, docs/performance.md). A row on its own (encode, decode, dots) is a block of one row,
// so every score has the same bits as in the cache.
class F16KeyCodec final : public KvCodec {
 public:
  explicit F16KeyCodec(int64_t dim)
      : KvCodec(KvType::kF16, dim, static_cast<size_t>(dim) * 2, dim), rows_(dim), table_(half_table()) {}
  void encode(const float* x, int64_t head, uint8_t* row) const override { rows_.encode(x, head, row); }
  void decode(const uint8_t* row, int64_t head, float* x) const override { rows_.decode(row, head, x); }
  void prepare_query(const float* q, int64_t head, float* prepared) const override {
    rows_.prepare_query(q, head, prepared);
  }
  void dots(const float* q, const uint8_t* rows, int64_t n, float* s) const override {
    dots_group(q, 1, 0, rows, n, s, 0);
  }
  void dots_group(const float* q, int64_t G, int64_t q_stride, const uint8_t* rows, int64_t n, float* s,
                  int64_t s_stride) const override {
    for (int64_t j = 0; j < n; ++j)
      kernels::dots_dim_major_f16(
          q, G, q_stride, reinterpret_cast<const uint16_t*>(rows + static_cast<size_t>(j) * row_bytes()), 1,
          0, 1, dim(), s + j, s_stride);
  }
  void accumulate(const float* p, const uint8_t* rows, int64_t n, float* acc) const override {
    rows_.accumulate(p, rows, n, acc);
  }
  void finish_values(const float* acc, int64_t head, float* out) const override {
    rows_.finish_values(acc, head, out);
  }
  void encode_in_block(const float* x, int64_t, uint8_t* block, int64_t block_rows,
                       int64_t off) const override {
    uint8_t h[2 * kMaxHeadDim];
    kernels::f32_to_f16(x, dim(), h);
    for (int64_t i = 0; i < dim(); ++i)
      std::memcpy(block + 2 * static_cast<size_t>(i * block_rows + off), h + 2 * i, 2);
  }
  void dots_in_block(const float* q, int64_t G, int64_t q_stride, const uint8_t* block, int64_t block_rows,
                     int64_t off, int64_t n, float* s, int64_t s_stride) const override {
    kernels::dots_dim_major_f16(q, G, q_stride, reinterpret_cast<const uint16_t*>(block), block_rows, off, n,
                                dim(), s, s_stride);
  }
  void copy_in_block(const uint8_t* src_block, int64_t src_off, uint8_t* dst_block, int64_t dst_off,
                     int64_t block_rows) const override {
    for (int64_t i = 0; i < dim(); ++i)
      std::memmove(dst_block + 2 * static_cast<size_t>(i * block_rows + dst_off),
                   src_block + 2 * static_cast<size_t>(i * block_rows + src_off), 2);
  }
  void decode_in_block(const uint8_t* block, int64_t head, int64_t block_rows, int64_t off,
                       float* x) const override {
    uint8_t h[2 * kMaxHeadDim];
    for (int64_t i = 0; i < dim(); ++i)
      std::memcpy(h + 2 * i, block + 2 * static_cast<size_t>(i * block_rows + off), 2);
    rows_.decode(h, head, x);
  }
  void decode_rows_in_block(const uint8_t* block, int64_t, int64_t block_rows, int64_t off, int64_t n,
                            float* x, int64_t x_stride) const override {
    // Dimension by dimension: a dimension's values of the n rows lie side by side (dimension-major), where
    // one row at a time gathers two bytes from every dimension's run. The values are decode()'s.
    for (int64_t i = 0; i < dim(); ++i) {
      const uint8_t* run = block + 2 * static_cast<size_t>(i * block_rows + off);
      for (int64_t r = 0; r < n; ++r) x[r * x_stride + i] = table_[load_u16(run + 2 * r)];
    }
  }

 private:
  F16Codec rows_;  // the row form: encode, decode, query preparation and the value side
  const float* table_;
};

// Row: per block [f16 d][int8 q[b]].
class Q8Codec final : public KvCodec {
 public:
  explicit Q8Codec(int64_t dim)
      : KvCodec(KvType::kQ8_0, dim,
                static_cast<size_t>(dim / kv_q8_block_size(dim) * (2 + kv_q8_block_size(dim))), dim),
        b_(kv_q8_block_size(dim)),
        table_(half_table()) {}
  void encode(const float* x, int64_t, uint8_t* row) const override {
    for (int64_t k = 0; k < dim(); k += b_, row += 2 + b_) {
      float amax = 0;
      for (int64_t i = 0; i < b_; ++i) amax = std::max(amax, std::fabs(x[k + i]));
      const uint16_t d16 = f32_to_fp16(amax / 127.0f);
      const float d = fp16_to_f32(d16);
      const float id = d > 0 ? 1.0f / d : 0.0f;
      store_u16(row, d16);
      auto* qs = reinterpret_cast<int8_t*>(row + 2);
      for (int64_t i = 0; i < b_; ++i)
        qs[i] = static_cast<int8_t>(std::clamp(std::nearbyint(x[k + i] * id), -127.0f, 127.0f));
    }
  }
  void decode(const uint8_t* row, int64_t, float* x) const override {
    for (int64_t k = 0; k < dim(); k += b_, row += 2 + b_) {
      const float d = table_[load_u16(row)];
      const auto* qs = reinterpret_cast<const int8_t*>(row + 2);
      for (int64_t i = 0; i < b_; ++i) x[k + i] = d * static_cast<float>(qs[i]);
    }
  }
  void prepare_query(const float* q, int64_t, float* prepared) const override {
    std::copy_n(q, dim(), prepared);
  }
  void dots(const float* q, const uint8_t* rows, int64_t n, float* s) const override {
    for (int64_t j = 0; j < n; ++j) {
      const uint8_t* row = rows + static_cast<size_t>(j) * row_bytes();
      float sum = 0;
      for (int64_t k = 0; k < dim(); k += b_, row += 2 + b_)
        sum += table_[load_u16(row)] *
               dot8(q + k, reinterpret_cast<const int8_t*>(row + 2), b_, [](int8_t v) { return float(v); });
      s[j] = sum;
    }
  }
  void accumulate(const float* p, const uint8_t* rows, int64_t n, float* acc) const override {
    for (int64_t j = 0; j < n; ++j) {
      const uint8_t* row = rows + static_cast<size_t>(j) * row_bytes();
      for (int64_t k = 0; k < dim(); k += b_, row += 2 + b_) {
        const float pd = p[j] * table_[load_u16(row)];
        const auto* qs = reinterpret_cast<const int8_t*>(row + 2);
        for (int64_t i = 0; i < b_; ++i) acc[k + i] += pd * static_cast<float>(qs[i]);
      }
    }
  }
  void finish_values(const float* acc, int64_t, float* out) const override { std::copy_n(acc, dim(), out); }

 private:
  int64_t b_;
  const float* table_;
};

// Row: per group [f16 d][f16 m (asymmetric form only)][nibbles g/2]. With a rotation, rows hold the rotated
// vector. Both forms decode as x = d * n + m; the symmetric one has the implied m = -8 d.
class Q4Codec final : public KvCodec {
 public:
  Q4Codec(int64_t dim, bool rotate, const Q4Format& format, int64_t n_heads, uint64_t seed)
      : KvCodec(rotate ? KvType::kQ4R : KvType::kQ4, dim,
                static_cast<size_t>(dim / format.group * (header(format) + format.group / 2)),
                dim + dim / format.group),
        g_(format.group),
        header_(header(format)),
        symmetric_(format.symmetric),
        table_(half_table()) {
    TANDEM_CHECK(g_ >= 2 && g_ % 2 == 0 && dim % g_ == 0, "bad 4-bit group size");
    if (rotate) rotation_ = std::make_unique<HeadRotation>(dim, n_heads, seed);
  }
  void encode(const float* x, int64_t head, uint8_t* row) const override {
    float tmp[kMaxHeadDim];
    if (rotation_) {
      rotation_->rotate(x, head, tmp);
      x = tmp;
    }
    const int64_t half = g_ / 2;
    for (int64_t k = 0; k < dim(); k += g_, row += header_ + half) {
      float d, m;
      if (symmetric_) {
        // The element of largest magnitude maps exactly to level 0 (d < 0 when it is positive), so the
        // 16 levels cover [-8|d|, 7|d|] on the side that needs the range.
        float far = 0;
        for (int64_t i = 0; i < g_; ++i)
          if (std::fabs(x[k + i]) > std::fabs(far)) far = x[k + i];
        const uint16_t d16 = f32_to_fp16(far / -8.0f);
        store_u16(row, d16);
        d = fp16_to_f32(d16);
        m = -8.0f * d;
      } else {
        float mn = x[k], mx = x[k];
        for (int64_t i = 1; i < g_; ++i) mn = std::min(mn, x[k + i]), mx = std::max(mx, x[k + i]);
        const uint16_t d16 = f32_to_fp16((mx - mn) / 15.0f), m16 = f32_to_fp16(mn);
        store_u16(row, d16);
        store_u16(row + 2, m16);
        d = fp16_to_f32(d16);
        m = fp16_to_f32(m16);
      }
      const float id = d != 0 ? 1.0f / d : 0.0f;
      auto level = [&](float v) {
        return static_cast<uint8_t>(std::clamp(std::nearbyint((v - m) * id), 0.0f, 15.0f));
      };
      for (int64_t i = 0; i < half; ++i)
        row[header_ + i] = static_cast<uint8_t>(level(x[k + i]) | (level(x[k + half + i]) << 4));
    }
  }
  void decode(const uint8_t* row, int64_t head, float* x) const override {
    const int64_t half = g_ / 2;
    for (int64_t k = 0; k < dim(); k += g_, row += header_ + half) {
      float d, m;
      scale_and_min(row, d, m);
      const uint8_t* nib = row + header_;
      for (int64_t i = 0; i < half; ++i) {
        x[k + i] = d * static_cast<float>(nib[i] & 15) + m;
        x[k + half + i] = d * static_cast<float>(nib[i] >> 4) + m;
      }
    }
    if (rotation_) rotation_->unrotate(x, head, x);
  }
  // prepared = [R q (dim)][sum of R q over each group (dim / g)].
  void prepare_query(const float* q, int64_t head, float* prepared) const override {
    if (rotation_) {
      rotation_->rotate(q, head, prepared);
    } else {
      std::copy_n(q, dim(), prepared);
    }
    for (int64_t k = 0, grp = 0; k < dim(); k += g_, ++grp) {
      float sum = 0;
      for (int64_t i = 0; i < g_; ++i) sum += prepared[k + i];
      prepared[dim() + grp] = sum;
    }
  }
  void dots(const float* q, const uint8_t* rows, int64_t n, float* s) const override {
    const int64_t half = g_ / 2;
    const float* qsum = q + dim();
    for (int64_t j = 0; j < n; ++j) {
      const uint8_t* row = rows + static_cast<size_t>(j) * row_bytes();
      float sum = 0;
      for (int64_t k = 0, grp = 0; k < dim(); k += g_, ++grp, row += header_ + half) {
        const uint8_t* nib = row + header_;
        const float lo = dot8(q + k, nib, half, [](uint8_t v) { return float(v & 15); });
        const float hi = dot8(q + k + half, nib, half, [](uint8_t v) { return float(v >> 4); });
        float d, m;
        scale_and_min(row, d, m);
        sum += d * (lo + hi) + m * qsum[grp];
      }
      s[j] = sum;
    }
  }
  void accumulate(const float* p, const uint8_t* rows, int64_t n, float* acc) const override {
    const int64_t half = g_ / 2;
    for (int64_t j = 0; j < n; ++j) {
      const uint8_t* row = rows + static_cast<size_t>(j) * row_bytes();
      for (int64_t k = 0; k < dim(); k += g_, row += header_ + half) {
        float d, m;
        scale_and_min(row, d, m);
        const float pd = p[j] * d, pm = p[j] * m;
        const uint8_t* nib = row + header_;
        for (int64_t i = 0; i < half; ++i) {
          acc[k + i] += pd * static_cast<float>(nib[i] & 15) + pm;
          acc[k + half + i] += pd * static_cast<float>(nib[i] >> 4) + pm;
        }
      }
    }
  }
  void finish_values(const float* acc, int64_t head, float* out) const override {
    if (rotation_) {
      rotation_->unrotate(acc, head, out);
    } else {
      std::copy_n(acc, dim(), out);
    }
  }

 private:
  static int64_t header(const Q4Format& f) { return f.symmetric ? 2 : 4; }
  void scale_and_min(const uint8_t* group, float& d, float& m) const {
    d = table_[load_u16(group)];
    m = symmetric_ ? -8.0f * d : table_[load_u16(group + 2)];
  }

  int64_t g_;       // elements per scale
  int64_t header_;  // bytes before a group's nibbles
  bool symmetric_;
  const float* table_;
  std::unique_ptr<HeadRotation> rotation_;
};

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in (0, 1).
double uniform01(uint64_t& state) {
  return (static_cast<double>(splitmix64(state) >> 11) + 0.5) * 0x1.0p-53;
}

// In-place unnormalized Walsh-Hadamard transform of n (a power of two) values.
void fwht(float* x, int64_t n) {
  for (int64_t len = 1; len < n; len <<= 1)
    for (int64_t i = 0; i < n; i += len << 1)
      for (int64_t j = i; j < i + len; ++j) {
        const float a = x[j], b = x[j + len];
        x[j] = a + b;
        x[j + len] = a - b;
      }
}

}  // namespace

std::unique_ptr<KvCodec> KvCodec::create(KvType type, int64_t dim, int64_t n_heads, uint64_t seed,
                                         bool keys) {
  if (dim <= 0 || dim > kMaxHeadDim)
    throw Error("KV cache head size " + std::to_string(dim) + " is outside 1.." +
                std::to_string(kMaxHeadDim));
  switch (type) {
    case KvType::kF32:
      return std::make_unique<F32Codec>(dim);
    case KvType::kF16:
      if (keys) return std::make_unique<F16KeyCodec>(dim);
      return std::make_unique<F16Codec>(dim);
    case KvType::kQ8_0:
      return std::make_unique<Q8Codec>(dim);
    case KvType::kQ4:
      return std::make_unique<Q4Codec>(dim, false, q4_format(dim), n_heads, seed);
    case KvType::kQ4R:
      return std::make_unique<Q4Codec>(dim, true, q4_format(dim), n_heads, seed);
  }
  throw Error("unknown KV cache type");
}

KeyAnchor::KeyAnchor(int64_t dim) : dim_(dim), table_(half_table()) {
  TANDEM_CHECK(dim > 0 && dim <= kMaxHeadDim, "bad key anchor size");
}

void KeyAnchor::set(const float* k, uint8_t* anchor) const {
  kernels::f32_to_f16(k, dim_, anchor);
}

void KeyAnchor::subtract(const uint8_t* anchor, const float* k, float* out) const {
  for (int64_t i = 0; i < dim_; ++i) out[i] = k[i] - table_[load_u16(anchor + 2 * i)];
}

void KeyAnchor::add(const uint8_t* anchor, float* x) const {
  for (int64_t i = 0; i < dim_; ++i) x[i] += table_[load_u16(anchor + 2 * i)];
}

float KeyAnchor::dot(const float* q, const uint8_t* anchor) const {
  float a[kMaxHeadDim];  // anchors need not be 2-byte aligned inside a block
  for (int64_t i = 0; i < dim_; ++i) a[i] = table_[load_u16(anchor + 2 * i)];
  return dot8(q, a, dim_, [](float v) { return v; });
}

HeadRotation::HeadRotation(int64_t dim, int64_t n_heads, uint64_t seed)
    : dim_(dim), n_heads_(n_heads), hadamard_(dim > 0 && (dim & (dim - 1)) == 0) {
  TANDEM_CHECK(dim > 0 && dim <= kMaxHeadDim && n_heads > 0, "bad rotation shape");
  if (hadamard_) {
    signs_.resize(static_cast<size_t>(n_heads * dim));
    for (int64_t h = 0; h < n_heads; ++h) {
      uint64_t state = seed ^ (0xA0761D6478BD642Full * static_cast<uint64_t>(h + 1));
      for (int64_t i = 0; i < dim; ++i)
        signs_[static_cast<size_t>(h * dim + i)] = (splitmix64(state) >> 63) ? -1.0f : 1.0f;
    }
    return;
  }
  // Gram-Schmidt (modified, twice for stability) on a seeded Gaussian matrix; rows of the result are
  // orthonormal.
  matrix_.resize(static_cast<size_t>(n_heads * dim * dim));
  std::vector<double> a(static_cast<size_t>(dim * dim));
  for (int64_t h = 0; h < n_heads; ++h) {
    uint64_t state = seed ^ (0xE7037ED1A0B428DBull * static_cast<uint64_t>(h + 1));
    for (auto& v : a) {
      const double u1 = uniform01(state);  // separate statements: a fixed draw order
      const double u2 = uniform01(state);
      v = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    }
    for (int64_t r = 0; r < dim; ++r) {
      double* row = a.data() + r * dim;
      for (int pass = 0; pass < 2; ++pass)
        for (int64_t p = 0; p < r; ++p) {
          const double* prev = a.data() + p * dim;
          double dot = 0;
          for (int64_t i = 0; i < dim; ++i) dot += row[i] * prev[i];
          for (int64_t i = 0; i < dim; ++i) row[i] -= dot * prev[i];
        }
      double norm = 0;
      for (int64_t i = 0; i < dim; ++i) norm += row[i] * row[i];
      norm = std::sqrt(norm);
      for (int64_t i = 0; i < dim; ++i) row[i] /= norm;
    }
    for (int64_t i = 0; i < dim * dim; ++i)
      matrix_[static_cast<size_t>(h * dim * dim + i)] = static_cast<float>(a[static_cast<size_t>(i)]);
  }
}

void HeadRotation::rotate(const float* x, int64_t head, float* y) const {
  TANDEM_CHECK(head >= 0 && head < n_heads_, "rotation head out of range");
  float tmp[kMaxHeadDim];
  if (hadamard_) {
    const float* s = signs_.data() + head * dim_;
    for (int64_t i = 0; i < dim_; ++i) tmp[i] = x[i] * s[i];
    fwht(tmp, dim_);
    const float norm = 1.0f / std::sqrt(static_cast<float>(dim_));
    for (int64_t i = 0; i < dim_; ++i) y[i] = tmp[i] * norm;
    return;
  }
  const float* m = matrix_.data() + head * dim_ * dim_;
  for (int64_t r = 0; r < dim_; ++r) {
    float sum = 0;
    for (int64_t i = 0; i < dim_; ++i) sum += m[r * dim_ + i] * x[i];
    tmp[r] = sum;
  }
  std::copy_n(tmp, dim_, y);
}

void HeadRotation::unrotate(const float* y, int64_t head, float* x) const {
  TANDEM_CHECK(head >= 0 && head < n_heads_, "rotation head out of range");
  float tmp[kMaxHeadDim];
  if (hadamard_) {
    std::copy_n(y, dim_, tmp);
    fwht(tmp, dim_);
    const float* s = signs_.data() + head * dim_;
    const float norm = 1.0f / std::sqrt(static_cast<float>(dim_));
    for (int64_t i = 0; i < dim_; ++i) x[i] = tmp[i] * norm * s[i];
    return;
  }
  const float* m = matrix_.data() + head * dim_ * dim_;
  for (int64_t i = 0; i < dim_; ++i) tmp[i] = 0;
  for (int64_t r = 0; r < dim_; ++r)
    for (int64_t i = 0; i < dim_; ++i) tmp[i] += m[r * dim_ + i] * y[r];
  std::copy_n(tmp, dim_, x);
}

}  // namespace tandem::cache
