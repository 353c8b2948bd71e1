// Quantized dot products on AVX2. Plain AVX2: vpmaddubsw multiplies unsigned weight codes (at most 127, so
// pairs never saturate) by signed activation codes, the products are added in 16 bits as far as the codes
// allow, and vpmaddwd sums pairs into 32-bit lanes. With AVX-VNNI (Intel cores from Alder Lake on, without
// AVX-512), vpdpbusd multiplies and adds the four products of each 32-bit lane into it in one instruction.
// The integer sums are exact either way, so both give the same bits. Q8_0 codes are stored signed; plain AVX2
// uses the sign trick |w| * sign(x, w), AVX-VNNI biases them to unsigned (accumulate_rows). Up to 4
// activation rows share each unpacked weight vector, up to 8 each directly decoded one. The legacy types with
// their per-32 activations, and Q4_K and Q5_K with their per-256 ones, are in block lanes (quant_layout.h),
// the other K-quants in group order.
//
// Static members of a template over the target's Isa (Avx2Isa, quant_regs_avx2.h: Isa::kVnni false for
// quant_avx2.cpp, true for quant_avx2_vnni.cpp), which each AVX2 target instantiates with an Isa of its own
// inside its `#pragma GCC target` region, after <immintrin.h>: each target's copy is compiled for its
// instruction set, under names of its own that the linker never folds together. Its includer includes
// <algorithm>, <array>, <cmath>, <cstring>, <type_traits> and <utility> before that region, so that the
// standard library is compiled for the baseline.
//
// Every helper that takes, fills or returns vectors is always inlined (here and in the loader headers):
// GCC 12 left the per-row work, the Q6_K and Q8_0 loaders and others as calls from the tiles, passing the
// vectors through memory with a vzeroupper per call (performance.md, AVX2 code generation).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "tandem/kernels/cpu_target.h"
#include "tandem/kernels/quant_direct_x86.h"
#include "tandem/kernels/quant_kquants_avx2.h"
#include "tandem/kernels/quant_layout.h"
#include "tandem/kernels/quant_legacy_avx2.h"
#include "tandem/kernels/quant_regs_avx2.h"
#include "tandem/kernels/quant_unpack.h"
#include "tandem/kernels/quant_x86_ops.h"
#include "tandem/kernels/repack.h"
#include "tandem/tensor/blocks.h"
#include "tandem/tensor/dtype.h"
#include "tandem/tensor/fp16.h"

namespace tandem::kernels {

// One AVX2 target's kernels (its QuantKernels table: table()), instantiated for its Isa.
template <Avx2Isa Isa>
struct Avx2Kernels {
  // Whether this target uses AVX-VNNI's vpdpbusd (its Isa).
  static constexpr bool kVnni = Isa::kVnni;

  // acc + the sums of the four u8 x s8 products of each 32-bit lane (vpdpbusd). Plain AVX2 names it only in
  // discarded branches of `if constexpr (kVnni)`, so it is never compiled there.
  [[gnu::always_inline]] static __m256i dot_add(__m256i acc, __m256i u, __m256i s) {
    return _mm256_dpbusd_avx_epi32(acc, u, s);
  }

  // This target's register form and super-block loaders (quant_regs_avx2.h, quant_legacy_avx2.h,
  // quant_kquants_avx2.h), instantiated for its Isa.
  using Regs = Avx2Regs<Isa>;
  using SuperRegs = Regs::SuperRegs;
  using Legacy = Avx2LegacyLoaders<Isa>;
  using KQuants = Avx2KQuantLoaders<Isa>;

  // Eight groups (four pairs of groups 2m, 2m + 1 with m < 4) into the four quarter vectors that hold them,
  // all in registers: p0 / h0 hold the first / second group of pairs 0 (low half) and 2 (high half), p1 / h1
  // those of pairs 1 and 3. Dword unpacks give (group 2m, group 2m + 1) qwords per quarter, qword unpacks
  // then line up pairs 0..3; no lane crossing, as the loads already split the pairs over the two halves.
  // Quarter q goes to out[2 * q].
  [[gnu::always_inline]] static void transpose_groups(__m256i p0, __m256i h0, __m256i p1, __m256i h1,
                                                      __m256i* out) {
    const __m256i a0 = _mm256_unpacklo_epi32(p0, h0), b0 = _mm256_unpackhi_epi32(p0, h0);
    const __m256i a1 = _mm256_unpacklo_epi32(p1, h1), b1 = _mm256_unpackhi_epi32(p1, h1);
    out[0] = _mm256_unpacklo_epi64(a0, a1);
    out[2] = _mm256_unpackhi_epi64(a0, a1);
    out[4] = _mm256_unpacklo_epi64(b0, b1);
    out[6] = _mm256_unpackhi_epi64(b0, b1);
  }

  // The unpacking's helpers on this target (UnpackOps, quant_unpack.h): the x86 ones, and its code orders.
  struct Ops : X86Ops<Ops> {
    static constexpr bool kBlockLanes = true;  // the legacy types in block lanes (quant_layout.h)
    static constexpr bool kK4BlockLanes =
        true;  // Q4_K and Q5_K in block lanes, as the legacy types with an offset

    // Element order to group-interleaved order (quant_layout.h): vector 2q + h (32 bytes) holds quarter q of
    // groups 8h..8h+7. Everything is loaded before anything is stored (in place), and the loads are 16 bytes,
    // so each stays inside one earlier store of the codes and forwards from it.
    static void interleave_groups(uint8_t* codes) {
      __m256i v[8];
      for (int h = 0; h < 2; ++h) {
        const uint8_t* c = codes + 128 * h;  // pairs of groups 4h..4h+3, 32 bytes each
        transpose_groups(Regs::load_pair(c, c + 64), Regs::load_pair(c + 16, c + 80),
                         Regs::load_pair(c + 32, c + 96), Regs::load_pair(c + 48, c + 112), v + h);
      }
      for (int i = 0; i < 8; ++i) _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + 32 * i), v[i]);
    }

