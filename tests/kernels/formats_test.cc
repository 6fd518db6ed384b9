#include "ampscope/formats.h"

#include <gtest/gtest.h>

#include <cmath>

namespace ampscope {
namespace {

// The formats' table (docs/numerics.md), written out independently of the derivation in formats.h. Overflow
// thresholds are max finite plus half an ulp (hex literals for the 2^127 formats).
struct Expected {
  Format format;
  double max_finite;
  int min_normal_exp;
  int min_subnormal_exp;
  bool has_inf;
  double overflow_threshold;
  bool overflow_inclusive;
};

constexpr Expected kExpected[] = {
    {Format::kFP32, 0x1.fffffep127, -126, -149, true, 0x1.ffffffp127, true},
    {Format::kFP16, 65504.0, -14, -24, true, 65520.0, true},
    {Format::kBF16, 0x1.fep127, -126, -133, true, 0x1.ffp127, true},
    {Format::kE4M3, 448.0, -6, -9, false, 464.0, false},
    {Format::kE5M2, 57344.0, -14, -16, true, 61440.0, true},
};

TEST(FormatInfoTest, MatchesDesignTable) {
  for (const Expected& e : kExpected) {
    const FormatInfo& f = format_info(e.format);
    SCOPED_TRACE(f.name);
    EXPECT_EQ(f.format, e.format);
    EXPECT_EQ(f.max_finite, e.max_finite);
    EXPECT_EQ(f.min_normal(), std::ldexp(1.0, e.min_normal_exp));
    EXPECT_EQ(f.min_subnormal(), std::ldexp(1.0, e.min_subnormal_exp));
    EXPECT_EQ(f.has_inf, e.has_inf);
    EXPECT_EQ(f.overflow_threshold, e.overflow_threshold);
    EXPECT_EQ(f.overflow_inclusive, e.overflow_inclusive);
  }
}

TEST(FormatInfoTest, WidthsAddUp) {
  for (const FormatInfo& f : kFormatInfos) {
    EXPECT_EQ(f.total_bits, 1 + f.exponent_bits + f.mantissa_bits) << f.name;
    EXPECT_EQ(f.min_subnormal_exponent, f.min_normal_exponent - f.mantissa_bits) << f.name;
  }
  EXPECT_EQ(storage_bytes(Format::kFP32), 4);
  EXPECT_EQ(storage_bytes(Format::kBF16), 2);
  EXPECT_EQ(storage_bytes(Format::kE5M2), 1);
}

TEST(FormatInfoTest, ParsesNamesAndAliases) {
  EXPECT_EQ(parse_format("fp16"), Format::kFP16);
  EXPECT_EQ(parse_format("Half"), Format::kFP16);
  EXPECT_EQ(parse_format("bfloat16"), Format::kBF16);
  EXPECT_EQ(parse_format("float8_e4m3fn"), Format::kE4M3);
  EXPECT_EQ(parse_format("FP8-E5M2"), Format::kE5M2);
  EXPECT_EQ(parse_format("float32"), Format::kFP32);
  EXPECT_FALSE(parse_format("fp64").has_value());
  EXPECT_FALSE(parse_format("").has_value());
  for (const FormatInfo& f : kFormatInfos) EXPECT_EQ(parse_format(f.name), f.format);
}

}  // namespace
}  // namespace ampscope
