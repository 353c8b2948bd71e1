// K-quant super-block formats (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, and Q8_K for activations): scalar reference
// dequantization and the reference quantizers (without an importance matrix) used to write model files.
//
// A super-block holds 256 elements in sub-blocks of 16 (Q2_K, Q3_K, Q6_K) or 32 (Q4_K, Q5_K) elements. Each
// sub-block has a small integer scale (and, for the asymmetric formats, a min) that is itself quantized
// against the super-block's f16 `d` (and `dmin`). The quantizers first fit a float scale (and min) per
// sub-block with a small search, quantize those to 4 or 6 bits, then re-derive every element's code from the
// rounded scales.
//
// Every expression keeps the reference's formula and operation order, so dequantized floats are bit-identical
// to the reference's portable C path and the quantizers make the same choices.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "tandem/tensor/blocks.h"
#include "tandem/tensor/fp16.h"

// Contracting a*b+c into a fused multiply-add (allowed by default in C++ when the target has FMA, e.g. with
// -march=native) would round differently from the reference formula; keep every product and sum separate.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace tandem::quant_impl {

namespace {

// Below this magnitude a group is treated as all zero.
constexpr float kGroupMaxEps = 1e-15f;

// Round to nearest, ties to even, the way the reference does it: adding 1.5 * 2^23 leaves the rounded integer
// in the low mantissa bits. Exact for |x| < 2^22, which holds for every call here (the arguments are codes
// and scale ratios of finite input); beyond that, or for NaN, it returns a meaningless value, as the
// reference does, but never invokes undefined behaviour.
inline int nearest_int(float x) {
  const float shifted = x + 12582912.0f;
  return (std::bit_cast<int32_t>(shifted) & 0x007FFFFF) - 0x00400000;
}

inline int clamp(int v, int lo, int hi) {
  return std::max(lo, std::min(hi, v));
}

// ---- Bit layouts.

// 2-bit codes (Q2_K, Q3_K): element e of a super-block sits in qs[32 * (e / 128) + e % 32] at bit
// 2 * ((e % 128) / 32): each 128-element half uses 32 bytes, one bit pair per group of 32 elements.
inline int crumb_byte(int e) {
  return 32 * (e / 128) + e % 32;
}
inline int crumb_shift(int e) {
  return 2 * ((e % 128) / 32);
}

// 4-bit codes (Q4_K, Q5_K): element e sits in qs[32 * (e / 64) + e % 32], low nibble for the first 32
// elements of each 64, high nibble for the next 32.
inline int nibble_byte(int e) {
  return 32 * (e / 64) + e % 32;
}
inline int nibble_shift(int e) {
  return 4 * ((e / 32) % 2);
}

// One extra bit per element (Q3_K hmask, Q5_K qh): element e sits in byte e % 32 at bit e / 32.
inline int bitplane_byte(int e) {
  return e % 32;
}
inline int bitplane_shift(int e) {
  return e / 32;
}

// Q6_K: low 4 bits of element e in ql[64 * h + 32 * (g % 2) + l], nibble g / 2, and high 2 bits in
// qh[32 * h + l] at bit 2 * g, where h = e / 128, g = (e % 128) / 32, l = e % 32.
inline int q6_low_byte(int e) {
  return 64 * (e / 128) + 32 * (((e % 128) / 32) % 2) + e % 32;
}
inline int q6_low_shift(int e) {
  return 4 * (((e % 128) / 32) / 2);
}
inline int q6_high_byte(int e) {
  return 32 * (e / 128) + e % 32;
}
inline int q6_high_shift(int e) {
  return 2 * ((e % 128) / 32);
}

// Q3_K: sixteen 6-bit scales (stored with +32 bias) in 12 bytes. The low 4 bits of scale j are nibble j / 8
// of byte j % 8; the high 2 bits are bits 2 * (j / 4) of byte 8 + j % 4. Returns the signed scale.
inline int q3k_scale(const uint8_t* scales, int j) {
  const int low = (scales[j % 8] >> (4 * (j / 8))) & 0xF;
  const int high = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (low | (high << 4)) - 32;
}
// Stores biased scale v (0..63) into zeroed scale bytes.
inline void set_q3k_scale(uint8_t* scales, int j, int v) {
  scales[j % 8] |= static_cast<uint8_t>((v & 0xF) << (4 * (j / 8)));
  scales[8 + j % 4] |= static_cast<uint8_t>((v >> 4) << (2 * (j / 4)));
}

// ---- Scale searches.

// Symmetric fit for n values with codes l in [-nmax, nmax - 1] (stored as l + nmax in L), minimizing the
// x^2-weighted squared error: start from the scale that maps the signed max to -nmax, try 18 nearby scales
// -(nmax + 0.1 * is) / max, and keep the least-squares scale of the best code assignment. Returns the scale.
float make_qx_quants(int n, int nmax, const float* x, int8_t* L) {
  float max = 0.0f;
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.0f;
  }
  float iscale = static_cast<float>(-nmax) / max;
  float sumlx = 0.0f;
  float suml2 = 0.0f;
  for (int i = 0; i < n; ++i) {
    const int l = clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1);
    L[i] = static_cast<int8_t>(l + nmax);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * static_cast<float>(l);
    suml2 += w * static_cast<float>(l) * static_cast<float>(l);
  }
  float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(is)) / max;
    sumlx = 0.0f;
    suml2 = 0.0f;
    for (int i = 0; i < n; ++i) {
      const int l = clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1);
      const float w = x[i] * x[i];
      sumlx += w * x[i] * static_cast<float>(l);
      suml2 += w * static_cast<float>(l) * static_cast<float>(l);
    }
    if (suml2 > 0.0f && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) {
        L[i] = static_cast<int8_t>(nmax + clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1));
      }
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Symmetric fit used by Q3_K: codes l in [-nmax, nmax - 1] (stored as l + nmax in L), starting from the scale
// that maps the signed max to -nmax, then up to 5 passes of coordinate descent that move one code at a time
// when that raises sumlx^2 / suml2 (i.e. lowers the x^2-weighted squared error). Returns the scale.
float make_q3_quants(int n, int nmax, const float* x, int8_t* L) {
  float max = 0.0f;
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.0f;
  }
  const float iscale = static_cast<float>(-nmax) / max;
  float sumlx = 0.0f;
  float suml2 = 0.0f;
  for (int i = 0; i < n; ++i) {
    const int l = clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1);
    L[i] = static_cast<int8_t>(l);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * static_cast<float>(l);
    suml2 += w * static_cast<float>(l) * static_cast<float>(l);
  }
  for (int itry = 0; itry < 5; ++itry) {
    int n_changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      const float li = static_cast<float>(L[i]);
      float slx = sumlx - w * x[i] * li;
      if (slx > 0.0f) {
        float sl2 = suml2 - w * li * li;
        const int new_l = clamp(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
        if (new_l != L[i]) {
          slx += w * x[i] * static_cast<float>(new_l);
          sl2 += w * static_cast<float>(new_l) * static_cast<float>(new_l);
          if (sl2 > 0.0f && slx * slx * suml2 > sumlx * sumlx * sl2) {
            L[i] = static_cast<int8_t>(new_l);
            sumlx = slx;
            suml2 = sl2;
            ++n_changed;
          }
        }
      }
    }
    if (n_changed == 0) break;
  }
  for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(L[i] + nmax);
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// Asymmetric fit for n <= 32 values: x ~ scale * l - the_min with codes l in [0, nmax] and the_min >= 0.
// Starts from the min/max range, then tries nstep + 1 scales (rmin + rdelta * is + nmax) / (max - min),
// solving a weighted least-squares problem for (scale, min) at each code assignment, and keeps the assignment
// with the lowest weighted error (absolute error when use_mad, squared otherwise). Returns the scale.
float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* the_min,
                       float rmin, float rdelta, int nstep, bool use_mad) {
  uint8_t Laux[32];
  float min = x[0];
  float max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0.0f) min = 0.0f;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *the_min = -min;
    return 0.0f;
  }
  float iscale = static_cast<float>(nmax) / (max - min);
  float scale = 1.0f / iscale;
  float best_error = 0.0f;
  for (int i = 0; i < n; ++i) {
    L[i] = static_cast<uint8_t>(clamp(nearest_int(iscale * (x[i] - min)), 0, nmax));
    float diff = scale * static_cast<float>(L[i]) + min - x[i];
    diff = use_mad ? std::fabs(diff) : diff * diff;
    best_error += weights[i] * diff;
  }
  if (nstep < 1) {
    *the_min = -min;
    return scale;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * static_cast<float>(is) + static_cast<float>(nmax)) / (max - min);
    float sum_l = 0.0f;
    float sum_l2 = 0.0f;
    float sum_xl = 0.0f;
    for (int i = 0; i < n; ++i) {
      const int l = clamp(nearest_int(iscale * (x[i] - min)), 0, nmax);
      Laux[i] = static_cast<uint8_t>(l);
      const float w = weights[i];
      const float lf = static_cast<float>(l);
      sum_l += w * lf;
      sum_l2 += w * lf * lf;
      sum_xl += w * lf * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0.0f) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0.0f) {
        this_min = 0.0f;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0.0f;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * static_cast<float>(Laux[i]) + this_min - x[i];
        diff = use_mad ? std::fabs(diff) : diff * diff;
        cur_error += weights[i] * diff;
      }
      if (cur_error < best_error) {
        for (int i = 0; i < n; ++i) L[i] = Laux[i];
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

// Q4_K/Q5_K share everything but the code width and the search parameters.
struct K4Params {
  int nmax;    // largest code: 15 (Q4_K) or 31 (Q5_K)
  float rmin;  // first scale step of the search
  int nstep;   // number of extra search steps (0.1 apart)
};

// Fills the scale bytes, d and dmin of one super-block and the codes L[0..255] (0..nmax).
template <typename Block>
void quantize_k4_scales_and_codes(const float* x, Block& b, uint8_t* L, const K4Params& p) {
  constexpr int kSub = kQKK / 32;
  float mins[kSub];
  float scales[kSub];
  float weights[32];
  float max_scale = 0.0f;  // scales are never negative: the min is subtracted first
  float max_min = 0.0f;
  for (int j = 0; j < kSub; ++j) {
    const float* xs = x + 32 * j;
    float sum_x2 = 0.0f;
    for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
    const float av_x = std::sqrt(sum_x2 / 32.0f);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(xs[l]);
    scales[j] = make_qkx2_quants(32, p.nmax, xs, weights, L + 32 * j, &mins[j], p.rmin, 0.1f, p.nstep, false);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }

  const float inv_scale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0.0f ? 63.0f / max_min : 0.0f;
  std::memset(b.scales, 0, sizeof(b.scales));
  for (int j = 0; j < kSub; ++j) {
    const uint8_t ls = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_scale * scales[j])));
    const uint8_t lm = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_min * mins[j])));
    set_k4_scale_min(b.scales, j, ls, lm);
  }
  b.d = f32_to_fp16(max_scale / 63.0f);
  b.dmin = f32_to_fp16(max_min / 63.0f);

  // Re-derive the codes from the rounded scales (a sub-block whose scale rounded to 0 keeps its search
  // codes).
  for (int j = 0; j < kSub; ++j) {
    const ScaleMin sm = k4_scale_min(b.scales, j);
    const float d = fp16_to_f32(b.d) * static_cast<float>(sm.scale);
    if (d == 0.0f) continue;
    const float dm = fp16_to_f32(b.dmin) * static_cast<float>(sm.min);
    for (int l = 0; l < 32; ++l) {
      L[32 * j + l] = static_cast<uint8_t>(clamp(nearest_int((x[32 * j + l] + dm) / d), 0, p.nmax));
    }
  }
}

}  // namespace