    // Element order to block lanes: block order first (vector 2q + h holds quarter q of blocks 4h..4h+3),
    // then block_lanes. Loaded before stored, in 16-byte pieces that each lie inside one earlier store.
    static void interleave_blocks(uint8_t* codes) {
      __m256i v[8];
      for (int h = 0; h < 2; ++h) {
        const uint8_t* c = codes + 128 * h;  // blocks 4h..4h+3, 32 bytes each
        Regs::block_quarters(Regs::load_pair(c, c + 64), Regs::load_pair(c + 32, c + 96), v + h);
        Regs::block_quarters(Regs::load_pair(c + 16, c + 80), Regs::load_pair(c + 48, c + 112), v + 4 + h);
      }
      Regs::block_lanes(v);
      for (int i = 0; i < 8; ++i) _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + 32 * i), v[i]);
    }
  };

  using Unpack = QuantUnpack<Ops>;

  // Activation quantization, vectorized; the same bits as quantize_row_impl (test_kernels compares them).

  [[gnu::always_inline]] static float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
  }

  [[gnu::always_inline]] static int32_t hsum8(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
  }

  // Round half away from zero, as round_away: truncate, then step by one where the exact remainder is at
  // least one half (comparison masks are -1, so subtracting one adds one).
  [[gnu::always_inline]] static __m256i round_away8(__m256 v) {
    const __m256i t = _mm256_cvttps_epi32(v);
    const __m256 frac = _mm256_sub_ps(v, _mm256_cvtepi32_ps(t));
    const __m256i up = _mm256_castps_si256(_mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ));
    const __m256i down = _mm256_castps_si256(_mm256_cmp_ps(frac, _mm256_set1_ps(-0.5f), _CMP_LE_OQ));
    return _mm256_add_epi32(_mm256_sub_epi32(t, up), down);
  }

  // 32 codes (four vectors of 8 int32 in element order, each in [-127, 127]) to s.q at e0, and the code sums
  // of the block's two lane groups: 16 consecutive elements each (group order) or alternate 4-element runs
  // (block order).
  [[gnu::always_inline]] static void store_codes32(ActSuper& s, int e0, const __m256i* c, bool block_order,
                                                   int32_t& sum0, int32_t& sum1) {
    const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(s.q + e0),
                        _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    if (block_order) {
      const __m256i t = _mm256_add_epi32(_mm256_add_epi32(c[0], c[1]), _mm256_add_epi32(c[2], c[3]));
      sum0 = hsum8(_mm256_blend_epi32(t, _mm256_setzero_si256(), 0xF0));
      sum1 = hsum8(_mm256_blend_epi32(t, _mm256_setzero_si256(), 0x0F));
    } else {
      sum0 = hsum8(_mm256_add_epi32(c[0], c[1]));
      sum1 = hsum8(_mm256_add_epi32(c[2], c[3]));
    }
  }

  static void quantize_row(const float* x, int64_t k, ActForm form, ActSuper* out);

  // How a weight type's offsets enter the sums. kFold > 0: the offset is -2^kFold times the scale in every
  // group (Q4_0: -8, Q6_K: -32), so it is folded into the integer sums (minus 2^kFold times the activation
  // code sums, exact) and the offset term vanishes. kNoOffset: signed Q8_0 codes, whose offset is zero. 0: b
  // times the scaled code sums, accumulated apart. The legacy types are in block lanes: Q4_0 (fold 3) and
  // signed Q8_0 (kNoOffset) as above; kLanes4 (Q4_1, and Q4_K: QuantKernels::k4_block_lanes) and kLanes5
  // (Q5_0, Q5_1, Q5_K) with the offset term, their codes below 16 and 32; kLanes8 (Q8_0 stored unsigned,
  // which these kernels never take: vpmaddubsw would saturate) likewise, vector by vector.
  static constexpr int kNoOffset = -1, kLanes4 = -2, kLanes5 = -3, kLanes8 = -4;

  static constexpr int fold_of(DType type, bool signed_codes) {
    if (type == DType::Q8_0) return signed_codes ? kNoOffset : kLanes8;
    switch (type) {
      case DType::Q4_0:
        return 3;
      case DType::Q6_K:
        return 5;
      case DType::Q4_1:
      case DType::Q4_K:
        return kLanes4;
      case DType::Q5_0:
      case DType::Q5_1:
      case DType::Q5_K:
        return kLanes5;
      default:
        return 0;
    }
  }

  static constexpr bool in_block_lanes(int fold) {
    return fold == 3 || fold == kNoOffset || fold == kLanes4 || fold == kLanes5 || fold == kLanes8;
  }

  // The per-row work of a legacy super-block in block lanes (quant_layout.h): lane L of all eight vectors
  // holds one block, so its integer sum is complete after the vectors are added (in 16 bits where codes below
  // 16 allow all eight: 8 * 2 * 15 * 127 = 30480; four at a time below 32), and each row takes one convert,
  // one scale product and one FMA per super-block (two per half in group order). The tiles take vectors 0, 1,
  // 4 and 5 for all their rows, then 2, 3, 6 and 7 (a repacked Q4_0 super-block decodes them from two pairs
  // of its code vectors), so that fewer weight vectors need registers beside each row's accumulator and
  // partial sum; the integer sums do not depend on the split. Faster than group order for the legacy types in
  // decode and in windows (performance.md).
  //
  // lanes_part: the partial sum of vectors v0, v0 + 1, v0 + 4 and v0 + 5 (16-bit for codes below 16 on plain
  // AVX2; with AVX-VNNI always 32-bit, one vpdpbusd per vector).
  template <int kFold>
  [[gnu::always_inline]] static __m256i lanes_part(const __m256i* u, int v0, const ActSuper& X) {
    const __m256i ones = _mm256_set1_epi16(1);
    const auto xq = [&X](int v) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(X.q + 32 * v)); };
    const auto m = [&](int v) { return _mm256_maddubs_epi16(u[v], xq(v)); };
    if constexpr (!kVnni && (kFold == 3 || kFold == kLanes4 || kFold == kLanes5)) {
      const __m256i quad =
          _mm256_add_epi16(_mm256_add_epi16(m(v0), m(v0 + 1)), _mm256_add_epi16(m(v0 + 4), m(v0 + 5)));
      return kFold == kLanes5 ? _mm256_madd_epi16(quad, ones) : quad;
    } else {
      __m256i sum = _mm256_setzero_si256();
      for (int v : {v0, v0 + 1, v0 + 4, v0 + 5}) {
        __m256i x = xq(v), w = u[v];
        if constexpr (kFold == kNoOffset && !kVnni) {
          x = _mm256_sign_epi8(x, w);
          w = _mm256_sign_epi8(w, w);  // |w|, 128 for -128: vpmaddubsw reads it unsigned
        }
        if constexpr (kVnni) {
          sum = dot_add(sum, w, x);
        } else {
          sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), ones));
        }
      }
      return sum;
    }
  }

  // The row's super-block from its two partial sums: the block sums, then the float work.
  template <int kFold>
  [[gnu::always_inline]] static void lanes_finish(__m256i p0, __m256i p1, __m256 a, __m256 b,
                                                  const ActSuper& X, __m256& acc) {
    __m256i sum;
    if constexpr (!kVnni && (kFold == 3 || kFold == kLanes4)) {  // 16-bit partial sums
      sum = _mm256_madd_epi16(_mm256_add_epi16(p0, p1), _mm256_set1_epi16(1));
    } else {
      sum = _mm256_add_epi32(p0, p1);
    }
    if constexpr (kFold == 3)
      sum = _mm256_add_epi32(sum, _mm256_load_si256(reinterpret_cast<const __m256i*>(X.offset_sums[0])));
    if constexpr (kVnni && kFold == kNoOffset)  // Q8_0 biased (accumulate_rows): -128 times the code sums
      sum = _mm256_add_epi32(
          sum, _mm256_load_si256(reinterpret_cast<const __m256i*>(X.offset_sums[fold_index(7)])));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(a, _mm256_load_ps(X.d)), acc);
    if constexpr (kFold == kLanes4 || kFold == kLanes5 || kFold == kLanes8)
      acc = _mm256_fmadd_ps(b, _mm256_load_ps(X.bs), acc);
  }

  // The per-row work of half h of one K-quant super-block (groups 8h..8h+7), shared by the unpacked and the
  // direct kernels so that both compute the same bits, whatever number of rows runs beside it. Vector v holds
  // quarter v / 2 of groups 8 * (v % 2)..+7, one group per 32-bit lane: half h reads u[h], u[2 + h], u[4 + h]
  // and u[6 + h]. The tiles take half 0 for all their rows, then half 1, so that only one half's weight
  // vectors need registers beside the rows' accumulators (all halves at once left 4-row tiles spilling their
  // accumulators to the stack); each accumulator still takes its terms in the order h = 0, 1.
  //
  // The offset term of fold 0 (b times the scaled code sums) goes into the same accumulator, after the
  // integer term: a second accumulator per row (as before) left 4-row tiles of Q4_K and the other fold-0
  // types spilling to the stack.
  template <int kFold>
  [[gnu::always_inline]] static void accumulate_half(const __m256i* u, int h, __m256 a, __m256 b,
                                                     const ActSuper& X, __m256& acc) {
    // The K-quants' group order only: fold 0, or Q6_K's fold 5 (the legacy types are in block lanes).
    static_assert(kFold == 0 || kFold == 5);
    const __m256i ones = _mm256_set1_epi16(1);
    const auto m = [&](int q) {
      return _mm256_maddubs_epi16(
          u[2 * q + h], _mm256_load_si256(reinterpret_cast<const __m256i*>(X.q + 32 * (2 * q + h))));
    };
    // The products are added in 16 bits before widening, as far as the codes allow: a vpmaddubsw sum is at
    // most 2 * 127 * (the largest code), so the 4-bit to 5-bit codes of fold 0 (Q2_K to Q5_K, below 32) take
    // all four quarters (4 * 7874 = 31496), Q6_K's 6-bit codes two at a time (2 * 16002 = 32004). The sums
    // are exact either way, so the bits do not change: 8 and 9 operations per row and half instead of 12,
    // faster than widening each product in matmuls and whole forwards (performance.md).
    __m256i sum;
    if constexpr (kVnni) {
      sum = _mm256_setzero_si256();
      for (int q = 0; q < 4; ++q)
        sum = dot_add(sum, u[2 * q + h],
                      _mm256_load_si256(reinterpret_cast<const __m256i*>(X.q + 32 * (2 * q + h))));
      if constexpr (kFold == 5)
        sum = _mm256_add_epi32(
            sum,
            _mm256_load_si256(reinterpret_cast<const __m256i*>(X.offset_sums[fold_index(kFold)] + 8 * h)));
    } else if constexpr (kFold == 0) {
      sum = _mm256_madd_epi16(_mm256_add_epi16(_mm256_add_epi16(m(0), m(1)), _mm256_add_epi16(m(2), m(3))),
                              ones);
    } else {
      sum = _mm256_add_epi32(_mm256_madd_epi16(_mm256_add_epi16(m(0), m(1)), ones),
                             _mm256_madd_epi16(_mm256_add_epi16(m(2), m(3)), ones));
      sum = _mm256_add_epi32(
          sum, _mm256_load_si256(reinterpret_cast<const __m256i*>(X.offset_sums[fold_index(kFold)] + 8 * h)));
    }
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(a, _mm256_load_ps(X.d + 8 * h)), acc);
    if (kFold == 0) acc = _mm256_fmadd_ps(b, _mm256_load_ps(X.bs + 8 * h), acc);
  }

  // One super-block of NR activation rows against one weight super-block in registers: in block lanes in two
  // passes of four vectors, in group order half by half.
  template <int NR, int kFold>
  [[gnu::always_inline]] static void accumulate_rows(const __m256i* u, const __m256* a, const __m256* b,
                                                     const ActSuper* x, int64_t x_stride, __m256* acc) {
    if constexpr (in_block_lanes(kFold)) {
      // With AVX-VNNI, Q8_0's signed codes are biased to unsigned (w + 128) once for all the rows, and each
      // block's sum starts from -128 times its activation code sums (lanes_finish): one vpdpbusd per row and
      // vector instead of the sign trick's vpsignb and vpdpbusd. The integer sums are the same.
      [[maybe_unused]] __m256i biased[8];
      if constexpr (kVnni && kFold == kNoOffset) {
        for (int v = 0; v < 8; ++v) biased[v] = _mm256_xor_si256(u[v], _mm256_set1_epi8(-128));
        u = biased;
      }
      __m256i part[NR];
#pragma GCC unroll 8
      for (int r = 0; r < NR; ++r) {
        part[r] = lanes_part<kFold>(u, 0, x[r * x_stride]);
        // Opaque to the optimizer: otherwise GCC reassociates each row's sums into one and computes all the
        // products of all rows first, spilling them.
        __asm__("" : "+x"(part[r]));
      }
#pragma GCC unroll 8
      for (int r = 0; r < NR; ++r) {
        const ActSuper& X = x[r * x_stride];
        lanes_finish<kFold>(part[r], lanes_part<kFold>(u, 2, X), a[0], b[0], X, acc[r]);
      }
    } else {
      // Both loops unrolled: as a loop over h, GCC kept the weight vectors on the stack and indexed
      // them.
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h)
#pragma GCC unroll 8
        for (int r = 0; r < NR; ++r) accumulate_half<kFold>(u, h, a[h], b[h], x[r * x_stride], acc[r]);
    }
  }

  [[gnu::always_inline]] static float finish_row(__m256 v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
  }

  // Intel cores (every one with AVX-VNNI but no AVX-512, and plain AVX2 where the CPU is Intel's) take the
  // prefetch of the AVX-512 tiles there: tiles of decode and windows of up to kL1NearRows rows prefetch first
  // into L1 kL1NearBytes ahead (direct_rows_target asks for PrefetchReach's L1 forms), and every tile of
  // whole rows a second time into L2 12 KB ahead (TilePart::again): on an Intel core, with avx2-vnni forced
  // (TANDEM_KERNELS), one row then streams much nearer the probe's rate than with the Zen 2's distance, and
  // short windows gain too (performance.md). Other CPUs keep the Zen 2's single prefetch.
  static bool intel_prefetch() {
    return kVnni || intel_cpu();
  }
  static constexpr int64_t kL1NearBytes = 6144;

  // The fold-0 and block-lane types with an offset term (Q4_K, Q5_K, Q4_1, Q5_0, ...) also hold a half's
  // offsets b beside its scales, and 8 rows spill. Since the K-quant sums stay in 16 bits (accumulate_half),
  // 5 rows in one pass beat 2 + 3 (passes of 4, before; performance.md).
  static constexpr int64_t kDirectRowsOffset = 5;

  // This target's side of the direct kernels (X86DirectTarget, quant_direct_x86.h).
  struct Target {
    // Every tile prefetches into L1, kPrefetchBytes ahead: the distance at which one row streamed from memory
    // fastest on a Zen 2 core; shorter and longer distances were slower, prefetches into L2 no faster, and a
    // Zen 3 core took several distances alike (performance.md).
    static constexpr int64_t kPrefetchBytes = 1024;
    static constexpr bool l2_prefetch(int, int64_t) { return false; }
    static constexpr int64_t kL2PrefetchBytes = kPrefetchBytes;
    // One distance (PrefetchReach::kFar is kNear): no longer one measured on an AVX2 machine.
    static constexpr int64_t far_prefetch_bytes(int, int64_t) { return 0; }
    // The second prefetch of Intel cores (intel_prefetch), into L2.
    static int64_t again_prefetch_bytes(int, int64_t, int64_t) { return intel_prefetch() ? 12288 : 0; }

    // Direct kernels: weight rows straight from their file bytes, each super-block decoded into registers and
    // applied to up to kDirectRows activation rows, with no unpack buffer (decode and small verify windows).
    // 8 measured a little faster than 4 for 8-row windows in cache (Q4_0 and Q8_0), though not every weight
    // vector stays in a register at 8 rows.
    static constexpr int64_t kDirectRows = 8;

    // Column chunks (quant_direct_x86.h) for every window whose activations pass the footprint (decode,
    // memory bound, keeps its one stream per weight row). The passes here have a fixed size
    // (direct_pass_rows) and the L1 cache is often 32 KiB: the FFN down projection's 4- and 5-row passes read
    // 34-42 KB of activations for every weight row, from L2; chunked, they take less time in matmuls and in
    // prefill (performance.md).
    static constexpr int64_t kChunkMinRows = 2;
    // Every window takes column chunks here, whatever its activations' size.
    static constexpr bool chunks_small_window(int64_t, int64_t) { return false; }

    // Q8_0 codes of this target's unpacked form and loaders: signed (vpmaddubsw saturates at 255 unsigned).
    static constexpr bool kSignedQ8 = true;

    // Activation rows per unpacked-kernel tile.
    static constexpr size_t kDotTileRows = 4;

    // Accumulator state per activation row between column chunks: acc.
    static constexpr int64_t kStateFloats = 8;

    using Unpack = QuantUnpack<Ops>;

    // Whole super-blocks through a loader into the unpacked form.
    template <void (*Load)(const uint8_t*, SuperRegs&), int64_t kSuperBytes>
    static void unpack_supers(const uint8_t* row, int64_t n_super, UnpackedSuper* out) {
      for (int64_t i = 0; i < n_super; ++i) {
        SuperRegs s;
        Load(row + i * kSuperBytes, s);
        for (int v = 0; v < 8; ++v) _mm256_store_si256(reinterpret_cast<__m256i*>(out[i].u + 32 * v), s.u[v]);
        for (int h = 0; h < 2; ++h) {
          _mm256_store_ps(out[i].a + 8 * h, s.a[h]);
          _mm256_store_ps(out[i].b + 8 * h, s.b[h]);
        }
      }
    }

    template <int NR, int kFold>
    static void dot_tile(const UnpackedSuper* w, int64_t n_super, const ActSuper* x, int64_t x_stride,
                         float* y, int64_t y_stride);

    // No tiles of two weight rows on this target (quant_direct_x86.h). Not measured here: with 16 vector
    // registers, two weight rows' codes and accumulators would leave few for the activations.
    template <void (*Load)(const uint8_t*, SuperRegs&), int64_t kSuperBytes, int kFold, auto Signed,
              auto TailLoad = nullptr, auto TailSigned = nullptr>
    static int64_t pair_rows(const uint8_t*, int64_t, int64_t, int64_t, const ActSuper*, int64_t, int64_t,
                             float*, int64_t, int = 0) {
      return 0;
    }

    // Signed: nullptr (this target has no signed form; see quant_layout.h).
    // With a TailLoad (tail_loader), the last of the n_super super-blocks is read from part.tail by it.
    template <int NR, void (*Load)(const uint8_t*, SuperRegs&), int64_t kSuperBytes, int kFold, auto Signed,
              auto TailLoad = nullptr, auto /*TailSigned: no signed forms here*/ = nullptr>
    static void direct_tile(const uint8_t* w, int64_t n_super, const ActSuper* x, int64_t x_stride, float* y,
                            int64_t y_stride, const TilePart& part);

    // The register loader of a weight type in its file or repacked form (repack.h), with its super-block size
    // and offset fold, handed to fn (call_with); false for a type this target does not decode in registers.
    // Q8_0 is decoded to signed codes.
    template <typename Fn>
    static bool with_loader(DType type, bool interleaved, Fn&& fn);

    // The loader that tiles of rows whose last super-block is partial (direct_width) read that super-block
    // with, from its copy padded with zero blocks (quant_direct_x86.h): a legacy type's file-form loader
    // itself; nullptr for the others (repacked rows with a partial last super-block take the unpacked path
    // here: direct_max_rows). tail_signed: the same for a signed form (none here).
    template <auto Load>
    static constexpr auto tail_loader() {
      if constexpr (Load == &Legacy::load_q4_0_super || Load == &Legacy::load_q8_0_super ||
                    Load == &Legacy::template load_legacy_super<BlockQ4_1, true, false> ||
                    Load == &Legacy::template load_legacy_super<BlockQ5_0, false, true> ||
                    Load == &Legacy::template load_legacy_super<BlockQ5_1, true, true>) {
        return Load;
      } else {
        return nullptr;
      }
    }

    template <auto Signed>
    static constexpr auto tail_signed() {
      return Signed;
    }
  };

  alignas(64) static constexpr float kZeroState[Target::kDirectRows * Target::kStateFloats] = {};

  using Direct = DirectX86<Target>;

  // The kernel table's unpack_row: whole super-blocks in this target's Q8_0 form through its loaders;
  // anything else takes the generic path.
  static void unpack_row(DType type, WeightForm form, const uint8_t* row, int64_t k, bool signed_q8,
                         UnpackedSuper* out);

  // The file and interleaved forms' direct kernels (DirectX86::direct_rows_t) for the loader of each type.
  static void direct_rows(DType type, WeightForm form, const uint8_t* w, int64_t row_bytes, int64_t n_out,
                          int64_t k, const ActSuper* x, int64_t x_stride, int64_t n_rows, float* y,
                          int64_t y_stride, PrefetchReach reach);

  static int64_t direct_max_rows(DType type, WeightForm form, int64_t k, bool signed_q8);

  // Rows per direct pass, for every type: at most kPassRows. Tiles of more rows no longer keep their
  // accumulators and one half's weight vectors in the 16 registers, and passes over the same block of weight
  // rows (the later ones from the cache) measured faster. 5, not 4: a window of 4 drafts and its last token
  // in one pass instead of 2 + 3. Q6_K takes passes of 5 too since its sums stay in 16 bits two at a time
  // (accumulate_half); the offset types: kDirectRowsOffset. With AVX-VNNI a row's work is fewer operations
  // and registers (one vpdpbusd chain per partial sum), and passes of 8 beat those of 5; passes of 3, 4 or 6
  // were slower or alike. The figures: performance.md, AVX2 window passes.
  static constexpr int64_t kPassRows = kVnni ? 8 : 5;

  static int64_t direct_pass_rows(DType type, WeightForm form, int64_t k, bool signed_q8);

  static void dot_rows(const UnpackedSuper* w, int64_t n_super, const ActSuper* x, int64_t x_stride,
                       int64_t n_rows, DType type, bool signed_codes, float* y, int64_t y_stride);

  // The throughput probe (QuantKernels::dot_probe), with the sequence of the group sums above: two vpmaddubsw
  // added in 16 bits (codes below 64 cannot overflow), one vpmaddwd and one add per chain and step; with
  // AVX-VNNI two vpdpbusd.
  static void dot_probe(const uint8_t* u, const int8_t* s, int64_t iterations, uint32_t* sums);

  // The direct kernels with this CPU's prefetch reach (Intel's: the L1 forms; see intel_prefetch).
  static void direct_rows_target(DType type, WeightForm form, const uint8_t* w, int64_t row_bytes,
                                 int64_t n_out, int64_t k, const ActSuper* x, int64_t x_stride,
                                 int64_t n_rows, float* y, int64_t y_stride, PrefetchReach reach);

  static const QuantKernels& table();
};

