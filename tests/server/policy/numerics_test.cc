// The policy library's binade helpers: the overflow-free ceiling agrees with the numerics
// core's predict_from_histogram, the unscaled shift is exact for powers of two and never
// underestimates the top otherwise, and the trimmed range trims what it says.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "ampscope/policy/policy_engine.h"

namespace ampscope::policy {
namespace {

TEST(PolicyNumericsTest, OverflowFreeScaleIsTheLastScaleWithZeroPredictedOverflow) {
  for (Format f : {Format::kFP16, Format::kBF16, Format::kE4M3, Format::kE5M2, Format::kFP32}) {
    for (int top = -60; top <= 20; top += 7) {
      BinadeHistogram h{top - 5, {3, 0, 7, 1, 1, 9}};
      const auto k = overflow_free_scale_log2(h, f);
      ASSERT_TRUE(k.has_value());
      EXPECT_EQ(predict_from_histogram(h, f, *k).overflow.upper, 0u) << format_name(f) << top;
      EXPECT_GT(predict_from_histogram(h, f, *k + 1).overflow.upper, 0u) << format_name(f) << top;
    }
  }
  // FP16: the top binade must land at or below [2^14, 2^15).
  EXPECT_EQ(overflow_free_scale_log2(BinadeHistogram{-10, {1}}, Format::kFP16), 24);
  EXPECT_EQ(overflow_free_scale_log2(BinadeHistogram{-10, {1}}, Format::kE4M3), 17);
  EXPECT_EQ(overflow_free_scale_log2(BinadeHistogram{}, Format::kFP16), std::nullopt);
}

TEST(PolicyNumericsTest, UnscaledShiftIsExactForPowersOfTwo) {
  const BinadeHistogram h{-3, {1, 2, 3}};
  EXPECT_EQ(to_unscaled(h, 65536.0).min_exponent, -19);
  EXPECT_EQ(to_unscaled(h, 0.25).min_exponent, -1);
  EXPECT_EQ(to_unscaled(h, 65536.0).counts, h.counts);
  EXPECT_TRUE(to_unscaled(BinadeHistogram{}, 8.0).empty());
}

TEST(PolicyNumericsTest, UnscaledShiftForOtherScalesNeverPutsAValueBelowItsBin) {
  // A value x in measured bin e lands in bin e - floor(log2 s); its true bin floor(log2(x/s))
  // is that bin or the one below, never above.
  for (double s : {1000.0, 1.5, 3.0, 0.3, 65535.0}) {
    for (double x = 1e-3; x < 1e6; x *= 1.0137) {
      const int e = static_cast<int>(std::floor(std::log2(x)));
      const BinadeHistogram u = to_unscaled(BinadeHistogram{e, {1}}, s);
      const int truth = static_cast<int>(std::floor(std::log2(x / s)));
      EXPECT_LE(truth, u.min_exponent) << "x=" << x << " s=" << s;
      EXPECT_GE(truth, u.min_exponent - 1) << "x=" << x << " s=" << s;
    }
  }
}

TEST(PolicyNumericsTest, UnscaledShiftRejectsScalesThatAreNotFiniteAndPositive) {
  const BinadeHistogram h{0, {1}};
  for (double s : {0.0, -2.0, std::numeric_limits<double>::infinity(),
                   std::numeric_limits<double>::quiet_NaN()}) {
    EXPECT_THROW(to_unscaled(h, s), PolicyError) << s;
  }
}

TEST(PolicyNumericsTest, TrimmedDynamicRangeDropsTheStatedShareFromEachEnd) {
  BinadeHistogram h{-40, std::vector<std::uint64_t>(51, 0)};
  h.counts[0] = 1;   // a lone value at 2^-40
  h.counts[50] = 1;  // a lone value at 2^10
  for (int i = 20; i <= 30; ++i) h.counts[static_cast<std::size_t>(i)] = 1000;  // 2^-20..2^-10
  EXPECT_EQ(trimmed_dynamic_range(h, 0.0), 50);
  EXPECT_EQ(trimmed_dynamic_range(h, 1e-3), 10);
  EXPECT_EQ(trimmed_dynamic_range(BinadeHistogram{}, 1e-3), 0);
  EXPECT_EQ(trimmed_dynamic_range(BinadeHistogram{5, {1}}, 0.2), 0);
}

}  // namespace
}  // namespace ampscope::policy
