// The device conversion element code, run on the host through the toolkit's host definitions of
// the intrinsics, against the CPU reference. Needs no GPU: it pins down the semantics (rounding,
// overflow, saturation, and which NaN bits differ) that the device tests then check on the
// hardware instructions.
#include "convert_host_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "conversion_cases.h"

namespace ampscope::cuda::testing {
namespace {

class CudaConvertHostModelTest : public ::testing::TestWithParam<Format> {};

TEST_P(CudaConvertHostModelTest, FromFp32MatchesReferenceInBothModes) {
  const Format f = GetParam();
  const std::vector<float> probes = conversion_probes(f);
  for (OverflowMode mode : {OverflowMode::kNonSaturating, OverflowMode::kSaturating}) {
    int failures = 0;
    for (float x : probes) {
      const auto result = same_narrow(host_model_from_fp32(x, f, mode), encode(x, f, mode), x, f);
      EXPECT_TRUE(result) << "mode " << static_cast<int>(mode);
      if (!result && ++failures == 10) break;
    }
  }
}

TEST_P(CudaConvertHostModelTest, ToFp32MatchesReferenceForEveryPattern) {
  const Format f = GetParam();
  for (std::uint32_t b = 0; b < decode_patterns(f); ++b) {
    ASSERT_TRUE(same_wide(host_model_to_fp32(b, f), b, f));
  }
}

TEST_P(CudaConvertHostModelTest, SaturationClampsOverflowAndInfinity) {
  const Format f = GetParam();
  const FormatInfo& info = format_info(f);
  const std::uint32_t max_bits = encode(static_cast<float>(info.max_finite), f);
  const std::uint32_t sign = 1u << (info.total_bits - 1);
  for (float x : {INFINITY, static_cast<float>(info.overflow_threshold) * 2,
                  std::numeric_limits<float>::max()}) {
    EXPECT_EQ(host_model_from_fp32(x, f, OverflowMode::kSaturating), max_bits) << x;
    EXPECT_EQ(host_model_from_fp32(-x, f, OverflowMode::kSaturating), sign | max_bits) << -x;
  }
}

// The documented difference: a NaN input loses its sign and payload on the device path. FP6/FP4
// have no NaN: there the device path gives the reference's S.max, sign kept, in both modes.
TEST_P(CudaConvertHostModelTest, NanInputGivesCanonicalNan) {
  const Format f = GetParam();
  const FormatInfo& info = format_info(f);
  const std::uint32_t canonical = f == Format::kFP16 || f == Format::kBF16 ? 0x7FFFu : 0x7Fu;
  for (std::uint32_t u : {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFFA5A5A5u}) {
    if (!info.has_nan) {
      const std::uint32_t signed_max =
          ((u >> 31) << (info.total_bits - 1)) | ((1u << (info.total_bits - 1)) - 1);
      for (OverflowMode mode : {OverflowMode::kNonSaturating, OverflowMode::kSaturating}) {
        EXPECT_EQ(host_model_from_fp32(from_bits(u), f, mode), signed_max) << hex(u);
        EXPECT_EQ(encode(from_bits(u), f, mode), signed_max) << hex(u);
      }
      continue;
    }
    EXPECT_EQ(host_model_from_fp32(from_bits(u), f, OverflowMode::kNonSaturating), canonical)
        << hex(u);
    EXPECT_TRUE(std::isnan(decode(encode(from_bits(u), f), f)));
  }
}

INSTANTIATE_TEST_SUITE_P(NarrowFormats, CudaConvertHostModelTest,
                         ::testing::ValuesIn(kNarrowFormats),
                         [](const auto& info) { return std::string(format_name(info.param)); });

}  // namespace
}  // namespace ampscope::cuda::testing