// The members that are not inline are defined out of the class, so that the compiler weighs inlining them
// as it would plain functions and function templates.

template <Avx2Isa Isa>
void Avx2Kernels<Isa>::quantize_row(const float* x, int64_t k, ActForm form, ActSuper* out) {
  // (This target never reads natural order: QuantKernels::row_tiles.)
  if (form == ActForm::kNatural) return Unpack::quantize_row_impl(x, k, form, out);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  int64_t j = 0;                                    // 32-element blocks done
  const bool lanes = form == ActForm::kSuperLanes;  // per-256 scales in block lanes
  if (form == ActForm::kSupers || lanes) {
    for (; (j + 8) * 32 <= k; j += 8) {
      ActSuper& s = out[j / 8];
      const float* xs = x + j * 32;
      __m256 m = _mm256_setzero_ps();
      for (int i = 0; i < 32; ++i) m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(xs + 8 * i), abs_mask));
      const float amax = hmax8(m);
      float max = 0.0f;  // the first element of largest magnitude, with its sign
      if (amax != 0.0f) {
        for (int i = 0; i < 32; ++i) {
          const int hit = _mm256_movemask_ps(_mm256_cmp_ps(
              _mm256_and_ps(_mm256_loadu_ps(xs + 8 * i), abs_mask), _mm256_set1_ps(amax), _CMP_EQ_OQ));
          if (hit != 0) {
            max = xs[8 * i + __builtin_ctz(static_cast<unsigned>(hit))];
            break;
          }
        }
      }
      const float iscale = amax != 0.0f ? -127.0f / max : 0.0f;
      const float d = amax != 0.0f ? 1.0f / iscale : 0.0f;
      const __m256 vs = _mm256_set1_ps(iscale);
      for (int b = 0; b < 8; ++b) {
        __m256i c[4];
        for (int i = 0; i < 4; ++i) {
          // round_even: the float adder rounds to nearest even at 2^23 + 2^22.
          const __m256 shifted = _mm256_add_ps(_mm256_mul_ps(vs, _mm256_loadu_ps(xs + 32 * b + 8 * i)),
                                               _mm256_set1_ps(12582912.0f));
          c[i] =
              _mm256_min_epi32(_mm256_sub_epi32(_mm256_castps_si256(shifted), _mm256_set1_epi32(0x4B400000)),
                               _mm256_set1_epi32(127));
        }
        int32_t sum0, sum1;
        store_codes32(s, 32 * b, c, lanes, sum0, sum1);
        if (lanes) {
          Unpack::set_legacy_block(s, 32 * b, d, sum0, sum1);
        } else {
          Unpack::set_block(s, 32 * b, d, sum0, sum1);
        }
      }
      if (lanes) {
        Ops::interleave_blocks(reinterpret_cast<uint8_t*>(s.q));
      } else {
        Ops::interleave_groups(reinterpret_cast<uint8_t*>(s.q));
      }
    }
  }
  const int64_t nb = k / 32;
  for (; j < nb; ++j) {
    ActSuper& s = out[j / 8];
    const int e0 = static_cast<int>(j % 8) * 32;
    __m256 v[4];
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(x + j * 32 + 8 * i);
      m = _mm256_max_ps(m, _mm256_and_ps(v[i], abs_mask));
    }
    const float d = hmax8(m) / 127.0f;
    const __m256 id = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
    __m256i c[4];
    for (int i = 0; i < 4; ++i) c[i] = round_away8(_mm256_mul_ps(v[i], id));
    int32_t sum0, sum1;
    store_codes32(s, e0, c, true, sum0, sum1);
    Unpack::set_legacy_block(s, e0, Ops::half_to_float(f32_to_fp16(d)), sum0, sum1);
    if (j % 8 == 7) Ops::interleave_blocks(reinterpret_cast<uint8_t*>(s.q));
  }
  if (nb % 8 != 0) Unpack::finish_partial_super(out[nb / 8], static_cast<int>(nb % 8) * 32);
  if (form == ActForm::kLanePairs)  // (this target never reads them: QuantKernels::lane_pairs)
    for (int64_t i = 0; i + 1 < super_count(k); i += 2) Unpack::to_lane_pairs(out + i);
  Unpack::bias_codes(out, super_count(k));
}

