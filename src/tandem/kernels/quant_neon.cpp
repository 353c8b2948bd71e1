// Quantized kernels for every AArch64 CPU (Advanced SIMD without the dot-product extension):
// quant_neon_kernels.h.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>

#include "tandem/kernels/quant_layout.h"
#include "tandem/kernels/repack.h"
#include "tandem/tensor/blocks.h"
#include "tandem/tensor/fp16.h"

#if defined(__aarch64__) && defined(__GNUC__)
#include <arm_neon.h>

#include "tandem/kernels/quant_neon_kernels.h"

namespace tandem::kernels {

// The instruction set this variant's NeonKernels is compiled for: Advanced SIMD without sdot.
struct NeonPlain {
  static constexpr bool kDotProduct = false;
};

const QuantKernels& quant_kernels_neon() {
  return NeonKernels<NeonPlain>::table();
}

}  // namespace tandem::kernels

#else
namespace tandem::kernels {
const QuantKernels& quant_kernels_neon() {
  return quant_kernels_scalar();
}
}  // namespace tandem::kernels
#endif