// ---- Q2_K: value = d * scale_j * q - dmin * min_j; q in 0..3, 4-bit scale and min per 16 elements.

void dequantize_q2_k(const BlockQ2_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQKK) {
    const BlockQ2_K& b = x[i];
    const float d = fp16_to_f32(b.d);
    const float min = fp16_to_f32(b.dmin);
    for (int j = 0; j < kQKK / 16; ++j) {
      const float dl = d * static_cast<float>(b.scales[j] & 0xF);
      const float ml = min * static_cast<float>(b.scales[j] >> 4);
      for (int e = 16 * j; e < 16 * j + 16; ++e) {
        const int q = (b.qs[crumb_byte(e)] >> crumb_shift(e)) & 3;
        y[e] = dl * static_cast<float>(q) - ml;
      }
    }
  }
}

void quantize_q2_k(const float* x, BlockQ2_K* y, int64_t nb) {
  constexpr int kSub = kQKK / 16;
  constexpr float kQ4Scale = 15.0f;
  for (int64_t i = 0; i < nb; ++i, x += kQKK) {
    BlockQ2_K& b = y[i];
    uint8_t L[kQKK];
    float mins[kSub];
    float scales[kSub];
    float weights[16];
    float max_scale = 0.0f;  // scales are never negative: the min is subtracted first
    float max_min = 0.0f;
    for (int j = 0; j < kSub; ++j) {
      for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
      scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], -0.5f, 0.1f, 15, true);
      if (scales[j] > max_scale) max_scale = scales[j];
      if (mins[j] > max_min) max_min = mins[j];
    }

    std::memset(b.scales, 0, sizeof(b.scales));
    if (max_scale > 0.0f) {
      const float iscale = kQ4Scale / max_scale;
      for (int j = 0; j < kSub; ++j) b.scales[j] = static_cast<uint8_t>(nearest_int(iscale * scales[j]));
      b.d = f32_to_fp16(max_scale / kQ4Scale);
    } else {
      b.d = f32_to_fp16(0.0f);
    }
    if (max_min > 0.0f) {
      const float iscale = kQ4Scale / max_min;
      for (int j = 0; j < kSub; ++j) b.scales[j] |= static_cast<uint8_t>(nearest_int(iscale * mins[j]) << 4);
      b.dmin = f32_to_fp16(max_min / kQ4Scale);
    } else {
      b.dmin = f32_to_fp16(0.0f);
    }

    // Re-derive the codes from the rounded scales (a sub-block whose scale rounded to 0 keeps its search
    // codes).
    for (int j = 0; j < kSub; ++j) {
      const float d = fp16_to_f32(b.d) * static_cast<float>(b.scales[j] & 0xF);
      if (d == 0.0f) continue;
      const float dm = fp16_to_f32(b.dmin) * static_cast<float>(b.scales[j] >> 4);
      for (int l = 0; l < 16; ++l) {
        L[16 * j + l] = static_cast<uint8_t>(clamp(nearest_int((x[16 * j + l] + dm) / d), 0, 3));
      }
    }

    std::memset(b.qs, 0, sizeof(b.qs));
    for (int e = 0; e < kQKK; ++e) b.qs[crumb_byte(e)] |= static_cast<uint8_t>(L[e] << crumb_shift(e));
  }
}