template <Avx2Isa Isa>
template <int NR, int kFold>
void Avx2Kernels<Isa>::Target::dot_tile(const UnpackedSuper* w, int64_t n_super, const ActSuper* x,
                                        int64_t x_stride, float* y, int64_t y_stride) {
  __m256 acc[NR];
#pragma GCC unroll 8  // (a loop here becomes a memset: direct_tile)
  for (int r = 0; r < NR; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t s = 0; s < n_super; ++s) {
    const UnpackedSuper& W = w[s];
    __m256i u[8];
    for (int v = 0; v < 8; ++v) u[v] = _mm256_load_si256(reinterpret_cast<const __m256i*>(W.u + 32 * v));
    const __m256 a[2] = {_mm256_load_ps(W.a), _mm256_load_ps(W.a + 8)};
    const __m256 b[2] = {_mm256_load_ps(W.b), _mm256_load_ps(W.b + 8)};
    accumulate_rows<NR, kFold>(u, a, b, x + s, x_stride, acc);
  }
  for (int r = 0; r < NR; ++r) y[r * y_stride] = finish_row(acc[r]);
}

template <Avx2Isa Isa>
template <int NR, void (*Load)(const uint8_t*, typename Avx2Regs<Isa>::SuperRegs&), int64_t kSuperBytes,
          int kFold, auto Signed, auto TailLoad, auto /*TailSigned: no signed forms here*/>
