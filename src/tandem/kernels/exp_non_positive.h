// e^x for x <= 0 on Highway vectors, in fewer operations than hn::Exp (which also serves positive and huge
// arguments): the softmax's exponentials (scores less their max) and the selective scan's decays
// (exp(dt * A) with dt > 0 and A < 0). A per-target header: include it after hwy/highway.h in a file compiled
// once per SIMD target (foreach_target); its guard toggles with HWY_TARGET_TOGGLE so that every target gets
// its own copy.
#if defined(TANDEM_KERNELS_EXP_NON_POSITIVE_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TANDEM_KERNELS_EXP_NON_POSITIVE_H_
#undef TANDEM_KERNELS_EXP_NON_POSITIVE_H_
#else
#define TANDEM_KERNELS_EXP_NON_POSITIVE_H_
#endif

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace tandem::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// n = round(x log2 e) by the shifter 1.5 * 2^23 (t's low mantissa bits hold n), r = x - n ln 2 in two steps,
// e^r = 1 + r + r^2 P(r) with hn::Exp's coefficients (Horner), and 2^n built in the exponent field from t's
// bits. Below -87 (2^n would leave the normal floats) the result is 0; above it e^r >= 0.7 and n >= -126 keep
// every result normal (denormals would cost microcode assists). Each lane depends only on its own argument.
template <class D, class V>
HWY_INLINE V ExpNonPositive(D d, V x) {
  const hn::RebindToSigned<D> di;
  const V shifter = hn::Set(d, 12582912.0f);
  const V t = hn::MulAdd(x, hn::Set(d, 1.44269504088896341f), shifter);
  const V n = hn::Sub(t, shifter);
  V r = hn::MulAdd(n, hn::Set(d, -0.693145751953125f), x);
  r = hn::MulAdd(n, hn::Set(d, -1.428606765330187045e-6f), r);
  V p = hn::Set(d, 0.000198527617612853646278381f);
  p = hn::MulAdd(p, r, hn::Set(d, 0.00139304355252534151077271f));
  p = hn::MulAdd(p, r, hn::Set(d, 0.00833336077630519866943359f));
  p = hn::MulAdd(p, r, hn::Set(d, 0.0416664853692054748535156f));
  p = hn::MulAdd(p, r, hn::Set(d, 0.166666671633720397949219f));
  p = hn::MulAdd(p, r, hn::Set(d, 0.5f));
  const V er = hn::Add(hn::MulAdd(p, hn::Mul(r, r), r), hn::Set(d, 1.0f));
  const V two_n = hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(hn::BitCast(di, t), hn::Set(di, 127))));
  return hn::IfThenElseZero(hn::Ge(x, hn::Set(d, -87.0f)), hn::Mul(er, two_n));
}

}  // namespace HWY_NAMESPACE
}  // namespace tandem::kernels
HWY_AFTER_NAMESPACE();

#endif  // TANDEM_KERNELS_EXP_NON_POSITIVE_H_
