// Weight unpacking and activation quantization, written once in plain C++ over a target's bit-level helpers
// (UnpackOps) and compiled into each target's translation unit with that target's instruction set, so the
// compiler vectorizes the element loops. Integer work plus exactly rounded scalar float operations: the
// results are bit-identical on every target. Codes are produced in element order, then interleaved once per
// super-block.
//
// A SIMD target includes this header inside its `#pragma GCC target` region (so that the instantiations for
// its Ops are compiled for its instruction set) and names QuantUnpack<Ops> with an Ops type of its own
// namespace: instantiations for different targets must not share a name, or the linker would keep one.
#pragma once

#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstring>

#include "tandem/kernels/quant_layout.h"
#include "tandem/kernels/repack.h"
#include "tandem/tensor/blocks.h"
#include "tandem/tensor/fp16.h"

namespace tandem::kernels {

// The bit-level helpers a target hands to QuantUnpack, as static members of one type:
//  - half_to_float(h): f16 bits to f32, exact;
//  - nibbles32(qs, u): the 32 codes of a 4-bit block, low nibbles then high;
//  - fifth_bits32(qh, u): OR bit j of the 32-bit word at qh into code j as 16;
//  - interleave_groups(codes), interleave_blocks(codes): reorder 256 codes in place from element order to the
//    group order, or to the target's legacy order, of quant_layout.h;
//  - kBlockLanes: whether that legacy order is block lanes rather than block order;
//  - kK4BlockLanes: whether Q4_K and Q5_K are unpacked in block lanes (QuantKernels::k4_block_lanes).
template <class Ops>
concept UnpackOps = requires(const uint8_t* in, uint8_t* out, uint16_t h) {
  { Ops::half_to_float(h) } -> std::same_as<float>;
  Ops::nibbles32(in, out);
  Ops::fifth_bits32(in, out);
  Ops::interleave_groups(out);
  Ops::interleave_blocks(out);
  { Ops::kBlockLanes } -> std::convertible_to<bool>;
  { Ops::kK4BlockLanes } -> std::convertible_to<bool>;
};

template <UnpackOps Ops>
struct QuantUnpack {
  // Scale and offset of 16-element group g: weight = a * u + b.
  static void set_group(UnpackedSuper& s, int g, float a, float b) {
    s.a[g] = a;
    s.b[g] = b;
  }

  // Lane groups of block j (< 8) of a legacy super-block: 2j and 2j + 1 in block order, the one lane of the
  // block in block lanes (quant_layout.h).
  static int legacy_group(int j, int half) { return Ops::kBlockLanes ? kLaneBlock[j] : 2 * j + half; }
  static constexpr int kLegacyGroupsPerBlock = Ops::kBlockLanes ? 1 : 2;

  // Blocks first_block.. of a legacy super-block: zero codes, scales and offsets.
  static void zero_super(UnpackedSuper& s, int first_block) {
    std::memset(s.u + 32 * first_block, 0, static_cast<size_t>(kSuper - 32 * first_block));
    for (int j = first_block; j < 8; ++j)
      for (int h = 0; h < kLegacyGroupsPerBlock; ++h) set_group(s, legacy_group(j, h), 0.0f, 0.0f);
  }

  // 32-element blocks j of a legacy row go to super j / 8, elements 32 * (j % 8).., the lane groups of block
  // j % 8 (legacy_group; groups 8..15 stay zero in block lanes).
  // (Defined below the class, not inline: as an inline function GCC inlines its Q8_0 instances into
  // unpack_file_row, which changes the code of the AVX-512 targets' unpacking.)
  template <typename Block, typename Fn>
  static void unpack_legacy(const uint8_t* row, int64_t k, UnpackedSuper* out, Fn&& fn);

  // Scales and offsets (weight = a * u + b) of the 16 lane groups of a Q2_K super-block from its f16 scale
  // and minimum scale and its 4-bit group scales (low nibbles) and minimums (high nibbles).
  static void k2_groups(uint16_t dh, uint16_t mh, const uint8_t* sc, float* a, float* b) {
    const float d = Ops::half_to_float(dh), dmin = Ops::half_to_float(mh);
    for (int g = 0; g < kGroups; ++g) {
      a[g] = d * static_cast<float>(sc[g] & 0xF);
      b[g] = -(dmin * static_cast<float>(sc[g] >> 4));
    }
  }

