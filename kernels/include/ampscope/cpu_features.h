// Run-time CPU feature detection for the vectorised kernels. The library is compiled for the
// x86-64 baseline; AVX2/F16C and AVX-512 code lives in functions with a target attribute and is
// only called when the running CPU has those features.
//
// AMPSCOPE_SIMD=scalar|avx2|avx512 in the environment caps the level (tests and benchmarks use
// it to compare paths; it never raises the level above what the CPU has).
// Thread safety: detection runs once (function-local static); all functions are thread-safe.
#pragma once

#include <string_view>

namespace ampscope {

enum class SimdLevel { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool bmi2 = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
};

const CpuFeatures& cpu_features();

// Highest level the CPU supports (AVX2 needs AVX2+FMA+F16C+BMI2; AVX-512 needs F/BW/VL/DQ too).
SimdLevel max_supported_simd_level();

// The level the dispatched kernels use: the supported maximum, capped by AMPSCOPE_SIMD.
SimdLevel active_simd_level();

// Clamps a requested level to what the CPU supports.
SimdLevel clamp_simd_level(SimdLevel requested);

std::string_view simd_level_name(SimdLevel level);

}  // namespace ampscope