void Avx2Kernels<Isa>::Target::direct_tile(const uint8_t* w, int64_t n_super, const ActSuper* x,
                                           int64_t x_stride, float* y, int64_t y_stride,
                                           const TilePart& part) {
  // The accumulators start from the state, or from a zero state on a row's first part: one form of start.
  // As a ?: of zero and a load, GCC made the arrays of tiles of 3 or more rows a memset on the stack, a
  // rep stos per weight row, a large share of a window's time in cache (performance.md).
  const float* init = part.first ? kZeroState : part.state;
  __m256 acc[NR];
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r) acc[r] = _mm256_load_ps(init + kStateFloats * r);
  for (int64_t s = 0; s < n_super; ++s) {
    const uint8_t* row_s = w + s * kSuperBytes;
    Ops::template prefetch_ahead<kSuperBytes>(row_s, part.near_l1 ? kL1NearBytes : part.prefetch);
    if (part.again > 0) Ops::template prefetch_ahead<kSuperBytes, _MM_HINT_T1>(row_s, part.again);
    constexpr bool kTail = !std::is_null_pointer_v<decltype(TailLoad)>;
    const uint8_t* ws = kTail && s == n_super - 1 ? part.tail : row_s;
    SuperRegs wr;
    if constexpr (kTail && TailLoad != Load) {
      if (ws == part.tail) {
        TailLoad(ws, wr);
      } else {
        Load(ws, wr);
      }
    } else {
      Load(ws, wr);
    }
    accumulate_rows<NR, kFold>(wr.u, wr.a, wr.b, x + s, x_stride, acc);
  }
  if (part.last) {
    for (int r = 0; r < NR; ++r) y[r * y_stride] = finish_row(acc[r]);
  } else {
    for (int r = 0; r < NR; ++r) _mm256_store_ps(part.state + kStateFloats * r, acc[r]);
  }
}

