// Numeric format descriptors: FP32, FP16 (IEEE binary16), BF16, FP8 E4M3 (OCP "fn") and
// FP8 E5M2 (OCP). Every constant here is derived from the encoding (exponent bits, mantissa
// bits, bias, whether the all-ones exponent is Inf) and checked against the formats'
// definitions in tests/kernels/formats_test.cc.
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

enum class Format : std::uint8_t { kFP32 = 0, kFP16 = 1, kBF16 = 2, kE4M3 = 3, kE5M2 = 4 };

inline constexpr int kNumFormats = 5;

struct FormatInfo {
  Format format;
  const char* name;        // canonical lower-case name: fp32, fp16, bf16, e4m3, e5m2
  int total_bits;          // storage width
  int exponent_bits;
  int mantissa_bits;       // explicit (stored) fraction bits
  int bias;
  bool has_inf;            // all-ones exponent with zero fraction is Inf (false for E4M3 fn)
  int max_exponent;        // floor(log2(max_finite))
  int min_normal_exponent; // log2(min normal)
  int min_subnormal_exponent;  // log2(smallest positive subnormal)
  double max_finite;
  // Rounded magnitude decides overflow: a value overflows when |x| >= overflow_threshold
  // (overflow_inclusive) or |x| > overflow_threshold (!overflow_inclusive). The threshold is
  // max_finite plus half an ulp at max_finite; whether the tie overflows follows from
  // round-to-nearest-even: for IEEE-like formats max_finite has an odd fraction, so the tie
  // goes to Inf; for E4M3 fn the next code is NaN, not a value, and the tie stays at 448.
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
constexpr FormatInfo make_format(Format f, const char* name, int ebits, int mbits, bool has_inf,
                                 bool ieee_max) {
  const int bias = (1 << (ebits - 1)) - 1;
  // IEEE-like: the all-ones exponent is reserved, so the largest finite exponent is
  // 2^ebits - 2 - bias with an all-ones fraction. E4M3 fn keeps the all-ones exponent for
  // values and gives up only S.1111.111 (NaN), so its largest fraction is all-ones minus one.
  const int max_biased = ieee_max ? (1 << ebits) - 2 : (1 << ebits) - 1;
  const int max_exp = max_biased - bias;
  const int max_frac = ieee_max ? (1 << mbits) - 1 : (1 << mbits) - 2;
  const double ulp_at_max = FormatInfo::exp2i(max_exp - mbits);
  const double max_finite = FormatInfo::exp2i(max_exp) + max_frac * ulp_at_max;
  const bool max_frac_odd = (max_frac & 1) != 0;
  return FormatInfo{f,
                    name,
                    1 + ebits + mbits,
                    ebits,
                    mbits,
                    bias,
                    has_inf,
                    max_exp,
                    1 - bias,
                    1 - bias - mbits,
                    max_finite,
                    max_finite + 0.5 * ulp_at_max,
                    /*overflow_inclusive=*/max_frac_odd};
}
}  // namespace detail

inline constexpr FormatInfo kFormatInfos[kNumFormats] = {
    detail::make_format(Format::kFP32, "fp32", 8, 23, true, true),
    detail::make_format(Format::kFP16, "fp16", 5, 10, true, true),
    detail::make_format(Format::kBF16, "bf16", 8, 7, true, true),
    detail::make_format(Format::kE4M3, "e4m3", 4, 3, false, false),
    detail::make_format(Format::kE5M2, "e5m2", 5, 2, true, true),
};

constexpr const FormatInfo& format_info(Format f) {
  return kFormatInfos[static_cast<int>(f)];
}

constexpr std::string_view format_name(Format f) { return format_info(f).name; }

// Accepts the canonical names and common aliases (float32, half, float16, bfloat16,
// fp8e4m3, fp8_e4m3, e4m3fn, fp8e5m2, ...), case-insensitive. nullopt when unknown.
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
  return std::nullopt;
}

// Storage types the statistics kernels read.
constexpr bool is_stats_storage_format(Format f) {
  return f == Format::kFP32 || f == Format::kFP16 || f == Format::kBF16;
}

constexpr int storage_bytes(Format f) { return format_info(f).total_bits / 8; }

}  // namespace ampscope
