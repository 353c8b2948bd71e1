// The target-independent half of the x86 direct kernels (quant_layout.h), shared by the AVX2 and AVX-512
// targets: column chunks, rows with a partial last super-block, tiles of two weight rows and the tile tables
// (direct_rows_t, dot_rows_t). Each target's kernel table entries unpack_row and direct_rows are plain
// functions of its own file over these. DirectX86<Target> is written once over a target's traits type
// (X86DirectTarget) and compiled into each target's translation unit with that target's instruction set.
//
// A target includes this header inside its `#pragma GCC target` region (after <immintrin.h>) and names
// DirectX86 with a traits type of its own namespace, so that no two targets' instantiations share a name
// for the linker to fold into one (as QuantUnpack, quant_unpack.h).
#pragma once

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "tandem/kernels/quant_layout.h"
#include "tandem/kernels/quant_x86_ops.h"

namespace tandem::kernels {

// What a target's with_loader hands each weight type's loader to (call_with): a callable taking the
// template arguments <Load, kSuperBytes, kFold, Signed>. Named only in X86DirectTarget's requirements.
struct LoaderVisitor {
  template <auto Load, int64_t kSuperBytes, int kFold, auto Signed>
  void operator()() const;
};

// What the driver takes from a target, as static members of one traits type:
//  - kPrefetchBytes, kL2PrefetchBytes, l2_prefetch(fold, rows): how far ahead the tiles of whole rows
//    prefetch, and which of them prefetch into L2 (at the second distance);
//  - far_prefetch_bytes(fold, rows): the distance of PrefetchReach::kFar, or 0 for none (into L2);
//  - again_prefetch_bytes(fold, rows, first): a second prefetch's distance (TilePart::again; 0 for none);
//  - kDirectRows: the most activation rows of a tile of one weight row;
//  - kChunkMinRows, chunks_small_window(n_rows, n_super): the fewest activation rows that column chunks take,
//    and whether a window of fewer rows takes them all the same;
//  - kStateFloats: floats of accumulator state per activation row between chunks (TilePart::state);
//  - kDotTileRows, dot_tile<NR, kFold>(w, n_super, x, x_stride, y, y_stride): the unpacked kernels' tile of
//    one unpacked weight row against NR activation rows;
//  - with_loader(type, interleaved, fn): the register loader of a type and form, handed to fn by call_with;
//    false for a type the target does not decode in registers;
//  - kSignedQ8: whether its Q8_0 codes are signed;
//  - Unpack: its QuantUnpack, the path of everything with_loader does not take;
//  - per loader (X86DirectLoader): direct_tile, pair_rows, tail_loader, tail_signed and unpack_supers.
// A traits type that leaves one out fails to compile with the unsatisfied requirement named.
template <typename T>
concept X86DirectTarget = requires(int fold, int64_t n, DType type, bool interleaved, LoaderVisitor& visit,
                                   const UnpackedSuper* w, const ActSuper* x, float* y) {
  { T::kPrefetchBytes } -> std::convertible_to<int64_t>;
  { T::kL2PrefetchBytes } -> std::convertible_to<int64_t>;
  { T::l2_prefetch(fold, n) } -> std::same_as<bool>;
  { T::far_prefetch_bytes(fold, n) } -> std::convertible_to<int64_t>;
  { T::again_prefetch_bytes(fold, n, n) } -> std::convertible_to<int64_t>;
  { T::kDirectRows } -> std::convertible_to<int64_t>;
  { T::kChunkMinRows } -> std::convertible_to<int64_t>;
  { T::chunks_small_window(n, n) } -> std::same_as<bool>;
  { T::kStateFloats } -> std::convertible_to<int64_t>;
  { T::kDotTileRows } -> std::convertible_to<size_t>;
  T::template dot_tile<1, 0>(w, n, x, n, y, n);
  { T::with_loader(type, interleaved, visit) } -> std::same_as<bool>;
  { T::kSignedQ8 } -> std::convertible_to<bool>;
  typename T::Unpack;
};

// The members a target instantiates with each loader that its with_loader hands over:
//  - direct_tile<NR, Load, kSuperBytes, kFold, Signed, TailLoad, TailSigned>(w, n_super, x, x_stride, y,
//    y_stride, part): one weight row, or a column chunk of it, against NR activation rows; with a TailLoad,
//    its last super-block through it;
//  - pair_rows<Load, kSuperBytes, kFold, Signed, TailLoad, TailSigned>(w, row_bytes, n_out, n_super, x,
//    x_stride, n_rows, y, y_stride, tail_blocks): the output rows it covered with tiles of two weight rows,
//    from the first (0 for none);
//  - tail_loader<Load>(), tail_signed<Signed>(): the loaders that read a partial last super-block, for the
//    loaders of rows that may end in one (nullptr for the others);
//  - unpack_supers<Load, kSuperBytes>(row, n_super, out): whole super-blocks through the loader into the
//    unpacked form.
template <typename T, auto Load, int64_t kSuperBytes, int kFold, auto Signed>
concept X86DirectLoader = requires(const uint8_t* w, int64_t n, const ActSuper* x, float* y,
                                   UnpackedSuper* out) {
  &T::template direct_tile<1, Load, kSuperBytes, kFold, Signed>;
  {
    T::template pair_rows<Load, kSuperBytes, kFold, Signed>(w, n, n, n, x, n, n, y, n)
    } -> std::same_as<int64_t>;
  T::template tail_loader<Load>();
  T::template tail_signed<Signed>();
  T::template unpack_supers<Load, kSuperBytes>(w, n, out);
};

// The register form a loader fills (its second parameter).
template <typename L>
struct LoaderRegs;
template <typename Regs>
struct LoaderRegs<void (*)(const uint8_t*, Regs&)> {
  using type = Regs;
};

template <X86DirectTarget T>
struct DirectX86 {
  using DirectTile = void (*)(const uint8_t*, int64_t, const ActSuper*, int64_t, float*, int64_t,
                              const TilePart&);

