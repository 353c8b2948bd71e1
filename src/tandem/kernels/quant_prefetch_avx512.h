// How far ahead, and into which cache, the AVX-512 tiles prefetch the weights they stream: the prefetch
// members of a variant's Target (X86DirectTarget, quant_direct_x86.h), which it takes by deriving from this
// template over its Isa (Avx512Isa, quant_regs_avx512.h).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "tandem/kernels/quant_regs_avx512.h"
#include "tandem/tensor/dtype.h"

namespace tandem::kernels {

template <Avx512Isa Isa>
struct Avx512Prefetch {
  using Regs = Avx512Regs<Isa>;

  // Software prefetch distance into L1: memory-level parallelism beyond what the reorder window reaches
  // (faster decode; performance.md).
  static constexpr int64_t kPrefetchBytes = 3072;

  // Which tiles prefetch into L2 rather than L1: one-row tiles (decode), and every tile of Q8_0 (272-byte
  // repacked super-blocks) and Q6_K; L2 kL2PrefetchBytes ahead, L1 kPrefetchBytes ahead (pair tiles: a pair
  // ahead either way). Into L2 these took less time than into L1 over a token's matrices; the other windows
  // lost with it (Q4_K, Q4_0 pair tiles). Distances that are multiples of 4 KB measured worse (the prefetch
  // aliases the load it runs ahead of). Figures: performance.md, AVX-512 prefetch.
  static constexpr bool l2_prefetch(int fold, int64_t rows) {
    return rows == 1 || fold == Regs::fold_of(DType::Q8_0) || fold == Regs::fold_of(DType::Q6_K);
  }
  static constexpr int64_t kL2PrefetchBytes = 6144;
  // PrefetchReach::kFar: one-row tiles of every fold but Q8_0's prefetch twice as far ahead (into L2), and
  // two-row tiles of Q4_0 and of the types without a fixed offset (fold 0) as far into L2 (against 3 KB ahead
  // into L1). On this project's Zen 4 machine kind, whose memory moves between a slow state and a fast one,
  // the far reach decodes faster in the fast state and slower in the slow one; Q8_0 decoded fastest at one
  // distance, so it keeps it. A PrefetchTuner per window width picks the reach by measuring forwards
  // (prefetch_tuner.h), so where the far reach loses, the forwards keep the near one.
  static constexpr int64_t far_prefetch_bytes(int fold, int64_t rows) {
    if (rows == 1) return fold != Regs::fold_of(DType::Q8_0) ? 2 * kL2PrefetchBytes : 0;
    return rows == 2 && (fold == Regs::fold_of(DType::Q4_0) || fold == 0) ? 2 * kL2PrefetchBytes : 0;
  }
  // One-row tiles prefetch each line a second time, into L2 twice as far ahead as the first (6 and 12 KB, far
  // reach 12 and 24 KB; TilePart::again), and tiles of two and three rows that have no far reach a second
  // time 12 KB ahead. The second prefetch gained at one row (Q8_0 most) and at two and three rows without a
  // far reach; with one 64-byte load a line, Q4_0 lane pairs needed both prefetches (the line's first
  // prefetch appears not always to be carried out). Two rows with a far reach, and four rows and more, gained
  // nothing from a second, so they keep one.
  static constexpr int64_t again_prefetch_bytes(int fold, int64_t rows, int64_t first) {
    if (rows == 1) return 2 * first;
    return rows <= 3 && far_prefetch_bytes(fold, rows) == 0 ? 2 * kL2PrefetchBytes : 0;
  }
  // PrefetchReach's L1 forms (near_into_l1), which the kernel tables take on Intel cores
  // (direct_rows_target): tiles of up to kL1NearRows rows prefetch first into L1 this far ahead, then into L2
  // at their second distance as before (one row: 12 KB, far reach 24). On the Xeon with AMX (48 KB L1 data
  // cache) decode took less time so, short windows a little less; the Zen 4 machine kind measured L1
  // prefetches slower (l2_prefetch), so AMD CPUs keep their forms.
  static constexpr int64_t kL1NearBytes = kL2PrefetchBytes;
  // The prefetch hint of a tile (l2_prefetch).
  static constexpr int prefetch_hint(int fold, int64_t rows) {
    return l2_prefetch(fold, rows) ? _MM_HINT_T1 : _MM_HINT_T0;
  }
};

}  // namespace tandem::kernels