  // The same for a Q3_K super-block from its f16 scale and its 12 bytes of packed 6-bit group scales (stored
  // plus 32); the codes' fixed offset is -4.
  static void k3_groups(uint16_t dh, const uint8_t* sc, float* a, float* b) {
    const float d = Ops::half_to_float(dh);
    int scale[kGroups];
    for (int g = 0; g < 8; ++g) {
      scale[g] = sc[g] & 0xF;
      scale[g + 8] = sc[g] >> 4;
    }
    for (int g = 0; g < kGroups; ++g) scale[g] |= ((sc[8 + g % 4] >> (2 * (g / 4))) & 3) << 4;
    for (int g = 0; g < kGroups; ++g) {
      a[g] = d * static_cast<float>(scale[g] - 32);
      b[g] = -4.0f * a[g];
    }
  }

  // Scales and offsets (weight = a * u + b) of the 16 lane groups of a Q4_K or Q5_K super-block (group order)
  // from its f16 scale d and minimum scale dmin and its 12 bytes of packed 6-bit sub-block scales and
  // minimums.
  static void k4_groups(uint16_t dh, uint16_t mh, const uint8_t* sc, float* a, float* b) {
    const float d = Ops::half_to_float(dh), dmin = Ops::half_to_float(mh);
    for (int j = 0; j < 8; ++j) {
      const ScaleMin sm = k4_scale_min(sc, j);
      const int scale = sm.scale, min = sm.min;
      a[2 * j] = a[2 * j + 1] = d * static_cast<float>(scale);
      b[2 * j] = b[2 * j + 1] = -(dmin * static_cast<float>(min));
    }
  }

  // Scales of the 16 lane groups of a Q6_K super-block from its f16 scale and signed 8-bit group scales (the
  // codes' fixed offset is -32, so b = -32a).
  static void k6_scales(uint16_t dh, const int8_t* sc, float* a) {
    const float d = Ops::half_to_float(dh);
    for (int g = 0; g < kGroups; ++g) a[g] = d * static_cast<float>(sc[g]);
  }