  // direct_tile for NR = 1..sizeof...(I) (index NR - 1).
  template <auto Load, int64_t kSuperBytes, int kFold, auto Signed, auto TailLoad = nullptr,
            auto TailSigned = nullptr, size_t... I>
  static constexpr std::array<DirectTile, sizeof...(I)> direct_tiles(std::index_sequence<I...>) {
    return {&T::template direct_tile<static_cast<int>(I) + 1, Load, kSuperBytes, kFold, Signed, TailLoad,
                                     TailSigned>...};
  }

  // Column chunks: a window reads 320-384 bytes of activations per row and super-block (ActSuper codes,
  // scales, offset sums or nothing more) for every weight row. Past kChunkFootprint row-supers (24 KB) that
  // no longer stays in the L1 cache beside the weight stream (the FFN down projection of an 8-row window or
  // prefill tile: 8 rows by 22 super-blocks), so the weight rows are taken kChunkRows at a time in chunks of
  // kChunkSupers super-blocks, with the accumulators carried in memory between chunks: the same operations in
  // the same order, so the results do not change, and in less time per row and super-block
  // (performance.md). Each super-block read then prefetches the same chunk of the next weight row. Windows of
  // fewer than the target's kChunkMinRows rows stay unchunked unless the target's chunks_small_window says
  // otherwise.
  static constexpr int64_t kChunkFootprint = 64, kChunkSupers = 8, kChunkRows = 16;

  // Whether a window of n_rows over rows of n_super super-blocks takes whole rows rather than column chunks.
  static bool takes_whole_rows(int64_t n_rows, int64_t n_super) {
    return n_rows * n_super <= kChunkFootprint ||
           (n_rows < T::kChunkMinRows && !T::chunks_small_window(n_rows, n_super));
  }

  // Widths the direct kernels take: whole super-blocks, or for the legacy 32-element block types any whole
  // number of blocks (the last super-block partial; repacked rows keep it in the file's form, repack.h).
  static bool direct_width(DType type, int64_t k) {
    const int64_t block = traits(type).block_size;
    return k % kSuper == 0 || (block == 32 && k % block == 0);
  }

  // Whether a tile of n_rows takes the target's far prefetch (far_prefetch_bytes, into L2: TilePart::to_l2).
  static constexpr bool far_to_l2(int fold, int64_t n_rows, PrefetchReach reach) {
    return is_far(reach) && T::far_prefetch_bytes(fold, n_rows) > 0;
  }

  // Bytes ahead of each super-block read that a tile of n_rows prefetches, where it reads whole rows.
  static constexpr int64_t whole_row_prefetch(int fold, int64_t n_rows, PrefetchReach reach) {
    if (far_to_l2(fold, n_rows, reach)) return T::far_prefetch_bytes(fold, n_rows);
    return T::l2_prefetch(fold, n_rows) ? T::kL2PrefetchBytes : T::kPrefetchBytes;
  }

  // The tiles of up to this many rows that take the first prefetch of PrefetchReach's L1 forms into L1
  // (TilePart::near_l1; quant_prefetch_avx512.h).
  static constexpr int64_t kL1NearRows = 3;

