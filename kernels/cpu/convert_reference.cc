// Scalar reference conversions, written from the definition of each format and shared by all
// formats: find the quantum (ulp) of the value's binade in the target format, round the value
// to an integer multiple of it (ties to even), then encode sign, exponent and fraction. FP64
// holds every intermediate exactly (an FP32 value has 24 significant bits). E8M0 (the MX scale)
// is at the end.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include "ampscope/check.h"
#include "ampscope/convert.h"

namespace ampscope {
namespace {

// Largest finite magnitude code. kIeee: exponent all-ones minus one, fraction all ones;
// kNanOnlyFn (E4M3 fn): exponent all ones, fraction all ones minus one; kFiniteOnly: all ones.
std::uint32_t max_finite_magnitude(const FormatInfo& f) {
  const int m = f.mantissa_bits;
  const std::uint32_t exp_all_ones = (1u << f.exponent_bits) - 1;
  const std::uint32_t frac_all_ones = (1u << m) - 1;
  switch (f.special) {
    case SpecialCodes::kIeee:
      return ((exp_all_ones - 1) << m) | frac_all_ones;
    case SpecialCodes::kNanOnlyFn:
      return (exp_all_ones << m) | (frac_all_ones - 1);
    case SpecialCodes::kFiniteOnly:
      break;
  }
  return (exp_all_ones << m) | frac_all_ones;
}

std::uint32_t max_finite_bits(std::uint32_t sign, const FormatInfo& f) {
  return (sign << (f.total_bits - 1)) | max_finite_magnitude(f);
}

// Only for formats with a NaN (f.has_nan).
std::uint32_t nan_bits(std::uint32_t sign, std::uint32_t fp32_frac, const FormatInfo& f) {
  const int m = f.mantissa_bits;
  const std::uint32_t sign_bit = sign << (f.total_bits - 1);
  const std::uint32_t exp_all_ones = ((1u << f.exponent_bits) - 1) << m;
  if (f.special == SpecialCodes::kNanOnlyFn) return sign_bit | exp_all_ones | ((1u << m) - 1);
  const std::uint32_t quiet = 1u << (m - 1);
  const std::uint32_t payload = fp32_frac >> (23 - m);
  return sign_bit | exp_all_ones | quiet | payload;
}

// What a value beyond max finite (or an Inf input) becomes: Inf where the format has one, the
// NaN of E4M3 fn, +-max when saturating or when the format has no code for either.
std::uint32_t overflow_bits(std::uint32_t sign, const FormatInfo& f, bool saturate) {
  if (saturate || !f.has_nan) return max_finite_bits(sign, f);
  if (!f.has_inf) return nan_bits(sign, 0, f);  // E4M3 fn: overflow is NaN
  return (sign << (f.total_bits - 1)) | (((1u << f.exponent_bits) - 1) << f.mantissa_bits);
}

// Rounds a positive finite double to an integer, ties to even.
double round_half_even(double v) {
  const double fl = std::floor(v);
  const double frac = v - fl;
  if (frac > 0.5) return fl + 1.0;
  if (frac < 0.5) return fl;
  return std::fmod(fl, 2.0) == 0.0 ? fl : fl + 1.0;
}

}  // namespace

std::uint32_t encode(float x, Format format, OverflowMode mode) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  if (format == Format::kFP32) return u;
  const FormatInfo& f = format_info(format);
  const std::uint32_t sign = u >> 31;
  const std::uint32_t a = u & 0x7FFFFFFFu;
  const bool saturate = mode == OverflowMode::kSaturating;
  if (a > 0x7F800000u) {
    // A format without NaN has no code for it: +-max, as for an overflow (convert.h).
    return f.has_nan ? nan_bits(sign, a & 0x7FFFFFu, f) : max_finite_bits(sign, f);
  }
  if (a == 0x7F800000u) return overflow_bits(sign, f, saturate);
  const std::uint32_t sign_bit = sign << (f.total_bits - 1);
  // |x| from its bits rather than by converting x: with DAZ set (the host process may have
  // called torch.set_flush_denormal(True)) cvtss2sd reads an FP32 subnormal as zero, and BF16
  // would lose its subnormals.
  const double v = a < 0x00800000u ? std::ldexp(static_cast<double>(a), -149)
                                   : static_cast<double>(std::bit_cast<float>(a));
  if (v == 0.0) return sign_bit;