  static void unpack_file_row(DType type, const uint8_t* row, int64_t k, bool signed_q8, UnpackedSuper* out) {
    switch (type) {
      case DType::Q4_0:
        return unpack_legacy<BlockQ4_0>(row, k, out, [](const BlockQ4_0& b, uint8_t* u, float& a, float& o) {
          Ops::nibbles32(b.qs, u);
          a = Ops::half_to_float(b.d);
          o = -8.0f * a;
        });
      case DType::Q4_1:
        return unpack_legacy<BlockQ4_1>(row, k, out, [](const BlockQ4_1& b, uint8_t* u, float& a, float& o) {
          Ops::nibbles32(b.qs, u);
          a = Ops::half_to_float(b.d);
          o = Ops::half_to_float(b.m);
        });
      case DType::Q5_0:
        return unpack_legacy<BlockQ5_0>(row, k, out, [](const BlockQ5_0& b, uint8_t* u, float& a, float& o) {
          Ops::nibbles32(b.qs, u);
          Ops::fifth_bits32(b.qh, u);
          a = Ops::half_to_float(b.d);
          o = -16.0f * a;
        });
      case DType::Q5_1:
        return unpack_legacy<BlockQ5_1>(row, k, out, [](const BlockQ5_1& b, uint8_t* u, float& a, float& o) {
          Ops::nibbles32(b.qs, u);
          Ops::fifth_bits32(b.qh, u);
          a = Ops::half_to_float(b.d);
          o = Ops::half_to_float(b.m);
        });
      case DType::Q8_0:
        if (signed_q8)
          return unpack_legacy<BlockQ8_0>(row, k, out,
                                          [](const BlockQ8_0& b, uint8_t* u, float& a, float& o) {
                                            std::memcpy(u, b.qs, 32);
                                            a = Ops::half_to_float(b.d);
                                            o = 0.0f;
                                          });
        return unpack_legacy<BlockQ8_0>(row, k, out, [](const BlockQ8_0& b, uint8_t* u, float& a, float& o) {
          for (int l = 0; l < 32; ++l) u[l] = static_cast<uint8_t>(static_cast<uint8_t>(b.qs[l]) ^ 0x80);
          a = Ops::half_to_float(b.d);
          o = -128.0f * a;
        });
      default:
        break;
    }
    // K-quants: whole 256-element super-blocks.
    const int64_t ns = k / kSuper;
    for (int64_t i = 0; i < ns; ++i) {
      UnpackedSuper& s = out[i];
      uint8_t* __restrict u = s.u;
      switch (type) {
        case DType::Q2_K: {
          const auto& b = reinterpret_cast<const BlockQ2_K*>(row)[i];
          for (int h = 0; h < 2; ++h)
            for (int g = 0; g < 4; ++g)
              for (int l = 0; l < 32; ++l) u[128 * h + 32 * g + l] = (b.qs[32 * h + l] >> (2 * g)) & 3;
          k2_groups(b.d, b.dmin, b.scales, s.a, s.b);
          break;
        }
        case DType::Q3_K: {
          const auto& b = reinterpret_cast<const BlockQ3_K*>(row)[i];
          for (int h = 0; h < 2; ++h)
            for (int g = 0; g < 4; ++g)
              for (int l = 0; l < 32; ++l)
                u[128 * h + 32 * g + l] = static_cast<uint8_t>(((b.qs[32 * h + l] >> (2 * g)) & 3) |
                                                               (((b.hmask[l] >> (4 * h + g)) & 1) << 2));
          k3_groups(b.d, b.scales, s.a, s.b);
          break;
        }
        case DType::Q4_K:
        case DType::Q5_K: {
          const bool five = type == DType::Q5_K;
          const BlockQ5_K* b5 = reinterpret_cast<const BlockQ5_K*>(row) + i;
          const BlockQ4_K* b4 = reinterpret_cast<const BlockQ4_K*>(row) + i;
          const uint8_t* qs = five ? b5->qs : b4->qs;
          const uint8_t* sc = five ? b5->scales : b4->scales;
          const uint16_t dh = five ? b5->d : b4->d;
          const uint16_t mh = five ? b5->dmin : b4->dmin;
          for (int c = 0; c < 4; ++c)
            for (int l = 0; l < 32; ++l) {
              u[64 * c + l] = qs[32 * c + l] & 0x0F;
              u[64 * c + 32 + l] = qs[32 * c + l] >> 4;
            }
          if (five) {
            const uint8_t* qh = b5->qh;
            for (int c = 0; c < 8; ++c)
              for (int l = 0; l < 32; ++l) u[32 * c + l] |= static_cast<uint8_t>(((qh[l] >> c) & 1) << 4);
          }
          k4_groups(dh, mh, sc, s.a, s.b);
          break;
        }
        case DType::Q6_K: {
          const auto& b = reinterpret_cast<const BlockQ6_K*>(row)[i];
          for (int h = 0; h < 2; ++h)
            for (int l = 0; l < 32; ++l) {
              const uint8_t l0 = b.ql[64 * h + l], l1 = b.ql[64 * h + 32 + l], hb = b.qh[32 * h + l];
              u[128 * h + l] = static_cast<uint8_t>((l0 & 0xF) | ((hb & 3) << 4));
              u[128 * h + 32 + l] = static_cast<uint8_t>((l1 & 0xF) | (((hb >> 2) & 3) << 4));
              u[128 * h + 64 + l] = static_cast<uint8_t>((l0 >> 4) | (((hb >> 4) & 3) << 4));
              u[128 * h + 96 + l] = static_cast<uint8_t>((l1 >> 4) | (((hb >> 6) & 3) << 4));
            }
          k6_scales(b.d, b.scales, s.a);
          for (int g = 0; g < kGroups; ++g) s.b[g] = -32.0f * s.a[g];
          break;
        }
        default:
          std::memset(&s, 0, sizeof(s));
          break;
      }
      Ops::interleave_groups(s.u);
      if (Ops::kK4BlockLanes && (type == DType::Q4_K || type == DType::Q5_K)) k4_group_to_block_lanes(s);
    }
  }

