// x86 pieces shared by the AVX2 and AVX-512 kernel files: the bit-level helpers of the unpacking
// (UnpackOps, quant_unpack.h) and the prefetch in intrinsics (X86Ops), and the types and compile-time
// helpers of the direct kernels (quant_direct_x86.h). Included inside each file's `#pragma GCC target`
// region, after <immintrin.h>, so that each target's instantiations are compiled for its instruction set;
// a target derives its Ops from X86Ops<Ops> so that its copies have names of their own.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "tandem/tensor/blocks.h"

namespace tandem::kernels {

// Bytes of a 256-element super-block (8 blocks) of the legacy 8-bit and 4-bit formats.
constexpr int64_t kQ4_0Super = 8 * sizeof(BlockQ4_0), kQ8_0Super = 8 * sizeof(BlockQ8_0);

template <class Target>
struct X86Ops {
  static float half_to_float(uint16_t h) { return _cvtsh_ss(h); }

  // The two bit-level helpers of UnpackOps in intrinsics (compilers vectorize the plain loops poorly).
  // One 32-byte store, so that a later 32-byte load of the codes (fifth_bits32) forwards from it instead of
  // stalling on two 16-byte stores.
  static void nibbles32(const uint8_t* qs, uint8_t* u) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(u), _mm256_and_si256(both, _mm256_set1_epi8(0x0F)));
  }

  static void fifth_bits32(const uint8_t* qh, uint8_t* u) {
    uint32_t bits;
    std::memcpy(&bits, qh, 4);
    const __m256i spread =
        _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int32_t>(bits)),
                            _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2,
                                             2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
    const __m256i high =
        _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
    __m256i* p = reinterpret_cast<__m256i*>(u);
    _mm256_storeu_si256(p, _mm256_or_si256(_mm256_loadu_si256(p), high));
  }

  // The cache lines of the super-block `ahead` bytes past the one at ws, into L1 (kHint _MM_HINT_T0) or L2
  // (_MM_HINT_T1).
  template <int64_t kSuperBytes, int kHint = _MM_HINT_T0>
  static void prefetch_ahead(const uint8_t* ws, int64_t ahead) {
    for (int64_t b = 0; b < kSuperBytes; b += 64)
      _mm_prefetch(reinterpret_cast<const char*>(ws + ahead + b), static_cast<_mm_hint>(kHint));
  }
};

// How a tile call covers its weight row: whole (first and last), or one column chunk of it, the accumulators
// carried between chunks in `state` (NR * kStateFloats floats). Prefetching runs `prefetch` bytes ahead of
// each super-block read. tail: the padded copy of the row's partial last super-block, read by the tiles that
// take one (TailLoad; quant_direct_x86.h) instead of the row's own bytes there; tail_blocks: its blocks,
// for the tail loaders that read it in place (repacked forms).
struct TilePart {
  float* state;
  bool first, last;
  int64_t prefetch;
  const uint8_t* tail = nullptr;
  int tail_blocks = 0;
  bool to_l2 = false;    // prefetch into L2 where the tile's own hint is L1 (PrefetchReach::kFar)
  int64_t again = 0;     // a second prefetch into L2 this many bytes ahead (0: none; the AVX-512 tiles)
  bool near_l1 = false;  // the first prefetch into L1 6 KB ahead (AVX-512 tiles: near_into_l1, kL1NearRows)
};

// Whether two loaders (of any signatures) are the same function.
template <auto A, auto B>
constexpr bool same_loader() {
  if constexpr (std::is_same_v<decltype(A), decltype(B)>) {
    return A == B;
  } else {
    return false;
  }
}

// Whether a tail loader reads a repacked row's partial last super-block in place, given its block count
// (repack.h), rather than from a padded copy in the file's form.
template <auto TailLoad, typename Regs>
constexpr bool reads_tail_in_place() {
  return std::is_invocable_v<decltype(TailLoad), const uint8_t*, int, Regs&>;
}

// Calls fn.operator()<Load, kSuperBytes, kFold, Signed>() and returns true: how a target's with_loader hands
// a weight type's register loader (and its super-block size, offset fold and, where the target has one, the
// loader of its signed form for wide windows, else nullptr) to the kernel templates.
template <auto Load, int64_t kSuperBytes, int kFold, auto Signed = nullptr, typename Fn>
bool call_with(Fn& fn) {
  fn.template operator()<Load, kSuperBytes, kFold, Signed>();
  return true;
}

}  // namespace tandem::kernels
