// A quantiser measurement as the wire carries it (StepReport.quantizers) against the
// RecipeCounts it came from: every field equal.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "ampscope/recipe.h"
#include "ampscope/v1/telemetry.pb.h"

namespace ampscope::agent::testing {

inline void expect_wire_equals(const v1::QuantizerStats& q, const RecipeCounts& c) {
  EXPECT_EQ(q.recipe(), to_string(c.recipe));
  EXPECT_EQ(q.values(), c.values);
  EXPECT_EQ(q.nonfinite(), c.nonfinite);
  EXPECT_EQ(q.underflow(), c.underflow);
  EXPECT_EQ(q.subnormal(), c.subnormal);
  EXPECT_EQ(q.saturated(), c.saturated);
  EXPECT_EQ(q.overflow(), c.overflow);
  EXPECT_EQ(q.amax(), c.amax);
  EXPECT_EQ(q.signal_sq(), c.signal_sq);
  EXPECT_EQ(q.error_sq(), c.error_sq);
  EXPECT_EQ(q.tensor_scale(), c.tensor_scale);
  EXPECT_EQ(q.blocks(), c.blocks);
  EXPECT_EQ(q.zero_blocks(), c.zero_blocks);
  EXPECT_EQ(q.saturated_blocks(), c.saturated_blocks);
  EXPECT_EQ(q.nan_blocks(), c.nan_blocks);
  EXPECT_EQ(q.scale_histogram().min_exponent(), c.scale_histogram.min_exponent);
  EXPECT_EQ(std::vector<std::uint64_t>(q.scale_histogram().counts().begin(),
                                       q.scale_histogram().counts().end()),
            c.scale_histogram.counts);
}

}  // namespace ampscope::agent::testing