  // Round half away from zero, as roundf, by exact integer and float steps (vectorizes on every target).
  static int32_t round_away(float v) {
    const int32_t t = static_cast<int32_t>(v);
    const float frac = v - static_cast<float>(t);
    return t + (frac >= 0.5f ? 1 : 0) - (frac <= -0.5f ? 1 : 0);
  }

  // Round to nearest (ties to even) of |v| < 2^22, by the float adder, as the reference's nearest_int.
  static int32_t round_even(float v) {
    const float shifted = v + 12582912.0f;
    int32_t bits;
    std::memcpy(&bits, &shifted, 4);
    return bits - 0x4B400000;
  }

  // Lane group g of an activation super: scale d and the sums of its codes (sum), scaled and as the offset
  // terms of each fold.
  static void set_act_group(ActSuper& s, int g, float d, int32_t sum) {
    s.d[g] = d;
    s.bs[g] = static_cast<float>(sum) * d;
    for (int f = 0; f < 3; ++f) s.offset_sums[f][g] = -(sum * (8 << (2 * f)));
  }

  // Scale and sums of one 32-element block of a per-256 super (group order: lane groups e0 / 16 and e0 / 16 +
  // 1) from the code sums of its two lane groups.
  static void set_block(ActSuper& s, int e0, float d, int32_t sum0, int32_t sum1) {
    set_act_group(s, e0 / 16, d, sum0);
    set_act_group(s, e0 / 16 + 1, d, sum1);
  }

  // Lane group g of an activation super: zero scale and sums.
  static void zero_act_group(ActSuper& s, int g) {
    s.d[g] = 0.0f;
    s.bs[g] = 0.0f;
    for (auto& sums : s.offset_sums) sums[g] = 0;
  }

  // The same for a block with per-32 scales in the target's legacy order, from the code sums of its
  // block-order lane groups (alternate 4-element runs): in block lanes, one lane group takes their sum, and
  // the groups past the eight lanes stay zero.
  static void set_legacy_block(ActSuper& s, int e0, float d, int32_t sum0, int32_t sum1) {
    if (!Ops::kBlockLanes) return set_block(s, e0, d, sum0, sum1);
    set_act_group(s, kLaneBlock[e0 / 32], d, sum0 + sum1);
    if (e0 == 0)
      for (int h = 8; h < kGroups; ++h) zero_act_group(s, h);
  }

  // Sums of one 32-element block with scale d, codes already in q[0..31] in element order: lane groups of 16
  // consecutive elements (group order) or per-32 ones in the legacy order.
  static void finish_block(ActSuper& s, int e0, float d, bool legacy) {
    int32_t sum[2] = {0, 0};
    for (int l = 0; l < 32; ++l) sum[legacy ? (l / 4) % 2 : l / 16] += s.q[e0 + l];
    if (legacy) return set_legacy_block(s, e0, d, sum[0], sum[1]);
    set_block(s, e0, d, sum[0], sum[1]);
  }

  // The rest of a partial last super-block (per-32 scales, the legacy order) from element e0 (a positive
  // multiple of 32, after set_legacy_block of block 0) on: zero codes and scales; then the interleave.
  static void finish_partial_super(ActSuper& s, int e0) {
    std::memset(s.q + e0, 0, static_cast<size_t>(kSuper - e0));
    for (int j = e0 / 32; j < 8; ++j)
      for (int h = 0; h < kLegacyGroupsPerBlock; ++h) zero_act_group(s, legacy_group(j, h));
    Ops::interleave_blocks(reinterpret_cast<uint8_t*>(s.q));
  }

  // The rest of a super in natural order (ActForm::kNatural: lane group b is block b) after its first
  // `blocks` blocks: zero codes, scales and sums.
  static void finish_natural_super(ActSuper& s, int blocks) {
    std::memset(s.q + 32 * blocks, 0, static_cast<size_t>(kSuper - 32 * blocks));
    for (int g = blocks; g < kGroups; ++g) zero_act_group(s, g);
  }

