// The scaled recipes' element and scale rules (ampscope/recipe.h), one element or one block at a
// time, for the device fake_quantize (recipe.cu). __host__ __device__ so that the host-model
// test (tests/kernels/cuda/recipe_host_model*) runs the same code against the CPU's
// fake_quantize on a machine without a GPU.
//
// Each function is kernels/cpu/recipe.cc's expression, operation for operation: element rounding
// adds and subtracts 2^(quantum exponent + 23) (the CPU's ElementRounder, exact round to
// nearest even on FP32's own grid); scales are powers of two built from bits, quotients and
// products of FP32 values. On the device every such operation is an explicit round-to-nearest
// intrinsic (__fadd_rn, __fmul_rn, __fdiv_rn: never contracted into an FMA, never approximated),
// and subnormals are kept (the library is not built with -ftz), so each dequantised value is the
// CPU's bit for bit. The squared-error sums are FP64 products added in another order: those
// agree within rounding of the sums, not bit for bit.
#pragma once

#include <cstdint>
#include <cstring>

#include "ampscope/convert.h"
#include "ampscope/formats.h"
#include "ampscope/recipe.h"
#include "ampscope/tensor_stats.h"

namespace ampscope::cuda::detail {

// ---- FP32 bits and round-to-nearest arithmetic --------------------------------------------

__host__ __device__ inline std::uint32_t bits_of(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}
__host__ __device__ inline float float_of(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}
__host__ __device__ inline double double_of(std::uint64_t u) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(u));
#else
  double x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

__host__ __device__ inline float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
__host__ __device__ inline float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
__host__ __device__ inline float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
__host__ __device__ inline float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
__host__ __device__ inline double dmul_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

__host__ __device__ inline float abs_of(float x) { return float_of(bits_of(x) & 0x7FFFFFFFu); }
__host__ __device__ inline bool finite_bits(float x) {
  return (bits_of(x) & 0x7F800000u) != 0x7F800000u;
}
// |q| with the sign of v (copysign).
__host__ __device__ inline float with_sign_of(float q, float v) {
  return float_of((bits_of(q) & 0x7FFFFFFFu) | (bits_of(v) & 0x80000000u));
}

// 2^e as FP32 for e in [-149, 127], exact (subnormal powers from bits, so FTZ cannot flush them).
__host__ __device__ inline float pow2f(int e) {
  if (e >= -126) return float_of(static_cast<std::uint32_t>(e + 127) << 23);
  return float_of(std::uint32_t{1} << (e + 149));
}
// 2^e as FP64 for e in [-1022, 1023], exact.
__host__ __device__ inline double pow2d(int e) {
  return double_of(static_cast<std::uint64_t>(e + 1023) << 52);
}

// floor(log2 x) for finite x > 0, subnormals included (convert.h's floor_log2).
__host__ __device__ inline int floor_log2_positive(float x) {
  const std::uint32_t u = bits_of(x);
  const int e = static_cast<int>(u >> 23);
  if (e != 0) return e - 127;
  int top = 31;  // highest set bit of the subnormal's fraction
  while (top > 0 && ((u >> top) & 1u) == 0u) --top;
  return top - 149;
}

// ---- Parameters, decided on the host (format_info is host-only) ----------------------------

// An element format's grid (the CPU's ElementRounder).
struct RounderParams {
  int mantissa_bits;
  int min_normal_exponent;
  float max;  // largest finite value
  float min_normal;
  float saturate_from;  // every |y| >= this rounds above max
};

// Everything a kernel needs to apply one Recipe.
struct RecipeParams {
  Scaling scaling;
  ScaleRounding rounding;
  RounderParams element;
  RounderParams e4m3;        // nvfp4's block-scale format
  int element_max_exponent;  // floor(log2(max)): MX's emax_elem
  double element_max;        // max as FP64 (MX ceil's comparison)
  int margin;                // current
  float delayed_scale;       // delayed
  int block_rows;
  int block_cols;
};

