// Quantized dot products on AVX-512 with VNNI: vpdpbusd multiplies the unsigned weight codes by the signed
// activation codes, 64 elements per instruction. Up to 8 activation rows share each loaded weight vector, and
// in windows of a few rows two weight rows share each loaded activation vector (pair_tile).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <type_traits>
#include <utility>

#include "tandem/kernels/quant_layout.h"
#include "tandem/kernels/repack.h"
#include "tandem/tensor/blocks.h"
#include "tandem/tensor/fp16.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
// GCC 12 reports its own _mm512_undefined_* placeholders inside the intrinsic headers as
// (maybe-)uninitialized.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")
#include <immintrin.h>

namespace tandem::kernels {
namespace avx512_target {

#include "tandem/kernels/quant_x86_helpers.inc"

// Element order to group-interleaved order (quant_layout.h): a transpose of 4-byte units, 16 groups by 4
// quarters. Each 64-byte vector (groups 4j..4j+3) is reordered quarter-major, then the 128-bit pieces are
// transposed.
inline void interleave_groups(uint8_t* codes) {
  const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  __m512i p[4];
  for (int j = 0; j < 4; ++j) p[j] = _mm512_permutexvar_epi32(idx, _mm512_loadu_si512(codes + 64 * j));
  const __m512i t0 = _mm512_shuffle_i32x4(p[0], p[1], 0x44), t1 = _mm512_shuffle_i32x4(p[0], p[1], 0xEE);
  const __m512i t2 = _mm512_shuffle_i32x4(p[2], p[3], 0x44), t3 = _mm512_shuffle_i32x4(p[2], p[3], 0xEE);
  _mm512_storeu_si512(codes, _mm512_shuffle_i32x4(t0, t2, 0x88));
  _mm512_storeu_si512(codes + 64, _mm512_shuffle_i32x4(t0, t2, 0xDD));
  _mm512_storeu_si512(codes + 128, _mm512_shuffle_i32x4(t1, t3, 0x88));
  _mm512_storeu_si512(codes + 192, _mm512_shuffle_i32x4(t1, t3, 0xDD));
}

// Four quarter vectors in block order from four vectors z[m] that each hold two blocks' 32 bytes (blocks 2m,
// 2m + 1; four qwords each): a transpose of qwords, 8 blocks by 4 quarters.
inline void block_quarters(const __m512i* z, __m512i* out) {
  const __m512i lo = _mm512_setr_epi64(0, 4, 8, 12, 1, 5, 9, 13),
                hi = _mm512_setr_epi64(2, 6, 10, 14, 3, 7, 11, 15);
  const __m512i p01 = _mm512_permutex2var_epi64(z[0], lo, z[1]);  // quarters 0, 1 of blocks 0..3
  const __m512i p23 = _mm512_permutex2var_epi64(z[0], hi, z[1]);  // quarters 2, 3 of blocks 0..3
  const __m512i r01 = _mm512_permutex2var_epi64(z[2], lo, z[3]);  // the same of blocks 4..7
  const __m512i r23 = _mm512_permutex2var_epi64(z[2], hi, z[3]);
  out[0] = _mm512_shuffle_i64x2(p01, r01, 0x44);
  out[1] = _mm512_shuffle_i64x2(p01, r01, 0xEE);
  out[2] = _mm512_shuffle_i64x2(p23, r23, 0x44);
  out[3] = _mm512_shuffle_i64x2(p23, r23, 0xEE);
}

// Element order to block order (quant_layout.h).
inline void interleave_blocks(uint8_t* codes) {
  __m512i z[4], out[4];
  for (int m = 0; m < 4; ++m) z[m] = _mm512_loadu_si512(codes + 64 * m);
  block_quarters(z, out);
  for (int q = 0; q < 4; ++q) _mm512_storeu_si512(codes + 64 * q, out[q]);
}

#include "tandem/kernels/quant_unpack.inc"

// Scales of the 8 blocks of one super, each repeated for its two groups: f16 words at word offsets
// kStride * j of the 128 bytes at d, picked by one two-source word permute (no scalar gathering, which
// would stall on store forwarding).
template <int kStride>
inline __m512 block_scales8(const uint8_t* d) {
  static_assert(7 * kStride < 64, "the scales must lie in the first 128 bytes");
  const __m512i idx = _mm512_setr_epi32(0, kStride * 0x10001, 2 * kStride * 0x10001, 3 * kStride * 0x10001,
                                        4 * kStride * 0x10001, 5 * kStride * 0x10001, 6 * kStride * 0x10001,
                                        7 * kStride * 0x10001, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512i words = _mm512_permutex2var_epi16(_mm512_loadu_si512(d), idx, _mm512_loadu_si512(d + 64));
  return _mm512_cvtph_ps(_mm512_castsi512_si256(words));
}

// One super-block held in registers in the unpacked form: the four quarter vectors of codes, the group
// scales a and offsets b (the same bits unpack_row_impl stores).
struct SuperRegs {
  __m512i u[4];
  __m512 a, b;
};

// Q4_0 (8 blocks from sb) in block order: the 16 code bytes of the even blocks side by side in one vector,
// of the odd ones in another; per 128-bit lane a qword unpack pairs block 2m's bytes 0..7 (or 8..15) with
// block 2m + 1's, which is quarter 0 (or 1) of blocks 2m and 2m + 1 in their low nibbles and quarter 2 (or
// 3) in their high ones.
inline void load_q4_0_super(const uint8_t* sb, SuperRegs& s) {
  constexpr int64_t kB = sizeof(BlockQ4_0);
  const auto qs = [sb](int j) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(sb + j * kB + 2)); };
  const __m512i nib = _mm512_set1_epi8(0x0F);
  const __m512i even = _mm512_inserti32x4(
      _mm512_inserti32x4(_mm512_inserti32x4(_mm512_castsi128_si512(qs(0)), qs(2), 1), qs(4), 2), qs(6), 3);
  const __m512i odd = _mm512_inserti32x4(
      _mm512_inserti32x4(_mm512_inserti32x4(_mm512_castsi128_si512(qs(1)), qs(3), 1), qs(5), 2), qs(7), 3);
  const __m512i el = _mm512_and_si512(even, nib), ol = _mm512_and_si512(odd, nib);
  const __m512i eh = _mm512_and_si512(_mm512_srli_epi16(even, 4), nib);
  const __m512i oh = _mm512_and_si512(_mm512_srli_epi16(odd, 4), nib);
  s.u[0] = _mm512_unpacklo_epi64(el, ol);
  s.u[1] = _mm512_unpackhi_epi64(el, ol);
  s.u[2] = _mm512_unpacklo_epi64(eh, oh);
  s.u[3] = _mm512_unpackhi_epi64(eh, oh);
  s.a = block_scales8<kB / 2>(sb);
  s.b = _mm512_mul_ps(_mm512_set1_ps(-8.0f), s.a);
}

// Scales of the 8 blocks of a Q8_0 super (34-byte blocks: word stride 17, spread over 272 bytes): blocks 0..3
// from the first 128 bytes, 4..7 from the 128 bytes at block 4, each repeated for its two groups.
inline __m512 q8_0_scales8(const uint8_t* sb) {
  const __m512i idx =
      _mm512_setr_epi32(0, 17 * 0x10001, 34 * 0x10001, 51 * 0x10001, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  const uint8_t* sb4 = sb + 4 * sizeof(BlockQ8_0);
  const __m512i w0 = _mm512_permutex2var_epi16(_mm512_loadu_si512(sb), idx, _mm512_loadu_si512(sb + 64));
  const __m512i w1 = _mm512_permutex2var_epi16(_mm512_loadu_si512(sb4), idx, _mm512_loadu_si512(sb4 + 64));
  return _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_inserti64x2(w0, _mm512_castsi512_si128(w1), 1)));
}

