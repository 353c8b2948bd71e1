// Quantized dot products on AVX-512 with VNNI: vpdpbusd multiplies the unsigned weight codes by the signed
// activation codes, 64 elements per instruction. Up to 8 activation rows share each loaded weight vector, and
// in windows of a few rows two weight rows share each loaded activation vector (pair_tile).
//
// Static members of a template over the variant's Isa (Avx512Isa, quant_regs_avx512.h: whether the variant
// may use VBMI byte permutes), which each AVX-512 variant (quant_avx512.cpp, quant_avx512_vbmi.cpp)
// instantiates with an Isa of its own inside its `#pragma GCC target` region, after <immintrin.h>: each
// variant's copy is compiled for its instruction set, under names of its own that the linker never folds
// together. Its includer includes <algorithm>, <array>, <cmath>, <cstring>, <type_traits> and <utility>
// before that region, so that the standard library is compiled for the baseline.
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
#include "tandem/kernels/quant_act_avx512.h"
#include "tandem/kernels/quant_direct_x86.h"
#include "tandem/kernels/quant_kquants_avx512.h"
#include "tandem/kernels/quant_lane_pairs_avx512.h"
#include "tandem/kernels/quant_layout.h"
#include "tandem/kernels/quant_legacy_avx512.h"
#include "tandem/kernels/quant_prefetch_avx512.h"
#include "tandem/kernels/quant_regs_avx512.h"
#include "tandem/kernels/quant_signed_avx512.h"
#include "tandem/kernels/quant_unpack.h"
#include "tandem/kernels/quant_x86_ops.h"
#include "tandem/kernels/repack.h"
#include "tandem/tensor/blocks.h"
#include "tandem/tensor/dtype.h"

namespace tandem::kernels {

// One AVX-512 variant's kernels (its QuantKernels table: table()), instantiated for its Isa.
template <Avx512Isa Isa>
struct Avx512Kernels {
  // Whether this variant uses VBMI byte permutes (its Isa). The VBMI decoders are defined in both
  // variants; the other names them only in discarded branches of `if constexpr (kVbmi)`.
  static constexpr bool kVbmi = Isa::kVbmi;

  // This variant's register form and super-block loaders (quant_regs_avx512.h, quant_kquants_avx512.h,
  // quant_legacy_avx512.h), instantiated for its Isa.
  using Regs = Avx512Regs<Isa>;
  using SuperRegs = Regs::SuperRegs;
  using KQuants = Avx512KQuantLoaders<Isa>;
  using Legacy = Avx512LegacyLoaders<Isa>;

  // The unpacking's helpers on this target (UnpackOps, quant_unpack.h): the x86 ones, and its code orders.
  struct Ops : X86Ops<Ops> {
    static constexpr bool kBlockLanes = false;    // the legacy types in block order (quant_layout.h)
    static constexpr bool kK4BlockLanes = false;  // Q4_K and Q5_K in group order

    // Element order to group-interleaved order (quant_layout.h): a transpose of 4-byte units, 16 groups by 4
    // quarters. Each 64-byte vector (groups 4j..4j+3) is reordered quarter-major, then the 128-bit pieces are
    // transposed.
    static void interleave_groups(uint8_t* codes) {
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

    // Element order to block order (quant_layout.h).
    static void interleave_blocks(uint8_t* codes) {
      __m512i z[4], out[4];
      for (int m = 0; m < 4; ++m) z[m] = _mm512_loadu_si512(codes + 64 * m);
      Regs::block_quarters(z, out);
      for (int q = 0; q < 4; ++q) _mm512_storeu_si512(codes + 64 * q, out[q]);
    }
  };

  using Unpack = QuantUnpack<Ops>;

  // The fold of a weight type (accumulate_super), or 0.
  static constexpr int fold_of(DType type) { return Regs::fold_of(type); }

  // The signed form (quant_signed_avx512.h) of this variant.
  using SignedForm = Avx512SignedForm<Isa>;
  using SignedRegs = SignedForm::SignedRegs;

  // This target's side of the direct kernels (X86DirectTarget, quant_direct_x86.h), its members defined in
  // one place. The prefetch distances and hints are Avx512Prefetch's (quant_prefetch_avx512.h).
  struct Target : Avx512Prefetch<Isa> {
    using Avx512Prefetch<Isa>::l2_prefetch;

    // Q8_0 codes of this target's unpacked form and loaders: unsigned (offset folded).
    static constexpr bool kSignedQ8 = false;

    // Direct kernels: weight rows straight from their file bytes, each super-block decoded into registers and
    // applied to up to kDirectRows activation rows, with no unpack buffer (decode and small verify windows).
    static constexpr int64_t kDirectRows = 8;

    // Windows of fewer rows stay unchunked (quant_direct_x86.h) unless their activations alone overflow the
    // L1 cache (chunks_small_window): with passes sized to a 48 KiB L1 (direct_pass_rows) the weights' memory
    // stream mattered more than the activations' cache traffic (measured no better at 4 to 6 rows).
    static constexpr int64_t kChunkMinRows = 8;

    // Activation rows per unpacked-kernel tile (quant_direct_x86.h).
    static constexpr size_t kDotTileRows = 8;

    // Accumulator state per activation row between column chunks (quant_direct_x86.h).
    static constexpr int64_t kStateFloats = 16;

    using Unpack = QuantUnpack<Ops>;

    template <void (*Load)(const uint8_t*, SuperRegs&), int64_t kSuperBytes>
    static void unpack_supers(const uint8_t* row, int64_t n_super, UnpackedSuper* out) {
      for (int64_t i = 0; i < n_super; ++i) {
        SuperRegs s;
        Load(row + i * kSuperBytes, s);
        for (int q = 0; q < 4; ++q) _mm512_store_si512(out[i].u + 64 * q, s.u[q]);
        _mm512_store_ps(out[i].a, s.a);
        _mm512_store_ps(out[i].b, s.b);
      }
    }

    // Signed: the loader of the type's signed form (load_signed), or nullptr; taken from signed_min_rows rows
    // on. Both forms give the same integer group sums and then the same float operations. With a TailLoad and
    // TailSigned (tail_loader, tail_signed), the last of the n_super super-blocks is read from part.tail by
    // them.
    template <int NR, void (*Load)(const uint8_t*, SuperRegs&), int64_t kSuperBytes, int kFold, auto Signed,
              auto TailLoad = nullptr, auto TailSigned = nullptr>
    static void direct_tile(const uint8_t* w, int64_t n_super, const ActSuper* x, int64_t x_stride, float* y,
                            int64_t y_stride, const TilePart& part);

    // The output rows that pair tiles cover for this window, pair_width at a time from the first
    // (quant_direct_x86.h runs the rest one at a time): all but the last n_out % pair_width from
    // pair_min_rows (kUnsignedPairMinRows) rows on, else none. Rows with a partial last super-block of
    // tail_blocks blocks pass their tail loaders (pair_tile).
    template <void (*Load)(const uint8_t*, SuperRegs&), int64_t kSuperBytes, int kFold, auto Signed,
              auto TailLoad = nullptr, auto TailSigned = nullptr>
    static int64_t pair_rows(const uint8_t* w, int64_t row_bytes, int64_t n_out, int64_t n_super,
                             const ActSuper* x, int64_t x_stride, int64_t n_rows, float* y, int64_t y_stride,
                             int tail_blocks = 0);