  // ActSuper::qb of n supers from their codes: q + 128, the same order.
  static void bias_codes(ActSuper* __restrict out, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
      for (int e = 0; e < kSuper; ++e) out[i].qb[e] = static_cast<uint8_t>(out[i].q[e] ^ 0x80);
  }

  // A pair of supers of per-32 activations, codes and scales in the target's legacy order -> lane pairs
  // (quant_layout.h): the codes moved, each block's scale to lane group b of the first super with the sums of
  // its 32 codes, every group of the second super zero. (Before bias_codes.)
  static void to_lane_pairs(ActSuper* pair) {
    constexpr CodeOrder kOrder = Ops::kBlockLanes ? CodeOrder::kBlockLanes : CodeOrder::kBlock;
    int8_t codes[2 * kSuper];
    float d[2 * 8];
    for (int e = 0; e < 2 * kSuper; ++e) codes[e] = pair[e / kSuper].q[code_position(e % kSuper, kOrder)];
    for (int b = 0; b < 16; ++b) d[b] = pair[b / 8].d[legacy_group(b % 8, 0)];
    for (int e = 0; e < 2 * kSuper; ++e) pair[lane_pair_super(e)].q[lane_pair_position(e)] = codes[e];
    for (int g = 0; g < kGroups; ++g) zero_act_group(pair[1], g);
    for (int b = 0; b < 16; ++b) {
      int32_t sum = 0;
      for (int l = 0; l < 32; ++l) sum += codes[32 * b + l];
      set_act_group(pair[0], b, d[b], sum);
    }
  }

  // ActForm::kBlocks: one scale per 32 elements, amax / 127 rounded to f16 and codes rounded half away from
  // zero (the reference's Q8_0 activations), in the target's legacy order (block order or block lanes);
  // kLanePairs the same in lane pairs (k a multiple of 512). kSupers: one scale per 256 elements mapping the
  // signed value of largest magnitude to -127 (the reference's Q8_K activations, used with K-quant weights),
  // in group order; a partial last super-block (legacy types only) takes per-32 scales in the legacy order.
  // kNatural: per-32 scales as kBlocks, in natural order.
  static void quantize_row_impl(const float* __restrict x, int64_t k, ActForm form,
                                ActSuper* __restrict out) {
    int64_t j = 0;                                    // 32-element blocks done
    const bool lanes = form == ActForm::kSuperLanes;  // per-256 scales in the legacy order
    if (form == ActForm::kSupers || lanes) {
      for (; (j + 8) * 32 <= k; j += 8) {
        ActSuper& s = out[j / 8];
        const float* __restrict xs = x + j * 32;
        float amax = 0.0f, max = 0.0f;
        for (int e = 0; e < kSuper; ++e) {
          const float ax = std::fabs(xs[e]);
          if (ax > amax) {
            amax = ax;
            max = xs[e];
          }
        }
        const float iscale = amax != 0.0f ? -127.0f / max : 0.0f;
        const float d = amax != 0.0f ? 1.0f / iscale : 0.0f;
        for (int e = 0; e < kSuper; ++e) {
          const int32_t c = round_even(iscale * xs[e]);
          s.q[e] = static_cast<int8_t>(c > 127 ? 127 : c);
        }
        for (int b = 0; b < 8; ++b) finish_block(s, 32 * b, d, lanes);
        if (lanes) {
          Ops::interleave_blocks(reinterpret_cast<uint8_t*>(s.q));
        } else {
          Ops::interleave_groups(reinterpret_cast<uint8_t*>(s.q));
        }
      }
    }
    const int64_t nb = k / 32;
    const bool natural = form == ActForm::kNatural;
    for (; j < nb; ++j) {
      ActSuper& s = out[j / 8];
      const int e0 = static_cast<int>(j % 8) * 32;
      const float* __restrict xb = x + j * 32;
      float amax = 0.0f;
      for (int l = 0; l < 32; ++l) amax = std::max(amax, std::fabs(xb[l]));
      const float d = amax / 127.0f;
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      int8_t* __restrict q = s.q + e0;
      for (int l = 0; l < 32; ++l) q[l] = static_cast<int8_t>(round_away(xb[l] * id));
      if (natural) {
        int32_t sum = 0;
        for (int l = 0; l < 32; ++l) sum += q[l];
        set_act_group(s, e0 / 32, Ops::half_to_float(f32_to_fp16(d)), sum);
        if (j % 8 == 7) finish_natural_super(s, 8);
        continue;
      }
      finish_block(s, e0, Ops::half_to_float(f32_to_fp16(d)), true);
      if (j % 8 == 7) Ops::interleave_blocks(reinterpret_cast<uint8_t*>(s.q));
    }
    if (nb % 8 != 0 && natural) finish_natural_super(out[nb / 8], static_cast<int>(nb % 8));
    if (nb % 8 != 0 && !natural) finish_partial_super(out[nb / 8], static_cast<int>(nb % 8) * 32);
    if (form == ActForm::kLanePairs)
      for (int64_t i = 0; i + 1 < super_count(k); i += 2) to_lane_pairs(out + i);
    bias_codes(out, super_count(k));
  }

