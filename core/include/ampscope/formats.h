// Numeric format descriptors: FP32, FP16 (IEEE binary16), BF16, FP8 E4M3 (OCP "fn"), FP8 E5M2
// (OCP), and the OCP Microscaling v1.0 element formats FP6 E3M2, FP6 E2M3 and FP4 E2M1. Every
// constant here is derived from the encoding (exponent bits, mantissa bits, bias, which codes
// are Inf or NaN) and checked against the formats' definitions in tests/kernels/formats_test.cc.
// E8M0, the MX block scale, is not an element format and lives in convert.h.
//
// The same enum names a tensor's storage type and a target format of a what-if question.
// Thread safety: everything here is constexpr or immutable.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "ampscope/detail/hd.h"

namespace ampscope {

enum class Format : std::uint8_t {
  kFP32 = 0,
  kFP16 = 1,
  kBF16 = 2,
  kE4M3 = 3,
  kE5M2 = 4,
  kE2M1 = 5,  // FP4
  kE3M2 = 6,  // FP6
  kE2M3 = 7,  // FP6
};

inline constexpr int kNumFormats = 8;

// How a format spends its all-ones exponent:
//   kIeee        Inf (fraction 0) and NaNs (fraction != 0): FP32, FP16, BF16, E5M2
//   kNanOnlyFn   values, except S.1..1.1..1 which is the one NaN per sign: E4M3 fn
//   kFiniteOnly  values: no Inf and no NaN, every code is a number: E2M1, E3M2, E2M3
enum class SpecialCodes : std::uint8_t { kIeee = 0, kNanOnlyFn = 1, kFiniteOnly = 2 };

struct FormatInfo {
  Format format;
  const char* name;  // canonical lower-case name: fp32, fp16, bf16, e4m3, e5m2, e2m1, ...
  int total_bits;    // storage width
  int exponent_bits;
  int mantissa_bits;  // explicit (stored) fraction bits
  int bias;
  SpecialCodes special;
  bool has_inf;                // all-ones exponent with zero fraction is Inf (kIeee only)
  bool has_nan;                // some code is NaN (false for the FP6/FP4 formats)
  int max_exponent;            // floor(log2(max_finite))
  int min_normal_exponent;     // log2(min normal)
  int min_subnormal_exponent;  // log2(smallest positive subnormal)
  double max_finite;
  // Rounded magnitude decides overflow: a value overflows when |x| >= overflow_threshold
  // (overflow_inclusive) or |x| > overflow_threshold (!overflow_inclusive). The threshold is
  // max_finite plus half an ulp at max_finite; whether the tie overflows follows from
  // round-to-nearest-even: for IEEE-like formats max_finite has an odd fraction, so the tie
  // goes to Inf; for E4M3 fn the next code is NaN, not a value, and the tie stays at 448. The
  // FP6/FP4 formats round as if the exponent range went on: max_finite's fraction is all ones
  // (odd), so the tie rounds to the next binade, beyond max (E2M1: 7 is a tie between 6 and 8,
  // rounds to 8). With no code for it, "overflow" there means the result saturates to +-max
  // (convert.h).
  double overflow_threshold;
  bool overflow_inclusive;

  constexpr double min_normal() const { return exp2i(min_normal_exponent); }
  constexpr double min_subnormal() const { return exp2i(min_subnormal_exponent); }

