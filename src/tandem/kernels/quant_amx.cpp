// Quantized kernels for x86-64 CPUs with AMX tiles (Target::kAMX): the AVX-512 VBMI kernels (which on these
// Intel cores take PrefetchReach's L1 forms: quant_avx512_kernels.h's direct_rows_target), and Q4_0 and Q8_0
// in row tiles (repack.h) against activations in natural order (quant_layout.h).
//
// Row tiles, 16 output rows at a time. Per 32-element block b, each output row n and activation row m take
// the integer sum of the weight codes w (Q4_0: the 4-bit codes minus 8; Q8_0: the signed codes) by the
// activation's 8-bit codes q,
//     s = sum(w * q),
// and then, in block order, one float step
//     acc = fma(float(s), d_w[n] * d_x[m], acc),
// so y[m][n] = acc after the last block. The integer sums are exact whatever adds them, so a row's result
// does not depend on which kernel ran it (batch invariance):
//  - up to kVnniRows rows (4: decode, short windows): vpdpbusd of each tile vector as unsigned bytes (Q4_0:
//    its low nibbles, and its high nibbles times 16 in a chain of their own, shifted back; Q8_0: the codes
//    plus 128), 16 output rows in the lanes, by the activation row's four codes broadcast, from the
//    activations' offset sum for that fixed offset (-8 or -128 times the sum of the codes);
//  - more rows (windows and prefill): one AMX multiply-add of signed bytes (tdpbssd) per block and tile of up
//    to 16 activation rows, with the block's codes as the B tile (8 rows of 64 bytes, K = 32: Q4_0's nibbles
//    minus 8 unpacked, Q8_0's as they lie) and the activation rows' block codes as the A tile; the tile's
//    sums stored, then scaled by the same float steps.
#include <algorithm>
#include <cstdint>
#include <utility>

#include "tandem/kernels/quant_layout.h"
#include "tandem/kernels/repack.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi,amx-tile,amx-int8")
#include <immintrin.h>

namespace tandem::kernels {
namespace amx_target {

// Rows up to which the vpdpbusd kernel runs; more take the tiles: up to four rows it was the faster of the
// two for Q4_0 and Q8_0 (performance.md, AMX).
constexpr int64_t kVnniRows = 4;
// Rows one call takes (one tile of activation rows; prefill runs in passes of up to 16 rows).
constexpr int64_t kMaxRows = kTileRows;
// How far ahead the weights are prefetched: each line twice, this far into L1 and twice as far into L2. The
// second prefetch, and the nearer one into L1 rather than L2, each took less time in whole forwards on the
// Xeon with AMX; one distance alone, other distances, a third prefetch and non-temporal hints measured alike
// or worse (performance.md, AMX).
constexpr int64_t kPrefetchBytes = 6144;
static_assert(kPrefetchBytes % 64 == 0, "prefetch_block finds a block's lines from the prefetched address");

// The tile instructions, with the memory they read or write declared to the compiler (the compiler's own
// tile intrinsics declare none); register numbers are literal.
#define TANDEM_TILE_LOAD(t, base, stride) \
  __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t : : "r"(base), "r"(static_cast<long>(stride)) : "memory")
#define TANDEM_TILE_STORE(t, base, stride)                     \
  __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)"         \
                   :                                           \
                   : "r"(base), "r"(static_cast<long>(stride)) \
                   : "memory")
#define TANDEM_TILE_ZERO(t) __asm__ volatile("tilezero %%tmm" #t ::)
#define TANDEM_TILE_DPBSSD(c, a, b) __asm__ volatile("tdpbssd %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)

// The LDTILECFG operand (palette 1).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

// Where one block of one tile of weight rows lies.
struct TileBlock {
  const uint8_t* codes;
  __m512 d;  // the 16 rows' scales
};

// Bytes of one block of a tile and code vectors in it.
template <DType kType>
constexpr size_t kBlockBytes = row_tile_block_bytes(kType);
template <DType kType>
constexpr int kVectors = kType == DType::Q8_0 ? 8 : 4;