  // Any row: a repacked one (repack.h) super-block by super-block (or pair by pair) through its file form,
  // its partial last super-block (if any) too.
  static void unpack_row_impl(DType type, WeightForm form, const uint8_t* row, int64_t k, bool signed_q8,
                              UnpackedSuper* out) {
    if (form == WeightForm::kFile) return unpack_file_row(type, row, k, signed_q8, out);
    if (form == WeightForm::kLanePairs) {
      uint8_t file_form[kMaxLanePairBytes];
      for (int64_t i = 0; i < k / (2 * kSuper); ++i) {
        lane_pair_to_file(type, row + static_cast<size_t>(i) * lane_pair_bytes(type), file_form);
        unpack_file_row(type, file_form, 2 * kSuper, signed_q8, out + 2 * i);
      }
      return;
    }
    const size_t sb = interleave_super_bytes(type);
    const int64_t whole = k / kSuper;
    uint8_t file_form[8 * sizeof(BlockQ8_0)];  // the largest interleaved super-block (Q8_0, then Q6_K)
    for (int64_t i = 0; i < whole; ++i) {
      deinterleave_super(type, row + static_cast<size_t>(i) * sb, file_form);
      unpack_file_row(type, file_form, kSuper, signed_q8, out + i);
    }
    if (k % kSuper != 0) {
      uint8_t padded[8 * sizeof(BlockQ8_0)];
      expand_tail(type, static_cast<int>(k % kSuper / 32), row + static_cast<size_t>(whole) * sb, padded);
      deinterleave_super(type, padded, file_form);
      unpack_file_row(type, file_form, k % kSuper, signed_q8, out + whole);
    }
  }
};

template <UnpackOps Ops>
template <typename Block, typename Fn>
void QuantUnpack<Ops>::unpack_legacy(const uint8_t* row, int64_t k, UnpackedSuper* out, Fn&& fn) {
  const int64_t nb = k / 32;
  const Block* blocks = reinterpret_cast<const Block*>(row);
  for (int64_t j = 0; j < nb; ++j) {
    UnpackedSuper& s = out[j / 8];
    const int e0 = static_cast<int>(j % 8) * 32;
    if (Ops::kBlockLanes && e0 == 0)
      for (int g = 8; g < kGroups; ++g) set_group(s, g, 0.0f, 0.0f);
    float a, b;
    fn(blocks[j], s.u + e0, a, b);
    for (int h = 0; h < kLegacyGroupsPerBlock; ++h) set_group(s, legacy_group(e0 / 32, h), a, b);
  }
  if (nb % 8 != 0) zero_super(out[nb / 8], static_cast<int>(nb % 8));
  for (int64_t i = 0; i < (nb + 7) / 8; ++i) Ops::interleave_blocks(out[i].u);
}

}  // namespace tandem::kernels
