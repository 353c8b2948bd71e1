// KV codecs: how one head's key or value vector is stored in the cache, and how attention reads it back
// without materializing a dequantized copy.
//
// A codec encodes a head vector x [dim] f32 into a row of row_bytes() bytes. Attention prepares the query
// once (prepare_query), computes q·x for a run of consecutive rows (dots) and accumulates sum_j p_j x_j over
// a run of rows (accumulate), then maps the accumulated vector back once (finish_values). Every result
// depends only on the rows and the query, never on how many rows a call covers, so a row's attention is the
// same alone or inside a verify window.
//
// Types:
//   f32   the vector as is.
//   f16   IEEE half per element (round to nearest even). The codec of a cache's keys (create(..., keys))
//         lays each block out dimension-major and scores it in vector lanes (kernels/key_blocks.h).
//   q8_0  blocks of b8 elements: f16 scale d, int8 q[b8]; x = d * q, d = max|x| / 127 (as GGUF Q8_0).
//   q4    blocks of b elements, symmetric: f16 scale d, 4-bit n[b]; x = d * (n - 8), where d = -x_far / 8 for
//         the element x_far of largest magnitude (it lands exactly on level 0). Element i sits in byte
//         i % (b/2), low nibble for i < b/2, high nibble otherwise.
//   q4r   the q4 format after a fixed, seeded, per-head orthogonal rotation R (TurboQuant-style): rows hold
//         q4(R x). R is a randomized Hadamard transform (H D / sqrt(dim), D random signs) when dim is a power
//         of two, else a random orthogonal matrix (QR of a seeded Gaussian matrix). Since R is orthogonal,
//         q·x = (R q)·(R x): attention rotates the query once, accumulates values in the rotated domain and
//         rotates the sum back once (finish_values). The rotation spreads an outlier channel over the whole
//         head, so one block scale fits every element better.
// The block b is 32 when dim is a multiple of 32, else the largest even divisor of dim below 32 (head size 8
// gives blocks of 8). q8_0 halves b when it would span the whole head vector (b8 = 4 for head size 8): the
// RoPE pairs of a small head differ widely in magnitude in real models, and one scale over all of them costs
// q8_0 far more KL divergence on small heads than the 2 more bytes per row (docs/performance.md).
//
// Why q4 and q4r share a symmetric, scale-only format rather than scale and minimum (as GGUF Q4_1): after a
// rotation (and after key anchoring, see KeyAnchor) the coordinates are centred, so a stored minimum mostly
// repeats -max; the symmetric form spends its 2 header bytes on the scale alone. A minimum lowers the KL
// divergence (tandem kld) less than the same bytes spent on finer levels would, and the rotation gains as
// much in both forms. One scale over the whole rotated head vector (saving 2 bytes per 32 elements) loses
// accuracy at head size 64, so q4r keeps per-block scales. Figures: docs/performance.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string_view>
#include <vector>

#include "tandem/kernels/float_kernels.h"

namespace tandem::cache {

enum class KvType { kF32, kF16, kQ8_0, kQ4, kQ4R };

// "f32" | "f16" | "q8_0" | "q4" | "q4r"; throws tandem::Error otherwise.
KvType kv_type_from_name(std::string_view name);
std::string_view kv_type_name(KvType type);

// Largest head size a codec accepts (attention keeps per-head scratch on the stack). Latent attention caches
// a key of kv_lora_rank + n_rot (576 for DeepSeek-V2/V3).
inline constexpr int64_t kMaxHeadDim = 1024;

class KvCodec {
 public:
  // dim: elements per head vector (<= kMaxHeadDim); n_heads: heads that get their own rotation (q4r);
  // seed: selects the rotations. Throws tandem::Error for a dim the type cannot block.
  // keys: the codec of a cache's keys, which may lay out its blocks for scoring (encode_in_block).
  static std::unique_ptr<KvCodec> create(KvType type, int64_t dim, int64_t n_heads, uint64_t seed,
                                         bool keys = false);
  virtual ~KvCodec() = default;