// Q8_0 in block order: quarter q holds bytes 8q..8q+7 of each block. kUnsigned: the codes made unsigned
// (offset -128), else the file's signed codes (offset 0).
template <bool kUnsigned>
inline void load_q8_0_super(const uint8_t* sb, SuperRegs& s) {
  constexpr int64_t kB = sizeof(BlockQ8_0);
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512i z[4];  // blocks 2m, 2m + 1
  for (int m = 0; m < 4; ++m)
    z[m] = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + 2 * m * kB + 2))),
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + (2 * m + 1) * kB + 2)), 1);
  block_quarters(z, s.u);
  if (kUnsigned)
    for (int q = 0; q < 4; ++q) s.u[q] = _mm512_xor_si512(s.u[q], flip);
  s.a = q8_0_scales8(sb);
  s.b = kUnsigned ? _mm512_mul_ps(_mm512_set1_ps(-128.0f), s.a) : _mm512_setzero_ps();
}

// The repacked forms (repack.h): the 8 scales side by side at the head, each repeated for its two groups.
inline __m512 interleaved_scales8(const uint8_t* sb) {
  const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sb)));
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7),
                               _mm512_castps256_ps512(d));
}

// 64 bytes as four 16-byte loads. Super-blocks of the repacked forms sit at multiples of 16 bytes (144 and
// 272 bytes long, in a file with 32-byte alignment), so these never straddle a cache line; one 64-byte load
// would in three super-blocks of four, and such loads run up to 1.5x slower when the weights stream from
// memory (measured at one row).
inline __m512i load64_by16(const uint8_t* p) {
  const auto q = [p](int i) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * i)); };
  return _mm512_inserti32x4(
      _mm512_inserti32x4(_mm512_inserti32x4(_mm512_castsi128_si512(q(0)), q(1), 1), q(2), 2), q(3), 3);
}