// ---- Q3_K: value = d * scale_j * (q - 4); q in 0..7 (2 bits in qs, third bit in hmask), signed 6-bit scale
// per 16 elements.

void dequantize_q3_k(const BlockQ3_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQKK) {
    const BlockQ3_K& b = x[i];
    const float d_all = fp16_to_f32(b.d);
    for (int j = 0; j < kQKK / 16; ++j) {
      const float dl = d_all * static_cast<float>(q3k_scale(b.scales, j));
      for (int e = 16 * j; e < 16 * j + 16; ++e) {
        const int low = (b.qs[crumb_byte(e)] >> crumb_shift(e)) & 3;
        const bool high = ((b.hmask[bitplane_byte(e)] >> bitplane_shift(e)) & 1) != 0;
        y[e] = dl * static_cast<float>(low - (high ? 0 : 4));
      }
    }
  }
}

void quantize_q3_k(const float* x, BlockQ3_K* y, int64_t nb) {
  constexpr int kSub = kQKK / 16;
  for (int64_t i = 0; i < nb; ++i, x += kQKK) {
    BlockQ3_K& b = y[i];
    int8_t L[kQKK];
    float scales[kSub];
    float max_scale = 0.0f;  // the signed scale of largest magnitude
    float amax = 0.0f;
    for (int j = 0; j < kSub; ++j) {
      scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j);
      const float scale = std::fabs(scales[j]);
      if (scale > amax) {
        amax = scale;
        max_scale = scales[j];
      }
    }

    std::memset(b.scales, 0, sizeof(b.scales));
    if (max_scale != 0.0f) {
      const float iscale = -32.0f / max_scale;
      for (int j = 0; j < kSub; ++j) {
        const int8_t l = static_cast<int8_t>(nearest_int(iscale * scales[j]));
        set_q3k_scale(b.scales, j, clamp(l, -32, 31) + 32);
      }
      b.d = f32_to_fp16(1.0f / iscale);
    } else {
      b.d = f32_to_fp16(0.0f);
    }

    // Re-derive the codes from the rounded scales (a sub-block whose scale rounded to 0 keeps its search
    // codes).
    for (int j = 0; j < kSub; ++j) {
      const float d = fp16_to_f32(b.d) * static_cast<float>(q3k_scale(b.scales, j));
      if (d == 0.0f) continue;
      for (int l = 0; l < 16; ++l) {
        L[16 * j + l] = static_cast<int8_t>(clamp(nearest_int(x[16 * j + l] / d), -4, 3) + 4);
      }
    }

    std::memset(b.hmask, 0, sizeof(b.hmask));
    std::memset(b.qs, 0, sizeof(b.qs));
    for (int e = 0; e < kQKK; ++e) {
      int q = L[e];
      if (q > 3) {
        b.hmask[bitplane_byte(e)] |= static_cast<uint8_t>(1 << bitplane_shift(e));
        q -= 4;
      }
      b.qs[crumb_byte(e)] |= static_cast<uint8_t>(q << crumb_shift(e));
    }
  }
}