// Prefetches, with kHint, the lines that begin within the block at p (a block lies 0 or 32 bytes past a
// 64-byte boundary, and blocks are 32 mod 64 bytes long, so each block's lines are prefetched once: Q4_0 five
// or four lines a block, Q8_0 nine or eight). Prefetching every line the block touches instead, as before,
// issued a third more prefetches for Q4_0, and one-row products took longer.
template <DType kType, _mm_hint kHint>
inline void prefetch_block(const uint8_t* p) {
  for (size_t line = 64; line < kBlockBytes<kType> + 32; line += 64)
    _mm_prefetch(reinterpret_cast<const char*>(p + line), kHint);
  if (row_tile_codes_offset(p) == 0) _mm_prefetch(reinterpret_cast<const char*>(p), kHint);
}

template <DType kType>
inline TileBlock tile_block(const uint8_t* tile, int64_t b) {
  const uint8_t* block = tile + static_cast<size_t>(b) * kBlockBytes<kType>;
  prefetch_block<kType, _MM_HINT_T0>(block + kPrefetchBytes);
  prefetch_block<kType, _MM_HINT_T1>(block + 2 * kPrefetchBytes);
  const __m256i h =
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + row_tile_scales_offset(kType, block)));
  return {block + row_tile_codes_offset(block), _mm512_cvtph_ps(h)};
}

// Activation row m's block b: its codes, scale and offset sum for weights stored with a fixed offset of
// -2^kFold (Q4_0's codes 0..15: -8 times the codes' sum; Q8_0's codes plus 128: -128 times it).
struct ActBlock {
  const int32_t* codes;  // four codes per int32, in natural order
  float d;
  int32_t offset;
};

template <int kOffsetFold>
inline ActBlock act_block(const ActSuper* x, int64_t b) {
  const ActSuper& s = x[b / 8];
  const int j = static_cast<int>(b % 8);
  return {reinterpret_cast<const int32_t*>(s.q + 32 * j), s.d[j], s.offset_sums[fold_index(kOffsetFold)][j]};
}

template <DType kType>
constexpr int kFold = kType == DType::Q8_0 ? 7 : 3;

// The float step of one block for one activation row (the contract above).
inline __m512 scale_sum(__m512 acc, __m512i sum, __m512 dw, float dx) {
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(dw, _mm512_set1_ps(dx)), acc);
}

// R activation rows (R <= kVnniRows) against n_tiles tiles of 16 weight rows: each code vector as
// unsigned bytes by the activation row's four codes broadcast, from the offset sum of that fixed offset.
// Q8_0: the codes plus 128. Q4_0: the low nibbles, and the high ones masked in place (16 times their value)
// into a second chain, which is a multiple of 16 and so shifts back exactly; against shifting each vector's
// high nibbles down, one instruction fewer per vector, and less time at one and two rows.
template <DType kType, int R>
void vnni_rows(const uint8_t* w, size_t tile_bytes, int64_t n_tiles, int64_t blocks, const ActSuper* x,
               int64_t x_stride, float* y, int64_t y_stride) {
  const __m512i low = _mm512_set1_epi8(0x0F), bias = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i high = _mm512_set1_epi8(static_cast<char>(0xF0));
  for (int64_t t = 0; t < n_tiles; ++t) {
    const uint8_t* tile = w + static_cast<size_t>(t) * tile_bytes;
    __m512 acc[R];
    for (int m = 0; m < R; ++m) acc[m] = _mm512_setzero_ps();
    for (int64_t b = 0; b < blocks; ++b) {
      const TileBlock tb = tile_block<kType>(tile, b);
      // The unsigned codes of elements 4v..4v+3 in vector v (Q4_0: of 16 + 4v.. times 16 in u[4 + v]).
      __m512i u[8];
      for (int v = 0; v < kVectors<kType>; ++v) {
        const __m512i c = _mm512_loadu_si512(tb.codes + 64 * v);
        if constexpr (kType == DType::Q8_0) {
          u[v] = _mm512_xor_si512(c, bias);
        } else {
          u[v] = _mm512_and_si512(c, low);
          u[4 + v] = _mm512_and_si512(c, high);
        }
      }
      for (int m = 0; m < R; ++m) {
        const ActBlock a = act_block<kFold<kType>>(x + m * x_stride, b);
        // Two chains, added (Q4_0: the high nibbles' shifted back): the same integer.
        __m512i s0 = _mm512_set1_epi32(a.offset), s1 = _mm512_setzero_si512();
        if constexpr (kType == DType::Q8_0) {
          for (int v = 0; v < 8; v += 2) {
            s0 = _mm512_dpbusd_epi32(s0, u[v], _mm512_set1_epi32(a.codes[v]));
            s1 = _mm512_dpbusd_epi32(s1, u[v + 1], _mm512_set1_epi32(a.codes[v + 1]));
          }
          acc[m] = scale_sum(acc[m], _mm512_add_epi32(s0, s1), tb.d, a.d);
        } else {
          for (int v = 0; v < 4; ++v) {
            s0 = _mm512_dpbusd_epi32(s0, u[v], _mm512_set1_epi32(a.codes[v]));
            s1 = _mm512_dpbusd_epi32(s1, u[4 + v], _mm512_set1_epi32(a.codes[4 + v]));
          }
          acc[m] = scale_sum(acc[m], _mm512_add_epi32(s0, _mm512_srai_epi32(s1, 4)), tb.d, a.d);
        }
      }
    }
    for (int m = 0; m < R; ++m) _mm512_storeu_ps(y + m * y_stride + kTileRows * t, acc[m]);
  }
}