// Repacked Q4_0: code bytes 0..7 of the 8 blocks in one vector, bytes 8..15 in the next; their low nibbles
// are quarters 0 and 1, the high ones quarters 2 and 3.
inline void load_q4_0x_super(const uint8_t* sb, SuperRegs& s) {
  const __m512i nib = _mm512_set1_epi8(0x0F);
  const __m512i lo = load64_by16(sb + 16), hi = load64_by16(sb + 80);
  s.u[0] = _mm512_and_si512(lo, nib);
  s.u[1] = _mm512_and_si512(hi, nib);
  s.u[2] = _mm512_and_si512(_mm512_srli_epi16(lo, 4), nib);
  s.u[3] = _mm512_and_si512(_mm512_srli_epi16(hi, 4), nib);
  s.a = interleaved_scales8(sb);
  s.b = _mm512_mul_ps(_mm512_set1_ps(-8.0f), s.a);
}

// Repacked Q8_0: the four quarters as they are, made unsigned (offset -128) or not (as load_q8_0_super).
template <bool kUnsigned>
inline void load_q8_0x_super(const uint8_t* sb, SuperRegs& s) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int q = 0; q < 4; ++q) {
    s.u[q] = load64_by16(sb + 16 + 64 * q);
    if (kUnsigned) s.u[q] = _mm512_xor_si512(s.u[q], flip);
  }
  s.a = interleaved_scales8(sb);
  s.b = kUnsigned ? _mm512_mul_ps(_mm512_set1_ps(-128.0f), s.a) : _mm512_setzero_ps();
}

#include "tandem/kernels/quant_kquants_avx512.inc"

// The fold of a weight type (accumulate_super), or 0.
constexpr int fold_of(DType type) {
  return type == DType::Q4_0 ? 3 : type == DType::Q6_K ? 5 : type == DType::Q8_0 ? 7 : 0;
}

// The signed form of a super-block with a fixed offset (quant_layout.h): codes s = u - kOffset against the
// biased activation codes qb = q + 128, each group sum started at -128 * sum(s), so that it ends at sum(s *
// q), the same integer as the unsigned form's. Per activation row this reads the codes and scales only (the
// unsigned form also reads the offset sums); the correction costs a few operations per weight super-block,
// which pays in windows (signed_min_rows).
struct SignedRegs {
  __m512i s[4];  // codes, quarter by quarter
  __m512i init;  // -128 times the lane sums of s
  __m512 a;      // group scales
};

// Load gives codes with weight = a * (u - kOffset); kOffset 0 (Q8_0's signed codes) or at most 32 with codes
// below 64 (Q4_0, Q6_K), whose four quarters then add up bytewise without overflow.
template <void (*Load)(const uint8_t*, SuperRegs&), int kOffset>
inline void load_signed(const uint8_t* sb, SignedRegs& s) {
  SuperRegs r;
  Load(sb, r);
  s.a = r.a;
  if constexpr (kOffset == 0) {
    const __m512i k128 = _mm512_set1_epi8(static_cast<char>(0x80));
    __m512i t = _mm512_setzero_si512();  // 128 times the lane sums
    for (int q = 0; q < 4; ++q) {
      s.s[q] = r.u[q];
      t = _mm512_dpbusd_epi32(t, k128, s.s[q]);
    }
    s.init = _mm512_sub_epi32(_mm512_setzero_si512(), t);
  } else {
    static_assert(kOffset > 0 && kOffset <= 32);
    const __m512i off = _mm512_set1_epi8(static_cast<char>(kOffset));
    for (int q = 0; q < 4; ++q) s.s[q] = _mm512_sub_epi8(r.u[q], off);
    const __m512i u_sum = _mm512_add_epi8(_mm512_add_epi8(r.u[0], r.u[1]), _mm512_add_epi8(r.u[2], r.u[3]));
    // -128 * (sum(u) - 16 * kOffset) over the 16 elements of each lane
    s.init = _mm512_dpbusd_epi32(_mm512_set1_epi32(128 * 16 * kOffset), u_sum,
                                 _mm512_set1_epi8(static_cast<char>(-128)));
  }
}

// The per-row work of one super-block in the signed form for kW weight rows (1: direct_tile, 2: pair_tile),
// one definition so that every tile computes the same bits: for each weight row, four vpdpbusd from the
// weights' correction add the biased activation codes' products lane by lane into the 16 group sums, then one
// convert and one scaling per group (as accumulate_super). The rows' instructions are interleaved (as two
// separate calls they measured 4-9% slower at 8 rows in cache).
template <int kW>
inline void accumulate_signed(const SignedRegs* w, const __m512i* qb, __m512 d, __m512* const* acc) {
  __m512i sum[kW];
  for (int i = 0; i < kW; ++i) sum[i] = w[i].init;
  for (int q = 0; q < 4; ++q)
    for (int i = 0; i < kW; ++i) sum[i] = _mm512_dpbusd_epi32(sum[i], qb[q], w[i].s[q]);
  for (int i = 0; i < kW; ++i)
    *acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[i]), _mm512_mul_ps(w[i].a, d), *acc[i]);
}