// ---- Q4_K: value = d * scale_j * q - dmin * min_j; q in 0..15, 6-bit scale and min per 32 elements.

void dequantize_q4_k(const BlockQ4_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQKK) {
    const BlockQ4_K& b = x[i];
    const float d = fp16_to_f32(b.d);
    const float min = fp16_to_f32(b.dmin);
    for (int j = 0; j < kQKK / 32; ++j) {
      const ScaleMin sm = k4_scale_min(b.scales, j);
      const float d1 = d * static_cast<float>(sm.scale);
      const float m1 = min * static_cast<float>(sm.min);
      for (int e = 32 * j; e < 32 * j + 32; ++e) {
        const int q = (b.qs[nibble_byte(e)] >> nibble_shift(e)) & 0xF;
        y[e] = d1 * static_cast<float>(q) - m1;
      }
    }
  }
}

void quantize_q4_k(const float* x, BlockQ4_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQKK) {
    BlockQ4_K& b = y[i];
    uint8_t L[kQKK];
    quantize_k4_scales_and_codes(x, b, L, K4Params{15, -1.0f, 20});
    std::memset(b.qs, 0, sizeof(b.qs));
    for (int e = 0; e < kQKK; ++e) b.qs[nibble_byte(e)] |= static_cast<uint8_t>(L[e] << nibble_shift(e));
  }
}

