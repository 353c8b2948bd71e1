// The legacy block types' super-block loaders on AVX-512 (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, in their file forms
// and their repacked forms of repack.h): 8 blocks of 32 elements into SuperRegs in
// block order (quant_layout.h). Static members of a template over the variant's Isa (Avx512Isa,
// quant_regs_avx512.h), built on the K-quant loaders' bit helpers (nibble_quarters, fifth_quarters,
// plane_bit), which each AVX-512 variant instantiates inside its `#pragma GCC target` region.
#pragma once

#include <immintrin.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "tandem/kernels/quant_kquants_avx512.h"
#include "tandem/tensor/blocks.h"

namespace tandem::kernels {

template <Avx512Isa Isa>
struct Avx512LegacyLoaders : Avx512KQuantLoaders<Isa> {
  using Base = Avx512KQuantLoaders<Isa>;
  using Base::block_quarters;
  using Base::broadcast_once;
  using Base::fifth_quarters;
  using Base::kVbmi;
  using Base::load_once;
  using Base::nibble_quarters;
  using Base::plane_bit;
  using Base::q5_kx_quarter;
  using typename Base::SuperRegs;

  // Scales of the 8 blocks of one super, each repeated for its two groups: f16 words at word offsets
  // kStride * j of the 128 bytes at d, picked by one two-source word permute (no scalar gathering, which
  // would stall on store forwarding).
  template <int kStride>
  static __m512 block_scales8(const uint8_t* d) {
    static_assert(7 * kStride < 64, "the scales must lie in the first 128 bytes");
    const __m512i idx = _mm512_setr_epi32(0, kStride * 0x10001, 2 * kStride * 0x10001, 3 * kStride * 0x10001,
                                          4 * kStride * 0x10001, 5 * kStride * 0x10001, 6 * kStride * 0x10001,
                                          7 * kStride * 0x10001, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i words = _mm512_permutex2var_epi16(_mm512_loadu_si512(d), idx, _mm512_loadu_si512(d + 64));
    return _mm512_cvtph_ps(_mm512_castsi512_si256(words));
  }

  // Q4_0 codes and scales from code bytes 0..7 (lo) and 8..15 (hi) of the 8 blocks, block j in qword j: their
  // low nibbles are quarters 0 and 1 of block order, the high ones quarters 2 and 3; weight = a * (u - 8).
  static void q4_0_from_halves(__m512i lo, __m512i hi, __m512 a, SuperRegs& s) {
    nibble_quarters(lo, hi, s.u);
    s.a = a;
    s.b = _mm512_mul_ps(_mm512_set1_ps(-8.0f), a);
  }

  // The 4-bit codes of 8 legacy blocks of kB bytes from sb, each block's 16 code bytes at kQs, in block
  // order: the code bytes of the even blocks side by side in one vector, of the odd ones in another; per
  // 128-bit lane a qword unpack pairs block 2m's bytes 0..7 (or 8..15) with block 2m + 1's, which is quarter
  // 0 (or 1) of blocks 2m and 2m + 1 in their low nibbles and quarter 2 (or 3) in their high ones.
  template <int64_t kB, int64_t kQs>
  static void legacy_nibbles(const uint8_t* sb, __m512i* u) {
    const auto qs = [sb](int j) {
      return _mm_loadu_si128(reinterpret_cast<const __m128i*>(sb + j * kB + kQs));
    };
    const __m512i nib = _mm512_set1_epi8(0x0F);
    const __m512i even = _mm512_inserti32x4(
        _mm512_inserti32x4(_mm512_inserti32x4(_mm512_castsi128_si512(qs(0)), qs(2), 1), qs(4), 2), qs(6), 3);
    const __m512i odd = _mm512_inserti32x4(
        _mm512_inserti32x4(_mm512_inserti32x4(_mm512_castsi128_si512(qs(1)), qs(3), 1), qs(5), 2), qs(7), 3);
    const __m512i el = _mm512_and_si512(even, nib), ol = _mm512_and_si512(odd, nib);
    const __m512i eh = _mm512_and_si512(_mm512_srli_epi16(even, 4), nib);
    const __m512i oh = _mm512_and_si512(_mm512_srli_epi16(odd, 4), nib);
    u[0] = _mm512_unpacklo_epi64(el, ol);
    u[1] = _mm512_unpackhi_epi64(el, ol);
    u[2] = _mm512_unpacklo_epi64(eh, oh);
    u[3] = _mm512_unpackhi_epi64(eh, oh);
  }

  // Q4_0 (8 blocks from sb) in block order.
  static void load_q4_0_super(const uint8_t* sb, SuperRegs& s) {
    constexpr int64_t kB = sizeof(BlockQ4_0);
    legacy_nibbles<kB, offsetof(BlockQ4_0, qs)>(sb, s.u);
    s.a = block_scales8<kB / 2>(sb);
    s.b = _mm512_mul_ps(_mm512_set1_ps(-8.0f), s.a);
  }

  // The f16 words at byte kOff of 8 legacy blocks of kB bytes, as floats, each repeated for its block's two
  // groups: inserted word by word (within the super-block's bytes, where Q4_0's two-vector permute would read
  // past the blocks of these longer types).
  template <int64_t kB, int64_t kOff>
  static __m512 legacy_halves8(const uint8_t* sb) {
    const auto word = [sb](int j) {
      uint16_t w;
      std::memcpy(&w, sb + j * kB + kOff, 2);
      return static_cast<short>(w);
    };
    const __m128i w = _mm_setr_epi16(word(0), word(1), word(2), word(3), word(4), word(5), word(6), word(7));
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7),
                                 _mm512_castps256_ps512(_mm256_cvtph_ps(w)));
  }