// The biased activation codes of one super-block, quarter by quarter.
inline void load_biased_codes(const ActSuper& X, __m512i* qb) {
  for (int q = 0; q < 4; ++q) qb[q] = _mm512_load_si512(X.qb + 64 * q);
}

// Window rows from which the direct kernels take the signed form, by offset fold. Measured over a TinyLlama
// token's matrices on two threads, weights streaming from memory, time against the unsigned form (median of
// 24 pairs): at 1 / 2 / 3 / 4 / 8 rows Q4_0 0.99 / 1.02 / 0.99 / 0.95 / 0.89, Q8_0 0.98 / 0.97 / 0.92 / 0.97
// / 0.92, Q6_K 0.97 / 0.96 / 0.91 / 0.90 / 0.88. One row stays unsigned: in cache the signed form costs 1.3x
// (Q4_0) and 1.15x (Q8_0) there, which binds when the machine's bandwidth is high.
constexpr int signed_min_rows(int fold) {
  return fold == fold_of(DType::Q4_0) ? 4 : 2;  // Q6_K, Q8_0: 2
}

template <void (*Load)(const uint8_t*, SuperRegs&), int64_t kSuperBytes>
inline void unpack_supers(const uint8_t* row, int64_t n_super, UnpackedSuper* out) {
  for (int64_t i = 0; i < n_super; ++i) {
    SuperRegs s;
    Load(row + i * kSuperBytes, s);
    for (int q = 0; q < 4; ++q) _mm512_store_si512(out[i].u + 64 * q, s.u[q]);
    _mm512_store_ps(out[i].a, s.a);
    _mm512_store_ps(out[i].b, s.b);
  }
}

// One activation super-block of a row, loaded once for every weight row of a tile.
struct ActRegs {
  __m512i q[4];  // codes, quarter by quarter
  __m512i init;  // start of the integer sums: minus 2^kFold times the group code sums (kFold > 0)
  __m512 d;      // group scales
};

template <int kFold>
inline void load_act(const ActSuper& X, ActRegs& r) {
  for (int q = 0; q < 4; ++q) r.q[q] = _mm512_load_si512(X.q + 64 * q);
  r.init = kFold > 0 ? _mm512_load_si512(X.offset_sums[fold_index(kFold > 0 ? kFold : 3)])
                     : _mm512_setzero_si512();
  r.d = _mm512_load_ps(X.d);
}

// The per-row work of one super-block, shared by the unpacked and the direct kernels so that both compute the
// same bits: four vpdpbusd add the quarters' products lane by lane into the 16 group sums, then one convert
// and one scaling per group. kFold > 0: the weight offset is -2^kFold times the scale in every group (Q4_0:
// -8, Q6_K: -32, Q8_0 stored unsigned: -128), so it is folded into the integer sums (minus 2^kFold times the
// activation code sums) and the offset term vanishes; otherwise b times the scaled code sums goes to acc_b.
template <int kFold>
inline void accumulate_super(const __m512i* u, __m512 a, __m512 b, const ActRegs& x, const ActSuper& X,
                             __m512& acc, __m512& acc_b) {
  __m512i sum = _mm512_dpbusd_epi32(x.init, u[0], x.q[0]);
  sum = _mm512_dpbusd_epi32(sum, u[1], x.q[1]);
  sum = _mm512_dpbusd_epi32(sum, u[2], x.q[2]);
  sum = _mm512_dpbusd_epi32(sum, u[3], x.q[3]);
  acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(a, x.d), acc);
  if (kFold == 0) acc_b = _mm512_fmadd_ps(b, _mm512_load_ps(X.bs), acc_b);
}

// Q8_0 codes of this target's unpacked form and loaders: unsigned (offset folded).
constexpr bool kSignedQ8 = false;

