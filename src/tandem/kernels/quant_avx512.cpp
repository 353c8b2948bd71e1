// Quantized kernels for x86-64 CPUs with AVX-512 F/BW/VL and VNNI: quant_avx512_kernels.h.
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

#include "tandem/kernels/quant_avx512_kernels.h"

namespace tandem::kernels {

// The instruction set this variant's Avx512Kernels is compiled for: no VBMI byte permutes.
struct Avx512Vnni {
  static constexpr bool kVbmi = false;
};

const QuantKernels& quant_kernels_avx512() {
  return Avx512Kernels<Avx512Vnni>::table();
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