inline constexpr float kNVFP4ElementMax = 6.0f;
inline constexpr float kNVFP4TensorDivisor = 448.0f * 6.0f;  // E4M3 max x E2M1 max

__host__ inline RounderParams rounder_params(Format f) {
  const FormatInfo& fi = format_info(f);
  RounderParams r;
  r.mantissa_bits = fi.mantissa_bits;
  r.min_normal_exponent = fi.min_normal_exponent;
  r.max = static_cast<float>(fi.max_finite);
  r.min_normal = pow2f(fi.min_normal_exponent);
  r.saturate_from = pow2f(fi.max_exponent + 1);
  return r;
}

// The recipe must have passed fake_quantize's checks (recipe.cu runs them first).
__host__ inline RecipeParams recipe_params(const Recipe& recipe) {
  RecipeParams p;
  p.scaling = recipe.scaling;
  p.rounding = recipe.rounding;
  p.element = rounder_params(recipe.element);
  p.e4m3 = rounder_params(Format::kE4M3);
  p.element_max_exponent = format_info(recipe.element).max_exponent;
  p.element_max = format_info(recipe.element).max_finite;
  p.margin = recipe.margin;
  p.delayed_scale = recipe.scale;
  p.block_rows = recipe.block_rows;
  p.block_cols = recipe.block_cols;
  return p;
}

// ---- Scales ------------------------------------------------------------------------------

// |y| rounded to the element's grid, nearest even, not clamped; 0 <= a < saturate_from.
__host__ __device__ inline float round_magnitude(float a, const RounderParams& r) {
  const int e = static_cast<int>(bits_of(a) >> 23) - 127;
  const int quantum = (e > r.min_normal_exponent ? e : r.min_normal_exponent) - r.mantissa_bits;
  const float c = float_of(static_cast<std::uint32_t>(quantum + 23 + 127) << 23);
  return sub_rn(add_rn(a, c), c);
}

// The per-tensor scale: current's s from the tensor's finite amax (recipe.cc's scale_from_amax
// with previous scale 1), delayed's given s, nvfp4's decode scale g; 0 for tile and mx.
__host__ __device__ inline float tensor_scale(const RecipeParams& p, float amax) {
  switch (p.scaling) {
    case Scaling::kCurrent: {
      if (!(amax > 0.0f)) return 1.0f;  // finite by construction: only 0 reaches here
      float s = div_rn(p.element.max, amax);
      if (!finite_bits(s)) s = float_of(0x7F7FFFFFu);  // FP32 max
      // s x 2^-margin; a result below 2^-126 is raised to 2^-126 (so 1 / s stays finite), which
      // also covers the rounding of a subnormal product.
      s = mul_rn(s, pow2f(-p.margin));
      const float min_normal = pow2f(-126);
      return s < min_normal ? min_normal : s;
    }
    case Scaling::kDelayed:
      return p.delayed_scale;
    case Scaling::kNVFP4: {
      if (amax == 0.0f) return 1.0f;
      const float g = div_rn(amax, kNVFP4TensorDivisor);
      const float smallest = pow2f(-149);
      return g < smallest ? smallest : g;
    }
    default:
      return 0.0f;
  }
}

enum class BlockKind : std::uint8_t { kZero, kNaN, kScaled, kAllZero };
struct BlockScale {
  BlockKind kind = BlockKind::kScaled;
  float enc = 1.0f;  // multiplier (mx) or divisor (tile, nvfp4)
  float dec = 1.0f;  // dequantised = q * dec
};

