#include "ampscope/cpu_features.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <cstdlib>
#include <string>

namespace ampscope {
namespace {

CpuFeatures detect() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
#if defined(__clang__) && __clang_major__ < 18
  // clang before 18 has no "f16c" for __builtin_cpu_supports: CPUID leaf 1, ECX bit 29.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  f.f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
#else
  f.f16c = __builtin_cpu_supports("f16c");
#endif
  f.bmi2 = __builtin_cpu_supports("bmi2");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512dq = __builtin_cpu_supports("avx512dq");
#endif
  return f;
}

SimdLevel env_cap() {
  const char* v = std::getenv("AMPSCOPE_SIMD");
  if (v == nullptr) return SimdLevel::kAvx512;
  const std::string s(v);
  if (s == "scalar") return SimdLevel::kScalar;
  if (s == "avx2") return SimdLevel::kAvx2;
  return SimdLevel::kAvx512;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

SimdLevel max_supported_simd_level() {
  const CpuFeatures& f = cpu_features();
  const bool avx2 = f.avx2 && f.fma && f.f16c && f.bmi2;
  if (avx2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq) return SimdLevel::kAvx512;
  if (avx2) return SimdLevel::kAvx2;
  return SimdLevel::kScalar;
}

SimdLevel clamp_simd_level(SimdLevel requested) {
  const SimdLevel max = max_supported_simd_level();
  return static_cast<int>(requested) < static_cast<int>(max) ? requested : max;
}

SimdLevel active_simd_level() {
  static const SimdLevel level = clamp_simd_level(env_cap());
  return level;
}

std::string_view simd_level_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar:
      return "scalar";
    case SimdLevel::kAvx2:
      return "avx2";
    case SimdLevel::kAvx512:
      return "avx512";
  }
  return "unknown";
}

}  // namespace ampscope