  KvType type() const { return type_; }
  int64_t dim() const { return dim_; }
  size_t row_bytes() const { return row_bytes_; }
  // Floats prepare_query() writes (at most 2 * kMaxHeadDim).
  int64_t prepared_size() const { return prepared_size_; }

  // x [dim] -> row [row_bytes()]. head: the head's rotation.
  virtual void encode(const float* x, int64_t head, uint8_t* row) const = 0;
  // row -> x [dim], in the original (unrotated) domain. The reference for tests; attention does not use it.
  virtual void decode(const uint8_t* row, int64_t head, float* x) const = 0;

  // q [dim] -> prepared [prepared_size()], the form dots() takes.
  virtual void prepare_query(const float* q, int64_t head, float* prepared) const = 0;
  // s[j] = q·x_j for n consecutive rows starting at rows (row j at rows + j * row_bytes()).
  virtual void dots(const float* prepared, const uint8_t* rows, int64_t n, float* s) const = 0;
  // acc[dim] += sum_j p[j] * x_j over n consecutive rows, in the codec's domain, rows in order.
  virtual void accumulate(const float* p, const uint8_t* rows, int64_t n, float* acc) const = 0;
  // acc (codec domain) -> out [dim] (original domain). out may not alias acc.
  virtual void finish_values(const float* acc, int64_t head, float* out) const = 0;

  // Grouped forms for G query heads sharing one KV head (prepared queries prep_stride apart, scores and
  // weights s_stride apart, accumulators acc_stride apart), each head's result bit-identical to dots() /
  // accumulate(). The default loops over the heads; codecs with a grouped kernel decode each row once for
  // all.
  virtual void dots_group(const float* prepared, int64_t G, int64_t prep_stride, const uint8_t* rows,
                          int64_t n, float* s, int64_t s_stride) const {
    for (int64_t h = 0; h < G; ++h) dots(prepared + h * prep_stride, rows, n, s + h * s_stride);
  }
  virtual void accumulate_group(const float* p, int64_t G, int64_t p_stride, const uint8_t* rows, int64_t n,
                                float* acc, int64_t acc_stride) const {
    for (int64_t h = 0; h < G; ++h) accumulate(p + h * p_stride, rows, n, acc + h * acc_stride);
  }
  // accumulate_group over several runs of rows in order (run k weighted from p + runs[k].p_offset): the same
  // bits as one call per run, which the default makes; codecs with a kernel for it keep the sums in
  // registers across the runs.
  virtual void accumulate_runs(const float* p, int64_t G, int64_t p_stride, const kernels::ValueRun* runs,
                               int64_t n_runs, float* acc, int64_t acc_stride) const {
    for (int64_t k = 0; k < n_runs; ++k)
      accumulate_group(p + runs[k].p_offset, G, p_stride, runs[k].rows, runs[k].n, acc, acc_stride);
  }

  // A block of the paged cache: block_rows rows of one head from `block` (block_rows * row_bytes() bytes).
  // encode_in_block stores x as row `off`; dots_in_block scores rows [off, off + n) as dots_group does. By
  // default the rows lie one after another; a codec may order a block's bytes otherwise (the f16 codec of
  // keys: dimension-major, kernels/key_blocks.h), so a block's bytes are read and written only through these.
  virtual void encode_in_block(const float* x, int64_t head, uint8_t* block, int64_t block_rows,
                               int64_t off) const {
    (void)block_rows;
    encode(x, head, block + static_cast<size_t>(off) * row_bytes());
  }
  virtual void dots_in_block(const float* prepared, int64_t G, int64_t prep_stride, const uint8_t* block,
                             int64_t block_rows, int64_t off, int64_t n, float* s, int64_t s_stride) const {
    (void)block_rows;
    dots_group(prepared, G, prep_stride, block + static_cast<size_t>(off) * row_bytes(), n, s, s_stride);
  }
  // Row src_off of src_block becomes row dst_off of dst_block, bit for bit (the blocks may be one).
  virtual void copy_in_block(const uint8_t* src_block, int64_t src_off, uint8_t* dst_block, int64_t dst_off,
                             int64_t block_rows) const {
    (void)block_rows;
    std::memmove(dst_block + static_cast<size_t>(dst_off) * row_bytes(),
                 src_block + static_cast<size_t>(src_off) * row_bytes(), row_bytes());
  }
  // decode() of row `off` of a block (the values of a latent cache are read from its key rows this way).
  virtual void decode_in_block(const uint8_t* block, int64_t head, int64_t block_rows, int64_t off,
                               float* x) const {
    (void)block_rows;
    decode(block + static_cast<size_t>(off) * row_bytes(), head, x);
  }
  // decode_in_block() of rows [off, off + n) of a block, row r into x + r * x_stride: one call for a run of
  // positions, which a codec whose block is not row by row (the f16 keys') reads in its own order.
  virtual void decode_rows_in_block(const uint8_t* block, int64_t head, int64_t block_rows, int64_t off,
                                    int64_t n, float* x, int64_t x_stride) const {
    for (int64_t r = 0; r < n; ++r) decode_in_block(block, head, block_rows, off + r, x + r * x_stride);
  }

