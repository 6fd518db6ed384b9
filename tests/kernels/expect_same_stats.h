// The kernels tests' one comparison of two TensorStats: everything exact but sum_sq, which a
// kernel sums in FP64 per chunk (compute_stats' splits and levels agree on it within a few ulps,
// the device's block order within a few more; stats_sums_test.cc checks it against an exact
// oracle).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "ampscope/tensor_stats.h"

namespace ampscope {

inline double ulp(double x) {
  const double a = std::fabs(x);
  return std::nextafter(a, std::numeric_limits<double>::infinity()) - a;
}

inline void expect_same_stats(const TensorStats& got, const TensorStats& want,
                              int sum_sq_ulps = 4) {
  EXPECT_EQ(got.numel, want.numel);
  EXPECT_EQ(got.zeros, want.zeros);
  EXPECT_EQ(got.nan, want.nan);
  EXPECT_EQ(got.pos_inf, want.pos_inf);
  EXPECT_EQ(got.neg_inf, want.neg_inf);
  EXPECT_EQ(got.max_abs, want.max_abs);
  EXPECT_EQ(got.min_abs_nonzero, want.min_abs_nonzero);
  EXPECT_EQ(got.histogram, want.histogram);
  ASSERT_EQ(got.targets.size(), want.targets.size());
  for (std::size_t i = 0; i < got.targets.size(); ++i) {
    EXPECT_EQ(got.targets[i], want.targets[i]) << "target " << to_string(want.targets[i].target);
  }
  // The reference's sum is exactly rounded, and so must every path's be.
  EXPECT_EQ(got.sum, want.sum);
  EXPECT_LE(std::fabs(got.sum_sq - want.sum_sq), sum_sq_ulps * ulp(want.sum_sq));
}

}  // namespace ampscope