// Which tiles prefetch into L2 rather than L1: one-row tiles (decode), and every tile of Q8_0 (272-byte
// repacked super-blocks) and Q6_K; L2 kL2PrefetchBytes ahead, L1 kPrefetchBytes ahead (pair tiles: a pair
// ahead either way). Measured over a TinyLlama token's matrices (two threads, weights from memory, median of
// 24 pairs) against L1: one row Q8_0 0.86-0.96, Q4_K 0.95-0.97, Q6_K 0.96-0.99, Q4_0 0.98-0.99 (the previous
// build against this one, paired the same way: Q8_0 1.02-1.18, Q6_K 1.04, Q4_K 1.03-1.05, Q4_0 1.01); Q8_0
// windows 0.81-0.97 / 0.93 / 0.91-0.93 / 0.94 at 2 / 3 / 4 / 8 rows; Q6_K 0.945 / 0.94 at 2 / 3 rows and, in
// pair tiles, 0.99 / 0.92 at 4 / 8. Other windows lose with it (Q4_K at 4 and 8 rows 1.04; Q4_0 pair tiles
// 1.28 / 1.12 / 1.04 at 3 / 4 / 8 rows). Distances that are multiples of 4 KB measured worse (the prefetch
// aliases the load it runs ahead of).
constexpr bool l2_prefetch(int fold, int64_t rows) {
  return rows == 1 || fold == fold_of(DType::Q8_0) || fold == fold_of(DType::Q6_K);
}
constexpr int64_t kL2PrefetchBytes = 6144;
// The prefetch hint of a tile (l2_prefetch).
constexpr int prefetch_hint(int fold, int64_t rows) {
  return l2_prefetch(fold, rows) ? _MM_HINT_T1 : _MM_HINT_T0;
}

// Direct kernels: weight rows straight from their file bytes, each super-block decoded into registers and
// applied to up to kDirectRows activation rows, with no unpack buffer (decode and small verify windows).
constexpr int64_t kDirectRows = 8;

// Activation rows per unpacked-kernel tile (quant_direct_x86.inc).
constexpr size_t kDotTileRows = 8;

// Accumulator state per activation row between column chunks (quant_direct_x86.inc): acc, then acc_b.
constexpr int64_t kStateFloats = 32;

// Signed: the loader of the type's signed form (load_signed), or nullptr; taken from signed_min_rows rows on.
// Both forms give the same integer group sums and then the same float operations.
template <int NR, void (*Load)(const uint8_t*, SuperRegs&), int64_t kSuperBytes, int kFold, auto Signed>
void direct_tile(const uint8_t* w, int64_t n_super, const ActSuper* x, int64_t x_stride, float* y,
                 int64_t y_stride, const TilePart& part) {
  __m512 acc[NR], acc_b[NR];
  for (int r = 0; r < NR; ++r) {
    acc[r] = part.first ? _mm512_setzero_ps() : _mm512_load_ps(part.state + kStateFloats * r);
    acc_b[r] = part.first ? _mm512_setzero_ps() : _mm512_load_ps(part.state + kStateFloats * r + 16);
  }
  for (int64_t s = 0; s < n_super; ++s) {
    const uint8_t* ws = w + s * kSuperBytes;
    prefetch_ahead<kSuperBytes, prefetch_hint(kFold, NR)>(ws, part.prefetch);
    if constexpr (!std::is_null_pointer_v<decltype(Signed)> && NR >= signed_min_rows(kFold)) {
      SignedRegs wr;
      Signed(ws, wr);
      for (int r = 0; r < NR; ++r) {
        const ActSuper& X = x[r * x_stride + s];
        __m512i qb[4];
        load_biased_codes(X, qb);
        __m512* const out[1] = {&acc[r]};
        accumulate_signed<1>(&wr, qb, _mm512_load_ps(X.d), out);
      }
    } else {
      SuperRegs wr;
      Load(ws, wr);
      for (int r = 0; r < NR; ++r) {
        const ActSuper& X = x[r * x_stride + s];
        ActRegs xr;
        load_act<kFold>(X, xr);
        accumulate_super<kFold>(wr.u, wr.a, wr.b, xr, X, acc[r], acc_b[r]);
      }
    }
  }
  if (part.last) {
    for (int r = 0; r < NR; ++r) y[r * y_stride] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r], acc_b[r]));
  } else {
    for (int r = 0; r < NR; ++r) {
      _mm512_store_ps(part.state + kStateFloats * r, acc[r]);
      _mm512_store_ps(part.state + kStateFloats * r + 16, acc_b[r]);
    }
  }
}

// Window rows from which the direct kernels take the weight rows two at a time (pair_tile), by offset fold;
// 0: never. Two weight rows share every activation load, which is what binds a window row in cache (five
// 64-byte loads against four vpdpbusd, a multiply and an FMA), but they double the register state, so
// tiles stop at kDirectRows. Measured over the matrices of one TinyLlama token (22 layers, two threads,
// weights streaming from memory, median of 24 pairs), time against one row at a time: Q4_0 1.00 / 1.00 /
// 0.95 / 0.92 / 0.86 / 0.86 / 0.88 at 1 / 2 / 3 / 4 / 6 / 7 / 8 rows; Q6_K 1.21 / 1.08 / 0.95 / 0.91 at 1 /
// 3 / 4 / 8; Q8_0 (repacked, 272-byte super-blocks) 1.06-1.46, never (0.87-0.94 in cache).
constexpr int pair_min_rows(int fold) {
  return fold == fold_of(DType::Q4_0) ? 3 : fold == fold_of(DType::Q6_K) ? 4 : 0;
}

