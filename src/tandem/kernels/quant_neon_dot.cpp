// Quantized kernels for AArch64 CPUs with the dot-product extension (ARMv8.2 sdot): quant_neon_kernels.h.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>

#include "tandem/kernels/quant_layout.h"
#include "tandem/kernels/repack.h"
#include "tandem/tensor/blocks.h"
#include "tandem/tensor/fp16.h"

#if defined(__aarch64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod")
#include <arm_neon.h>

#include "tandem/kernels/quant_neon_kernels.h"

namespace tandem::kernels {

// The instruction set this variant's NeonKernels is compiled for: the dot-product extension (sdot).
struct NeonDot {
  static constexpr bool kDotProduct = true;
};

const QuantKernels& quant_kernels_neon_dot() {
  return NeonKernels<NeonDot>::table();
}

}  // namespace tandem::kernels
#pragma GCC pop_options

#else
namespace tandem::kernels {
const QuantKernels& quant_kernels_neon_dot() {
  return quant_kernels_scalar();
}
}  // namespace tandem::kernels
#endif