  // Adds 16 to the codes whose fifth bit is set (Q5_0, Q5_1): element 8q + i of block j (byte i of qword j of
  // quarter q) takes bit 8q + i of the block's 32-bit qh word at kQh, that is bit i of its byte q, tested by
  // spreading byte q over the qword's 8 bytes against the bit pattern 1, 2, 4, ... 128.
  template <int64_t kB, int64_t kQh>
  static void legacy_fifth_bits(const uint8_t* sb, __m512i* u) {
    const auto qh = [sb](int j) {
      uint32_t w;
      std::memcpy(&w, sb + j * kB + kQh, 4);
      return static_cast<int>(w);
    };
    // Inserted dword by dword (built through memory, the vector load would stall on store forwarding).
    const auto four = [&qh](int j0) {
      return _mm_insert_epi32(
          _mm_insert_epi32(_mm_insert_epi32(_mm_cvtsi32_si128(qh(j0)), qh(j0 + 1), 1), qh(j0 + 2), 2),
          qh(j0 + 3), 3);
    };
    const __m512i words = _mm512_cvtepu32_epi64(
        _mm256_inserti128_si256(_mm256_castsi128_si256(four(0)), four(4), 1));  // qword j: qh_j
    const __m512i bits = _mm512_set1_epi64(static_cast<long long>(0x8040201008040201ULL));
    const __m512i sixteen = _mm512_set1_epi8(16);
    for (int q = 0; q < 4; ++q) {
      const long long lo = 0x0101010101010101LL * q, hi = 0x0101010101010101LL * (8 + q);
      const __m512i spread = _mm512_shuffle_epi8(words, _mm512_set_epi64(hi, lo, hi, lo, hi, lo, hi, lo));
      u[q] = _mm512_mask_add_epi8(u[q], _mm512_test_epi8_mask(spread, bits), u[q], sixteen);
    }
  }

  // Q4_1, Q5_0 and Q5_1 (8 blocks from sb) in block order: 4-bit codes, plus the fifth bits for Q5_*;
  // a = d, b = m (Q4_1, Q5_1) or -16 * d (Q5_0), as unpack_row_impl.
  // Always inlined: as a call (GCC's choice for Q5_1 under AVX2) the registers pass through memory, and one
  // row took longer.
  template <typename Block, bool kMin, bool kFifth>
  [[gnu::always_inline]] static void load_legacy_super(const uint8_t* sb, SuperRegs& s) {
    constexpr int64_t kB = sizeof(Block);
    legacy_nibbles<kB, offsetof(Block, qs)>(sb, s.u);
    if constexpr (kFifth) legacy_fifth_bits<kB, offsetof(Block, qh)>(sb, s.u);
    s.a = legacy_halves8<kB, offsetof(Block, d)>(sb);
    if constexpr (kMin) {
      s.b = legacy_halves8<kB, offsetof(Block, m)>(sb);
    } else {
      s.b = _mm512_mul_ps(_mm512_set1_ps(-16.0f), s.a);
    }
  }