// Two adjacent weight rows (row_bytes apart) against NR activation rows, in the signed form: per activation
// row and super-block, the codes and scales are loaded once for both weight rows. Each output keeps the
// operations and order of direct_tile (the same integer sums, then the same convert, multiply and FMA into
// its own accumulator), so results are bit-identical to one row at a time. The rows' two streams are
// prefetched as one: each step fetches the next pair's bytes in address order, a pair ahead (interleaved
// per-row prefetches left this 1.15-1.25x slower than one row at a time at 3 rows).
template <int NR, void (*Load)(const uint8_t*, SuperRegs&), int64_t kSuperBytes, int kFold, auto Signed>
void pair_tile(const uint8_t* w, int64_t row_bytes, int64_t n_super, const ActSuper* x, int64_t x_stride,
               float* y, int64_t y_stride) {
  __m512 acc0[NR], acc1[NR];
  for (int r = 0; r < NR; ++r) acc0[r] = acc1[r] = _mm512_setzero_ps();
  const uint8_t* next_pair = w + 2 * row_bytes;
  for (int64_t s = 0; s < n_super; ++s) {
    const uint8_t* ws0 = w + s * kSuperBytes;
    for (int64_t b = 0; b < 2 * kSuperBytes; b += 64)
      _mm_prefetch(reinterpret_cast<const char*>(next_pair + 2 * s * kSuperBytes + b),
                   static_cast<_mm_hint>(prefetch_hint(kFold, NR)));
    SignedRegs wr[2];
    Signed(ws0, wr[0]);
    Signed(ws0 + row_bytes, wr[1]);
    for (int r = 0; r < NR; ++r) {
      const ActSuper& X = x[r * x_stride + s];
      __m512i qb[4];
      load_biased_codes(X, qb);
      __m512* const out[2] = {&acc0[r], &acc1[r]};
      accumulate_signed<2>(wr, qb, _mm512_load_ps(X.d), out);
    }
  }
  // As direct_tile's acc + acc_b, whose acc_b stays zero for a folded offset.
  for (int r = 0; r < NR; ++r) {
    y[r * y_stride] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[r], _mm512_setzero_ps()));
    y[r * y_stride + 1] = _mm512_reduce_add_ps(_mm512_add_ps(acc1[r], _mm512_setzero_ps()));
  }
}

using PairTile = void (*)(const uint8_t*, int64_t, int64_t, const ActSuper*, int64_t, float*, int64_t);

template <void (*Load)(const uint8_t*, SuperRegs&), int64_t kSuperBytes, int kFold, auto Signed, size_t... I>
constexpr std::array<PairTile, sizeof...(I)> pair_tiles(std::index_sequence<I...>) {
  return {&pair_tile<static_cast<int>(I) + 1, Load, kSuperBytes, kFold, Signed>...};
}

// The output rows that pair tiles cover for this window, two at a time from the first (quant_direct_x86.inc
// runs the rest one at a time): all but an odd last one from pair_min_rows rows on, else none.
template <void (*Load)(const uint8_t*, SuperRegs&), int64_t kSuperBytes, int kFold, auto Signed>
int64_t pair_rows(const uint8_t* w, int64_t row_bytes, int64_t n_out, int64_t n_super, const ActSuper* x,
                  int64_t x_stride, int64_t n_rows, float* y, int64_t y_stride) {
  if constexpr (std::is_null_pointer_v<decltype(Signed)> || pair_min_rows(kFold) == 0) {
    return 0;
  } else {
    if (n_rows < pair_min_rows(kFold)) return 0;
    static constexpr auto tiles =
        pair_tiles<Load, kSuperBytes, kFold, Signed>(std::make_index_sequence<kDirectRows>());
    const PairTile tile = tiles[static_cast<size_t>(n_rows - 1)];
    const int64_t paired = n_out & ~int64_t{1};
    for (int64_t o = 0; o < paired; o += 2)
      tile(w + o * row_bytes, row_bytes, n_super, x, x_stride, y + o, y_stride);
    return paired;
  }
}

// Activation quantization, vectorized; the same bits as quantize_row_impl (test_kernels compares them).

// Round half away from zero, as round_away: truncate, then step by one where the exact remainder is at
// least one half.
inline __m512i round_away16(__m512 v) {
  const __m512i t = _mm512_cvttps_epi32(v);
  const __m512 frac = _mm512_sub_ps(v, _mm512_cvtepi32_ps(t));
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i up =
      _mm512_mask_add_epi32(t, _mm512_cmp_ps_mask(frac, _mm512_set1_ps(0.5f), _CMP_GE_OQ), t, one);
  return _mm512_mask_sub_epi32(up, _mm512_cmp_ps_mask(frac, _mm512_set1_ps(-0.5f), _CMP_LE_OQ), up, one);
}

