// Highway implementations of ssm.h's steps; this file is compiled once per SIMD target (foreach_target).
// Vectors run over the channels: a channel's state rows, A and convolution weights are laid out channel-minor
// ([d_state, d_inner], [d_conv, d_inner]), so each load is contiguous and no lane waits on another. The last
// partial vector of a range goes through the same vector code on a padded copy, so a channel's bits depend
// only on its inputs, never on how the channels were split.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "tandem/kernels/ssm.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tandem/kernels/ssm.cpp"
// clang-format off
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"  // after highway.h: per-target include guards
#include "tandem/kernels/exp_non_positive.h"  // likewise
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace tandem::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
constexpr size_t kMaxLanes = HWY_MAX_BYTES / sizeof(float);

// `rest` lanes from p (all of them when kFull), the others zero.
template <bool kFull>
HWY_INLINE VF load(DF d, const float* p, size_t rest) {
  if constexpr (kFull) {
    (void)rest;
    return hn::LoadU(d, p);
  } else {
    alignas(64) float buf[kMaxLanes] = {};
    std::memcpy(buf, p, rest * sizeof(float));
    return hn::Load(d, buf);
  }
}

template <bool kFull>
HWY_INLINE void store(DF d, VF v, float* p, size_t rest) {
  if constexpr (kFull) {
    (void)rest;
    hn::StoreU(v, d, p);
  } else {
    alignas(64) float buf[kMaxLanes];
    hn::Store(v, d, buf);
    std::memcpy(p, buf, rest * sizeof(float));
  }
}

HWY_INLINE VF silu(DF d, VF v) {
  const VF e = hn::Exp(d, hn::Min(hn::Neg(v), hn::Set(d, 88.0f)));
  return hn::Div(v, hn::Add(hn::Set(d, 1.0f), e));
}

template <bool kFull>
HWY_INLINE void conv_chunk(const SsmConvArgs& a, int64_t i, size_t rest) {
  const DF d;
  const int64_t N = a.d_inner, K = a.d_conv;
  VF acc = load<kFull>(d, a.b + i, rest);
  for (int64_t k = 0; k + 1 < K; ++k)
    acc =
        hn::MulAdd(load<kFull>(d, a.w + k * N + i, rest), load<kFull>(d, a.state_in + k * N + i, rest), acc);
  const VF x = load<kFull>(d, a.x + i, rest);
  acc = hn::MulAdd(load<kFull>(d, a.w + (K - 1) * N + i, rest), x, acc);
  store<kFull>(d, silu(d, acc), a.y + i, rest);
  for (int64_t k = 0; k + 2 < K; ++k)
    store<kFull>(d, load<kFull>(d, a.state_in + (k + 1) * N + i, rest), a.state_out + k * N + i, rest);
  if (K > 1) store<kFull>(d, x, a.state_out + (K - 2) * N + i, rest);
}

// Channels a scan block holds in its local buffers. The state rows of one channel are d_inner floats apart
// (a page or more), so walking a vector's d_state rows one after another touches as many lines that share one
// cache set, and the other half of each line is evicted before the next vector reads it. A block walks each
// state row across all of its channels instead: every line is used whole, the rows stream in order, and each
// channel's operations stay exactly those of the per-channel order (the same bits).
constexpr int64_t kScanBlock = 64;