  // 2^e for the exponent range used by the formats (|e| < 1023), exact and constexpr.
  static constexpr double exp2i(int e) {
    double r = 1.0;
    if (e >= 0) {
      for (int i = 0; i < e; ++i) r *= 2.0;
    } else {
      for (int i = 0; i < -e; ++i) r *= 0.5;
    }
    return r;
  }
};

namespace detail {
constexpr FormatInfo make_format(Format f, const char* name, int ebits, int mbits,
                                 SpecialCodes special) {
  const int bias = (1 << (ebits - 1)) - 1;
  // kIeee: the all-ones exponent is reserved, so the largest finite exponent is
  // 2^ebits - 2 - bias with an all-ones fraction. kNanOnlyFn keeps the all-ones exponent for
  // values and gives up only S.1..1.1..1 (NaN), so its largest fraction is all-ones minus one.
  // kFiniteOnly gives up nothing: all-ones exponent, all-ones fraction.
  const bool ieee = special == SpecialCodes::kIeee;
  const int max_biased = ieee ? (1 << ebits) - 2 : (1 << ebits) - 1;
  const int max_exp = max_biased - bias;
  const int max_frac = special == SpecialCodes::kNanOnlyFn ? (1 << mbits) - 2 : (1 << mbits) - 1;
  const double ulp_at_max = FormatInfo::exp2i(max_exp - mbits);
  const double max_finite = FormatInfo::exp2i(max_exp) + max_frac * ulp_at_max;
  const bool max_frac_odd = (max_frac & 1) != 0;
  return FormatInfo{f,
                    name,
                    1 + ebits + mbits,
                    ebits,
                    mbits,
                    bias,
                    special,
                    /*has_inf=*/ieee,
                    /*has_nan=*/special != SpecialCodes::kFiniteOnly,
                    max_exp,
                    1 - bias,
                    1 - bias - mbits,
                    max_finite,
                    max_finite + 0.5 * ulp_at_max,
                    /*overflow_inclusive=*/max_frac_odd};
}
}  // namespace detail

inline constexpr FormatInfo kFormatInfos[kNumFormats] = {
    detail::make_format(Format::kFP32, "fp32", 8, 23, SpecialCodes::kIeee),
    detail::make_format(Format::kFP16, "fp16", 5, 10, SpecialCodes::kIeee),
    detail::make_format(Format::kBF16, "bf16", 8, 7, SpecialCodes::kIeee),
    detail::make_format(Format::kE4M3, "e4m3", 4, 3, SpecialCodes::kNanOnlyFn),
    detail::make_format(Format::kE5M2, "e5m2", 5, 2, SpecialCodes::kIeee),
    detail::make_format(Format::kE2M1, "e2m1", 2, 1, SpecialCodes::kFiniteOnly),
    detail::make_format(Format::kE3M2, "e3m2", 3, 2, SpecialCodes::kFiniteOnly),
    detail::make_format(Format::kE2M3, "e2m3", 2, 3, SpecialCodes::kFiniteOnly),
};

// The enum and the table agree entry by entry (format_info indexes the table by the enum).
static_assert([] {
  for (int i = 0; i < kNumFormats; ++i) {
    if (static_cast<int>(kFormatInfos[i].format) != i) return false;
  }
  return true;
}());

constexpr const FormatInfo& format_info(Format f) { return kFormatInfos[static_cast<int>(f)]; }

constexpr std::string_view format_name(Format f) { return format_info(f).name; }

// Accepts the canonical names and common aliases (float32, half, float16, bfloat16,
// fp8e4m3, fp8_e4m3, e4m3fn, fp8e5m2, fp4, float4_e2m1fn, fp6_e3m2, float6_e2m3fn, ...),
// case-insensitive; '_' and '-' are ignored. nullopt when unknown. "fp6" alone is refused:
// it names two formats.
inline std::optional<Format> parse_format(std::string_view name) {
  std::string s;
  for (const char c : name) {
    if (c == '_' || c == '-') continue;
    s += (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
  }
  if (s == "fp32" || s == "float32" || s == "float" || s == "f32") return Format::kFP32;
  if (s == "fp16" || s == "float16" || s == "half" || s == "f16" || s == "binary16") {
    return Format::kFP16;
  }
  if (s == "bf16" || s == "bfloat16") return Format::kBF16;
  if (s == "e4m3" || s == "fp8e4m3" || s == "e4m3fn" || s == "fp8e4m3fn" || s == "float8e4m3fn") {
    return Format::kE4M3;
  }
  if (s == "e5m2" || s == "fp8e5m2" || s == "float8e5m2") return Format::kE5M2;
  if (s == "e2m1" || s == "fp4" || s == "fp4e2m1" || s == "float4e2m1fn" || s == "e2m1fn") {
    return Format::kE2M1;
  }
  if (s == "e3m2" || s == "fp6e3m2" || s == "float6e3m2fn" || s == "e3m2fn") return Format::kE3M2;
  if (s == "e2m3" || s == "fp6e2m3" || s == "float6e2m3fn" || s == "e2m3fn") return Format::kE2M3;
  return std::nullopt;
}

// Storage types the statistics kernels read: FP32, FP16, BF16 and FP8 (E4M3, E5M2; one byte per
// element, as torch.float8_e4m3fn / float8_e5m2 store them). Device statistics read the first
// three only.
constexpr bool is_stats_storage_format(Format f) {
  return f == Format::kFP32 || f == Format::kFP16 || f == Format::kBF16 || f == Format::kE4M3 ||
         f == Format::kE5M2;
}

// Bytes per element in memory. The narrow formats take one byte each, unpacked: an FP6/FP4
// code sits in the low bits of its byte, the high bits zero (and ignored when read). Packed FP4
// (two elements per byte) is not a storage format here.
constexpr int storage_bytes(Format f) { return (format_info(f).total_bits + 7) / 8; }

}  // namespace ampscope