// ---- Q5_K: as Q4_K with q in 0..31 (fifth bit in qh).

void dequantize_q5_k(const BlockQ5_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQKK) {
    const BlockQ5_K& b = x[i];
    const float d = fp16_to_f32(b.d);
    const float min = fp16_to_f32(b.dmin);
    for (int j = 0; j < kQKK / 32; ++j) {
      const ScaleMin sm = k4_scale_min(b.scales, j);
      const float d1 = d * static_cast<float>(sm.scale);
      const float m1 = min * static_cast<float>(sm.min);
      for (int e = 32 * j; e < 32 * j + 32; ++e) {
        const int low = (b.qs[nibble_byte(e)] >> nibble_shift(e)) & 0xF;
        const int high = (b.qh[bitplane_byte(e)] >> bitplane_shift(e)) & 1;
        y[e] = d1 * static_cast<float>(low + (high ? 16 : 0)) - m1;
      }
    }
  }
}

void quantize_q5_k(const float* x, BlockQ5_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQKK) {
    BlockQ5_K& b = y[i];
    uint8_t L[kQKK];
    quantize_k4_scales_and_codes(x, b, L, K4Params{31, -0.5f, 15});
    std::memset(b.qh, 0, sizeof(b.qh));
    std::memset(b.qs, 0, sizeof(b.qs));
    for (int e = 0; e < kQKK; ++e) {
      int q = L[e];
      if (q > 15) {
        b.qh[bitplane_byte(e)] |= static_cast<uint8_t>(1 << bitplane_shift(e));
        q -= 16;
      }
      b.qs[nibble_byte(e)] |= static_cast<uint8_t>(q << nibble_shift(e));
    }
  }
}

