#include "tandem/kernels/cpu_target.h"

#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <string>

#include "hwy/targets.h"
#include "tandem/util/error.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif
#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#endif

#if defined(__aarch64__) && defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

namespace tandem::kernels {
namespace {

#if defined(__x86_64__) && defined(__GNUC__)
// AMX tiles with 8-bit multiply-adds (CPUID leaf 7: AMX-TILE and AMX-INT8), the tile state enabled by the
// system (XCR0 bits 17 and 18) and, on Linux, granted to this process (the tile data is not in a process's
// signal frame until it asks: arch_prctl ARCH_REQ_XCOMP_PERM). The grant is process-wide and idempotent.
bool amx_usable() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  if (((d >> 24) & 1) == 0 || ((d >> 25) & 1) == 0) return false;
  if (!__get_cpuid(1, &a, &b, &c, &d) || ((c >> 27) & 1) == 0) return false;  // OSXSAVE
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if (((lo >> 17) & 3) != 3) return false;
#if defined(__linux__)
  constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
  if (syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) != 0) return false;
#endif
  return true;
}
#endif

bool cpu_supports(Target t) {
  switch (t) {
    case Target::kScalar:
      return true;
#if defined(__x86_64__) && defined(__GNUC__)
    case Target::kAVX2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    case Target::kAVX2VNNI:
      return cpu_supports(Target::kAVX2) && __builtin_cpu_supports("avxvnni");
    case Target::kAVX512:
      return cpu_supports(Target::kAVX2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512vnni");
    case Target::kAVX512VBMI:
      return cpu_supports(Target::kAVX512) && __builtin_cpu_supports("avx512vbmi");
    case Target::kAMX:
      return cpu_supports(Target::kAVX512VBMI) && amx_usable();
#endif
#if defined(__aarch64__)
    case Target::kNEON:
      return true;
#endif
#if defined(__aarch64__) && defined(__linux__)
    case Target::kNEONDot:
      return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#elif defined(__aarch64__) && defined(__APPLE__)
    case Target::kNEONDot:
      return true;  // every Apple arm64 CPU has the dot-product extension
#endif
    default:
      return false;
  }
}

}  // namespace

std::string_view target_name(Target t) {
  switch (t) {
    case Target::kScalar:
      return "scalar";
    case Target::kAVX2:
      return "avx2";
    case Target::kAVX2VNNI:
      return "avx2-vnni";
    case Target::kAVX512:
      return "avx512-vnni";
    case Target::kAVX512VBMI:
      return "avx512-vnni-vbmi";
    case Target::kAMX:
      return "avx512-amx";
    case Target::kNEON:
      return "neon";
    case Target::kNEONDot:
      return "neon-dotprod";
  }
  return "?";
}

std::vector<Target> runnable_targets() {
  std::vector<Target> out;
  for (Target t : {Target::kScalar, Target::kAVX2, Target::kAVX2VNNI, Target::kAVX512, Target::kAVX512VBMI,
                   Target::kAMX, Target::kNEON, Target::kNEONDot})
    if (cpu_supports(t)) out.push_back(t);
  return out;
}

Target best_target() {
  static const Target best = [] {
    const std::vector<Target> runnable = runnable_targets();
    const char* named = std::getenv("TANDEM_KERNELS");
    if (named == nullptr || *named == '\0') return runnable.back();
    std::string want(named);  // in any case: AVX2 is avx2
    for (char& c : want) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    std::string names;
    for (Target t : runnable) {
      if (target_name(t) != want) {
        names += (names.empty() ? "" : ", ") + std::string(target_name(t));
        continue;
      }
      // The float kernels follow: no AVX-512 below it, no SIMD beyond the baseline for scalar.
      if (t == Target::kAVX2 || t == Target::kAVX2VNNI) hwy::DisableTargets(HWY_AVX3 | HWY_AVX3_DL);
      if (t == Target::kScalar) hwy::DisableTargets(~int64_t{0});
      return t;
    }
    throw Error("TANDEM_KERNELS=" + std::string(named) + " names no kernel target this CPU runs; it runs " +
                names + " (unset TANDEM_KERNELS for the best of them)");
  }();
  return best;
}

int64_t l1_data_cache_bytes() {
  static const int64_t bytes = [] {
#if defined(_SC_LEVEL1_DCACHE_SIZE)
    const long reported = sysconf(_SC_LEVEL1_DCACHE_SIZE);
    if (reported >= 4096) return static_cast<int64_t>(reported);
#endif
    return int64_t{32768};
  }();
  return bytes;
}

bool splits_512bit_ops() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool splits = cpu_supports(Target::kAVX512) && __builtin_cpu_is("amdfam19h");
  return splits;
#else
  return false;
#endif
}

bool intel_cpu() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool intel = __builtin_cpu_is("intel");
  return intel;
#else
  return false;
#endif
}

}  // namespace tandem::kernels