  // Byte gathers over the 8 blocks of a legacy super-block (Q4_1, Q5_0, Q5_1; kSuperBytes of at most 192)
  // held in three vectors, the third loaded masked to the super-block's end so that nothing past it is read:
  // result byte r takes super-block byte src[r] through two two-vector byte permutes and a blend (bytes
  // 0..127 from the first two vectors, the rest from the last two).
  template <int64_t kSuperBytes>
  struct LegacyBytes {
    __m512i v0, v1, v2;
    explicit LegacyBytes(const uint8_t* sb)
        : v0(_mm512_loadu_si512(sb)),
          v1(_mm512_loadu_si512(sb + 64)),
          v2(_mm512_maskz_loadu_epi8(_cvtu64_mask64(~0ULL >> (192 - kSuperBytes)), sb + 128)) {
      static_assert(kSuperBytes > 128 && kSuperBytes <= 192);
    }
    // The permute indices of the low and high source pairs, and which result bytes take the high one.
    struct Gather {
      std::array<uint8_t, 64> low, high;
      uint64_t from_high;
    };
    static constexpr Gather gather_of(const std::array<int, 64>& src) {
      Gather g{};
      for (int r = 0; r < 64; ++r) {
        g.low[r] = static_cast<uint8_t>(src[r] & 127);
        g.high[r] = static_cast<uint8_t>((src[r] - 64) & 127);
        if (src[r] >= 128) g.from_high |= uint64_t{1} << r;
      }
      return g;
    }
    __m512i operator()(const Gather& g) const {
      const __m512i a = _mm512_permutex2var_epi8(v0, _mm512_loadu_si512(g.low.data()), v1);
      const __m512i b = _mm512_permutex2var_epi8(v1, _mm512_loadu_si512(g.high.data()), v2);
      return _mm512_mask_blend_epi8(_cvtu64_mask64(g.from_high), a, b);
    }
  };