template <Avx2Isa Isa>
template <typename Fn>
bool Avx2Kernels<Isa>::Target::with_loader(DType type, bool interleaved, Fn&& fn) {
  switch (type) {
    case DType::Q4_0:
      return interleaved ? call_with<Legacy::load_q4_0x_super, kQ4_0Super, fold_of(DType::Q4_0, false)>(fn)
                         : call_with<Legacy::load_q4_0_super, kQ4_0Super, fold_of(DType::Q4_0, false)>(fn);
    case DType::Q8_0:
      return interleaved ? call_with<Legacy::load_q8_0x_super, kQ8_0Super, kNoOffset>(fn)
                         : call_with<Legacy::load_q8_0_super, kQ8_0Super, kNoOffset>(fn);
    case DType::Q4_1:
      return !interleaved && call_with<Legacy::template load_legacy_super<BlockQ4_1, true, false>,
                                       8 * sizeof(BlockQ4_1), fold_of(DType::Q4_1, false)>(fn);
    case DType::Q5_0:
      return !interleaved && call_with<Legacy::template load_legacy_super<BlockQ5_0, false, true>,
                                       8 * sizeof(BlockQ5_0), fold_of(DType::Q5_0, false)>(fn);
    case DType::Q5_1:
      return !interleaved && call_with<Legacy::template load_legacy_super<BlockQ5_1, true, true>,
                                       8 * sizeof(BlockQ5_1), fold_of(DType::Q5_1, false)>(fn);
    case DType::Q2_K:
      return interleaved
                 ? call_with<KQuants::load_q2_kx_super, sizeof(BlockQ2_K), fold_of(DType::Q2_K, false)>(fn)
                 : call_with<KQuants::load_q2_k_super, sizeof(BlockQ2_K), fold_of(DType::Q2_K, false)>(fn);
    case DType::Q3_K:
      return interleaved
                 ? call_with<KQuants::load_q3_kx_super, sizeof(BlockQ3_K), fold_of(DType::Q3_K, false)>(fn)
                 : call_with<KQuants::load_q3_k_super, sizeof(BlockQ3_K), fold_of(DType::Q3_K, false)>(fn);
    case DType::Q4_K:
      return interleaved
                 ? call_with<KQuants::load_q4_kx_lanes, sizeof(BlockQ4_K), fold_of(DType::Q4_K, false)>(fn)
                 : call_with<KQuants::load_q4_k_lanes, sizeof(BlockQ4_K), fold_of(DType::Q4_K, false)>(fn);
    case DType::Q5_K:
      return interleaved
                 ? call_with<KQuants::load_q5_kx_lanes, sizeof(BlockQ5_K), fold_of(DType::Q5_K, false)>(fn)
                 : call_with<KQuants::load_q5_k_lanes, sizeof(BlockQ5_K), fold_of(DType::Q5_K, false)>(fn);
    case DType::Q6_K:
      return interleaved
                 ? call_with<KQuants::load_q6_kx_super, sizeof(BlockQ6_K), fold_of(DType::Q6_K, false)>(fn)
                 : call_with<KQuants::load_q6_k_super, sizeof(BlockQ6_K), fold_of(DType::Q6_K, false)>(fn);
    default:
      return false;
  }
}