  int e = 0;
  std::frexp(v, &e);  // v = m * 2^e, m in [0.5, 1)
  const int binade = e - 1;
  const int quantum_exp = std::max(binade, f.min_normal_exponent) - f.mantissa_bits;
  const double q = std::ldexp(round_half_even(std::ldexp(v, -quantum_exp)), quantum_exp);
  if (q > f.max_finite) return overflow_bits(sign, f, saturate);
  if (q == 0.0) return sign_bit;  // underflow to a signed zero

  const int m = f.mantissa_bits;
  // ldexp, not f.min_normal(): FormatInfo::exp2i is a loop (126 multiplications for BF16) when
  // it runs at run time.
  if (q < std::ldexp(1.0, f.min_normal_exponent)) {
    const auto frac = static_cast<std::uint32_t>(std::ldexp(q, -f.min_subnormal_exponent));
    return sign_bit | frac;
  }
  std::frexp(q, &e);
  const int qb = e - 1;
  const auto frac = static_cast<std::uint32_t>(std::ldexp(q, m - qb)) - (1u << m);
  const auto biased = static_cast<std::uint32_t>(qb + f.bias);
  return sign_bit | (biased << m) | frac;
}

float decode(std::uint32_t bits, Format format) {
  if (format == Format::kFP32) return std::bit_cast<float>(bits);
  const FormatInfo& f = format_info(format);
  const int m = f.mantissa_bits;
  const std::uint32_t sign = (bits >> (f.total_bits - 1)) & 1u;
  const std::uint32_t exp_field = (bits >> m) & ((1u << f.exponent_bits) - 1);
  const std::uint32_t frac = bits & ((1u << m) - 1);
  const std::uint32_t exp_all_ones = (1u << f.exponent_bits) - 1;
  const std::uint32_t fp32_sign = sign << 31;
  bool is_nan = false;
  switch (f.special) {
    case SpecialCodes::kIeee:
      is_nan = exp_field == exp_all_ones && frac != 0;
      break;
    case SpecialCodes::kNanOnlyFn:
      is_nan = exp_field == exp_all_ones && frac == (1u << m) - 1;
      break;
    case SpecialCodes::kFiniteOnly:
      break;  // every code is a value
  }
  if (is_nan) return std::bit_cast<float>(fp32_sign | 0x7FC00000u | (frac << (23 - m)));
  if (f.has_inf && exp_field == exp_all_ones) {
    return std::bit_cast<float>(fp32_sign | 0x7F800000u);
  }
  double v;
  if (exp_field == 0) {
    v = std::ldexp(static_cast<double>(frac), f.min_subnormal_exponent);
  } else {
    v = std::ldexp(static_cast<double>(frac + (1u << m)), static_cast<int>(exp_field) - f.bias - m);
  }
  // Exact: every narrow value is an FP32 value. FP32 subnormals (BF16's) are assembled from
  // bits, since with FTZ set cvtsd2ss would flush them to zero.
  const float r = v < 0x1p-126
                      ? std::bit_cast<float>(static_cast<std::uint32_t>(std::ldexp(v, 149)))
                      : static_cast<float>(v);
  return sign ? -r : r;
}

float round_to(float x, Format f, OverflowMode mode) { return decode(encode(x, f, mode), f); }

float decode_e8m0(std::uint8_t code) {
  if (code == kE8M0Nan) return std::bit_cast<float>(0x7FC00000u);
  // 2^(code - 127) from bits: code >= 1 is the FP32 exponent field itself; code 0 is 2^-127,
  // the FP32 subnormal with only fraction bit 22 set (built from bits: FTZ cannot touch it).
  if (code == 0) return std::bit_cast<float>(0x00400000u);
  return std::bit_cast<float>(static_cast<std::uint32_t>(code) << 23);
}

std::uint8_t encode_e8m0(int exponent) {
  return static_cast<std::uint8_t>(std::clamp(exponent, kE8M0MinExponent, kE8M0MaxExponent) +
                                   kE8M0Bias);
}

int floor_log2(float x) {
  const std::uint32_t a = std::bit_cast<std::uint32_t>(x) & 0x7FFFFFFFu;
  AMPSCOPE_CHECK(a != 0 && a < 0x7F800000u, "floor_log2 needs a finite nonzero value, found ", x);
  const int biased = static_cast<int>(a >> 23);
  if (biased != 0) return biased - 127;
  return std::bit_width(a) - 1 - 149;  // subnormal: a * 2^-149
}

}  // namespace ampscope