// Blocks by which the tile kernel unpacks the codes ahead of the multiply-adds that read them: a tile load
// of bytes still in the store buffer waits for them to reach the cache (four blocks ahead took about half
// the time per block of unpacking just before the tile load; performance.md, AMX).
constexpr int64_t kUnpackAhead = 4;
constexpr int64_t kUnpackRing = 8;  // B buffers (a power of two above kUnpackAhead + 1)

// The codes of one block of a tile of weight rows, minus 8 (signed bytes), as the B tile (8 rows of 64 bytes,
// K = 32): the low nibbles of vector v in row v, the high ones in row 4 + v.
inline void unpack_b(const uint8_t* codes, uint8_t* bt) {
  const __m512i low = _mm512_set1_epi8(0x0F), eight = _mm512_set1_epi8(8);
  for (int v = 0; v < 4; ++v) {
    const __m512i c = _mm512_loadu_si512(codes + 64 * v);
    _mm512_store_si512(bt + 64 * v, _mm512_sub_epi8(_mm512_and_si512(c, low), eight));
    _mm512_store_si512(bt + 64 * (4 + v),
                       _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(c, 4), low), eight));
  }
}

// One block's multiply-adds in tile set S (tmm0-2 or tmm3-5: B, A, C): the integer sums of the configured
// activation rows at a (rows a_stride bytes apart) against the signed codes at bt (the B tile, 8 rows of 64
// bytes), stored to sums [rows][16].
template <int S>
inline void tile_sums(const uint8_t* bt, const int32_t* a, int64_t a_stride, int32_t* sums) {
  if constexpr (S == 0) {
    TANDEM_TILE_LOAD(0, bt, 64);
    TANDEM_TILE_LOAD(1, a, a_stride);
    TANDEM_TILE_ZERO(2);
    TANDEM_TILE_DPBSSD(2, 1, 0);
    TANDEM_TILE_STORE(2, sums, 64);
  } else {
    TANDEM_TILE_LOAD(3, bt, 64);
    TANDEM_TILE_LOAD(4, a, a_stride);
    TANDEM_TILE_ZERO(5);
    TANDEM_TILE_DPBSSD(5, 4, 3);
    TANDEM_TILE_STORE(5, sums, 64);
  }
}