  // load_legacy_super from three loads and byte permutes: per block, its code bytes 0..7 into qword j of one
  // vector and 8..15 into qword j of another (quarters 0 and 2, 1 and 3 of block order, as legacy_nibbles),
  // and its fifth-bit word, scale and minimum into qword j of a third, from which each quarter's fifth bits
  // are spread over its bytes (as legacy_fifth_bits) and the scales converted (as legacy_halves8). The same
  // registers as load_legacy_super, in about 35 operations instead of about 60.
  template <typename Block, bool kMin, bool kFifth>
  [[gnu::always_inline]] static void load_legacy_super_vbmi(const uint8_t* sb, SuperRegs& s) {
    constexpr int kB = sizeof(Block);
    using Bytes = LegacyBytes<8 * kB>;
    static constexpr int kQh = [] {
      if constexpr (kFifth) {
        return static_cast<int>(offsetof(Block, qh));
      } else {
        return static_cast<int>(offsetof(Block, d));
      }
    }();
    static constexpr int kM = [] {
      if constexpr (kMin) {
        return static_cast<int>(offsetof(Block, m));
      } else {
        return static_cast<int>(offsetof(Block, d));
      }
    }();
    static constexpr auto kGathers = [] {
      std::array<typename Bytes::Gather, 3> g{};
      for (int h = 0; h < 2; ++h) {  // code bytes 8h..8h + 7
        std::array<int, 64> src{};
        for (int r = 0; r < 64; ++r)
          src[r] = kB * (r / 8) + static_cast<int>(offsetof(Block, qs)) + 8 * h + r % 8;
        g[h] = Bytes::gather_of(src);
      }
      std::array<int, 64> src{};  // qword j: fifth-bit word, d, m
      for (int r = 0; r < 64; ++r) {
        const int j = r / 8, i = r % 8;
        src[r] = kB * j + (i < 4   ? kQh + i
                           : i < 6 ? static_cast<int>(offsetof(Block, d)) + i - 4
                                   : kM + i - 6);
      }
      g[2] = Bytes::gather_of(src);
      return g;
    }();
    const Bytes bytes(sb);
    const __m512i hdr = bytes(kGathers[2]);
    nibble_quarters(bytes(kGathers[0]), bytes(kGathers[1]), s.u);
    if constexpr (kFifth) {
      // Quarter q: byte 8j + i takes bit i of byte q of block j's fifth-bit word.
      alignas(64) static constexpr auto kSpread = [] {
        std::array<std::array<uint8_t, 64>, 4> t{};
        for (int q = 0; q < 4; ++q)
          for (int r = 0; r < 64; ++r) t[q][r] = static_cast<uint8_t>(r / 8 * 8 + q);
        return t;
      }();
      const __m512i bits = _mm512_set1_epi64(static_cast<long long>(0x8040201008040201ULL));
      const __m512i sixteen = _mm512_set1_epi8(16);
      for (int q = 0; q < 4; ++q) {
        const __m512i spread = _mm512_permutexvar_epi8(_mm512_load_si512(kSpread[q].data()), hdr);
        s.u[q] = _mm512_mask_add_epi8(s.u[q], _mm512_test_epi8_mask(spread, bits), s.u[q], sixteen);
      }
    }
    // d of block j is word 4j + 2 of hdr, m word 4j + 3: gathered as [d0..d7, m0..m7] and converted at once.
    const __m512i dm_idx = _mm512_setr_epi32(0x00060002, 0x000E000A, 0x00160012, 0x001E001A, 0x00070003,
                                             0x000F000B, 0x00170013, 0x001F001B, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512 dm = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(dm_idx, hdr)));
    s.a = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7), dm);
    if constexpr (kMin) {
      s.b = _mm512_permutexvar_ps(
          _mm512_setr_epi32(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15), dm);
    } else {
      s.b = _mm512_mul_ps(_mm512_set1_ps(-16.0f), s.a);
    }
  }

  // The same registers as load_q4_0_super from two 64-byte loads and two byte permutes (blocks 0..6 lie in
  // the first 128 bytes), with block 7's two 8-byte halves merged in: fewer operations than gathering eight
  // 16-byte pieces, which pays where a window's weight decoding binds (PairTileLoader), but its loads
  // straddle cache lines, which streams slower for one row (from memory).
  static void load_q4_0_super_vbmi(const uint8_t* sb, SuperRegs& s) {
    constexpr int kB = sizeof(BlockQ4_0);
    // Byte i of qword j of the low (high) vector: code byte i (8 + i) of block j.
    alignas(64) static constexpr auto idx = [] {
      std::array<std::array<uint8_t, 64>, 2> t{};
      for (int h = 0; h < 2; ++h)
        for (int j = 0; j < 7; ++j)
          for (int i = 0; i < 8; ++i) t[h][8 * j + i] = static_cast<uint8_t>(kB * j + 2 + 8 * h + i);
      return t;
    }();
    const __m512i v0 = load_once(sb), v1 = load_once(sb + 64);
    const auto last = [sb](int h) {
      return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sb + 7 * kB + 2 + 8 * h));
    };
    const __m512i lo = _mm512_mask_broadcastq_epi64(
        _mm512_permutex2var_epi8(v0, _mm512_load_si512(idx[0].data()), v1), 0x80, last(0));
    const __m512i hi = _mm512_mask_broadcastq_epi64(
        _mm512_permutex2var_epi8(v0, _mm512_load_si512(idx[1].data()), v1), 0x80, last(1));
    q4_0_from_halves(lo, hi, block_scales8<kB / 2>(sb), s);
  }

  // Scales of the 8 blocks of a Q8_0 super (34-byte blocks: word stride 17, spread over 272 bytes): blocks
  // 0..3 from the first 128 bytes, 4..7 from the 128 bytes at block 4, each repeated for its two groups.
  static __m512 q8_0_scales8(const uint8_t* sb) {
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
  static void load_q8_0_super(const uint8_t* sb, SuperRegs& s) {
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
  static __m512 interleaved_scales8(const uint8_t* sb) {
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sb)));
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7),
                                 _mm512_castps256_ps512(d));
  }

  // 64 bytes as four 16-byte loads. Super-blocks of the repacked forms sit at multiples of 16 bytes (144 and
  // 272 bytes long, in a file with 32-byte alignment), so these never straddle a cache line; one 64-byte load
  // would in three super-blocks of four, and such loads run much slower when the weights stream from memory
  // (measured at one row; performance.md, tried and dropped).
  static __m512i load64_by16(const uint8_t* p) {
    const auto q = [p](int i) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * i)); };
    return _mm512_inserti32x4(
        _mm512_inserti32x4(_mm512_inserti32x4(_mm512_castsi128_si512(q(0)), q(1), 1), q(2), 2), q(3), 3);
  }

  // 64 code bytes of a repacked super-block: in four 16-byte pieces (kPieces, load64_by16) for one row, whose
  // tiles keep pace with the weights streaming from memory (there one 64-byte load measured slower for Q8_0);
  // in one 64-byte load for windows, which bind on arithmetic and where the pieces' three inserts per load
  // compete with it for issue, and which took less time so (performance.md). The same bytes either way.
  template <bool kPieces>
  static __m512i load_codes64(const uint8_t* p) {
    return kPieces ? load64_by16(p) : _mm512_loadu_si512(p);
  }

  // Repacked Q4_0: code bytes 0..7 of the 8 blocks in one vector, bytes 8..15 in the next; their low nibbles
  // are quarters 0 and 1, the high ones quarters 2 and 3.
  template <bool kPieces>
  static void load_q4_0x_super(const uint8_t* sb, SuperRegs& s) {
    q4_0_from_halves(load_codes64<kPieces>(sb + 16), load_codes64<kPieces>(sb + 80), interleaved_scales8(sb),
                     s);
  }

  // Repacked Q8_0: the four quarters as they are, made unsigned (offset -128) or not (as load_q8_0_super).
  template <bool kUnsigned, bool kPieces>
  static void load_q8_0x_super(const uint8_t* sb, SuperRegs& s) {
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    for (int q = 0; q < 4; ++q) {
      s.u[q] = load_codes64<kPieces>(sb + 16 + 64 * q);
      if (kUnsigned) s.u[q] = _mm512_xor_si512(s.u[q], flip);
    }
    s.a = interleaved_scales8(sb);
    s.b = kUnsigned ? _mm512_mul_ps(_mm512_set1_ps(-128.0f), s.a) : _mm512_setzero_ps();
  }

  // Repacked Q5_0 (repack.h): the nibble planes of repacked Q4_0 at byte 48 with each quarter's fifth bits
  // from the 32-byte plane at byte 16 (q5_kx_quarter), a = d and b = -16 * d (as load_legacy_super).
  static void load_q5_0x_super(const uint8_t* sb, SuperRegs& s) {
    fifth_quarters(load_once(sb + 48), load_once(sb + 112), broadcast_once(sb + 16), s.u);
    s.a = interleaved_scales8(sb);
    s.b = _mm512_mul_ps(_mm512_set1_ps(-16.0f), s.a);
  }

  // Repacked Q4_1 and Q5_1 (repack.h): the codes as repacked Q4_0's (and the fifth bits as repacked Q5_0's)
  // after the 8 scales and the 8 minimums; a = d, b = m (as load_legacy_super).
  static void load_q4_1x_super(const uint8_t* sb, SuperRegs& s) {
    nibble_quarters(load_once(sb + 32), load_once(sb + 96), s.u);
    s.a = interleaved_scales8(sb);
    s.b = interleaved_scales8(sb + 16);
  }

  static void load_q5_1x_super(const uint8_t* sb, SuperRegs& s) {
    fifth_quarters(load_once(sb + 64), load_once(sb + 128), broadcast_once(sb + 32), s.u);
    s.a = interleaved_scales8(sb);
    s.b = interleaved_scales8(sb + 16);
  }

  // The partial last super-block of a repacked row, in place (repack.h: its n < 8 blocks' scales, then the
  // first 8n bytes of each code plane, then for Q5_0 its fifth bits), through masked loads that read nothing
  // past it: the registers of the whole repacked super-block with zero blocks after those n (the same as the
  // file form's loaders give for a copy padded with zero blocks).
  static __m512 tail_scales8(const uint8_t* p, int n) {
    const __m256 d = _mm256_cvtph_ps(_mm_maskz_loadu_epi16(static_cast<__mmask8>((1u << n) - 1), p));
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7),
                                 _mm512_castps256_ps512(d));
  }

  // The first 8n bytes of code plane c, zero after them, the planes after kHead bytes per block (the scales,
  // and for Q4_1 and Q5_1 the minimums).
  template <int kHead = 2>
  static __m512i tail_plane(const uint8_t* p, int n, int c) {
    return _mm512_maskz_loadu_epi8(_cvtu64_mask64(~0ULL >> (64 - 8 * n)), p + kHead * n + 8 * n * c);
  }

  static void load_q4_0x_tail(const uint8_t* p, int n, SuperRegs& s) {
    q4_0_from_halves(tail_plane(p, n, 0), tail_plane(p, n, 1), tail_scales8(p, n), s);
  }

  template <bool kUnsigned>
  static void load_q8_0x_tail(const uint8_t* p, int n, SuperRegs& s) {
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    for (int q = 0; q < 4; ++q) {
      s.u[q] = tail_plane(p, n, q);
      if (kUnsigned) s.u[q] = _mm512_xor_si512(s.u[q], flip);
    }
    s.a = tail_scales8(p, n);
    s.b = kUnsigned ? _mm512_mul_ps(_mm512_set1_ps(-128.0f), s.a) : _mm512_setzero_ps();
  }

  static void load_q4_1x_tail(const uint8_t* p, int n, SuperRegs& s) {
    nibble_quarters(tail_plane<4>(p, n, 0), tail_plane<4>(p, n, 1), s.u);
    s.a = tail_scales8(p, n);
    s.b = tail_scales8(p + 2 * n, n);
  }

  // Q5_0 and Q5_1 (kMin): the fifth bits, nibble p of the 4n bytes after the planes (position p's quarters),
  // spread back to the 32-byte plane of the whole form: byte k takes positions k (low nibble) and 32 + k
  // (high nibble).
  template <bool kMin>
  static void load_q5x_tail(const uint8_t* p, int n, SuperRegs& s) {
    constexpr int kHead = kMin ? 4 : 2;
    const __m512i lo = tail_plane<kHead>(p, n, 0), hi = tail_plane<kHead>(p, n, 1);
    __m512i hm;
    if constexpr (kVbmi) {
      // Qword m of both halves gathers the packed bytes 4m..4m+3 (positions 8m..8m+7) and 16 + 4m..16 + 4m +
      // 3 (positions 32 + 8m..): byte t of the plane's qword m takes position 8m + t's nibble from bit 4t
      // into its low nibble and position 32 + 8m + t's from bit 32 + 4t into its high one (8-bit fields at
      // bit offsets 4t and 28 + 4t of the qword), in three byte shuffles instead of about a dozen operations:
      // less time in cache, alike from memory (performance.md, VBMI).
      static constexpr auto kGather = [] {
        std::array<uint8_t, 64> g{};
        for (int b = 0; b < 64; ++b) {
          const int m = (b / 8) % 4, t = b % 8;
          g[static_cast<size_t>(b)] = static_cast<uint8_t>(t < 4 ? 4 * m + t : 16 + 4 * m + t - 4);
        }
        return g;
      }();
      const __m512i bytes = _mm512_permutexvar_epi8(
          _mm512_loadu_si512(kGather.data()),
          _mm512_maskz_loadu_epi8(_cvtu64_mask64((uint64_t{1} << (4 * n)) - 1), p + (kHead + 16) * n));
      const __m512i low = _mm512_multishift_epi64_epi8(_mm512_set1_epi64(0x1C1814100C080400LL), bytes);
      const __m512i high = _mm512_multishift_epi64_epi8(_mm512_set1_epi64(0x3834302C2824201CLL), bytes);
      hm = _mm512_ternarylogic_epi32(low, high, _mm512_set1_epi8(0x0F), 0xE4);  // c ? a : b
    } else {
      const __m256i packed =
          _mm256_maskz_loadu_epi8(_cvtu32_mask32((1u << (4 * n)) - 1), p + (kHead + 16) * n);
      // Words of the packed bytes 0..15 (positions 0..31) and 16..31 (32..63), 0x00XY for nibbles Y (even
      // position), X (odd): 0x0X0Y puts each position in its own byte, low nibble; 0xX0Y0 in the high one.
      const __m256i w0 = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(packed));
      const __m256i w1 = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(packed, 1));
      const __m256i low =
          _mm256_or_si256(_mm256_and_si256(w0, _mm256_set1_epi16(0x000F)),
                          _mm256_and_si256(_mm256_slli_epi16(w0, 4), _mm256_set1_epi16(0x0F00)));
      const __m256i high = _mm256_or_si256(
          _mm256_and_si256(_mm256_slli_epi16(w1, 4), _mm256_set1_epi16(0x00F0)),
          _mm256_and_si256(_mm256_slli_epi16(w1, 8), _mm256_set1_epi16(static_cast<short>(0xF000))));
      hm = _mm512_broadcast_i64x4(_mm256_or_si256(low, high));
    }
    fifth_quarters(lo, hi, hm, s.u);
    s.a = tail_scales8(p, n);
    s.b = kMin ? tail_scales8(p + 2 * n, n) : _mm512_mul_ps(_mm512_set1_ps(-16.0f), s.a);
  }

  static void load_q5_0x_tail(const uint8_t* p, int n, SuperRegs& s) { load_q5x_tail<false>(p, n, s); }

  static void load_q5_1x_tail(const uint8_t* p, int n, SuperRegs& s) { load_q5x_tail<true>(p, n, s); }
};

}  // namespace tandem::kernels