  // The TilePart of a tile of n_rows that reads whole rows: its prefetch (whole_row_prefetch, far_to_l2, or
  // into L1: near_l1) and second prefetch (again_prefetch_bytes; 0: none).
  static TilePart whole_row_part(int fold, int64_t n_rows, PrefetchReach reach) {
    TilePart part{nullptr, true, true, whole_row_prefetch(fold, n_rows, reach)};
    part.to_l2 = far_to_l2(fold, n_rows, reach);
    part.again = T::again_prefetch_bytes(fold, n_rows, part.prefetch);
    part.near_l1 = n_rows <= kL1NearRows && near_into_l1(reach);
    return part;
  }

  // Rows with a partial last super-block (direct_rows_t; no column chunks: such widths are model widths,
  // short rows). A repacked row's tiles read it in place (its tail loader, TilePart::tail_blocks); a
  // file-form row's from a padded copy (TilePart::tail). The copies alternate between two buffers, the next
  // row's made before the current row's tile runs, so that the tile's loads do not wait on the copy's stores
  // (faster for Q4_0 than one buffer filled by a library copy just before its tile, alike for the others).
  // Read in place, repacked rows take less time than the file form's copies, and they also take the target's
  // pair tiles (pair_rows with the tail loaders), faster again in windows (performance.md).
  template <auto Load, int64_t kSuperBytes, int kFold, auto Signed>
  static void tail_rows(const uint8_t* w, int64_t row_bytes, int64_t n_out, int64_t n_super,
                        int64_t tail_bytes, const ActSuper* x, int64_t x_stride, int64_t n_rows, float* y,
                        int64_t y_stride, PrefetchReach reach);

  // Weight rows two at a time where the target's pair_rows takes them, the rest one at a time. A row of k
  // elements spans super_count(k) super-blocks; where the last is partial (direct_width), the row's tile
  // reads it as one whole super-block whose other blocks are zero (scale and codes 0; tail_rows): from a copy
  // of the row's last blocks padded with zero blocks, or for a repacked row in place with masked loads
  // (tail_loader). The zero blocks meet the activations' zero tail, so every lane they fill adds an exact
  // zero, as the unpacked form's zero tail does, and each result keeps the bits of unpack_row + dot_rows.
  // Such rows take pair tiles only where they are repacked (read in place).
  template <auto Load, int64_t kSuperBytes, int kFold, auto Signed>
  requires X86DirectLoader<T, Load, kSuperBytes, kFold, Signed>
  static void direct_rows_t(const uint8_t* w, int64_t row_bytes, int64_t n_out, int64_t k, const ActSuper* x,
                            int64_t x_stride, int64_t n_rows, float* y, int64_t y_stride,
                            PrefetchReach reach);

  // The unpacked kernels' row tiles: tiles[NR - 1] applies one unpacked weight row to NR activation rows.
  using DotTile = void (*)(const UnpackedSuper*, int64_t, const ActSuper*, int64_t, float*, int64_t);

  template <int kFold, size_t... I>
  static constexpr std::array<DotTile, sizeof...(I)> dot_tiles(std::index_sequence<I...>) {
    return {&T::template dot_tile<static_cast<int>(I) + 1, kFold>...};
  }