 protected:
  KvCodec(KvType type, int64_t dim, size_t row_bytes, int64_t prepared_size)
      : type_(type), dim_(dim), row_bytes_(row_bytes), prepared_size_(prepared_size) {}

 private:
  KvType type_;
  int64_t dim_;
  size_t row_bytes_;
  int64_t prepared_size_;
};

// The scalar 4-bit format q4 and q4r share (see above).
struct Q4Format {
  bool symmetric;  // scale only (x = d * (n - 8)); else scale and minimum (x = d * n + m)
  int64_t group;   // elements per scale
};
Q4Format q4_format(int64_t dim);

// Whether a store of this type anchors its keys (see KeyAnchor).
bool kv_type_anchors_keys(KvType type);

// Key anchoring. Keys of real models carry a large, slowly varying offset in some channels (the low-frequency
// RoPE pairs), which sets every block scale and wastes the quantizer's levels on it. An anchored key cache
// stores the residual k - a through the codec, where the anchor a [dim] is kept in f16 once per (cache
// block, layer, KV head), and attention adds q·a back to every score of that block: q·k = q·(k - a) + q·a
// exactly in real arithmetic, so only the residual is quantized. Values are not anchored (their error
// matters far less). How the anchor is chosen is the cache's contract (kv_cache.h).
class KeyAnchor {
 public:
  explicit KeyAnchor(int64_t dim);
  int64_t dim() const { return dim_; }
  size_t bytes() const { return static_cast<size_t>(dim_) * 2; }
  // anchor [bytes()] = f16(k); k [dim].
  void set(const float* k, uint8_t* anchor) const;
  // out [dim] = k - anchor; out may alias k.
  void subtract(const uint8_t* anchor, const float* k, float* out) const;
  // x [dim] += anchor.
  void add(const uint8_t* anchor, float* x) const;
  // q·anchor, summed in an order fixed by dim alone.
  float dot(const float* q, const uint8_t* anchor) const;

 private:
  int64_t dim_;
  const float* table_;
};

// A fixed per-head orthogonal rotation (see q4r above). Exposed for tests.
class HeadRotation {
 public:
  HeadRotation(int64_t dim, int64_t n_heads, uint64_t seed);
  int64_t dim() const { return dim_; }
  bool hadamard() const { return hadamard_; }
  // y = R_head x and x = R_head^T y; y may alias x.
  void rotate(const float* x, int64_t head, float* y) const;
  void unrotate(const float* y, int64_t head, float* x) const;

 private:
  int64_t dim_, n_heads_;
  bool hadamard_;
  std::vector<float> signs_;   // [n_heads, dim] (Hadamard form)
  std::vector<float> matrix_;  // [n_heads, dim, dim] row-major (dense form)
};

// The quantization block of q4 and q4r for head vectors of `dim` elements (see above); throws tandem::Error
// when dim has no even divisor <= 32.
int64_t kv_block_size(int64_t dim);
// The block of q8_0: kv_block_size(dim), halved when that would be the whole head vector (see above).
int64_t kv_q8_block_size(int64_t dim);

}  // namespace tandem::cache
