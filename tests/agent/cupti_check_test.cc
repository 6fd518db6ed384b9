// The offline CUPTI check (Profiler Host API, no GPU) for three chips, as a library call and
// through `ampscope cupti-check`.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "ampscope/agent/cupti.h"
#include "ampscope/testing/child_process.h"

namespace ampscope::agent {
namespace {

struct ChipCase {
  const char* chip;
  const char* tensor_metric;
};

class CuptiCheckTest : public ::testing::TestWithParam<ChipCase> {
 protected:
  void SetUp() override {
    if (!cupti_built_in()) GTEST_SKIP() << "built without CUPTI";
  }
};

TEST_P(CuptiCheckTest, ChoosesAResolvingSinglePassConfiguration) {
  const auto [chip, metric] = GetParam();
  const CuptiChipCheck c = check_chip(chip);
  ASSERT_TRUE(c.available) << c.error;
  EXPECT_EQ(c.tensor_metric, metric);
  EXPECT_EQ(c.time_metric, "gpu__time_duration.sum");
  EXPECT_EQ(c.passes, 1);
  EXPECT_GT(c.config_image_bytes, 0u);
  // Every candidate was tried, each on its own host object: the ones after an invalid name
  // still resolve where they exist.
  ASSERT_EQ(c.candidates.size(), tensor_metric_candidates().size() + 1);
  const auto& any_pipe = c.candidates[2];
  EXPECT_EQ(any_pipe.name, "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active");
  EXPECT_TRUE(any_pipe.resolves) << any_pipe.error;
}

INSTANTIATE_TEST_SUITE_P(
    Chips, CuptiCheckTest,
    ::testing::Values(
        ChipCase{"GA100", "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"},
        ChipCase{"GH100", "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"},
        ChipCase{"GB100",
                 "sm__pipe_tensor_subpipe_hmma_cycles_active.avg.pct_of_peak_sustained_active"}),
    [](const auto& info) { return std::string(info.param.chip); });

TEST(CuptiCheckTest, UnknownChipIsNamed) {
  if (!cupti_built_in()) GTEST_SKIP() << "built without CUPTI";
  const CuptiChipCheck c = check_chip("ZZ999");
  EXPECT_FALSE(c.available);
  EXPECT_NE(c.error.find("ZZ999"), std::string::npos);
  EXPECT_GT(c.supported_chips.size(), 3u);
}

TEST(CuptiCheckCommandTest, ThreeChipsOffline) {
  if (!cupti_built_in()) GTEST_SKIP() << "built without CUPTI";
  std::string out;
  const int code = ampscope::testing::run_to_completion(
      {AMPSCOPE_CLI_BINARY, "cupti-check", "--chip", "GA100", "--chip", "GH100", "--chip", "GB100"},
      &out);
  EXPECT_EQ(code, 0) << out;
  for (const char* chip : {"chip GA100: supported", "chip GH100: supported", "chip GB100: supported"}) {
    EXPECT_NE(out.find(chip), std::string::npos) << out;
  }
  EXPECT_NE(out.find("<- tensor_core_active_ratio"), std::string::npos) << out;
  EXPECT_NE(out.find("1 pass"), std::string::npos) << out;
}

TEST(CuptiCheckCommandTest, UnknownChipFailsWithOneLine) {
  if (!cupti_built_in()) GTEST_SKIP() << "built without CUPTI";
  const ampscope::testing::CommandResult r =
      ampscope::testing::run_process({AMPSCOPE_CLI_BINARY, "cupti-check", "--chip", "ZZ999"});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("ZZ999"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace ampscope::agent
