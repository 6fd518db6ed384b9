// The vector toolkit of the layers' tuned CPU versions, and how they are compiled per SIMD level.
//
// A kernel body is written once, as an always-inline function on 16-lane GCC vector types (V:
// lowered to 1 zmm, 2 ymm or 4 xmm registers), and compiled three times by at_level<&body>():
// for the x86-64 baseline and inside functions carrying the project's AMPSCOPE_TARGET_AVX2 /
// AMPSCOPE_TARGET_AVX512 attributes (ampscope/cpu_features.h, the one dispatch scheme). A layer
// picks its functions with the CpuExec's level, which the back end takes from
// active_simd_level(), so AMPSCOPE_SIMD caps the layers as it caps every kernel of the project.
//
// Sums accumulate per lane and are combined in lane order, so a kernel's result depends only on
// its inputs and the level. The AVX2 and AVX-512 instantiations may contract a * b + c into FMA
// (GCC's default for C++), so levels can differ by rounding; a machine always runs the same
// level, which is what bit-exact resume needs. The scalar reference of each layer (its
// *_reference.cc) is the oracle the tests hold every level to.
#pragma once

#include <xmmintrin.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "ampscope/cpu_features.h"

// The 16-lane helpers take and return vectors by value but are always inlined, so no call ABI
// is involved; GCC still notes the ABI of such functions.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace ampscope::trainer::layers {

namespace level_detail {
template <auto Body, class R, class... A>
R baseline(A... a) {
  return Body(a...);
}
template <auto Body, class R, class... A>
AMPSCOPE_TARGET_AVX2 R avx2(A... a) {
  return Body(a...);
}
template <auto Body, class R, class... A>
AMPSCOPE_TARGET_AVX512 R avx512(A... a) {
  return Body(a...);
}
template <auto Body>
struct Levels;
template <class R, class... A, R (*Body)(A...)>
struct Levels<Body> {
  static R (*at(SimdLevel level))(A...) {
    switch (level) {
      case SimdLevel::kAvx512:
        return &avx512<Body, R, A...>;
      case SimdLevel::kAvx2:
        return &avx2<Body, R, A...>;
      case SimdLevel::kScalar:
        break;
    }
    return &baseline<Body, R, A...>;
  }
};
}  // namespace level_detail

// The always-inline kernel `Body` compiled for `level` (a plain function pointer).
template <auto Body>
auto at_level(SimdLevel level) {
  return level_detail::Levels<Body>::at(level);
}

namespace vk {

using V = float __attribute__((vector_size(64)));
using VI = std::int32_t __attribute__((vector_size(64)));
using V4 = float __attribute__((vector_size(16)));
using V8 = float __attribute__((vector_size(32)));
using VD = double __attribute__((vector_size(64)));
constexpr std::size_t kLanes = 16;

AMPSCOPE_ALWAYS_INLINE V load(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
AMPSCOPE_ALWAYS_INLINE void store(float* p, V v) { std::memcpy(p, &v, sizeof v); }
AMPSCOPE_ALWAYS_INLINE V splat(float x) { return V{} + x; }

AMPSCOPE_ALWAYS_INLINE float hsum(V v) {
  float s = 0.0f;
  for (std::size_t l = 0; l < kLanes; ++l) s += v[l];
  return s;
}

AMPSCOPE_ALWAYS_INLINE V vsqrt(V v) {
  V4 parts[4];
  std::memcpy(parts, &v, sizeof v);
  for (auto& p : parts) p = _mm_sqrt_ps(p);
  std::memcpy(&v, parts, sizeof v);
  return v;
}

// e^x (Cephes expf: x = k ln2 + r, a degree-6 polynomial in r; ~1 ulp). Below -87.34 the
// result is 0 (no subnormals), above 88 it is +Inf (callers stay far below), NaN stays NaN.
AMPSCOPE_ALWAYS_INLINE V vexp(V x) {
  const VI under = x < -87.33654f;
  const VI over = x > 88.0f;
  V c = under ? splat(-87.33654f) : x;
  c = over ? splat(88.0f) : c;
  // Round to the nearest integer (ties to even) by adding and removing 1.5 * 2^23.
  V k = c * 1.44269504088896341f;
  k = (k + 12582912.0f) - 12582912.0f;
  V r = c - k * 0.693359375f;
  r = r - k * -2.12194440e-4f;
  V y = splat(1.9875691500e-4f);
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * (r * r) + r + 1.0f;
  const VI n = __builtin_convertvector(k, VI);
  V e = y * reinterpret_cast<V>((n + 127) << 23);
  e = under ? splat(0.0f) : e;
  return over ? splat(std::numeric_limits<float>::infinity()) : e;
}

// out[i] = f(i-th vectors of the inputs) over n elements; the tail goes through a zero-padded
// vector, so every element sees the same code.
template <class F>
AMPSCOPE_ALWAYS_INLINE void map(std::size_t n, float* out, const F& f, const float* a,
                                const float* b = nullptr, const float* c = nullptr) {
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    store(out + i, f(load(a + i), b ? load(b + i) : V{}, c ? load(c + i) : V{}));
  }
  if (i == n) return;
  float pa[kLanes] = {}, pb[kLanes] = {}, pc[kLanes] = {}, po[kLanes];
  const std::size_t rest = (n - i) * sizeof(float);
  std::memcpy(pa, a + i, rest);
  if (b) std::memcpy(pb, b + i, rest);
  if (c) std::memcpy(pc, c + i, rest);
  store(po, f(load(pa), load(pb), load(pc)));
  std::memcpy(out + i, po, rest);
}

}  // namespace vk
}  // namespace ampscope::trainer::layers