    // The register loader of a weight type in its file or repacked form (repack.h), with its super-block
    // size, offset fold and signed form, handed to fn (call_with); false for a type this target does not
    // decode in registers. Q8_0 is decoded to unsigned codes (signed in its signed form). The repacked forms
    // load their codes in pieces for the unsigned form (one row, and Q4_0's 2-row windows) and whole for the
    // signed form (windows from signed_min_rows or pair_min_rows on, and prefill tiles; load_codes64).
    template <typename Fn>
    static bool with_loader(DType type, bool interleaved, Fn&& fn);

    // Each row keeps the same accumulator and the same operation sequence whatever NR is (and whichever
    // kernel, unpacked, direct or pair, runs it), so its result does not depend on the rows beside it.
    template <int NR, int kFold>
    static void dot_tile(const UnpackedSuper* w, int64_t n_super, const ActSuper* x, int64_t x_stride,
                         float* y, int64_t y_stride);

    // Whether a window of fewer than kChunkMinRows rows takes column chunks (quant_direct_x86.h): where its
    // activations (kPairActBytes per row and super-block, as the signed form reads them) do not fit in the L1
    // cache by themselves, every weight row read them from L2; chunked, such windows took less time, and
    // windows that fit about the same or more (performance.md, pair tiles).
    static bool chunks_small_window(int64_t n_rows, int64_t n_super) {
      return n_rows * n_super * kPairActBytes > l1_data_cache_bytes();
    }

    // The loader that tiles of rows whose last super-block is partial (direct_width) read that super-block
    // with (quant_direct_x86.h): a legacy type's file-form loader itself, from a copy padded with zero
    // blocks; for a repacked form, its tail loader, which reads the partial form of repack.h in place and
    // gives the registers of the padded super-block; nullptr for the loaders of whole super-blocks only.
    // tail_signed: the same for the signed forms.
    template <auto Load>
    static constexpr auto tail_loader() {
      if constexpr (Load == &Legacy::template load_q4_0x_super<true>) {
        return &Legacy::load_q4_0x_tail;
      } else if constexpr (Load == &Legacy::load_q5_0x_super) {
        return &Legacy::load_q5_0x_tail;
      } else if constexpr (Load == &Legacy::load_q4_1x_super) {
        return &Legacy::load_q4_1x_tail;
      } else if constexpr (Load == &Legacy::load_q5_1x_super) {
        return &Legacy::load_q5_1x_tail;
      } else if constexpr (Load == &Legacy::template load_q8_0x_super<true, true>) {
        return &Legacy::template load_q8_0x_tail<true>;
      } else if constexpr (Load == &Legacy::load_q4_0_super ||
                           Load == &Legacy::template load_legacy_super<BlockQ4_1, true, false> ||
                           Load == &Legacy::template load_legacy_super<BlockQ5_0, false, true> ||
                           Load == &Legacy::template load_legacy_super<BlockQ5_1, true, true> ||
                           Load == &Legacy::template load_q8_0_super<true>) {
        return Load;
      } else {
        return nullptr;
      }
    }

    template <auto Signed>
    static constexpr auto tail_signed() {
      if constexpr (Signed ==
                    &SignedForm::template load_signed<Legacy::template load_q4_0x_super<false>, 8>) {
        return &SignedForm::template load_signed_tail<Legacy::load_q4_0x_tail, 8>;
      } else if constexpr (Signed ==
                           &SignedForm::template load_signed<Legacy::template load_q8_0x_super<false, false>,
                                                             0>) {
        return &SignedForm::template load_signed_tail<Legacy::template load_q8_0x_tail<false>, 0>;
      } else {
        return Signed;
      }
    }
  };

  struct ActRegs {
    __m512i q[4];  // codes, quarter by quarter
    __m512i init;  // start of the integer sums: minus 2^kFold times the group code sums (kFold > 0)
    __m512 d;      // group scales
  };

  template <int kFold>
  static void load_act(const ActSuper& X, ActRegs& r) {
    for (int q = 0; q < 4; ++q) r.q[q] = _mm512_load_si512(X.q + 64 * q);
    r.init = kFold > 0 ? _mm512_load_si512(X.offset_sums[fold_index(kFold > 0 ? kFold : 3)])
                       : _mm512_setzero_si512();
    r.d = _mm512_load_ps(X.d);
  }

  // The per-row work of one super-block, shared by the unpacked, direct and pair kernels so that all compute
  // the same bits: four vpdpbusd add the quarters' products lane by lane into the 16 group sums, then one
  // convert and one scaling per group. kFold > 0: the weight offset is -2^kFold times the scale in every
  // group (Q4_0: -8, Q6_K: -32, Q8_0 stored unsigned: -128), so it is folded into the integer sums (minus
  // 2^kFold times the activation code sums) and the offset term vanishes; otherwise b times the scaled code
  // sums is added to the same accumulator next. (A second accumulator for that term held two registers per
  // row, which kept unsigned pair tiles out of the 32; with one, 8-row Q4_K windows took less time in cache,
  // one row about the same; performance.md.)
  template <int kFold>
  static void accumulate_super(const __m512i* u, __m512 a, __m512 b, const ActRegs& x, const ActSuper& X,
                               __m512& acc) {
    __m512i sum = _mm512_dpbusd_epi32(x.init, u[0], x.q[0]);
    sum = _mm512_dpbusd_epi32(sum, u[1], x.q[1]);
    sum = _mm512_dpbusd_epi32(sum, u[2], x.q[2]);
    sum = _mm512_dpbusd_epi32(sum, u[3], x.q[3]);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(a, x.d), acc);
    if (kFold == 0) acc = _mm512_fmadd_ps(b, _mm512_load_ps(X.bs), acc);
  }

  // A row's result from its accumulator: plus zero (as the pair tiles' reduce_add8 takes it, so that a zero
  // sum has one sign in every tile), then its 16 lanes in _mm512_reduce_add_ps's order.
  static float row_result(__m512 acc) {
    return _mm512_reduce_add_ps(_mm512_add_ps(acc, _mm512_setzero_ps()));
  }

  // The loader a direct tile of NR rows takes for Load: with VBMI, one and two rows of Q4_1, Q5_0 and Q5_1
  // decode through byte permutes (load_legacy_super_vbmi; the same registers), where the decoding binds:
  // faster at one and two rows, about even at three, mixed from four rows on (performance.md, VBMI).
  template <auto Load, int NR>
  static constexpr auto tile_loader() {
    if constexpr (kVbmi && NR <= 2 && Load == &Legacy::template load_legacy_super<BlockQ4_1, true, false>) {
      return &Legacy::template load_legacy_super_vbmi<BlockQ4_1, true, false>;
    } else if constexpr (kVbmi && NR <= 2 &&
                         Load == &Legacy::template load_legacy_super<BlockQ5_0, false, true>) {
      return &Legacy::template load_legacy_super_vbmi<BlockQ5_0, false, true>;
    } else if constexpr (kVbmi && NR <= 2 &&
                         Load == &Legacy::template load_legacy_super<BlockQ5_1, true, true>) {
      return &Legacy::template load_legacy_super_vbmi<BlockQ5_1, true, true>;
    } else {
      return Load;
    }
  }

  alignas(64) static constexpr float kZeroState[Target::kDirectRows * Target::kStateFloats] = {};

