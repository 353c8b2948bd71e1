#include "tandem/kernels/cpu_target.h"

#include <unistd.h>

#if defined(__aarch64__) && defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

namespace tandem::kernels {
namespace {

bool cpu_supports(Target t) {
  switch (t) {
    case Target::kScalar:
      return true;
#if defined(__x86_64__) && defined(__GNUC__)
    case Target::kAVX2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    case Target::kAVX512:
      return cpu_supports(Target::kAVX2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512vnni");
    case Target::kAVX512VBMI:
      return cpu_supports(Target::kAVX512) && __builtin_cpu_supports("avx512vbmi");
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
    case Target::kAVX512:
      return "avx512-vnni";
    case Target::kAVX512VBMI:
      return "avx512-vnni-vbmi";
    case Target::kNEON:
      return "neon";
    case Target::kNEONDot:
      return "neon-dotprod";
  }
  return "?";
}

std::vector<Target> runnable_targets() {
  std::vector<Target> out;
  for (Target t : {Target::kScalar, Target::kAVX2, Target::kAVX512, Target::kAVX512VBMI, Target::kNEON,
                   Target::kNEONDot})
    if (cpu_supports(t)) out.push_back(t);
  return out;
}

Target best_target() {
  static const Target best = runnable_targets().back();
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

}  // namespace tandem::kernels
