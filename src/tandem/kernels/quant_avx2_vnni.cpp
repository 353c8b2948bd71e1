// Quantized kernels for x86-64 CPUs with AVX2 and AVX-VNNI (vpdpbusd on 256-bit vectors, without AVX-512):
// quant_avx2.inc.
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
#pragma GCC target("avx2,fma,f16c,avxvnni")
#include <immintrin.h>

#include "tandem/kernels/quant_direct_x86.h"
#include "tandem/kernels/quant_kquants_avx2.h"
#include "tandem/kernels/quant_legacy_avx2.h"
#include "tandem/kernels/quant_regs_avx2.h"
#include "tandem/kernels/quant_unpack.h"
#include "tandem/kernels/quant_x86_ops.h"

namespace tandem::kernels {
namespace avx2_vnni_target {

// The instruction set this copy of quant_avx2.inc is compiled for: AVX-VNNI: vpdpbusd.
struct Isa {
  static constexpr bool kVnni = true;
};

#include "tandem/kernels/quant_avx2.inc"

}  // namespace avx2_vnni_target

const QuantKernels& quant_kernels_avx2_vnni() {
  return avx2_vnni_target::kernels();
}

}  // namespace tandem::kernels
#pragma GCC pop_options

#else
namespace tandem::kernels {
const QuantKernels& quant_kernels_avx2_vnni() {
  return quant_kernels_scalar();
}
}  // namespace tandem::kernels
#endif