  // A row's partial last super-block into registers (or their signed form, Regs = SignedRegs), through its
  // tail loader: in place with its block count (a repacked row), or from the padded copy in the file's form.
  template <auto TailLoad, int NR, typename Regs>
  static void load_tail(const uint8_t* p, int blocks, Regs& r) {
    if constexpr (reads_tail_in_place<TailLoad, Regs>()) {
      TailLoad(p, blocks, r);
    } else if constexpr (std::is_same_v<Regs, SuperRegs>) {
      tile_loader<TailLoad, NR>()(p, r);
    } else {
      TailLoad(p, r);
    }
  }

  // A one-weight-row tile's prefetch of the kBytes at p, as `part` says: part.prefetch bytes ahead with the
  // tile's hint, or into L2 where the far reach asks it (TilePart::to_l2; tiles that prefetch into L2 anyway,
  // decode, keep one path), or into L1 kL1NearBytes ahead where an L1 form of the reach asks that
  // (TilePart::near_l1); and again into L2 part.again bytes ahead where that is set.
  template <int64_t kBytes, int kFold, int NR>
  [[gnu::always_inline]] static void prefetch_row_ahead(const uint8_t* p, const TilePart& part) {
    if (part.near_l1) {
      Ops::template prefetch_ahead<kBytes, _MM_HINT_T0>(p, Target::kL1NearBytes);
    } else if (Target::prefetch_hint(kFold, NR) == _MM_HINT_T1 || !part.to_l2) {
      Ops::template prefetch_ahead<kBytes, Target::prefetch_hint(kFold, NR)>(p, part.prefetch);
    } else {
      Ops::template prefetch_ahead<kBytes, _MM_HINT_T1>(p, part.prefetch);
    }
    if (part.again > 0) Ops::template prefetch_ahead<kBytes, _MM_HINT_T1>(p, part.again);
  }

