// Runs the C source c_api_test.c and checks what the agent spooled for it.
#include <gtest/gtest.h>

#include "ampscope/testing/files.h"
#include "spool_reader.h"

extern "C" int run_c_api_test(const char* spool_dir, char* why, size_t why_size);

namespace ampscope::agent {
namespace {

TEST(CApiTest, ExercisedFromC) {
  ampscope::testing::TempDir dir;
  char why[512] = {0};
  const int failed = run_c_api_test((dir / "spool").c_str(), why, sizeof(why));
  ASSERT_EQ(failed, 0) << "check " << failed << ": " << why;
  const auto reports = testing::read_spool(dir / "spool", "c-api");
  ASSERT_EQ(reports.size(), 3u);
  EXPECT_FALSE(reports[0].has_first_offender());
  ASSERT_TRUE(reports[1].has_first_offender());
  EXPECT_EQ(reports[1].first_offender().tensor(), "fc.weight.grad");
  EXPECT_EQ(reports[1].tensors(0).nan(), 1u);
  EXPECT_EQ(reports[1].tensors(0).level(), v1::STATS_LEVEL_FULL);
  EXPECT_TRUE(reports[1].found_inf());
  EXPECT_EQ(reports[2].tensors(0).level(), v1::STATS_LEVEL_FULL) << "the step after";
}

}  // namespace
}  // namespace ampscope::agent
