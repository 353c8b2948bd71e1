// Quantized kernels for AArch64 CPUs with the dot-product extension (ARMv8.2 sdot): quant_neon.inc.
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

#include "tandem/kernels/quant_plain_ops.h"
#include "tandem/kernels/quant_unpack.h"

namespace tandem::kernels {
namespace neon_dot_target {

constexpr bool kDotProduct = true;
#include "tandem/kernels/quant_neon.inc"

}  // namespace neon_dot_target

const QuantKernels& quant_kernels_neon_dot() {
  return neon_dot_target::kernels();
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
