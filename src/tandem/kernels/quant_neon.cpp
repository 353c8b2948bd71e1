// Quantized kernels for every AArch64 CPU (Advanced SIMD without the dot-product extension): quant_neon.inc.
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

#include "tandem/kernels/quant_plain_ops.h"
#include "tandem/kernels/quant_unpack.h"

namespace tandem::kernels {
namespace neon_target {

constexpr bool kDotProduct = false;
#include "tandem/kernels/quant_neon.inc"

}  // namespace neon_target

const QuantKernels& quant_kernels_neon() {
  return neon_target::kernels();
}

}  // namespace tandem::kernels

#else
namespace tandem::kernels {
const QuantKernels& quant_kernels_neon() {
  return quant_kernels_scalar();
}
}  // namespace tandem::kernels
#endif
