// Quantized kernels for x86-64 CPUs with AVX2, FMA and F16C: quant_avx2_kernels.h.
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

#include "tandem/kernels/quant_avx2_kernels.h"

namespace tandem::kernels {

// The instruction set this target's Avx2Kernels is compiled for: plain AVX2: vpmaddubsw and vpmaddwd.
struct Avx2Plain {
  static constexpr bool kVnni = false;
};

const QuantKernels& quant_kernels_avx2() {
  return Avx2Kernels<Avx2Plain>::table();
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
