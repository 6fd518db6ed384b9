// The scaled recipes' element and scale rules (ampscope/recipe.h), one element or one block at a
// time: the one definition of each rule, used by the CPU's fake_quantize (kernels/cpu/recipe.cc)
// and, compiled as __host__ __device__ code, by the device fake_quantize (kernels/cuda/
// recipe.cu); the host-model test (tests/kernels/cuda/recipe_host_model*) runs the device
// compilation's host side against the CPU on a machine without a GPU.
//
// Element rounding adds and subtracts 2^(quantum exponent + 23), which rounds to the element's
// grid, nearest even, in FP32's own arithmetic (tests/kernels/recipe_test.cc checks it against
// convert.h's round_to over every binade). Scales are powers of two built from bits, quotients
// and products of FP32 values. On the device every such operation is an explicit
// round-to-nearest intrinsic (__fadd_rn, __fmul_rn, __fdiv_rn: never contracted into an FMA,
// never approximated), and subnormals are kept (the library is not built with -ftz); on the host
// they are plain FP32 operations under the default MXCSR (the callers' ScopedDefaultMxcsr; the
// build has no -ffast-math). So each dequantised value is the same bit for bit on both; the
// squared-error sums are FP64 products added in another order on the device, so those agree
// within rounding of the sums.
#pragma once

#if defined(__CUDACC__)
#define AMPSCOPE_RECIPE_HD __host__ __device__
#else
#define AMPSCOPE_RECIPE_HD
#endif

#include <cstdint>
#include <cstring>

#include "ampscope/convert.h"
#include "ampscope/formats.h"
#include "ampscope/recipe.h"
#include "ampscope/tensor_stats.h"

namespace ampscope::recipe_rules {

// ---- FP32 bits and round-to-nearest arithmetic --------------------------------------------

AMPSCOPE_RECIPE_HD inline std::uint32_t bits_of(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}
AMPSCOPE_RECIPE_HD inline float float_of(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}
AMPSCOPE_RECIPE_HD inline double double_of(std::uint64_t u) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(u));
#else
  double x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

AMPSCOPE_RECIPE_HD inline float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
AMPSCOPE_RECIPE_HD inline float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
AMPSCOPE_RECIPE_HD inline float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
AMPSCOPE_RECIPE_HD inline float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
AMPSCOPE_RECIPE_HD inline double dmul_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

AMPSCOPE_RECIPE_HD inline float abs_of(float x) { return float_of(bits_of(x) & 0x7FFFFFFFu); }
AMPSCOPE_RECIPE_HD inline bool finite_bits(float x) {
  return (bits_of(x) & 0x7F800000u) != 0x7F800000u;
}
// |q| with the sign of v (copysign).
AMPSCOPE_RECIPE_HD inline float with_sign_of(float q, float v) {
  return float_of((bits_of(q) & 0x7FFFFFFFu) | (bits_of(v) & 0x80000000u));
}

// 2^e as FP32 for e in [-149, 127], exact (subnormal powers from bits, so FTZ cannot flush them).
AMPSCOPE_RECIPE_HD inline float pow2f(int e) {
  if (e >= -126) return float_of(static_cast<std::uint32_t>(e + 127) << 23);
  return float_of(std::uint32_t{1} << (e + 149));
}
// 2^e as FP64 for e in [-1022, 1023], exact.
AMPSCOPE_RECIPE_HD inline double pow2d(int e) {
  return double_of(static_cast<std::uint64_t>(e + 1023) << 52);
}

// floor(log2 x) for finite x > 0, subnormals included (convert.h's floor_log2).
AMPSCOPE_RECIPE_HD inline int floor_log2_positive(float x) {
  const std::uint32_t u = bits_of(x);
  const int e = static_cast<int>(u >> 23);
  if (e != 0) return e - 127;
  int top = 31;  // highest set bit of the subnormal's fraction
  while (top > 0 && ((u >> top) & 1u) == 0u) --top;
  return top - 149;
}

// ---- Parameters, decided on the host (format_info is host-only) ----------------------------

// An element format's grid, for round_magnitude.
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

inline RounderParams rounder_params(Format f) {
  const FormatInfo& fi = format_info(f);
  RounderParams r;
  r.mantissa_bits = fi.mantissa_bits;
  r.min_normal_exponent = fi.min_normal_exponent;
  r.max = static_cast<float>(fi.max_finite);
  r.min_normal = pow2f(fi.min_normal_exponent);
  r.saturate_from = pow2f(fi.max_exponent + 1);
  return r;
}

