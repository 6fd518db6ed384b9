#include "ampscope/formats.h"

#include <gtest/gtest.h>

#include <cmath>
#include <iterator>

namespace ampscope {
namespace {

// The formats' table (docs/numerics.md), written out independently of the derivation in
// formats.h. Overflow thresholds are max finite plus half an ulp (hex literals for the 2^127
// formats). FP6/FP4 from OCP Microscaling v1.0: E2M1 +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}, E3M2 max 28,
// min normal 2^-2, min subnormal 2^-4; E2M3 max 7.5, min normal 1, min subnormal 2^-3; none has
// Inf or NaN. Their thresholds: 6 + 1 = 7 (a tie between 6 and 8, rounding to the even 8),
// 28 + 2 = 30, 7.5 + 0.25 = 7.75, each tie rounding beyond max, so inclusive.
struct Expected {
  Format format;
  double max_finite;
  int min_normal_exp;
  int min_subnormal_exp;
  bool has_inf;
  bool has_nan;
  double overflow_threshold;
  bool overflow_inclusive;
};

constexpr Expected kExpected[] = {
    {Format::kFP32, 0x1.fffffep127, -126, -149, true, true, 0x1.ffffffp127, true},
    {Format::kFP16, 65504.0, -14, -24, true, true, 65520.0, true},
    {Format::kBF16, 0x1.fep127, -126, -133, true, true, 0x1.ffp127, true},
    {Format::kE4M3, 448.0, -6, -9, false, true, 464.0, false},
    {Format::kE5M2, 57344.0, -14, -16, true, true, 61440.0, true},
    {Format::kE2M1, 6.0, 0, -1, false, false, 7.0, true},
    {Format::kE3M2, 28.0, -2, -4, false, false, 30.0, true},
    {Format::kE2M3, 7.5, 0, -3, false, false, 7.75, true},
};
static_assert(std::size(kExpected) == kNumFormats, "a format without its expected row");

TEST(FormatInfoTest, MatchesDesignTable) {
  for (const Expected& e : kExpected) {
    const FormatInfo& f = format_info(e.format);
    SCOPED_TRACE(f.name);
    EXPECT_EQ(f.format, e.format);
    EXPECT_EQ(f.max_finite, e.max_finite);
    EXPECT_EQ(f.min_normal(), std::ldexp(1.0, e.min_normal_exp));
    EXPECT_EQ(f.min_subnormal(), std::ldexp(1.0, e.min_subnormal_exp));
    EXPECT_EQ(f.has_inf, e.has_inf);
    EXPECT_EQ(f.has_nan, e.has_nan);
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
  // One unpacked element per byte, not total_bits / 8 = 0.
  EXPECT_EQ(storage_bytes(Format::kE2M1), 1);
  EXPECT_EQ(storage_bytes(Format::kE3M2), 1);
  EXPECT_EQ(storage_bytes(Format::kE2M3), 1);
}

// The largest normal's exponent: what OCP MX's scale subtracts (emax_elem: E4M3 8, E5M2 15,
// E3M2 4, E2M3 2, E2M1 2).
TEST(FormatInfoTest, MaxExponentIsTheLargestNormalsBinade) {
  EXPECT_EQ(format_info(Format::kE4M3).max_exponent, 8);
  EXPECT_EQ(format_info(Format::kE5M2).max_exponent, 15);
  EXPECT_EQ(format_info(Format::kE3M2).max_exponent, 4);
  EXPECT_EQ(format_info(Format::kE2M3).max_exponent, 2);
  EXPECT_EQ(format_info(Format::kE2M1).max_exponent, 2);
}

// FP6/FP4 are element formats of scaled recipes: the statistics kernels never read them.
TEST(FormatInfoTest, MxElementsAreNotStatsStorage) {
  EXPECT_TRUE(is_stats_storage_format(Format::kFP32));
  EXPECT_FALSE(is_stats_storage_format(Format::kE2M1));
  EXPECT_FALSE(is_stats_storage_format(Format::kE3M2));
  EXPECT_FALSE(is_stats_storage_format(Format::kE2M3));
}

TEST(FormatInfoTest, ParsesNamesAndAliases) {
  EXPECT_EQ(parse_format("fp16"), Format::kFP16);
  EXPECT_EQ(parse_format("Half"), Format::kFP16);
  EXPECT_EQ(parse_format("bfloat16"), Format::kBF16);
  EXPECT_EQ(parse_format("float8_e4m3fn"), Format::kE4M3);
  EXPECT_EQ(parse_format("FP8-E5M2"), Format::kE5M2);
  EXPECT_EQ(parse_format("float32"), Format::kFP32);
  for (const char* name : {"e2m1", "fp4", "FP4_E2M1", "float4_e2m1fn", "e2m1fn"}) {
    EXPECT_EQ(parse_format(name), Format::kE2M1) << name;
  }
  for (const char* name : {"e3m2", "fp6_e3m2", "float6_e3m2fn", "E3M2FN"}) {
    EXPECT_EQ(parse_format(name), Format::kE3M2) << name;
  }
  for (const char* name : {"e2m3", "fp6-e2m3", "float6_e2m3fn", "e2m3fn"}) {
    EXPECT_EQ(parse_format(name), Format::kE2M3) << name;
  }
  EXPECT_FALSE(parse_format("fp6").has_value());   // two formats: ambiguous
  EXPECT_FALSE(parse_format("e8m0").has_value());  // a scale, not an element format
  EXPECT_FALSE(parse_format("fp64").has_value());
  EXPECT_FALSE(parse_format("").has_value());
  for (const FormatInfo& f : kFormatInfos) EXPECT_EQ(parse_format(f.name), f.format);
}

}  // namespace
}  // namespace ampscope