  // The unpacked kernels: rows in tiles of kDotTileRows, then one tile of the rest.
  template <int kFold>
  static void dot_rows_t(const UnpackedSuper* w, int64_t n_super, const ActSuper* x, int64_t x_stride,
                         int64_t n_rows, float* y, int64_t y_stride);
};

// The members that are not inline are defined out of the class, so that the compiler weighs inlining them
// as it would plain function templates.

template <X86DirectTarget T>
template <auto Load, int64_t kSuperBytes, int kFold, auto Signed>
void DirectX86<T>::tail_rows(const uint8_t* w, int64_t row_bytes, int64_t n_out, int64_t n_super,
                             int64_t tail_bytes, const ActSuper* x, int64_t x_stride, int64_t n_rows,
                             float* y, int64_t y_stride, PrefetchReach reach) {
  using SuperRegs = typename LoaderRegs<decltype(Load)>::type;
  static constexpr auto tiles =
      direct_tiles<Load, kSuperBytes, kFold, Signed, T::template tail_loader<Load>(),
                   T::template tail_signed<Signed>()>(std::make_index_sequence<T::kDirectRows>());
  const DirectTile tile = tiles[static_cast<size_t>(n_rows - 1)];
  TilePart part = whole_row_part(kFold, n_rows, reach);
  constexpr int64_t kBlockBytes = kSuperBytes / 8;
  if constexpr (reads_tail_in_place<T::template tail_loader<Load>(), SuperRegs>()) {  // a repacked row's own
    const int blocks = static_cast<int>(tail_bytes / kBlockBytes);
    const int64_t paired =
        T::template pair_rows<Load, kSuperBytes, kFold, Signed, T::template tail_loader<Load>(),
                              T::template tail_signed<Signed>()>(w, row_bytes, n_out, n_super, x, x_stride,
                                                                 n_rows, y, y_stride, blocks);
    part.tail_blocks = blocks;
    for (int64_t o = paired; o < n_out; ++o)
      tile(w + o * row_bytes, n_super, x, x_stride, y + o, y_stride, part);
    return;
  }
  alignas(64) uint8_t tails[2][kSuperBytes] = {};
  const auto copy_tail = [&](int64_t o) {  // block by block: fixed-size copies, no library call
    const uint8_t* src = w + o * row_bytes + (n_super - 1) * kSuperBytes;
    for (int64_t b = 0; b < tail_bytes; b += kBlockBytes)
      std::memcpy(tails[o & 1] + b, src + b, static_cast<size_t>(kBlockBytes));
  };
  copy_tail(0);
  for (int64_t o = 0; o < n_out; ++o) {
    if (o + 1 < n_out) copy_tail(o + 1);
    part.tail = tails[o & 1];
    tile(w + o * row_bytes, n_super, x, x_stride, y + o, y_stride, part);
  }
}

template <X86DirectTarget T>
template <auto Load, int64_t kSuperBytes, int kFold, auto Signed>
requires X86DirectLoader<T, Load, kSuperBytes, kFold, Signed>
void DirectX86<T>::direct_rows_t(const uint8_t* w, int64_t row_bytes, int64_t n_out, int64_t k,
                                 const ActSuper* x, int64_t x_stride, int64_t n_rows, float* y,
                                 int64_t y_stride, PrefetchReach reach) {
  const int64_t n_super = super_count(k);
  if constexpr (!std::is_null_pointer_v<decltype(T::template tail_loader<Load>())>) {
    if (k % kSuper != 0)
      return tail_rows<Load, kSuperBytes, kFold, Signed>(w, row_bytes, n_out, n_super,
                                                         row_bytes - (n_super - 1) * kSuperBytes, x, x_stride,
                                                         n_rows, y, y_stride, reach);
  }
  const int64_t paired = T::template pair_rows<Load, kSuperBytes, kFold, Signed>(
      w, row_bytes, n_out, n_super, x, x_stride, n_rows, y, y_stride);
  w += paired * row_bytes;
  y += paired;
  n_out -= paired;
  if (n_out == 0) return;
  static constexpr auto tiles =
      direct_tiles<Load, kSuperBytes, kFold, Signed>(std::make_index_sequence<T::kDirectRows>());
  const DirectTile tile = tiles[static_cast<size_t>(n_rows - 1)];
  if (takes_whole_rows(n_rows, n_super)) {
    const TilePart whole = whole_row_part(kFold, n_rows, reach);
    for (int64_t o = 0; o < n_out; ++o) tile(w + o * row_bytes, n_super, x, x_stride, y + o, y_stride, whole);
    return;
  }
  alignas(64) float state[kChunkRows * T::kDirectRows * T::kStateFloats];
  for (int64_t o0 = 0; o0 < n_out; o0 += kChunkRows) {
    const int64_t n_o = std::min(kChunkRows, n_out - o0);
    for (int64_t c0 = 0; c0 < n_super; c0 += kChunkSupers) {
      const int64_t n_c = std::min(kChunkSupers, n_super - c0);
      for (int64_t o = 0; o < n_o; ++o) {
        const TilePart part{state + o * T::kDirectRows * T::kStateFloats, c0 == 0, c0 + n_c == n_super,
                            row_bytes};
        tile(w + (o0 + o) * row_bytes + c0 * kSuperBytes, n_c, x + c0, x_stride, y + o0 + o, y_stride, part);
      }
    }
  }
}

template <X86DirectTarget T>
template <int kFold>
void DirectX86<T>::dot_rows_t(const UnpackedSuper* w, int64_t n_super, const ActSuper* x, int64_t x_stride,
                              int64_t n_rows, float* y, int64_t y_stride) {
  static constexpr auto tiles = dot_tiles<kFold>(std::make_index_sequence<T::kDotTileRows>());
  constexpr auto kMax = static_cast<int64_t>(T::kDotTileRows);
  for (int64_t r = 0; r < n_rows; r += kMax)
    tiles[static_cast<size_t>(std::min(kMax, n_rows - r) - 1)](w, n_super, x + r * x_stride, x_stride,
                                                               y + r * y_stride, y_stride);
}

}  // namespace tandem::kernels