  // The sums of the 16 lanes of each of v[0..7] into out[0..7], each added in _mm512_reduce_add_ps's order
  // (lane i + lane i + 8, then i + i + 4, then 0 + 2 and 1 + 3, then those two), so every sum has that
  // intrinsic's bits, in about 24 operations for all eight instead of about 9 each.
  static void reduce_add8(const __m512* v, float* out) {
    __m512 l1[4];  // per pair (a, b): [a0 + a2, a1 + a3, b0 + b2, b1 + b3] in 128-bit chunks
    for (int k = 0; k < 4; ++k)
      l1[k] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)),
                            _mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)));
    __m512 l2[2];  // chunks: the 4-lane halves' sums of v[4m], v[4m + 1], v[4m + 2], v[4m + 3]
    for (int m = 0; m < 2; ++m)
      l2[m] = _mm512_add_ps(_mm512_shuffle_f32x4(l1[2 * m], l1[2 * m + 1], _MM_SHUFFLE(3, 1, 3, 1)),
                            _mm512_shuffle_f32x4(l1[2 * m], l1[2 * m + 1], _MM_SHUFFLE(2, 0, 2, 0)));
    // Chunk c: [lanes 0 + 2, 1 + 3 of v[c]; the same of v[c + 4]].
    const __m512 l3 = _mm512_add_ps(_mm512_shuffle_ps(l2[0], l2[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                    _mm512_shuffle_ps(l2[0], l2[1], _MM_SHUFFLE(3, 2, 3, 2)));
    // Chunk c: [v[c], v[c + 4], v[c], v[c + 4]].
    const __m512 l4 = _mm512_add_ps(_mm512_shuffle_ps(l3, l3, _MM_SHUFFLE(2, 0, 2, 0)),
                                    _mm512_shuffle_ps(l3, l3, _MM_SHUFFLE(3, 1, 3, 1)));
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, l4);
    for (int c = 0; c < 4; ++c) out[c] = lanes[4 * c], out[c + 4] = lanes[4 * c + 1];
  }

  // The results of a tile of kW weight rows by NR activation rows, y[r * y_stride + i] from acc[i][r]: as
  // row_result, 8 outputs at a time in _mm512_reduce_add_ps's order (reduce_add8).
  template <int kW, int NR>
  static void store_results(const __m512 (&acc)[kW][NR], float* y, int64_t y_stride) {
    constexpr int kOut = (kW * NR + 7) / 8 * 8;
    __m512 v[kOut];
    for (int r = 0; r < NR; ++r)
      for (int i = 0; i < kW; ++i) v[kW * r + i] = _mm512_add_ps(acc[i][r], _mm512_setzero_ps());
    for (int i = kW * NR; i < kOut; ++i) v[i] = _mm512_setzero_ps();
    float sums[kOut];
    for (int g = 0; g < kOut; g += 8) reduce_add8(v + g, sums + g);
    for (int r = 0; r < NR; ++r)
      for (int i = 0; i < kW; ++i) y[r * y_stride + i] = sums[kW * r + i];
  }

  // Window rows from which the direct kernels take the weight rows two at a time (pair_tile), by offset fold;
  // 0: never. Two weight rows share every activation load, which is what binds a window row in cache (five
  // 64-byte loads against four vpdpbusd, a multiply and an FMA), but they double the register state, so
  // tiles stop at kDirectRows. Against one row at a time over a token's matrices, Q4_0 pairs gain from 3 rows
  // and Q6_K from 4, and lose below; Q8_0 (repacked, 272-byte super-blocks) loses from memory (though it
  // gains in cache), so it takes pairs only where the window's activations fill more than 3/4 of the L1
  // (pairs_only_past_l1), which one weight row at a time then reads from L2 for every row; where they fit,
  // pairs took longer (performance.md, pair tiles).
  static constexpr int pair_min_rows(int fold) {
    return fold == fold_of(DType::Q4_0)   ? 3
           : fold == fold_of(DType::Q6_K) ? 4
           : fold == fold_of(DType::Q8_0) ? 2
                                          : 0;
  }
  // Whether a fold's pair tiles wait for a window whose activations fill more than 3/4 of the L1 (pair_rows).
  static constexpr bool pairs_only_past_l1(int fold) { return fold == fold_of(DType::Q8_0); }
  // Window rows from which the types without a fixed offset (fold 0: Q4_1, Q5_0, Q5_1, Q2_K-Q5_K) take pair
  // tiles in their unsigned form, and then only past the L1 as Q8_0 (the FFN down projection): there two
  // weight rows a tile take less time than one at a time, in cache and from memory; where the activations
  // fit, they gain nothing (performance.md, pair tiles). (pair_rows' L1 test counts the signed form's 320
  // activation bytes per row and super-block for these too, though the unsigned form reads 384: the
  // thresholds above were measured so.)
  static constexpr int kUnsignedPairMinRows = 4;

  // The signed loader of pair tiles of NR rows (PairTileLoader<Signed>::get<NR>()): with VBMI, Q4_0 windows
  // of 3 to 6 rows decode with byte permutes (load_q4_0_super_vbmi; the same bits), faster there and slower
  // at 7 and 8 (performance.md, VBMI). Q4_0 is repacked where it can be (repack_pays), so this serves the
  // matrices left in the file form.
  template <auto Signed>
  struct PairTileLoader {
    template <int NR>
    static constexpr auto get() {
      if constexpr (Signed != &SignedForm::template load_signed<&Legacy::load_q4_0_super, 8>) {
        return Signed;
      } else if constexpr (kVbmi && NR >= 3 && NR <= 6) {
        return &SignedForm::template load_signed<&Legacy::load_q4_0_super_vbmi, 8>;
      } else {
        return &SignedForm::template load_signed<&Legacy::load_q4_0_super, 8>;
      }
    }
  };

  // Bytes of one activation row's super-block that pair tiles read: the biased codes and the scales (320).
  static constexpr int64_t kPairActBytes = sizeof(ActSuper::qb) + sizeof(ActSuper::d);

  // Weight rows of a fold that pair tiles take together (pair_tile): two, or three for Q8_0 and the types
  // without a fixed offset (fold 0), whose windows take pair tiles only past the L1 cache and then read each
  // activation row's codes and scales from L2 for every group of weight rows; three a group took less time
  // than two for them from memory (four: the same as three), but not for Q4_0, which keeps pairs
  // (performance.md, pair tiles).
  static constexpr int pair_width(int fold) { return fold == fold_of(DType::Q8_0) || fold == 0 ? 3 : 2; }

  // The registers (SuperRegs or SignedRegs) of kW weight rows' super-blocks at ws, row_bytes apart, through
  // Load; at a partial last super-block of tail_blocks blocks (at_tail), through TailLoad (load_tail).
  template <auto Load, auto TailLoad, int NR, int kW, typename Regs>
  static void load_rows(const uint8_t* ws, int64_t row_bytes, bool at_tail, int tail_blocks, Regs* wr) {
    for (int i = 0; i < kW; ++i) {
      if constexpr (!std::is_null_pointer_v<decltype(TailLoad)>) {
        if (at_tail) {
          load_tail<TailLoad, NR>(ws + i * row_bytes, tail_blocks, wr[i]);
          continue;
        }
      }
      Load(ws + i * row_bytes, wr[i]);
    }
  }

  // Two (pair_width) adjacent weight rows (row_bytes apart) against NR activation rows, in the signed form
  // (the types with a fixed offset) or the unsigned one (Signed nullptr: the types whose offsets are their
  // own, fold 0): per activation row and super-block, the codes and scales are loaded once for all its weight
  // rows. Each output keeps the operations and order of direct_tile (the same integer sums, then the same
  // convert, multiply and FMAs into its own accumulator), so results are bit-identical to one row at a time.
  // The rows' streams are prefetched as one: each step fetches the next group's bytes in address order, a
  // group ahead (interleaved per-row prefetches left this slower than one row at a time at 3 rows), into L2
  // where to_l2 (the caller's choice, pair_rows): where the window's activations (320 bytes per row and
  // super-block) fill more than 3/4 of the L1 data cache, so that it does not evict the activations before
  // they are reused (on top of the tiles that always prefetch into L2, l2_prefetch): with a 32 KiB L1 (Zen 4)
  // the FFN down projection's 4-row windows (28 KB) took about twice the time per row and super-block of
  // shorter rows, and less so prefetched into L2 (performance.md, pair tiles). With TailLoad and TailSigned
  // (tail_loader, tail_signed: loaders that read a repacked row's partial last super-block in place), the
  // last of the n_super super-blocks holds tail_blocks blocks, as in direct_tile.
  template <int NR, void (*Load)(const uint8_t*, SuperRegs&), int64_t kSuperBytes, int kFold, auto Signed,
            auto TailLoad = nullptr, auto TailSigned = nullptr>
  static void pair_tile(const uint8_t* w, int64_t row_bytes, int64_t n_super, const ActSuper* x,
                        int64_t x_stride, float* y, int64_t y_stride, bool to_l2, int tail_blocks);

  using PairTile = void (*)(const uint8_t*, int64_t, int64_t, const ActSuper*, int64_t, float*, int64_t, bool,
                            int);

  template <void (*Load)(const uint8_t*, SuperRegs&), int64_t kSuperBytes, int kFold, auto Signed,
            auto TailLoad, auto TailSigned, size_t... I>
  static constexpr std::array<PairTile, sizeof...(I)> pair_tiles(std::index_sequence<I...>) {
    return {&pair_tile<static_cast<int>(I) + 1, Load, kSuperBytes, kFold, Signed, TailLoad, TailSigned>...};
  }

  // Activation quantization (quant_act_avx512.h) with this variant's unpacking helpers.
  using ActQuant = Avx512ActQuant<Ops>;

  using Direct = DirectX86<Target>;

  // The kernel table's unpack_row: whole super-blocks in this target's Q8_0 form through its loaders;
  // anything else takes the generic path.
  static void unpack_row(DType type, WeightForm form, const uint8_t* row, int64_t k, bool signed_q8,
                         UnpackedSuper* out);

  // The file and interleaved forms' direct kernels (DirectX86::direct_rows_t) for the loader of each type.
  static void direct_rows(DType type, WeightForm form, const uint8_t* w, int64_t row_bytes, int64_t n_out,
                          int64_t k, const ActSuper* x, int64_t x_stride, int64_t n_rows, float* y,
                          int64_t y_stride, PrefetchReach reach);

  // Lane pairs (quant_lane_pairs_avx512.h) of this variant: its tiles of one and two weight rows and the rows
  // driver, on this variant's Target and Direct.
  using LanePairs = Avx512LanePairs<Isa>;

  // kW (1 or 2) adjacent weight rows of kType, row_bytes apart, against NR activation rows over n_pairs
  // pairs: Q4_0 one weight row in the signed form from signed_min_rows on (as direct_tile), two always (they
  // start at LanePairs::kLanePairMinRows); Q4_K (no fixed offset) and Q8_0 (stored unsigned) unsigned. One
  // weight row prefetches as direct_tile (part.prefetch bytes ahead); two prefetch a later group's two rows'
  // bytes in address order, a pair ahead, into L2 where part.to_l2 (as pair_tile). Column chunks (part,
  // accumulators in part.state) for one weight row only.
  template <DType kType, int NR, int kW>
  [[gnu::always_inline]] static void lane_pair_group(const uint8_t* w, int64_t row_bytes, int64_t n_pairs,
                                                     const ActSuper* x, int64_t x_stride, float* y,
                                                     int64_t y_stride, const TilePart& part) {
    constexpr int kFold = fold_of(kType);
    constexpr bool kSigned = kType == DType::Q4_0 && (kW == 2 || NR >= SignedForm::signed_min_rows(kFold));
    using Regs =
        std::conditional_t<kType == DType::Q4_K, typename LanePairs::LanePairK4Regs,
                           std::conditional_t<kType == DType::Q8_0, typename LanePairs::LanePairQ8Regs,
                                              std::conditional_t<kSigned, typename LanePairs::LanePairSigned,
                                                                 typename LanePairs::LanePairRegs>>>;
    constexpr int64_t kBytes = LanePairs::template kPairBytes<kType>;
    const float* init = part.first ? kZeroState : part.state;
    __m512 acc[kW][NR];
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r)
#pragma GCC unroll 2
      for (int i = 0; i < kW; ++i) acc[i][r] = _mm512_load_ps(init + Target::kStateFloats * (NR * i + r));
    // Two weight rows prefetch the group kGroupsAhead groups on: Q8_0 (twice Q4_0's bytes for the same work)
    // two groups on, which took less time in windows than one group on; Q4_0 and Q4_K_M alike either way.
    constexpr int kGroupsAhead = kType == DType::Q8_0 ? 2 : 1;
    const uint8_t* next_group = w + kGroupsAhead * kW * row_bytes;
    for (int64_t p = 0; p < n_pairs; ++p) {
      const uint8_t* wp = w + p * kBytes;
      if constexpr (kW == 1) {
        prefetch_row_ahead<kBytes, kFold, NR>(wp, part);
      } else {
        for (int64_t b = 0; b < kW * kBytes; b += 64) {
          const char* q = reinterpret_cast<const char*>(next_group + kW * p * kBytes + b);
          if (part.to_l2) {
            _mm_prefetch(q, _MM_HINT_T1);
          } else {
            _mm_prefetch(q, _MM_HINT_T0);
          }
        }
      }
      Regs wr[kW];
      for (int i = 0; i < kW; ++i) {
        if constexpr (kSigned) {
          LanePairs::load_lane_pair_signed(wp + i * row_bytes, wr[i]);
        } else {
          LanePairs::template load_lane_pair<LanePairs::lane_pair_pieces(kType, NR)>(wp + i * row_bytes,
                                                                                     wr[i]);
        }
      }
      for (int r = 0; r < NR; ++r) {
        __m512* out[kW];
        for (int i = 0; i < kW; ++i) out[i] = &acc[i][r];
        LanePairs::template lane_pair_row<kW>(wr, x + r * x_stride + 2 * p, out);
      }
    }
    if (!part.last) {
      for (int r = 0; r < NR; ++r)
        for (int i = 0; i < kW; ++i)
          _mm512_store_ps(part.state + Target::kStateFloats * (NR * i + r), acc[i][r]);
    } else if constexpr (kW == 1) {
      for (int r = 0; r < NR; ++r) y[r * y_stride] = row_result(acc[0][r]);
    } else {
      store_results<kW, NR>(acc, y, y_stride);
    }
  }

  // n_w weight rows (a multiple of kW) in groups of kW, each with its own outputs y[o]: one call for a
  // thread's whole share of a matrix, so that the end of one row's work overlaps the start of the next.
  template <DType kType, int NR, int kW>
  static void lane_pair_tile(const uint8_t* w, int64_t row_bytes, int64_t n_w, int64_t n_pairs,
                             const ActSuper* x, int64_t x_stride, float* y, int64_t y_stride,
                             const TilePart& part);

  using LanePairTile = void (*)(const uint8_t*, int64_t, int64_t, int64_t, const ActSuper*, int64_t, float*,
                                int64_t, const TilePart&);

  // lane_pair_tile for NR = kFirst.. (index NR - kFirst).
  template <DType kType, int kW, int kFirst, size_t... I>
  static constexpr std::array<LanePairTile, sizeof...(I)> lane_pair_tiles(std::index_sequence<I...>) {
    return {&lane_pair_tile<kType, static_cast<int>(I) + kFirst, kW>...};
  }

  // direct_rows_t for lane pairs of kType: weight rows two at a time where lane_pair_two_rows says (all but
  // an odd last one), the rest one at a time, in column chunks of whole pairs where direct_rows_t would
  // chunk.
  template <DType kType>
  static void lane_pair_rows(const uint8_t* w, int64_t row_bytes, int64_t n_out, int64_t k, const ActSuper* x,
                             int64_t x_stride, int64_t n_rows, float* y, int64_t y_stride,
                             PrefetchReach reach);

  // The kernel table's direct_rows: lane pairs here, the other forms through direct_rows.
  static void direct_rows_any(DType type, WeightForm form, const uint8_t* w, int64_t row_bytes, int64_t n_out,
                              int64_t k, const ActSuper* x, int64_t x_stride, int64_t n_rows, float* y,
                              int64_t y_stride, PrefetchReach reach);

  static int64_t direct_max_rows(DType type, WeightForm form, int64_t k, bool signed_q8);

  // Pair tiles read each activation row's biased codes and scales (5 cache lines) for every pair of weight
  // rows, so a pass of n rows keeps n * 320 bytes per super-block in the L1 cache beside the pair's weights;
  // past 15/16 of the cache they come from L2 for every pair, and the time per row and super-block jumps (on
  // a 48 KiB L1 this keeps up to 8 rows at k = 4096, 5 at 5632 and 3 at 8192; TinyLlama's windows then took
  // less time). Tiles of one weight row chunk long rows instead (quant_direct_x86.h). Where 512-bit
  // operations run as two halves (splits_512bit_ops: Zen 4, 32 KiB L1) a row and super-block takes 6 cycles
  // of the two multiplying pipes, enough for the L2 cache to supply its five activation lines, so windows go
  // in one pass: passes sized to the L1 took longer there. Figures: performance.md, AVX-512 window passes.
  static int64_t direct_pass_rows(DType type, WeightForm form, int64_t k, bool signed_q8);

  static void dot_rows(const UnpackedSuper* w, int64_t n_super, const ActSuper* x, int64_t x_stride,
                       int64_t n_rows, DType type, bool /*signed_codes: never set on this target*/, float* y,
                       int64_t y_stride);

  // The throughput probe (QuantKernels::dot_probe): one vpdpbusd per chain and step, its signed operand read
  // from memory as the tiles read activation codes.
  static void dot_probe(const uint8_t* u, const int8_t* s, int64_t iterations, uint32_t* sums);

  // The kernel table's direct_rows. On Intel cores the tiles of decode and windows of up to kL1NearRows rows
  // take their first prefetch into L1 (PrefetchReach's L1 forms; measured first under the AMX target, which
  // delegates its other forms to these kernels: quant_prefetch_avx512.h), which took less time at one row and
  // a little less at two and three with avx512-vnni-vbmi forced on the Xeon with AMX (performance.md). Other
  // CPUs (the Zen 4 these kernels were measured on) keep the reach as it comes.
  static void direct_rows_target(DType type, WeightForm form, const uint8_t* w, int64_t row_bytes,
                                 int64_t n_out, int64_t k, const ActSuper* x, int64_t x_stride,
                                 int64_t n_rows, float* y, int64_t y_stride, PrefetchReach reach);

  // This variant's kernel table.
  static const QuantKernels& table();
};