// The recipe must have passed fake_quantize's checks (check_recipe).
inline RecipeParams recipe_params(const Recipe& recipe) {
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
AMPSCOPE_RECIPE_HD inline float round_magnitude(float a, const RounderParams& r) {
  const int e = static_cast<int>(bits_of(a) >> 23) - 127;
  const int quantum = (e > r.min_normal_exponent ? e : r.min_normal_exponent) - r.mantissa_bits;
  const float c = float_of(static_cast<std::uint32_t>(quantum + 23 + 127) << 23);
  return sub_rn(add_rn(a, c), c);
}

// Current scaling's s from a finite amax > 0: fl32(max_elem / amax) / 2^margin; an infinite
// quotient is clamped to FP32 max, and a result below 2^-126 is raised to 2^-126 (so 1 / s stays
// finite), which also covers the rounding of a subnormal product.
AMPSCOPE_RECIPE_HD inline float current_scale(float element_max, float amax, int margin) {
  float s = div_rn(element_max, amax);
  if (!finite_bits(s)) s = float_of(0x7F7FFFFFu);  // FP32 max
  s = mul_rn(s, pow2f(-margin));
  const float min_normal = pow2f(-126);
  return s < min_normal ? min_normal : s;
}

// NVFP4's per-tensor decode scale g = fl32(amax / (448 x 6)) from the finite amax (0: g = 1; a
// g that rounds to 0 is 2^-149).
AMPSCOPE_RECIPE_HD inline float nvfp4_tensor_decode(float amax) {
  if (amax == 0.0f) return 1.0f;
  const float g = div_rn(amax, kNVFP4TensorDivisor);
  const float smallest = pow2f(-149);
  return g < smallest ? smallest : g;
}

// The per-tensor scale from the tensor's finite amax: current's s (amax 0: s = 1), delayed's
// given s, nvfp4's decode scale g; 0 for tile and mx.
AMPSCOPE_RECIPE_HD inline float tensor_scale(const RecipeParams& p, float amax) {
  switch (p.scaling) {
    case Scaling::kCurrent:
      return amax > 0.0f ? current_scale(p.element.max, amax, p.margin) : 1.0f;
    case Scaling::kDelayed:
      return p.delayed_scale;
    case Scaling::kNVFP4:
      return nvfp4_tensor_decode(amax);
    default:
      return 0.0f;
  }
}

// How one block is quantised, decided from its finite amax and whether it holds Inf or NaN.
enum class BlockKind : std::uint8_t { kZero, kNaN, kScaled, kAllZero };
struct BlockScale {
  BlockKind kind = BlockKind::kScaled;
  float enc = 1.0f;  // multiplier (mx) or divisor (tile, nvfp4)
  float dec = 1.0f;  // dequantised = q * dec
};

// Every block recipe's scale rule, with its edge cases, in one place (docs/numerics.md): a
// block's scales from its finite amax and whether it holds Inf or NaN (OCP MX: scale NaN).
AMPSCOPE_RECIPE_HD inline BlockScale block_scale(const RecipeParams& p, float amax, bool nonfinite,
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

// What the elements of one device thread, or of one CPU Quantizer, added up to.
struct ElementTally {
  std::uint64_t underflow = 0;
  std::uint64_t subnormal = 0;
  std::uint64_t saturated = 0;
  std::uint64_t overflow = 0;
  double signal_sq = 0.0;
  double error_sq = 0.0;
};

// The element a finite value becomes under a scaled block or tensor scale: y = v * enc (divide:
// v / enc), rounded and clamped to the element grid, with v's sign (a value of the element
// format, exactly: what a real low-precision GEMM reads). Counts saturated, underflow and
// subnormal.
AMPSCOPE_RECIPE_HD inline float quantize_element(float v, float enc, bool divide,
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
  return with_sign_of(q, v);
}

// v's element q (quantize_element's) dequantised, q * dec, counted: overflow when that is not
// finite, else the squared signal and error.
AMPSCOPE_RECIPE_HD inline float dequantize_element(float v, float q, float dec, ElementTally& t) {
  const float deq = mul_rn(q, dec);
  if (!finite_bits(deq)) {
    ++t.overflow;
    return deq;
  }
  const double err = static_cast<double>(v) - static_cast<double>(deq);
  t.signal_sq += dmul_rn(static_cast<double>(v), static_cast<double>(v));
  t.error_sq += dmul_rn(err, err);
  return deq;
}

// One finite element under a scaled block or tensor scale: quantised, then dequantised. Returns
// the dequantised value and counts it.
AMPSCOPE_RECIPE_HD inline float quantize_finite(float v, float enc, float dec, bool divide,
                                                 const RounderParams& r, ElementTally& t) {
  return dequantize_element(v, quantize_element(v, enc, divide, r, t), dec, t);
}

// An element of a block whose scale is NaN (it holds an Inf or NaN): decodes to NaN; a finite
// one counts as overflow.
AMPSCOPE_RECIPE_HD inline float nan_block_element(float v, ElementTally& t) {
  if (finite_bits(v)) ++t.overflow;
  return float_of(0x7FC00000u);
}

// An element of an nvfp4 block whose decode scale is 0 (kAllZero): quantises to a zero of its
// sign, the whole value lost.
AMPSCOPE_RECIPE_HD inline float all_zero_block_element(float v, ElementTally& t) {
  if (v != 0.0f) ++t.underflow;
  const double sq = dmul_rn(static_cast<double>(v), static_cast<double>(v));
  t.signal_sq += sq;
  t.error_sq += sq;
  return with_sign_of(0.0f, v);
}

// One element of a block of kind `s.kind`. Non-finite inputs of a scaled block cannot occur
// (such a block is kNaN).
AMPSCOPE_RECIPE_HD inline float quantize_in_block(float v, const BlockScale& s, bool multiply,
                                                   const RounderParams& r, ElementTally& t) {
  switch (s.kind) {
    case BlockKind::kZero:
      return v;
    case BlockKind::kNaN:
      return nan_block_element(v, t);
    case BlockKind::kAllZero:
      return all_zero_block_element(v, t);
    case BlockKind::kScaled:
      break;
  }
  return quantize_finite(v, s.enc, s.dec, !multiply, r, t);
}

}  // namespace ampscope::recipe_rules
