// The SIMD targets the kernels are compiled for, and the best one this CPU runs. Detection happens once (a
// function-local constant); kernels are chosen from it once per matmul or forward, never per element.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace tandem::kernels {

enum class Target {
  kScalar,      // portable C++: the reference every SIMD kernel is tested against
  kAVX2,        // x86-64 AVX2 + FMA + F16C
  kAVX2VNNI,    // the same with AVX-VNNI (vpdpbusd on 256-bit vectors: Intel cores without AVX-512)
  kAVX512,      // x86-64 AVX-512 F/BW/VL + VNNI
  kAVX512VBMI,  // the same with VBMI (byte permutes)
  kAMX,         // the same with AMX tiles and their 8-bit multiply-adds (Linux grants the tile state)
  kNEON,        // AArch64 Advanced SIMD (every AArch64 CPU)
  kNEONDot,     // AArch64 Advanced SIMD with the dot-product extension (ARMv8.2 sdot)
};

std::string_view target_name(Target t);
// The best target this CPU supports, or the one the environment variable TANDEM_KERNELS names (a
// target_name, to compare targets or to run as a CPU with fewer instructions would): read once, on the first
// call, which throws Error if it names no target this CPU runs. A named x86 target below AVX-512 also holds
// the float kernels (Highway's dispatch) to AVX2, and the scalar one holds them to the compiler's baseline.
Target best_target();
// Every target compiled in that this CPU can run, scalar first.
std::vector<Target> runnable_targets();
// Bytes of this CPU's level-1 data cache per core, as the C library reports it (32 KiB where it reports
// nothing). The window kernels size their passes by it (QuantKernels::direct_pass_rows).
int64_t l1_data_cache_bytes();
// Whether this CPU runs 512-bit vector operations as two 256-bit halves on its 256-bit pipes (AMD family
// 19h with AVX-512: Zen 4). Its window kernels are bound by those pipes, not by the L2 cache supplying their
// activations (QuantKernels::direct_pass_rows).
bool splits_512bit_ops();
// Whether the CPU is Intel's (false off x86-64). The x86 kernels prefetch as measured on Intel cores there
// (quant_avx2_kernels.h, quant_avx512_kernels.h), and as measured on AMD cores elsewhere.
bool intel_cpu();

}  // namespace tandem::kernels