// The members that are not inline are defined out of the class, so that the compiler weighs inlining them
// as it would plain functions and function templates.

template <Avx512Isa Isa>
template <int NR, int kFold>
void Avx512Kernels<Isa>::Target::dot_tile(const UnpackedSuper* w, int64_t n_super, const ActSuper* x,
                                          int64_t x_stride, float* y, int64_t y_stride) {
  __m512 acc[NR];
#pragma GCC unroll 8  // (a loop here becomes a memset: quant_avx2_kernels.h's direct_tile)
  for (int r = 0; r < NR; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t s = 0; s < n_super; ++s) {
    const UnpackedSuper& W = w[s];
    const __m512i u[4] = {_mm512_load_si512(W.u), _mm512_load_si512(W.u + 64), _mm512_load_si512(W.u + 128),
                          _mm512_load_si512(W.u + 192)};
    const __m512 a = _mm512_load_ps(W.a), b = _mm512_load_ps(W.b);
    for (int r = 0; r < NR; ++r) {
      const ActSuper& X = x[r * x_stride + s];
      ActRegs xr;
      load_act<kFold>(X, xr);
      accumulate_super<kFold>(u, a, b, xr, X, acc[r]);
    }
  }
  for (int r = 0; r < NR; ++r) y[r * y_stride] = row_result(acc[r]);
}