template <Avx2Isa Isa>
void Avx2Kernels<Isa>::unpack_row(DType type, WeightForm form, const uint8_t* row, int64_t k, bool signed_q8,
                                  UnpackedSuper* out) {
  const auto unpack = [&]<auto Load, int64_t kSuperBytes, int, auto>() {
    Target::template unpack_supers<Load, kSuperBytes>(row, k / kSuper, out);
  };
  const bool q8_form_ok = type != DType::Q8_0 || signed_q8 == Target::kSignedQ8;
  if (form != WeightForm::kLanePairs && k % kSuper == 0 && q8_form_ok &&
      Target::with_loader(type, form == WeightForm::kInterleaved, unpack))
    return;
  Unpack::unpack_row_impl(type, form, row, k, signed_q8, out);
}

template <Avx2Isa Isa>
void Avx2Kernels<Isa>::direct_rows(DType type, WeightForm form, const uint8_t* w, int64_t row_bytes,
                                   int64_t n_out, int64_t k, const ActSuper* x, int64_t x_stride,
                                   int64_t n_rows, float* y, int64_t y_stride, PrefetchReach reach) {
  Target::with_loader(
      type, form == WeightForm::kInterleaved, [&]<auto Load, int64_t kSuperBytes, int kFold, auto Signed>() {
        Direct::template direct_rows_t<Load, kSuperBytes, kFold, Signed>(w, row_bytes, n_out, k, x, x_stride,
                                                                         n_rows, y, y_stride, reach);
      });
}