// ---- Q6_K: value = d * scale_j * (q - 32); q in 0..63 (4 bits in ql, 2 in qh), int8 scale per 16 elements.

void dequantize_q6_k(const BlockQ6_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQKK) {
    const BlockQ6_K& b = x[i];
    const float d = fp16_to_f32(b.d);
    for (int j = 0; j < kQKK / 16; ++j) {
      const float sc = static_cast<float>(b.scales[j]);
      for (int e = 16 * j; e < 16 * j + 16; ++e) {
        const int low = (b.ql[q6_low_byte(e)] >> q6_low_shift(e)) & 0xF;
        const int high = (b.qh[q6_high_byte(e)] >> q6_high_shift(e)) & 3;
        y[e] = d * sc * static_cast<float>((low | (high << 4)) - 32);
      }
    }
  }
}

void quantize_q6_k(const float* x, BlockQ6_K* y, int64_t nb) {
  constexpr int kSub = kQKK / 16;
  for (int64_t i = 0; i < nb; ++i, x += kQKK) {
    BlockQ6_K& b = y[i];
    int8_t L[kQKK];
    float scales[kSub];
    float max_scale = 0.0f;  // the signed scale of largest magnitude
    float max_abs_scale = 0.0f;
    for (int j = 0; j < kSub; ++j) {
      scales[j] = make_qx_quants(16, 32, x + 16 * j, L + 16 * j);
      const float abs_scale = std::fabs(scales[j]);
      if (abs_scale > max_abs_scale) {
        max_abs_scale = abs_scale;
        max_scale = scales[j];
      }
    }
    if (max_abs_scale < kGroupMaxEps) {
      std::memset(&b, 0, sizeof(b));
      continue;
    }

    const float iscale = -128.0f / max_scale;
    b.d = f32_to_fp16(1.0f / iscale);
    for (int j = 0; j < kSub; ++j)
      b.scales[j] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scales[j])));

    // Re-derive the codes from the rounded scales (a sub-block whose scale rounded to 0 keeps its search
    // codes).
    for (int j = 0; j < kSub; ++j) {
      const float d = fp16_to_f32(b.d) * static_cast<float>(b.scales[j]);
      if (d == 0.0f) continue;
      for (int l = 0; l < 16; ++l) {
        L[16 * j + l] = static_cast<int8_t>(clamp(nearest_int(x[16 * j + l] / d), -32, 31) + 32);
      }
    }

    std::memset(b.ql, 0, sizeof(b.ql));
    std::memset(b.qh, 0, sizeof(b.qh));
    for (int e = 0; e < kQKK; ++e) {
      b.ql[q6_low_byte(e)] |= static_cast<uint8_t>((L[e] & 0xF) << q6_low_shift(e));
      b.qh[q6_high_byte(e)] |= static_cast<uint8_t>((L[e] >> 4) << q6_high_shift(e));
    }
  }
}

// ---- Q8_K (activations): value = d * q; f32 d, q in -127..127, bsums = sums of each 16 codes.

void dequantize_q8_k(const BlockQ8_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQKK) {
    for (int e = 0; e < kQKK; ++e) y[e] = x[i].d * static_cast<float>(x[i].qs[e]);
  }
}

// d = -max / 127 for the signed value of largest magnitude, so that value maps to -127 exactly.
void quantize_q8_k(const float* x, BlockQ8_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQKK) {
    BlockQ8_K& b = y[i];
    float max = 0.0f;
    float amax = 0.0f;
    for (int e = 0; e < kQKK; ++e) {
      const float ax = std::fabs(x[e]);
      if (ax > amax) {
        amax = ax;
        max = x[e];
      }
    }
    if (amax == 0.0f) {
      // The reference leaves bsums untouched here; zero them, which is what they sum to.
      std::memset(&b, 0, sizeof(b));
      continue;
    }
    const float iscale = -127.0f / max;
    for (int e = 0; e < kQKK; ++e) b.qs[e] = static_cast<int8_t>(std::min(127, nearest_int(iscale * x[e])));
    for (int j = 0; j < kQKK / 16; ++j) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += b.qs[16 * j + l];
      b.bsums[j] = static_cast<int16_t>(sum);
    }
    b.d = 1.0f / iscale;
  }
}

}  // namespace tandem::quant_impl