template <Avx512Isa Isa>
template <int NR, void (*Load)(const uint8_t*, typename Avx512Regs<Isa>::SuperRegs&), int64_t kSuperBytes,
          int kFold, auto Signed, auto TailLoad, auto TailSigned>
void Avx512Kernels<Isa>::Target::direct_tile(const uint8_t* w, int64_t n_super, const ActSuper* x,
                                             int64_t x_stride, float* y, int64_t y_stride,
                                             const TilePart& part) {
  // From a zero state on the first part: one form of start (as in quant_avx2_kernels.h; a ?: of zero and a
  // load became a memset of the arrays on the stack, a rep stos per tile).
  const float* init = part.first ? kZeroState : part.state;
  __m512 acc[NR];
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r) acc[r] = _mm512_load_ps(init + kStateFloats * r);
  for (int64_t s = 0; s < n_super; ++s) {
    const uint8_t* row_s = w + s * kSuperBytes;
    prefetch_row_ahead<kSuperBytes, kFold, NR>(row_s, part);
    constexpr bool kTail = !std::is_null_pointer_v<decltype(TailLoad)>;
    constexpr bool kInPlace = reads_tail_in_place<TailLoad, SuperRegs>();
    const bool at_tail = kTail && s == n_super - 1;
    const uint8_t* ws = at_tail && !kInPlace ? part.tail : row_s;
    if constexpr (!std::is_null_pointer_v<decltype(Signed)> && NR >= SignedForm::signed_min_rows(kFold)) {
      SignedRegs wr;
      if constexpr (kTail && !same_loader<TailSigned, Signed>()) {
        if (at_tail) {
          load_tail<TailSigned, NR>(ws, part.tail_blocks, wr);
        } else {
          Signed(ws, wr);
        }
      } else {
        Signed(ws, wr);
      }
      for (int r = 0; r < NR; ++r) {
        const ActSuper& X = x[r * x_stride + s];
        __m512i qb[4];
        SignedForm::load_biased_codes(X, qb);
        __m512* const out[1] = {&acc[r]};
        SignedForm::template accumulate_signed<1>(&wr, qb, _mm512_load_ps(X.d), out);
      }
    } else {
      SuperRegs wr;
      if constexpr (kTail && !same_loader<TailLoad, Load>()) {
        if (at_tail) {
          load_tail<TailLoad, NR>(ws, part.tail_blocks, wr);
        } else {
          tile_loader<Load, NR>()(ws, wr);
        }
      } else {
        tile_loader<Load, NR>()(ws, wr);
      }
      for (int r = 0; r < NR; ++r) {
        const ActSuper& X = x[r * x_stride + s];
        ActRegs xr;
        load_act<kFold>(X, xr);
        accumulate_super<kFold>(wr.u, wr.a, wr.b, xr, X, acc[r]);
      }
    }
  }
  if (part.last) {
    for (int r = 0; r < NR; ++r) y[r * y_stride] = row_result(acc[r]);
  } else {
    for (int r = 0; r < NR; ++r) _mm512_store_ps(part.state + kStateFloats * r, acc[r]);
  }
}

template <Avx512Isa Isa>
template <void (*Load)(const uint8_t*, typename Avx512Regs<Isa>::SuperRegs&), int64_t kSuperBytes, int kFold,
          auto Signed, auto TailLoad, auto TailSigned>
int64_t Avx512Kernels<Isa>::Target::pair_rows(const uint8_t* w, int64_t row_bytes, int64_t n_out,
                                              int64_t n_super, const ActSuper* x, int64_t x_stride,
                                              int64_t n_rows, float* y, int64_t y_stride, int tail_blocks) {
  constexpr bool kUnsigned = std::is_null_pointer_v<decltype(Signed)>;
  constexpr int kMinRows = kUnsigned ? (kFold == 0 ? kUnsignedPairMinRows : 0) : pair_min_rows(kFold);
  if constexpr (kMinRows == 0) {
    return 0;
  } else {
    if (n_rows < kMinRows) return 0;
    static constexpr auto tiles = pair_tiles<Load, kSuperBytes, kFold, Signed, TailLoad, TailSigned>(
        std::make_index_sequence<kDirectRows>());
    const PairTile tile = tiles[static_cast<size_t>(n_rows - 1)];
    const bool past_l1 = 4 * n_rows * n_super * kPairActBytes > 3 * l1_data_cache_bytes();
    if ((kUnsigned || pairs_only_past_l1(kFold)) && !past_l1) return 0;
    const bool to_l2 = l2_prefetch(kFold, n_rows) || past_l1;
    constexpr int kW = pair_width(kFold);
    const int64_t grouped = n_out - n_out % kW;
    for (int64_t o = 0; o < grouped; o += kW)
      tile(w + o * row_bytes, row_bytes, n_super, x, x_stride, y + o, y_stride, to_l2, tail_blocks);
    return grouped;
  }
}

template <Avx512Isa Isa>
template <typename Fn>
bool Avx512Kernels<Isa>::Target::with_loader(DType type, bool interleaved, Fn&& fn) {
  switch (type) {
    case DType::Q4_0:
      return interleaved
                 ? call_with<Legacy::template load_q4_0x_super<true>, kQ4_0Super, fold_of(DType::Q4_0),
                             SignedForm::template load_signed<Legacy::template load_q4_0x_super<false>, 8>>(
                       fn)
                 : call_with<Legacy::load_q4_0_super, kQ4_0Super, fold_of(DType::Q4_0),
                             SignedForm::template load_signed<Legacy::load_q4_0_super, 8>>(fn);
    case DType::Q4_1:
      return interleaved
                 ? call_with<Legacy::load_q4_1x_super, 8 * sizeof(BlockQ4_1), fold_of(DType::Q4_1)>(fn)
                 : call_with<Legacy::template load_legacy_super<BlockQ4_1, true, false>,
                             8 * sizeof(BlockQ4_1), fold_of(DType::Q4_1)>(fn);
    case DType::Q5_0:
      return interleaved
                 ? call_with<Legacy::load_q5_0x_super, 8 * sizeof(BlockQ5_0), fold_of(DType::Q5_0)>(fn)
                 : call_with<Legacy::template load_legacy_super<BlockQ5_0, false, true>,
                             8 * sizeof(BlockQ5_0), fold_of(DType::Q5_0)>(fn);
    case DType::Q5_1:
      return interleaved
                 ? call_with<Legacy::load_q5_1x_super, 8 * sizeof(BlockQ5_1), fold_of(DType::Q5_1)>(fn)
                 : call_with<Legacy::template load_legacy_super<BlockQ5_1, true, true>, 8 * sizeof(BlockQ5_1),
                             fold_of(DType::Q5_1)>(fn);
    case DType::Q8_0:
      return interleaved
                 ? call_with<
                       Legacy::template load_q8_0x_super<true, true>, kQ8_0Super, fold_of(DType::Q8_0),
                       SignedForm::template load_signed<Legacy::template load_q8_0x_super<false, false>, 0>>(
                       fn)
                 : call_with<Legacy::template load_q8_0_super<true>, kQ8_0Super, fold_of(DType::Q8_0),
                             SignedForm::template load_signed<Legacy::template load_q8_0_super<false>, 0>>(
                       fn);
    case DType::Q2_K:
      return interleaved ? call_with<KQuants::load_q2_kx_super, sizeof(BlockQ2_K), fold_of(DType::Q2_K)>(fn)
                         : call_with<KQuants::load_q2_k_super, sizeof(BlockQ2_K), fold_of(DType::Q2_K)>(fn);
    case DType::Q3_K:
      return interleaved ? call_with<KQuants::load_q3_kx_super, sizeof(BlockQ3_K), fold_of(DType::Q3_K)>(fn)
                         : call_with<KQuants::load_q3_k_super, sizeof(BlockQ3_K), fold_of(DType::Q3_K)>(fn);
    case DType::Q4_K:
      return interleaved ? call_with<KQuants::load_q4_kx_super, sizeof(BlockQ4_K), fold_of(DType::Q4_K)>(fn)
                         : call_with<KQuants::load_q4_k_super, sizeof(BlockQ4_K), fold_of(DType::Q4_K)>(fn);
    case DType::Q5_K:
      return interleaved ? call_with<KQuants::load_q5_kx_super, sizeof(BlockQ5_K), fold_of(DType::Q5_K)>(fn)
                         : call_with<KQuants::load_q5_k_super, sizeof(BlockQ5_K), fold_of(DType::Q5_K)>(fn);
    case DType::Q6_K:
      return interleaved ? call_with<KQuants::load_q6_kx_super, sizeof(BlockQ6_K), fold_of(DType::Q6_K),
                                     SignedForm::template load_signed<KQuants::load_q6_kx_super, 32>>(fn)
                         : call_with<KQuants::load_q6_k_super, sizeof(BlockQ6_K), fold_of(DType::Q6_K),
                                     SignedForm::template load_signed<KQuants::load_q6_k_super, 32>>(fn);
    default:
      return false;
  }
}

