// Run-time CPU feature detection and the project's one SIMD dispatch scheme.
//
// The scheme. Every library and binary is compiled for the x86-64 baseline, so it runs on any
// x86-64 CPU. A vectorised kernel family is a table (or a set of functions) per SimdLevel:
//   - vector code lives in functions carrying AMPSCOPE_TARGET_AVX2 or AMPSCOPE_TARGET_AVX512
//     (helpers they call carry the AMPSCOPE_INLINE_* form, or are plain always-inline code that
//     the target function inlines and compiles for its own level);
//   - the level's table or function is chosen once with active_simd_level() (or an explicit,
//     clamped level that tests and benchmarks pass), never with target_clones or a
//     hand-written CPUID check,
// so AMPSCOPE_SIMD caps every kernel of the project, and a test can run each level the CPU has
// against the scalar path. The attributes name the exact feature sets that max_supported_
// simd_level() checks for, so a function of a level only ever runs on a CPU with that level.
//
// AMPSCOPE_SIMD=scalar|avx2|avx512 in the environment caps the level (tests and benchmarks use
// it to compare paths; it never raises the level above what the CPU has).
// Thread safety: detection runs once (function-local static); all functions are thread-safe.
#pragma once

#include <string_view>

// The target attributes of the two vector levels (GCC and clang). The AVX2 level needs
// AVX2+FMA+F16C+BMI2 (+POPCNT, which every such CPU has); AVX-512 adds F/BW/VL/DQ.
#define AMPSCOPE_TARGET_AVX2 __attribute__((target("avx2,fma,f16c,bmi2,popcnt")))
#define AMPSCOPE_TARGET_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,bmi2,popcnt")))
// The same for small helpers that must be inlined into their level's kernels.
#define AMPSCOPE_INLINE_AVX2 \
  __attribute__((target("avx2,fma,f16c,bmi2,popcnt"), always_inline)) inline
#define AMPSCOPE_INLINE_AVX512                                                           \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,bmi2,popcnt"), \
                 always_inline)) inline
// Level-neutral code (a loop body written once in plain C++ or GCC vector types) that each
// level's target function inlines, so the compiler vectorises it for that level.
#define AMPSCOPE_ALWAYS_INLINE __attribute__((always_inline)) inline

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