void scan_block(const SsmScanArgs& a, int64_t i0, int64_t i1) {
  const DF d;
  const auto L = static_cast<int64_t>(hn::Lanes(d));
  const int64_t N = a.d_inner;
  const int64_t n = i1 - i0;
  const int64_t n_vec = (n + L - 1) / L;
  const auto tail = static_cast<size_t>(n - (n_vec - 1) * L);  // lanes of the last vector
  alignas(64) float dt_buf[kScanBlock + kMaxLanes], xdt_buf[kScanBlock + kMaxLanes],
      sum_buf[kScanBlock + kMaxLanes];
  // The last vector goes through load<false>/store<false> (a padded copy) when it is partial.
  const auto for_vectors = [&](auto&& body) {
    for (int64_t v = 0; v + 1 < n_vec; ++v) body(std::true_type{}, v * L, static_cast<size_t>(L));
    if (tail == static_cast<size_t>(L))
      body(std::true_type{}, (n_vec - 1) * L, tail);
    else
      body(std::false_type{}, (n_vec - 1) * L, tail);
  };
  for_vectors([&](auto full, int64_t o, size_t rest) {
    constexpr bool kFull = decltype(full)::value;
    const VF raw = load<kFull>(d, a.dt + i0 + o, rest);
    const VF dt = hn::IfThenElse(hn::Gt(raw, hn::Set(d, 20.0f)), raw,
                                 hn::Log1p(d, hn::Exp(d, hn::Min(raw, hn::Set(d, 20.0f)))));
    hn::Store(dt, d, dt_buf + o);
    hn::Store(hn::Mul(load<kFull>(d, a.x + i0 + o, rest), dt), d, xdt_buf + o);
    hn::Store(hn::Zero(d), d, sum_buf + o);
  });
  for (int64_t s = 0; s < a.d_state; ++s) {
    const VF b = hn::Set(d, a.b[s]), c = hn::Set(d, a.c[s]);
    const float* state_in = a.state_in + s * N + i0;
    float* state_out = a.state_out + s * N + i0;
    const float* a_row = a.a + s * N + i0;
    for_vectors([&](auto full, int64_t o, size_t rest) {
      constexpr bool kFull = decltype(full)::value;
      // dt > 0 and A < 0: the decay's exponent is never positive.
      const VF decay = ExpNonPositive(d, hn::Mul(hn::Load(d, dt_buf + o), load<kFull>(d, a_row + o, rest)));
      const VF s1 =
          hn::MulAdd(load<kFull>(d, state_in + o, rest), decay, hn::Mul(b, hn::Load(d, xdt_buf + o)));
      store<kFull>(d, s1, state_out + o, rest);
      hn::Store(hn::MulAdd(s1, c, hn::Load(d, sum_buf + o)), d, sum_buf + o);
    });
  }
  for_vectors([&](auto full, int64_t o, size_t rest) {
    constexpr bool kFull = decltype(full)::value;
    const VF x = load<kFull>(d, a.x + i0 + o, rest);
    const VF y = hn::MulAdd(x, load<kFull>(d, a.d + i0 + o, rest), hn::Load(d, sum_buf + o));
    store<kFull>(d, hn::Mul(y, silu(d, load<kFull>(d, a.z + i0 + o, rest))), a.y + i0 + o, rest);
  });
}

void SsmConvStep(const SsmConvArgs& a, int64_t i0, int64_t i1) {
  const auto L = static_cast<int64_t>(hn::Lanes(DF()));
  int64_t i = i0;
  for (; i + L <= i1; i += L) conv_chunk<true>(a, i, static_cast<size_t>(L));
  if (i < i1) conv_chunk<false>(a, i, static_cast<size_t>(i1 - i));
}

void SsmScanStep(const SsmScanArgs& a, int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; i += kScanBlock) scan_block(a, i, std::min(i1, i + kScanBlock));
}

}  // namespace HWY_NAMESPACE
}  // namespace tandem::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tandem::kernels {

HWY_EXPORT(SsmConvStep);
HWY_EXPORT(SsmScanStep);

void ssm_conv_step(const SsmConvArgs& a, int64_t i0, int64_t i1) {
  HWY_DYNAMIC_DISPATCH(SsmConvStep)(a, i0, i1);
}

void ssm_scan_step(const SsmScanArgs& a, int64_t i0, int64_t i1) {
  HWY_DYNAMIC_DISPATCH(SsmScanStep)(a, i0, i1);
}

}  // namespace tandem::kernels
#endif  // HWY_ONCE