// Codes of 16 elements (int32 lanes) to s.q at e.
inline void store_codes16(ActSuper& s, int e, __m512i c) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(s.q + e), _mm512_cvtepi32_epi8(c));
}

void quantize_row(const float* x, int64_t k, bool per_super, ActSuper* out) {
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
  int64_t j = 0;  // 32-element blocks done
  if (per_super) {
    for (; (j + 8) * 32 <= k; j += 8) {
      ActSuper& s = out[j / 8];
      const float* xs = x + j * 32;
      __m512 v[16];
      __m512 m = _mm512_setzero_ps();
      for (int i = 0; i < 16; ++i) {
        v[i] = _mm512_loadu_ps(xs + 16 * i);
        m = _mm512_max_ps(m, _mm512_and_ps(v[i], abs_mask));
      }
      const float amax = _mm512_reduce_max_ps(m);
      float max = 0.0f;  // the first element of largest magnitude, with its sign
      if (amax != 0.0f) {
        for (int i = 0; i < 16; ++i) {
          const __mmask16 hit =
              _mm512_cmp_ps_mask(_mm512_and_ps(v[i], abs_mask), _mm512_set1_ps(amax), _CMP_EQ_OQ);
          if (hit != 0) {
            max = xs[16 * i + __builtin_ctz(hit)];
            break;
          }
        }
      }
      const float iscale = amax != 0.0f ? -127.0f / max : 0.0f;
      const float d = amax != 0.0f ? 1.0f / iscale : 0.0f;
      const __m512 vs = _mm512_set1_ps(iscale);
      int32_t sums[16];
      for (int i = 0; i < 16; ++i) {
        // round_even: the float adder rounds to nearest even at 2^23 + 2^22.
        const __m512 shifted = _mm512_add_ps(_mm512_mul_ps(vs, v[i]), _mm512_set1_ps(12582912.0f));
        const __m512i c = _mm512_sub_epi32(_mm512_castps_si512(shifted), _mm512_set1_epi32(0x4B400000));
        const __m512i code = _mm512_min_epi32(c, _mm512_set1_epi32(127));
        store_codes16(s, 16 * i, code);
        sums[i] = _mm512_reduce_add_epi32(code);  // group order: a lane group is 16 consecutive elements
      }
      for (int b = 0; b < 8; ++b) set_block(s, 32 * b, d, sums[2 * b], sums[2 * b + 1]);
      interleave_groups(reinterpret_cast<uint8_t*>(s.q));
    }
  }
  const int64_t nb = k / 32;
  for (; j < nb; ++j) {
    ActSuper& s = out[j / 8];
    const int e0 = static_cast<int>(j % 8) * 32;
    const __m512 x0 = _mm512_loadu_ps(x + j * 32), x1 = _mm512_loadu_ps(x + j * 32 + 16);
    const float amax =
        _mm512_reduce_max_ps(_mm512_max_ps(_mm512_and_ps(x0, abs_mask), _mm512_and_ps(x1, abs_mask)));
    const float d = amax / 127.0f;
    const __m512 id = _mm512_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
    const __m512i c0 = round_away16(_mm512_mul_ps(x0, id)), c1 = round_away16(_mm512_mul_ps(x1, id));
    store_codes16(s, e0, c0);
    store_codes16(s, e0 + 16, c1);
    // Block order: lane group 2j takes the even 4-element runs of the block, 2j + 1 the odd ones.
    const __m512i c = _mm512_add_epi32(c0, c1);
    set_block(s, e0, half_to_float(f32_to_fp16(d)), _mm512_mask_reduce_add_epi32(0x0F0F, c),
              _mm512_mask_reduce_add_epi32(0xF0F0, c));
    if (j % 8 == 7) interleave_blocks(reinterpret_cast<uint8_t*>(s.q));
  }
  if (nb % 8 != 0) finish_partial_super(out[nb / 8], static_cast<int>(nb % 8) * 32);
  bias_codes(out, super_count(k));
}