template <Avx512Isa Isa>
template <int NR, void (*Load)(const uint8_t*, typename Avx512Regs<Isa>::SuperRegs&), int64_t kSuperBytes,
          int kFold, auto Signed, auto TailLoad, auto TailSigned>
void Avx512Kernels<Isa>::pair_tile(const uint8_t* w, int64_t row_bytes, int64_t n_super, const ActSuper* x,
                                   int64_t x_stride, float* y, int64_t y_stride, bool to_l2,
                                   int tail_blocks) {
  constexpr int kW = pair_width(kFold);
  constexpr bool kTail = !std::is_null_pointer_v<decltype(TailLoad)>;
  __m512 acc[kW][NR];
#pragma GCC unroll 8  // (a loop here becomes a memset: quant_avx2_kernels.h's direct_tile)
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
    for (int i = 0; i < kW; ++i) acc[i][r] = _mm512_setzero_ps();
  const uint8_t* next_group = w + kW * row_bytes;
  for (int64_t s = 0; s < n_super; ++s) {
    const uint8_t* ws0 = w + s * kSuperBytes;
    for (int64_t b = 0; b < kW * kSuperBytes; b += 64) {
      const char* p = reinterpret_cast<const char*>(next_group + kW * s * kSuperBytes + b);
      if (to_l2) {
        _mm_prefetch(p, _MM_HINT_T1);
      } else {
        _mm_prefetch(p, _MM_HINT_T0);
      }
    }
    const bool at_tail = kTail && s == n_super - 1;
    if constexpr (std::is_null_pointer_v<decltype(Signed)>) {
      SuperRegs wr[kW];
      load_rows<Load, TailLoad, NR, kW>(ws0, row_bytes, at_tail, tail_blocks, wr);
      for (int r = 0; r < NR; ++r) {
        const ActSuper& X = x[r * x_stride + s];
        ActRegs xr;
        load_act<kFold>(X, xr);
        for (int i = 0; i < kW; ++i) accumulate_super<kFold>(wr[i].u, wr[i].a, wr[i].b, xr, X, acc[i][r]);
      }
    } else {
      constexpr auto kLoad = PairTileLoader<Signed>::template get<NR>();
      SignedRegs wr[kW];
      load_rows<kLoad, TailSigned, NR, kW>(ws0, row_bytes, at_tail, tail_blocks, wr);
      for (int r = 0; r < NR; ++r) {
        const ActSuper& X = x[r * x_stride + s];
        __m512i qb[4];
        SignedForm::load_biased_codes(X, qb);
        __m512* out[kW];
        for (int i = 0; i < kW; ++i) out[i] = &acc[i][r];
        SignedForm::template accumulate_signed<kW>(wr, qb, _mm512_load_ps(X.d), out);
      }
    }
  }
  store_results<kW, NR>(acc, y, y_stride);
}

template <Avx512Isa Isa>
void Avx512Kernels<Isa>::unpack_row(DType type, WeightForm form, const uint8_t* row, int64_t k,
                                    bool signed_q8, UnpackedSuper* out) {
  const auto unpack = [&]<auto Load, int64_t kSuperBytes, int, auto>() {
    Target::template unpack_supers<Load, kSuperBytes>(row, k / kSuper, out);
  };
  const bool q8_form_ok = type != DType::Q8_0 || signed_q8 == Target::kSignedQ8;
  if (form != WeightForm::kLanePairs && k % kSuper == 0 && q8_form_ok &&
      Target::with_loader(type, form == WeightForm::kInterleaved, unpack))
    return;
  Unpack::unpack_row_impl(type, form, row, k, signed_q8, out);
}

template <Avx512Isa Isa>
void Avx512Kernels<Isa>::direct_rows(DType type, WeightForm form, const uint8_t* w, int64_t row_bytes,
                                     int64_t n_out, int64_t k, const ActSuper* x, int64_t x_stride,
                                     int64_t n_rows, float* y, int64_t y_stride, PrefetchReach reach) {
  Target::with_loader(
      type, form == WeightForm::kInterleaved, [&]<auto Load, int64_t kSuperBytes, int kFold, auto Signed>() {
        Direct::template direct_rows_t<Load, kSuperBytes, kFold, Signed>(w, row_bytes, n_out, k, x, x_stride,
                                                                         n_rows, y, y_stride, reach);
      });
}

template <Avx512Isa Isa>
template <DType kType, int NR, int kW>
void Avx512Kernels<Isa>::lane_pair_tile(const uint8_t* w, int64_t row_bytes, int64_t n_w, int64_t n_pairs,
                                        const ActSuper* x, int64_t x_stride, float* y, int64_t y_stride,
                                        const TilePart& part) {
  for (int64_t o = 0; o < n_w; o += kW)
    lane_pair_group<kType, NR, kW>(w + o * row_bytes, row_bytes, n_pairs, x, x_stride, y + o, y_stride, part);
}

