// Quantized kernels for x86-64 CPUs with AVX-512 F/BW/VL and VNNI: quant_avx512.inc.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <type_traits>
#include <utility>

#include "tandem/kernels/quant_layout.h"
#include "tandem/kernels/repack.h"
#include "tandem/tensor/blocks.h"
#include "tandem/tensor/fp16.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
// GCC 12 reports its own _mm512_undefined_* placeholders inside the intrinsic headers as
// (maybe-)uninitialized.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")
#include <immintrin.h>

#include "tandem/kernels/quant_act_avx512.h"
#include "tandem/kernels/quant_direct_x86.h"
#include "tandem/kernels/quant_kquants_avx512.h"
#include "tandem/kernels/quant_lane_pairs_avx512.h"
#include "tandem/kernels/quant_legacy_avx512.h"
#include "tandem/kernels/quant_prefetch_avx512.h"
#include "tandem/kernels/quant_regs_avx512.h"
#include "tandem/kernels/quant_signed_avx512.h"
#include "tandem/kernels/quant_unpack.h"
#include "tandem/kernels/quant_x86_ops.h"

namespace tandem::kernels {
namespace avx512_target {

// The instruction set this copy of quant_avx512.inc is compiled for: no VBMI byte permutes.
struct Isa {
  static constexpr bool kVbmi = false;
};

#include "tandem/kernels/quant_avx512.inc"

}  // namespace avx512_target

const QuantKernels& quant_kernels_avx512() {
  return avx512_target::kernels();
}

}  // namespace tandem::kernels
#pragma GCC diagnostic pop
#pragma GCC pop_options

#else
namespace tandem::kernels {
const QuantKernels& quant_kernels_avx512() {
  return quant_kernels_scalar();
}
}  // namespace tandem::kernels
#endif