// R activation rows (R <= 16, the tiles configured for R rows) against n_tiles tiles of 16 weight rows. Per
// block b: the codes of block b + kUnpackAhead made ready (Q4_0 unpacked; Q8_0's codes are the B tile as they
// lie), block b's multiply-adds (the tile sets alternate), then block b - 1's float steps, so that one
// block's tile work overlaps the other's float work.
// With `unpacked` (Q4_0, one tile of weight rows: its blocks' B tiles end to end, and their scales at
// `scales`), the codes are read from there instead.
template <DType kType, int R>
void amx_rows(const uint8_t* w, size_t tile_bytes, int64_t n_tiles, int64_t blocks, const ActSuper* x,
              int64_t x_stride, float* y, int64_t y_stride, const uint8_t* unpacked, const float* scales) {
  alignas(64) uint8_t bt[kType == DType::Q4_0 ? kUnpackRing : 1][8 * 64];
  alignas(64) float d[kUnpackRing][16];
  const uint8_t* b_tile[kUnpackRing];
  const float* d_of[kUnpackRing];  // each block's 16 scales: in d, or in `scales`
  alignas(64) int32_t sums[2][R * 16];
  const int64_t a_stride = x_stride * static_cast<int64_t>(sizeof(ActSuper));
  for (int64_t t = 0; t < n_tiles; ++t) {
    const uint8_t* tile = w + static_cast<size_t>(t) * tile_bytes;
    __m512 acc[R];
    for (int m = 0; m < R; ++m) acc[m] = _mm512_setzero_ps();
    const auto ready = [&](int64_t u) {
      const int64_t slot = u % kUnpackRing;
      if (unpacked != nullptr) {
        b_tile[slot] = unpacked + 8 * 64 * u;
        d_of[slot] = scales + 16 * u;
        return;
      }
      const TileBlock tb = tile_block<kType>(tile, u);
      if constexpr (kType == DType::Q4_0) {
        unpack_b(tb.codes, bt[slot]);
        b_tile[slot] = bt[slot];
      } else {
        b_tile[slot] = tb.codes;
      }
      _mm512_store_ps(d[slot], tb.d);
      d_of[slot] = d[slot];
    };
    for (int64_t b = 0; b < std::min(kUnpackAhead, blocks); ++b) ready(b);
    for (int64_t b = 0; b <= blocks; ++b) {
      if (b + kUnpackAhead < blocks) ready(b + kUnpackAhead);
      if (b < blocks) {
        const int32_t* a = act_block<kFold<kType>>(x, b).codes;
        if (b % 2 == 0)
          tile_sums<0>(b_tile[b % kUnpackRing], a, a_stride, sums[0]);
        else
          tile_sums<1>(b_tile[b % kUnpackRing], a, a_stride, sums[1]);
      }
      if (b == 0) continue;
      // Block b - 1's float steps.
      const int64_t p = b - 1;
      const int32_t* s = sums[p % 2];
      const __m512 dw = _mm512_load_ps(d_of[p % kUnpackRing]);
      for (int m = 0; m < R; ++m)
        acc[m] = scale_sum(acc[m], _mm512_load_si512(s + 16 * m), dw,
                           act_block<kFold<kType>>(x + m * x_stride, p).d);
    }
    for (int m = 0; m < R; ++m) _mm512_storeu_ps(y + m * y_stride + kTileRows * t, acc[m]);
  }
}

using RowsFn = void (*)(const uint8_t*, size_t, int64_t, int64_t, const ActSuper*, int64_t, float*, int64_t);
using TileRowsFn = void (*)(const uint8_t*, size_t, int64_t, int64_t, const ActSuper*, int64_t, float*,
                            int64_t, const uint8_t*, const float*);

template <DType kType, int... R>
constexpr TileRowsFn amx_kernel(int rows, std::integer_sequence<int, R...>) {
  TileRowsFn fn = nullptr;
  ((rows == R + 1 ? (fn = amx_rows<kType, R + 1>) : fn), ...);
  return fn;
}

// The tiles configured for `rows` activation rows (both sets: tmm0-2 and tmm3-5, B, A and C).
inline void configure_tiles(int64_t rows) {
  TileConfig cfg;
  for (int set = 0; set < 2; ++set) {
    cfg.rows[3 * set] = 8;  // B: 8 rows of 64 bytes (K = 32)
    cfg.colsb[3 * set] = 64;
    cfg.rows[3 * set + 1] = cfg.rows[3 * set + 2] = static_cast<uint8_t>(rows);
    cfg.colsb[3 * set + 1] = 32;  // A: a block's codes per activation row
    cfg.colsb[3 * set + 2] = 64;  // C: 16 sums per activation row
  }
  _tile_loadconfig(&cfg);
}

// Q4_0 passes of more than 16 rows (prefill) take the activation rows 16 at a time against each tile of
// weight rows, its codes unpacked once for all of them, where a tile's unpacked codes fit kUnpackedBytes.
constexpr int64_t kUnpackedBytes = 128 << 10;
constexpr int64_t kWideRows = 64;