template <Avx512Isa Isa>
template <DType kType>
void Avx512Kernels<Isa>::lane_pair_rows(const uint8_t* w, int64_t row_bytes, int64_t n_out, int64_t k,
                                        const ActSuper* x, int64_t x_stride, int64_t n_rows, float* y,
                                        int64_t y_stride, PrefetchReach reach) {
  constexpr int kFold = fold_of(kType);
  const int64_t n_pairs = k / (2 * kSuper), n_super = 2 * n_pairs;
  int64_t o = 0;
  if (LanePairs::lane_pair_two_rows(kType, n_rows)) {
    static constexpr auto pairs = lane_pair_tiles<kType, 2, LanePairs::kLanePairMinRows>(
        std::make_index_sequence<Target::kDirectRows - LanePairs::kLanePairMinRows + 1>());
    const bool past_l1 = 4 * n_rows * n_super * kPairActBytes > 3 * l1_data_cache_bytes();
    const TilePart part{nullptr, true, true, 0, nullptr, 0, Target::l2_prefetch(kFold, n_rows) || past_l1};
    o = n_out - n_out % 2;
    pairs[static_cast<size_t>(n_rows - LanePairs::kLanePairMinRows)](w, row_bytes, o, n_pairs, x, x_stride, y,
                                                                     y_stride, part);
  }
  if (o == n_out) return;
  static constexpr auto tiles = lane_pair_tiles<kType, 1, 1>(std::make_index_sequence<Target::kDirectRows>());
  const LanePairTile tile = tiles[static_cast<size_t>(n_rows - 1)];
  if (Direct::takes_whole_rows(n_rows, n_super)) {
    tile(w + o * row_bytes, row_bytes, n_out - o, n_pairs, x, x_stride, y + o, y_stride,
         Direct::whole_row_part(kFold, n_rows, reach));
    return;
  }
  constexpr int64_t kChunkPairs = Direct::kChunkSupers / 2;
  alignas(64) float state[Direct::kChunkRows * Target::kDirectRows * Target::kStateFloats];
  for (int64_t o0 = o; o0 < n_out; o0 += Direct::kChunkRows) {
    const int64_t n_o = std::min(Direct::kChunkRows, n_out - o0);
    for (int64_t c0 = 0; c0 < n_pairs; c0 += kChunkPairs) {
      const int64_t n_c = std::min(kChunkPairs, n_pairs - c0);
      for (int64_t i = 0; i < n_o; ++i) {
        const TilePart part{state + i * Target::kDirectRows * Target::kStateFloats, c0 == 0,
                            c0 + n_c == n_pairs, row_bytes};
        tile(w + (o0 + i) * row_bytes + c0 * LanePairs::template kPairBytes<kType>, row_bytes, 1, n_c,
             x + 2 * c0, x_stride, y + o0 + i, y_stride, part);
      }
    }
  }
}

template <Avx512Isa Isa>
void Avx512Kernels<Isa>::direct_rows_any(DType type, WeightForm form, const uint8_t* w, int64_t row_bytes,
                                         int64_t n_out, int64_t k, const ActSuper* x, int64_t x_stride,
                                         int64_t n_rows, float* y, int64_t y_stride, PrefetchReach reach) {
  if (form == WeightForm::kLanePairs) {
    switch (type) {
      case DType::Q4_K:
        return lane_pair_rows<DType::Q4_K>(w, row_bytes, n_out, k, x, x_stride, n_rows, y, y_stride, reach);
      case DType::Q8_0:
        return lane_pair_rows<DType::Q8_0>(w, row_bytes, n_out, k, x, x_stride, n_rows, y, y_stride, reach);
      default:
        return lane_pair_rows<DType::Q4_0>(w, row_bytes, n_out, k, x, x_stride, n_rows, y, y_stride, reach);
    }
  }
  direct_rows(type, form, w, row_bytes, n_out, k, x, x_stride, n_rows, y, y_stride, reach);
}

template <Avx512Isa Isa>
int64_t Avx512Kernels<Isa>::direct_max_rows(DType type, WeightForm form, int64_t k, bool signed_q8) {
  if (form == WeightForm::kLanePairs) return can_lane_pair(type, k) ? Target::kDirectRows : 0;
  if (!Direct::direct_width(type, k)) return 0;
  switch (type) {
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
      return Target::kDirectRows;
    case DType::Q8_0:
      return signed_q8 ? 0 : Target::kDirectRows;
    default:
      return 0;
  }
}

template <Avx512Isa Isa>
int64_t Avx512Kernels<Isa>::direct_pass_rows(DType type, WeightForm form, int64_t k, bool signed_q8) {
  const int64_t max_rows = direct_max_rows(type, form, k, signed_q8);
  const int min_rows = pair_min_rows(fold_of(type));  // 0 for types without pair tiles
  if (max_rows == 0 || min_rows == 0 || splits_512bit_ops()) return max_rows;
  const int64_t ns = super_count(k), budget = l1_data_cache_bytes() / 16 * 15;
  const int64_t weights = 2 * static_cast<int64_t>(interleave_super_bytes(type)) * ns;  // both forms' size
  return std::clamp<int64_t>((budget - weights) / (kPairActBytes * ns), min_rows, max_rows);
}

template <Avx512Isa Isa>
void Avx512Kernels<Isa>::dot_rows(const UnpackedSuper* w, int64_t n_super, const ActSuper* x,
                                  int64_t x_stride, int64_t n_rows, DType type,
                                  bool /*signed_codes: never set on this target*/, float* y,
                                  int64_t y_stride) {
  switch (fold_of(type)) {
    case fold_of(DType::Q4_0):
      return Direct::template dot_rows_t<fold_of(DType::Q4_0)>(w, n_super, x, x_stride, n_rows, y, y_stride);
    case fold_of(DType::Q6_K):
      return Direct::template dot_rows_t<fold_of(DType::Q6_K)>(w, n_super, x, x_stride, n_rows, y, y_stride);
    case fold_of(DType::Q8_0):
      return Direct::template dot_rows_t<fold_of(DType::Q8_0)>(w, n_super, x, x_stride, n_rows, y, y_stride);
    default:
      return Direct::template dot_rows_t<0>(w, n_super, x, x_stride, n_rows, y, y_stride);
  }
}

template <Avx512Isa Isa>
void Avx512Kernels<Isa>::dot_probe(const uint8_t* u, const int8_t* s, int64_t iterations, uint32_t* sums) {
  const __m512i uv = _mm512_loadu_si512(u);
  __m512i acc[kDotProbeChains];
  for (__m512i& a : acc) a = _mm512_setzero_si512();
  for (int64_t i = 0; i < iterations; ++i)
    for (int c = 0; c < kDotProbeChains; ++c)
      acc[c] = _mm512_dpbusd_epi32(acc[c], uv, _mm512_loadu_si512(s + 64 * c));
  for (int c = 0; c < kDotProbeChains;
       ++c) {  // lanes added as unsigned (they wrap; the intrinsic adds signed)
    alignas(64) uint32_t lanes[16];
    _mm512_store_si512(lanes, acc[c]);
    uint32_t t = 0;
    for (uint32_t v : lanes) t += v;
    sums[c] = t;
  }
}

template <Avx512Isa Isa>
void Avx512Kernels<Isa>::direct_rows_target(DType type, WeightForm form, const uint8_t* w, int64_t row_bytes,
                                            int64_t n_out, int64_t k, const ActSuper* x, int64_t x_stride,
                                            int64_t n_rows, float* y, int64_t y_stride, PrefetchReach reach) {
  direct_rows_any(type, form, w, row_bytes, n_out, k, x, x_stride, n_rows, y, y_stride,
                  intel_cpu() ? with_near_l1(reach) : reach);
}

template <Avx512Isa Isa>
const QuantKernels& Avx512Kernels<Isa>::table() {
  // (direct_prefill and lane_pairs: both.)
  static const QuantKernels k{false,
                              false,
                              unpack_row,
                              ActQuant::quantize_row,
                              dot_rows,
                              direct_max_rows,
                              direct_pass_rows,
                              direct_rows_target,
                              dot_probe,
                              true,
                              true};
  return k;
}

}  // namespace tandem::kernels
