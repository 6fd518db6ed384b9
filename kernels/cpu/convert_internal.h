// Private pieces shared by the bulk conversion paths (convert_bulk.cc, convert_avx2.cc,
// convert_avx512.cc): the per-format codes the lane-wise algorithms need (derived from
// formats.h, never written by hand; FP8, FP6 and FP4 alike) and the entry points of each level. The
// target attributes are the project's one set (cpu_features.h).
#pragma once

#include <xmmintrin.h>

#include <cstddef>
#include <cstdint>

#include "ampscope/convert.h"
#include "ampscope/formats.h"

namespace ampscope::detail {

// What the lane-wise encoder and decoder need to know about a narrow format. Magnitude codes
// are the format's bits without the sign.
struct NarrowCodes {
  int mantissa_bits;  // m
  int bias;
  int total_bits;
  int min_normal_exponent;        // 1 - bias
  std::uint32_t max_finite_code;  // +max finite
  std::uint32_t overflow_code;    // what a non-saturating overflow becomes: Inf, NaN (E4M3), max
  std::uint32_t nan_code;         // quiet NaN with a zero payload (max finite: FP6/FP4)
  std::uint32_t payload_mask;     // fraction bits that carry the FP32 payload (0: one NaN)
  std::uint32_t special_min;      // magnitude codes >= this are Inf or NaN
  // Encoder constants. Normal range (|x| >= min normal, FP32 bits >= min_normal_fp32): the
  // code is (bits + rebias_and_half + lsb) >> (23 - m), where rebias_and_half moves the
  // exponent from FP32's bias to the target's and adds half an ulp minus one (lsb makes ties
  // go to even; a carry moves into the exponent, as it should). Subnormal range: the FPU
  // rounds |x| + subnormal_magic, whose ulp is the target's smallest subnormal, to nearest
  // even, and bits(sum) - bits(magic) is the code (2^m, rounded up to the min normal, is that
  // code too).
  std::uint32_t min_normal_fp32;
  std::uint32_t rebias_and_half;
  std::uint32_t subnormal_magic;
  // round_through constants: FP32 bits of what decode() gives for max finite, a non-saturating
  // overflow and the NaN without payload, and where the payload sits in an FP32 fraction.
  std::uint32_t max_finite_fp32;
  std::uint32_t overflow_fp32;
  std::uint32_t nan_fp32;
  std::uint32_t payload_mask_fp32;
};

constexpr NarrowCodes narrow_codes(Format format) {
  const FormatInfo& f = format_info(format);
  const int m = f.mantissa_bits;
  const std::uint32_t exp_all_ones = (1u << f.exponent_bits) - 1;
  const std::uint32_t frac_all_ones = (1u << m) - 1;
  NarrowCodes c{};
  c.mantissa_bits = m;
  c.bias = f.bias;
  c.total_bits = f.total_bits;
  c.min_normal_exponent = f.min_normal_exponent;
  switch (f.special) {
    case SpecialCodes::kIeee:
      c.max_finite_code = ((exp_all_ones - 1) << m) | frac_all_ones;
      c.overflow_code = exp_all_ones << m;
      c.nan_code = (exp_all_ones << m) | (1u << (m - 1));
      c.payload_mask = frac_all_ones;
      c.special_min = exp_all_ones << m;
      break;
    case SpecialCodes::kNanOnlyFn:  // E4M3 fn: S.1111.111 is the only NaN and overflow lands on it
      c.max_finite_code = (exp_all_ones << m) | (frac_all_ones - 1);
      c.overflow_code = (exp_all_ones << m) | frac_all_ones;
      c.nan_code = c.overflow_code;
      c.payload_mask = 0;
      c.special_min = c.overflow_code;
      break;
    case SpecialCodes::kFiniteOnly:  // FP6/FP4: overflow, Inf and NaN all become max finite
      c.max_finite_code = (exp_all_ones << m) | frac_all_ones;
      c.overflow_code = c.max_finite_code;
      c.nan_code = c.max_finite_code;
      c.payload_mask = 0;
      c.special_min = c.max_finite_code + 1;  // past every magnitude code: nothing is special
      break;
  }
  c.min_normal_fp32 = static_cast<std::uint32_t>(127 + c.min_normal_exponent) << 23;
  c.rebias_and_half = (static_cast<std::uint32_t>(c.bias - 127) << 23) + (1u << (22 - m)) - 1;
  c.subnormal_magic = static_cast<std::uint32_t>(127 + c.min_normal_exponent - m + 23) << 23;
  c.max_finite_fp32 = (((c.max_finite_code >> m) - c.bias + 127) << 23) |
                      ((c.max_finite_code & frac_all_ones) << (23 - m));
  c.nan_fp32 = 0x7FC00000u | ((c.nan_code & frac_all_ones) << (23 - m));
  c.overflow_fp32 = f.has_inf ? 0x7F800000u : c.nan_fp32;
  if (!f.has_nan) {  // the reference's +-max for NaN and overflow alike
    c.nan_fp32 = c.max_finite_fp32;
    c.overflow_fp32 = c.max_finite_fp32;
  }
  c.payload_mask_fp32 = c.payload_mask << (23 - m);
  return c;
}

// The codes of the OCP FP8 spec, spelled out.
static_assert(narrow_codes(Format::kE4M3).max_finite_code == 0x7E);        // 448
static_assert(narrow_codes(Format::kE4M3).overflow_code == 0x7F);          // NaN
static_assert(narrow_codes(Format::kE4M3).subnormal_magic == 0x46800000);  // 2^14, ulp 2^-9
static_assert(narrow_codes(Format::kE5M2).max_finite_code == 0x7B);        // 57344
static_assert(narrow_codes(Format::kE5M2).overflow_code == 0x7C);          // Inf
static_assert(narrow_codes(Format::kE5M2).nan_code == 0x7E);
static_assert(narrow_codes(Format::kE5M2).subnormal_magic == 0x43000000);  // 2^7, ulp 2^-16
static_assert(narrow_codes(Format::kE4M3).max_finite_fp32 == 0x43E00000);  // 448.0f
static_assert(narrow_codes(Format::kE4M3).overflow_fp32 == 0x7FF00000);
static_assert(narrow_codes(Format::kE5M2).max_finite_fp32 == 0x47600000);  // 57344.0f
static_assert(narrow_codes(Format::kE5M2).nan_fp32 == 0x7FC00000);
// ... and of OCP Microscaling v1.0's FP6/FP4 elements.
static_assert(narrow_codes(Format::kE2M1).max_finite_code == 0x7);         // 6
static_assert(narrow_codes(Format::kE2M1).subnormal_magic == 0x4A800000);  // 2^22, ulp 2^-1
static_assert(narrow_codes(Format::kE2M1).max_finite_fp32 == 0x40C00000);  // 6.0f
static_assert(narrow_codes(Format::kE3M2).max_finite_code == 0x1F);        // 28
static_assert(narrow_codes(Format::kE3M2).subnormal_magic == 0x49000000);  // 2^19, ulp 2^-4
static_assert(narrow_codes(Format::kE3M2).max_finite_fp32 == 0x41E00000);  // 28.0f
static_assert(narrow_codes(Format::kE2M3).max_finite_code == 0x1F);        // 7.5
static_assert(narrow_codes(Format::kE2M3).subnormal_magic == 0x49800000);  // 2^20, ulp 2^-3
static_assert(narrow_codes(Format::kE2M3).max_finite_fp32 == 0x40F00000);  // 7.5f
static_assert(narrow_codes(Format::kE2M3).overflow_fp32 == 0x40F00000);
static_assert(narrow_codes(Format::kE2M3).nan_fp32 == 0x40F00000);

// round_through() at an explicit level (clamped to what the CPU has), for the tests: convert.h
// has no level overload for it.
void round_through_at_level(float* data, std::size_t n, Format f, OverflowMode mode,
                            SimdLevel level);

// The vector paths use FP arithmetic (the magic-number add that rounds FP8 subnormals) whose
// result depends on MXCSR, and the host process may have changed it: FTZ/DAZ
// (torch.set_flush_denormal), another rounding mode, unmasked exceptions. Each vector entry
// point runs under the default MXCSR and gives the caller's back on the way out.
class ScopedDefaultMxcsr {
 public:
  ScopedDefaultMxcsr() : saved_(_mm_getcsr()) {
    if (changed()) _mm_setcsr(kDefault);
  }
  ~ScopedDefaultMxcsr() {
    if (changed()) _mm_setcsr(saved_);
  }
  ScopedDefaultMxcsr(const ScopedDefaultMxcsr&) = delete;
  ScopedDefaultMxcsr& operator=(const ScopedDefaultMxcsr&) = delete;

 private:
  static constexpr unsigned kDefault = 0x1F80;      // all exceptions masked, nearest, no FTZ/DAZ
  static constexpr unsigned kStatusFlags = 0x003F;  // sticky exception flags: not a setting
  bool changed() const { return (saved_ & ~kStatusFlags) != kDefault; }
  unsigned saved_;
};

// Level entry points. dst_format/src_format/f is never kFP32 (the dispatcher copies).
void convert_from_fp32_avx2(const float* src, void* dst, std::size_t n, Format dst_format,
                            OverflowMode mode);
void convert_to_fp32_avx2(const void* src, float* dst, std::size_t n, Format src_format);
void round_through_avx2(float* data, std::size_t n, Format f, OverflowMode mode);

void convert_from_fp32_avx512(const float* src, void* dst, std::size_t n, Format dst_format,
                              OverflowMode mode);
void convert_to_fp32_avx512(const void* src, float* dst, std::size_t n, Format src_format);
void round_through_avx512(float* data, std::size_t n, Format f, OverflowMode mode);

}  // namespace ampscope::detail
