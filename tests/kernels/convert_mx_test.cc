// The OCP Microscaling v1.0 element formats (FP4 E2M1, FP6 E3M2 and E2M3) and the E8M0 scale
// against value tables copied from the specification's format tables, not derived from the
// code: every code decodes to its table value at every SIMD level (bits above the code
// ignored), every FP32 value just below, at and just above each midpoint between neighbours
// rounds to the nearer neighbour or, on the tie, to the even code; half the smallest subnormal
// underflows to a signed zero; values past max, Inf and NaN become +-max in both overflow modes
// (the formats have no code for anything else). E8M0: all 256 codes, and the exponent clamp.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "../../kernels/cpu/convert_internal.h"  // detail::round_through_at_level
#include "ampscope/check.h"
#include "ampscope/convert.h"
#include "ampscope/cpu_features.h"

namespace ampscope {
namespace {

// Positive values in code order (code i is values[i]; code i | sign bit is -values[i]).
constexpr double kE2m1Values[] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
constexpr double kE3m2Values[] = {
    0.0,  0.0625, 0.125, 0.1875,  // subnormal: 2^-2 * 0.m
    0.25, 0.3125, 0.375, 0.4375,  // 2^-2 * 1.m
    0.5,  0.625,  0.75,  0.875,   // 2^-1
    1.0,  1.25,   1.5,   1.75,    // 2^0
    2.0,  2.5,    3.0,   3.5,     // 2^1
    4.0,  5.0,    6.0,   7.0,     // 2^2
    8.0,  10.0,   12.0,  14.0,    // 2^3
    16.0, 20.0,   24.0,  28.0,    // 2^4
};
constexpr double kE2m3Values[] = {
    0.0, 0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875,  // subnormal: 2^0 * 0.m
    1.0, 1.125, 1.25, 1.375, 1.5, 1.625, 1.75, 1.875,  // 2^0 * 1.m
    2.0, 2.25,  2.5,  2.75,  3.0, 3.25,  3.5,  3.75,   // 2^1
    4.0, 4.5,   5.0,  5.5,   6.0, 6.5,   7.0,  7.5,    // 2^2
};

struct Element {
  Format format;
  std::span<const double> values;  // positive half
  std::uint32_t sign_bit;
};

const Element kElements[] = {
    {Format::kE2M1, kE2m1Values, 0x8},
    {Format::kE3M2, kE3m2Values, 0x20},
    {Format::kE2M3, kE2m3Values, 0x20},
};

constexpr SimdLevel kLevels[] = {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512};
constexpr OverflowMode kModes[] = {OverflowMode::kNonSaturating, OverflowMode::kSaturating};

std::uint32_t bits_of(float x) { return std::bit_cast<std::uint32_t>(x); }

// encode/round_to and every level's bulk paths on one input.
void expect_encodes_to(const Element& e, float x, std::uint32_t want_code) {
  const float want_value = decode(want_code, e.format);
  for (OverflowMode mode : kModes) {
    SCOPED_TRACE(::testing::Message()
                 << format_name(e.format) << " x=" << x << " (" << std::hexfloat << x
                 << std::defaultfloat << ") mode " << static_cast<int>(mode));
    EXPECT_EQ(encode(x, e.format, mode), want_code);
    EXPECT_EQ(bits_of(round_to(x, e.format, mode)), bits_of(want_value));
    for (SimdLevel level : kLevels) {
      if (clamp_simd_level(level) != level) continue;
      std::uint8_t code = 0xEE;
      convert_from_fp32(&x, &code, 1, e.format, mode, level);
      EXPECT_EQ(code, want_code) << simd_level_name(level);
      float r = x;
      detail::round_through_at_level(&r, 1, e.format, mode, level);
      EXPECT_EQ(bits_of(r), bits_of(want_value)) << simd_level_name(level);
    }
  }
}

TEST(MxElementTest, EveryCodeDecodesToTheSpecificationTable) {
  for (const Element& e : kElements) {
    SCOPED_TRACE(format_name(e.format));
    const auto half = static_cast<std::uint32_t>(e.values.size());
    ASSERT_EQ(half, e.sign_bit);
    ASSERT_EQ(half * 2, 1u << format_info(e.format).total_bits);
    // Every byte: the low total_bits bits are the code, the rest is ignored.
    std::vector<std::uint8_t> bytes(256);
    for (std::uint32_t b = 0; b < 256; ++b) bytes[b] = static_cast<std::uint8_t>(b);
    for (std::uint32_t b = 0; b < 256; ++b) {
      const std::uint32_t code = b & (2 * half - 1);
      const double magnitude = e.values[code & (half - 1)];
      const float want = static_cast<float>((code & half) != 0 ? -magnitude : magnitude);
      EXPECT_EQ(bits_of(decode(b, e.format)), bits_of(want)) << "byte 0x" << std::hex << b;
    }
    for (SimdLevel level : kLevels) {
      if (clamp_simd_level(level) != level) continue;
      std::vector<float> out(256);
      convert_to_fp32(bytes.data(), out.data(), out.size(), e.format, level);
      for (std::uint32_t b = 0; b < 256; ++b) {
        EXPECT_EQ(bits_of(out[b]), bits_of(decode(b, e.format)))
            << simd_level_name(level) << " byte 0x" << std::hex << b;
      }
    }
    EXPECT_EQ(decode(e.sign_bit, e.format), 0.0f);
    EXPECT_TRUE(std::signbit(decode(e.sign_bit, e.format)));  // -0
    EXPECT_EQ(format_info(e.format).max_finite, e.values.back());
  }
}

// Around each midpoint between neighbouring values a < b: below -> a, above -> b, at the
// midpoint -> the even code. Both signs. The midpoint above max (where the next binade's first
// value would be) and everything past it saturate to max.
TEST(MxElementTest, RoundsToNearestEvenAtEveryBoundary) {
  for (const Element& e : kElements) {
    const auto n = static_cast<std::uint32_t>(e.values.size());
    for (std::uint32_t i = 0; i < n; ++i) {
      const double a = e.values[i];
      for (std::uint32_t s : {0u, e.sign_bit}) {
        const float sign = s != 0 ? -1.0f : 1.0f;
        expect_encodes_to(e, sign * static_cast<float>(a), s | i);
        if (i + 1 == n) continue;
        const double b = e.values[i + 1];
        const auto mid = static_cast<float>((a + b) / 2);  // exact in FP32
        ASSERT_EQ(static_cast<double>(mid), (a + b) / 2);
        const std::uint32_t even = (i % 2 == 0) ? i : i + 1;
        expect_encodes_to(e, sign * std::nextafter(mid, 0.0f), s | i);
        expect_encodes_to(e, sign * mid, s | even);
        expect_encodes_to(e, sign * std::nextafter(mid, INFINITY), s | (i + 1));
      }
    }
  }
}

TEST(MxElementTest, SaturatesAboveMaxAndOnInfAndNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const Element& e : kElements) {
    const auto max_code = static_cast<std::uint32_t>(e.values.size() - 1);
    const auto max = static_cast<float>(e.values.back());
    // The tie above max rounds to the next binade (max's code is odd), beyond max.
    const auto ulp_at_max = static_cast<float>(e.values.back() - e.values[max_code - 1]);
    const float tie = max + ulp_at_max / 2;
    for (float x : {std::nextafter(max, INFINITY), std::nextafter(tie, 0.0f), tie,
                    std::nextafter(tie, INFINITY), max + ulp_at_max, 2 * max, 1e30f,
                    std::numeric_limits<float>::max(), INFINITY, nan,
                    std::bit_cast<float>(0x7F800001u), std::bit_cast<float>(0x7FFFFFFFu)}) {
      expect_encodes_to(e, x, max_code);
      expect_encodes_to(e, -x, e.sign_bit | max_code);
    }
    // The FormatInfo thresholds the statistics kernels count with say the same: the tie is
    // already an overflow (its rounded magnitude is beyond max).
    const FormatInfo& f = format_info(e.format);
    EXPECT_EQ(f.overflow_threshold, static_cast<double>(tie));
    EXPECT_TRUE(f.overflow_inclusive);
  }
}

TEST(MxElementTest, UnderflowsAtHalfTheSmallestSubnormalToASignedZero) {
  for (const Element& e : kElements) {
    const auto min_sub = static_cast<float>(e.values[1]);
    EXPECT_EQ(static_cast<double>(min_sub), format_info(e.format).min_subnormal());
    for (std::uint32_t s : {0u, e.sign_bit}) {
      const float sign = s != 0 ? -1.0f : 1.0f;
      expect_encodes_to(e, sign * 0.0f, s);
      expect_encodes_to(e, sign * 0x1p-149f, s);  // FP32 subnormal
      expect_encodes_to(e, sign * std::nextafter(min_sub / 2, 0.0f), s);
      expect_encodes_to(e, sign * (min_sub / 2), s);  // tie: even (0)
      expect_encodes_to(e, sign * std::nextafter(min_sub / 2, INFINITY), s | 1u);
      expect_encodes_to(e, sign * (min_sub * 0.75f), s | 1u);
    }
  }
}

// Spot checks in the words of the formats' definitions.
TEST(MxElementTest, KnownRoundings) {
  EXPECT_EQ(round_to(5.0f, Format::kE2M1), 4.0f);   // tie between 4 (code 6) and 6 (code 7)
  EXPECT_EQ(round_to(2.5f, Format::kE2M1), 2.0f);   // tie between 2 (code 4) and 3 (code 5)
  EXPECT_EQ(round_to(3.5f, Format::kE2M1), 4.0f);   // tie between 3 (code 5) and 4 (code 6)
  EXPECT_EQ(round_to(0.25f, Format::kE2M1), 0.0f);  // half the min subnormal 0.5
  EXPECT_EQ(round_to(0.75f, Format::kE2M1), 1.0f);  // tie between 0.5 (code 1) and 1 (code 2)
  EXPECT_EQ(round_to(7.0f, Format::kE2M1), 6.0f);   // rounds to 8, beyond max: saturates
  EXPECT_EQ(round_to(-100.0f, Format::kE2M1), -6.0f);
  EXPECT_EQ(round_to(29.0f, Format::kE3M2), 28.0f);
  EXPECT_EQ(round_to(0.03125f, Format::kE3M2), 0.0f);    // half of 2^-4
  EXPECT_EQ(round_to(0.09375f, Format::kE3M2), 0.125f);  // 1.5 * 2^-4 ties to 2 * 2^-4
  EXPECT_EQ(round_to(7.7f, Format::kE2M3), 7.5f);
  EXPECT_EQ(round_to(0.0625f, Format::kE2M3), 0.0f);  // half of 2^-3
  EXPECT_EQ(round_to(1.0625f, Format::kE2M3), 1.0f);  // tie between 1 and 1.125
  EXPECT_EQ(encode(std::numeric_limits<float>::quiet_NaN(), Format::kE2M1), 0x7u);
  EXPECT_EQ(encode(-std::numeric_limits<float>::quiet_NaN(), Format::kE3M2), 0x3Fu);
  EXPECT_EQ(encode(-INFINITY, Format::kE2M3, OverflowMode::kNonSaturating), 0x3Fu);
}

// ---- E8M0 ------------------------------------------------------------------------------------

TEST(E8m0Test, EveryCodeIsTwoToTheCodeMinus127) {
  for (int code = 0; code < 255; ++code) {
    const float x = decode_e8m0(static_cast<std::uint8_t>(code));
    // Converting an FP32 to double is exact (no DAZ in the test process by default).
    EXPECT_EQ(static_cast<double>(x), std::ldexp(1.0, code - 127)) << code;
    EXPECT_EQ(encode_e8m0(code - 127), code);
    EXPECT_EQ(floor_log2(x), code - 127) << code;
  }
  EXPECT_TRUE(std::isnan(decode_e8m0(0xFF)));
  EXPECT_EQ(bits_of(decode_e8m0(0)), 0x00400000u);  // 2^-127: an FP32 subnormal
  EXPECT_EQ(decode_e8m0(127), 1.0f);
  EXPECT_EQ(decode_e8m0(254), 0x1p127f);
}

TEST(E8m0Test, EncodeClampsTheExponentAndNeverGivesNaN) {
  for (int e = -400; e <= 400; ++e) {
    const int clamped = e < -127 ? -127 : (e > 127 ? 127 : e);
    EXPECT_EQ(encode_e8m0(e), clamped + 127) << e;
  }
  EXPECT_EQ(encode_e8m0(std::numeric_limits<int>::max()), 254);
  EXPECT_EQ(encode_e8m0(std::numeric_limits<int>::min()), 0);
}

TEST(E8m0Test, FloorLog2IsExactOnEveryBinadeAndItsEdges) {
  for (int e = -149; e <= 127; ++e) {
    const float p = std::ldexp(1.0f, e);
    EXPECT_EQ(floor_log2(p), e);
    EXPECT_EQ(floor_log2(-p), e);
    if (e > -149) {  // 2^-149's neighbours are 0 and 2^-148
      EXPECT_EQ(floor_log2(std::nextafter(p, INFINITY)), e) << e;
      EXPECT_EQ(floor_log2(std::nextafter(p, 0.0f)), e - 1) << e;
    }
  }
  EXPECT_EQ(floor_log2(std::numeric_limits<float>::max()), 127);
  EXPECT_EQ(floor_log2(448.0f), 8);
  EXPECT_EQ(floor_log2(6.0f), 2);
  EXPECT_THROW(floor_log2(0.0f), Error);
  EXPECT_THROW(floor_log2(-0.0f), Error);
  EXPECT_THROW(floor_log2(INFINITY), Error);
  EXPECT_THROW(floor_log2(std::numeric_limits<float>::quiet_NaN()), Error);
}

}  // namespace
}  // namespace ampscope