// recipe.cc's block_scale: a block's scales from its finite amax and whether it holds Inf/NaN.
__host__ __device__ inline BlockScale block_scale(const RecipeParams& p, float amax, bool nonfinite,
                                                  float tensor_decode) {
  BlockScale b;
  if (nonfinite) {
    b.kind = BlockKind::kNaN;
    return b;
  }
  if (amax == 0.0f) {
    b.kind = BlockKind::kZero;
    return b;
  }
  if (p.scaling == Scaling::kMX) {
    int k = floor_log2_positive(amax) - p.element_max_exponent;
    if (p.rounding == ScaleRounding::kCeil &&
        static_cast<double>(amax) > p.element_max * pow2d(k)) {
      ++k;
    }
    k = k < kE8M0MinExponent ? kE8M0MinExponent : (k > kE8M0MaxExponent ? kE8M0MaxExponent : k);
    b.enc = pow2f(-k);
    b.dec = pow2f(k);
    return b;
  }
  if (p.scaling == Scaling::kTile) {
    float d = div_rn(amax, p.element.max);
    if (d == 0.0f) d = pow2f(-149);
    b.enc = d;
    b.dec = d;
    return b;
  }
  // nvfp4: the block decode scale as an E4M3 code under the tensor's g (saturating rounding).
  const float ratio = div_rn(div_rn(amax, kNVFP4ElementMax), tensor_decode);
  float code = ratio >= p.e4m3.saturate_from ? p.e4m3.max : round_magnitude(ratio, p.e4m3);
  if (code > p.e4m3.max) code = p.e4m3.max;
  const float d = mul_rn(code, tensor_decode);
  if (d == 0.0f) {
    b.kind = BlockKind::kAllZero;
    return b;
  }
  b.enc = d;
  b.dec = d;
  return b;
}

// ---- Elements ----------------------------------------------------------------------------

// What the elements of one thread (or one strip on the CPU) added up to.
struct ElementTally {
  std::uint64_t underflow = 0;
  std::uint64_t subnormal = 0;
  std::uint64_t saturated = 0;
  std::uint64_t overflow = 0;
  double signal_sq = 0.0;
  double error_sq = 0.0;
};

// One finite element under a scaled block or tensor scale (recipe.cc's quantize_span): y = v *
// enc (divide: v / enc), rounded and clamped to q, dequantised q * dec. Returns the dequantised
// value and counts it.
__host__ __device__ inline float quantize_finite(float v, float enc, float dec, bool divide,
                                                 const RounderParams& r, ElementTally& t) {
  const float y = divide ? div_rn(v, enc) : mul_rn(v, enc);
  const float a = abs_of(y);
  float q;
  if (a >= r.saturate_from) {
    q = r.max;
    ++t.saturated;
  } else {
    q = round_magnitude(a, r);
    if (q > r.max) {
      q = r.max;
      ++t.saturated;
    } else if (q == 0.0f) {
      if (v != 0.0f) ++t.underflow;
    } else if (q < r.min_normal) {
      ++t.subnormal;
    }
  }
  const float deq = mul_rn(with_sign_of(q, v), dec);
  if (!finite_bits(deq)) {
    ++t.overflow;
    return deq;
  }
  const double err = static_cast<double>(v) - static_cast<double>(deq);
  t.signal_sq += dmul_rn(static_cast<double>(v), static_cast<double>(v));
  t.error_sq += dmul_rn(err, err);
  return deq;
}

// One element of a block of kind `s.kind` (recipe.cc's quantize_block_row). Non-finite inputs
// of a scaled block cannot occur (such a block is kNaN).
__host__ __device__ inline float quantize_in_block(float v, const BlockScale& s, bool multiply,
                                                   const RounderParams& r, ElementTally& t) {
  switch (s.kind) {
    case BlockKind::kZero:
      return v;
    case BlockKind::kNaN:
      if (finite_bits(v)) ++t.overflow;
      return float_of(0x7FC00000u);
    case BlockKind::kAllZero: {
      if (v != 0.0f) ++t.underflow;
      const double sq = dmul_rn(static_cast<double>(v), static_cast<double>(v));
      t.signal_sq += sq;
      t.error_sq += sq;
      return with_sign_of(0.0f, v);
    }
    case BlockKind::kScaled:
      break;
  }
  return quantize_finite(v, s.enc, s.dec, !multiply, r, t);
}

}  // namespace ampscope::cuda::detail
