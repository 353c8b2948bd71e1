// Quantized kernels for x86-64 CPUs with AVX2, FMA and F16C: quant_avx2.inc.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "tandem/kernels/quant_layout.h"
#include "tandem/kernels/repack.h"
#include "tandem/tensor/blocks.h"
#include "tandem/tensor/fp16.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include "tandem/kernels/quant_direct_x86.h"
#include "tandem/kernels/quant_kquants_avx2.h"
#include "tandem/kernels/quant_legacy_avx2.h"
#include "tandem/kernels/quant_regs_avx2.h"
#include "tandem/kernels/quant_unpack.h"
#include "tandem/kernels/quant_x86_ops.h"

namespace tandem::kernels {
namespace avx2_target {

// The instruction set this copy of quant_avx2.inc is compiled for: plain AVX2: vpmaddubsw and vpmaddwd.
struct Isa {
  static constexpr bool kVnni = false;
};

#include "tandem/kernels/quant_avx2.inc"

}  // namespace avx2_target

const QuantKernels& quant_kernels_avx2() {
  return avx2_target::kernels();
}

}  // namespace tandem::kernels
#pragma GCC pop_options

#else
namespace tandem::kernels {
const QuantKernels& quant_kernels_avx2() {
  return quant_kernels_scalar();
}
}  // namespace tandem::kernels
#endif