template <Avx2Isa Isa>
int64_t Avx2Kernels<Isa>::direct_max_rows(DType type, WeightForm form, int64_t k, bool signed_q8) {
  if (form == WeightForm::kLanePairs) return 0;  // read through the file form (unpack_row)
  const bool interleaved = form == WeightForm::kInterleaved;
  // Repacked Q4_1, Q5_0 and Q5_1, and repacked rows with a partial last super-block (repacked where the
  // AVX-512 kernels run), have no loader here: they take the unpacked path.
  const bool no_form = type == DType::Q4_1 || type == DType::Q5_0 || type == DType::Q5_1 || k % kSuper != 0;
  if (!Direct::direct_width(type, k) || (interleaved && no_form)) return 0;
  if (type == DType::Q4_0 || (type == DType::Q8_0 && signed_q8)) return Target::kDirectRows;
  if (type == DType::Q6_K) return Target::kDirectRows;
  // With AVX-VNNI the K-quants' rows take one vpdpbusd chain per half (Q4_K and Q5_K, in block lanes, one
  // per partial sum), and windows of their matrices go in passes of 8, faster for Q4_K_M from 6 to 16 rows
  // (performance.md). The legacy block-lane types keep 5: their rows hold a partial sum beside the
  // accumulator (not measured at 8).
  if (type == DType::Q2_K || type == DType::Q3_K || type == DType::Q4_K || type == DType::Q5_K)
    return kVnni ? Target::kDirectRows : kDirectRowsOffset;
  if (type == DType::Q4_1 || type == DType::Q5_0 || type == DType::Q5_1) return kDirectRowsOffset;
  return 0;
}

template <Avx2Isa Isa>
int64_t Avx2Kernels<Isa>::direct_pass_rows(DType type, WeightForm form, int64_t k, bool signed_q8) {
  return std::min(kPassRows, direct_max_rows(type, form, k, signed_q8));
}

template <Avx2Isa Isa>
void Avx2Kernels<Isa>::dot_rows(const UnpackedSuper* w, int64_t n_super, const ActSuper* x, int64_t x_stride,
                                int64_t n_rows, DType type, bool signed_codes, float* y, int64_t y_stride) {
  switch (fold_of(type, signed_codes)) {
    case kNoOffset:
      return Direct::template dot_rows_t<kNoOffset>(w, n_super, x, x_stride, n_rows, y, y_stride);
    case fold_of(DType::Q4_0, false):
      return Direct::template dot_rows_t<fold_of(DType::Q4_0, false)>(w, n_super, x, x_stride, n_rows, y,
                                                                      y_stride);
    case fold_of(DType::Q6_K, false):
      return Direct::template dot_rows_t<fold_of(DType::Q6_K, false)>(w, n_super, x, x_stride, n_rows, y,
                                                                      y_stride);
    case kLanes4:
      return Direct::template dot_rows_t<kLanes4>(w, n_super, x, x_stride, n_rows, y, y_stride);
    case kLanes5:
      return Direct::template dot_rows_t<kLanes5>(w, n_super, x, x_stride, n_rows, y, y_stride);
    case kLanes8:
      return Direct::template dot_rows_t<kLanes8>(w, n_super, x, x_stride, n_rows, y, y_stride);
    default:
      return Direct::template dot_rows_t<0>(w, n_super, x, x_stride, n_rows, y, y_stride);
  }
}

template <Avx2Isa Isa>
void Avx2Kernels<Isa>::dot_probe(const uint8_t* u, const int8_t* s, int64_t iterations, uint32_t* sums) {
  __m256i u0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(u));
  __m256i u1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(u + 32));
  [[maybe_unused]] const __m256i ones = _mm256_set1_epi16(1);  // plain AVX2 only
  __m256i acc[kDotProbeChains];
  for (__m256i& a : acc) a = _mm256_setzero_si256();
  for (int64_t i = 0; i < iterations; ++i) {
    // Opaque to the optimizer: with the same operands every step, GCC computed the products once, before
    // the loop, and the probe timed the adds alone (it read far above this target's peak).
    __asm__("" : "+x"(u0), "+x"(u1));
    for (int c = 0; c < kDotProbeChains; ++c) {
      const auto* sc = reinterpret_cast<const __m256i*>(s + 64 * c);
      if constexpr (kVnni) {
        acc[c] = dot_add(dot_add(acc[c], u0, _mm256_loadu_si256(sc)), u1, _mm256_loadu_si256(sc + 1));
      } else {
        const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(u0, _mm256_loadu_si256(sc)),
                                           _mm256_maddubs_epi16(u1, _mm256_loadu_si256(sc + 1)));
        acc[c] = _mm256_add_epi32(acc[c], _mm256_madd_epi16(p, ones));
      }
    }
  }
  for (int c = 0; c < kDotProbeChains; ++c) {
    alignas(32) uint32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc[c]);
    uint32_t t = 0;
    for (uint32_t v : lanes) t += v;
    sums[c] = t;
  }
}

template <Avx2Isa Isa>
void Avx2Kernels<Isa>::direct_rows_target(DType type, WeightForm form, const uint8_t* w, int64_t row_bytes,
                                          int64_t n_out, int64_t k, const ActSuper* x, int64_t x_stride,
                                          int64_t n_rows, float* y, int64_t y_stride, PrefetchReach reach) {
  direct_rows(type, form, w, row_bytes, n_out, k, x, x_stride, n_rows, y, y_stride,
              intel_prefetch() ? with_near_l1(reach) : reach);
}

template <Avx2Isa Isa>
const QuantKernels& Avx2Kernels<Isa>::table() {
  static const QuantKernels k = [] {
    QuantKernels q{true,
                   true,
                   unpack_row,
                   quantize_row,
                   dot_rows,
                   direct_max_rows,
                   direct_pass_rows,
                   direct_rows_target,
                   dot_probe};
    q.k4_block_lanes = Ops::kK4BlockLanes;
    return q;
  }();
  return k;
}

}  // namespace tandem::kernels