template <DType kType>
void row_tiles_rows(const uint8_t* w, int64_t row_bytes, int64_t n_out, int64_t k, const ActSuper* x,
                    int64_t x_stride, int64_t n_rows, float* y, int64_t y_stride) {
  const size_t tile_bytes = static_cast<size_t>(row_bytes) * kTileRows;
  const int64_t n_tiles = n_out / kTileRows, blocks = k / 32;
  if (n_rows <= kVnniRows) {
    constexpr RowsFn kVnni[] = {vnni_rows<kType, 1>, vnni_rows<kType, 2>, vnni_rows<kType, 3>,
                                vnni_rows<kType, 4>};
    return kVnni[n_rows - 1](w, tile_bytes, n_tiles, blocks, x, x_stride, y, y_stride);
  }
  const auto rows_fn = [](int64_t rows) {
    return amx_kernel<kType>(static_cast<int>(rows), std::make_integer_sequence<int, kTileRows>());
  };
  if (n_rows <= kTileRows) {
    configure_tiles(n_rows);
    rows_fn(n_rows)(w, tile_bytes, n_tiles, blocks, x, x_stride, y, y_stride, nullptr, nullptr);
    _tile_release();
    return;
  }
  // (Q4_0 only: direct_pass_rows.)
  alignas(64) uint8_t unpacked[kUnpackedBytes];
  alignas(64) float scales[kUnpackedBytes / (8 * 64)][16];
  int64_t configured = 0;
  for (int64_t t = 0; t < n_tiles; ++t) {
    const uint8_t* tile = w + static_cast<size_t>(t) * tile_bytes;
    for (int64_t b = 0; b < blocks; ++b) {
      const TileBlock tb = tile_block<kType>(tile, b);
      unpack_b(tb.codes, unpacked + 8 * 64 * b);
      _mm512_store_ps(scales[b], tb.d);
    }
    for (int64_t r0 = 0; r0 < n_rows; r0 += kTileRows) {
      const int64_t rows = std::min(kTileRows, n_rows - r0);
      if (rows != configured) configure_tiles(configured = rows);
      rows_fn(rows)(tile, tile_bytes, 1, blocks, x + r0 * x_stride, x_stride,
                    y + r0 * y_stride + kTileRows * t, y_stride, unpacked, scales[0]);
    }
  }
  _tile_release();
}

const QuantKernels& vbmi() {
  return quant_kernels_avx512_vbmi();
}

// Rows one call takes: Q4_0 up to kWideRows where a tile's unpacked codes fit, else 16.
int64_t row_tile_rows(DType type, int64_t k) {
  return type == DType::Q4_0 && k / 32 * 8 * 64 <= kUnpackedBytes ? kWideRows : kMaxRows;
}

int64_t direct_max_rows(DType type, WeightForm form, int64_t k, bool signed_q8) {
  return form == WeightForm::kRowTiles ? row_tile_rows(type, k)
                                       : vbmi().direct_max_rows(type, form, k, signed_q8);
}

int64_t direct_pass_rows(DType type, WeightForm form, int64_t k, bool signed_q8) {
  return form == WeightForm::kRowTiles ? row_tile_rows(type, k)
                                       : vbmi().direct_pass_rows(type, form, k, signed_q8);
}

void direct_rows(DType type, WeightForm form, const uint8_t* w, int64_t row_bytes, int64_t n_out, int64_t k,
                 const ActSuper* x, int64_t x_stride, int64_t n_rows, float* y, int64_t y_stride,
                 PrefetchReach reach) {
  if (form != WeightForm::kRowTiles)
    return vbmi().direct_rows(type, form, w, row_bytes, n_out, k, x, x_stride, n_rows, y, y_stride, reach);
  if (type == DType::Q8_0)
    return row_tiles_rows<DType::Q8_0>(w, row_bytes, n_out, k, x, x_stride, n_rows, y, y_stride);
  row_tiles_rows<DType::Q4_0>(w, row_bytes, n_out, k, x, x_stride, n_rows, y, y_stride);
}

#undef TANDEM_TILE_LOAD
#undef TANDEM_TILE_STORE
#undef TANDEM_TILE_ZERO
#undef TANDEM_TILE_DPBSSD

}  // namespace amx_target

const QuantKernels& quant_kernels_amx() {
  static const QuantKernels kernels = [] {
    QuantKernels qk = quant_kernels_avx512_vbmi();
    qk.direct_max_rows = amx_target::direct_max_rows;
    qk.direct_pass_rows = amx_target::direct_pass_rows;
    qk.direct_rows = amx_target::direct_rows;
    qk.row_tiles = true;
    return qk;
  }();
  return kernels;
}

}  // namespace tandem::kernels
#pragma GCC diagnostic pop
#pragma GCC pop_options

#else
namespace tandem::kernels {
const QuantKernels& quant_kernels_amx() {
  return quant_kernels_scalar();
}
}  // namespace tandem::kernels
#endif