// The register loader of a weight type in its file or repacked form (repack.h), with its super-block size,
// offset fold and signed form, handed to fn (call_with); false for a type this target does not decode in
// registers. Q8_0 is decoded to unsigned codes (signed in its signed form).
template <typename Fn>
bool with_loader(DType type, bool interleaved, Fn&& fn) {
  switch (type) {
    case DType::Q4_0:
      return interleaved ? call_with<load_q4_0x_super, kQ4_0Super, fold_of(DType::Q4_0),
                                     load_signed<load_q4_0x_super, 8>>(fn)
                         : call_with<load_q4_0_super, kQ4_0Super, fold_of(DType::Q4_0),
                                     load_signed<load_q4_0_super, 8>>(fn);
    case DType::Q8_0:
      return interleaved ? call_with<load_q8_0x_super<true>, kQ8_0Super, fold_of(DType::Q8_0),
                                     load_signed<load_q8_0x_super<false>, 0>>(fn)
                         : call_with<load_q8_0_super<true>, kQ8_0Super, fold_of(DType::Q8_0),
                                     load_signed<load_q8_0_super<false>, 0>>(fn);
    case DType::Q4_K:
      return interleaved ? call_with<load_q4_kx_super, sizeof(BlockQ4_K), fold_of(DType::Q4_K)>(fn)
                         : call_with<load_q4_k_super, sizeof(BlockQ4_K), fold_of(DType::Q4_K)>(fn);
    case DType::Q5_K:
      return !interleaved && call_with<load_q5_k_super, sizeof(BlockQ5_K), fold_of(DType::Q5_K)>(fn);
    case DType::Q6_K:
      return interleaved ? call_with<load_q6_kx_super, sizeof(BlockQ6_K), fold_of(DType::Q6_K),
                                     load_signed<load_q6_kx_super, 32>>(fn)
                         : call_with<load_q6_k_super, sizeof(BlockQ6_K), fold_of(DType::Q6_K),
                                     load_signed<load_q6_k_super, 32>>(fn);
    default:
      return false;
  }
}

// Each row keeps the same two accumulators and the same operation sequence whatever NR is (and whichever
// kernel, unpacked or direct, runs it), so its result does not depend on the rows beside it.
template <int NR, int kFold>
void dot_tile(const UnpackedSuper* w, int64_t n_super, const ActSuper* x, int64_t x_stride, float* y,
              int64_t y_stride) {
  __m512 acc[NR], acc_b[NR];
  for (int r = 0; r < NR; ++r) acc[r] = acc_b[r] = _mm512_setzero_ps();
  for (int64_t s = 0; s < n_super; ++s) {
    const UnpackedSuper& W = w[s];
    const __m512i u[4] = {_mm512_load_si512(W.u), _mm512_load_si512(W.u + 64), _mm512_load_si512(W.u + 128),
                          _mm512_load_si512(W.u + 192)};
    const __m512 a = _mm512_load_ps(W.a), b = _mm512_load_ps(W.b);
    for (int r = 0; r < NR; ++r) {
      const ActSuper& X = x[r * x_stride + s];
      ActRegs xr;
      load_act<kFold>(X, xr);
      accumulate_super<kFold>(u, a, b, xr, X, acc[r], acc_b[r]);
    }
  }
  for (int r = 0; r < NR; ++r) y[r * y_stride] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r], acc_b[r]));
}

#include "tandem/kernels/quant_direct_x86.inc"

int64_t direct_max_rows(DType type, bool /*interleaved: both forms*/, int64_t k, bool signed_q8) {
  if (k % kSuper != 0) return 0;
  switch (type) {
    case DType::Q4_0:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
      return kDirectRows;
    case DType::Q8_0:
      return signed_q8 ? 0 : kDirectRows;
    default:
      return 0;
  }
}

void dot_rows(const UnpackedSuper* w, int64_t n_super, const ActSuper* x, int64_t x_stride, int64_t n_rows,
              DType type, bool /*signed_codes: never set on this target*/, float* y, int64_t y_stride) {
  switch (fold_of(type)) {
    case fold_of(DType::Q4_0):
      return dot_rows_t<fold_of(DType::Q4_0)>(w, n_super, x, x_stride, n_rows, y, y_stride);
    case fold_of(DType::Q6_K):
      return dot_rows_t<fold_of(DType::Q6_K)>(w, n_super, x, x_stride, n_rows, y, y_stride);
    case fold_of(DType::Q8_0):
      return dot_rows_t<fold_of(DType::Q8_0)>(w, n_super, x, x_stride, n_rows, y, y_stride);
    default:
      return dot_rows_t<0>(w, n_super, x, x_stride, n_rows, y, y_stride);
  }
}

}  // namespace avx512_target

const QuantKernels& quant_kernels_avx512() {
  static const QuantKernels k{false,
                              avx512_target::unpack_row,
                              avx512_target::quantize_row,
                              avx512_target::dot_rows,
                              avx512_target::direct_max_rows,
                              avx512_target::direct_rows};
  return k;
}

}  // namespace tandem::kernels
#pragma GCC diagnostic pop
#pragma GCC pop_options

#else
namespace tandem::kernels {
const QuantKernels& quant_kernels_avx512() {
  return quant_kernels_scalar();
}
}  // namespace tandem::kernels
#endif
