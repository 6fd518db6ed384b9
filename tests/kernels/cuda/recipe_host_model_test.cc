// The device fake_quantize's rules (recipe_rules.h as nvcc compiles them) run against the CPU's
// fake_quantize: every recipe over tensors that reach every rule (recipe_cases.h). Needs no GPU.
// The host model visits elements in the CPU's order, so even the FP64 sums must be equal.
#include "recipe_host_model.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "recipe_cases.h"

namespace ampscope::cuda::testing {
namespace {

class CudaRecipeHostModelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaRecipeHostModelTest, MatchesCpuFakeQuantizeBitForBit) {
  const Recipe recipe = *parse_recipe(GetParam());
  for (const TensorCase& c : tensor_cases()) {
    SCOPED_TRACE(c.name);
    std::vector<float> ref(c.values.size()), got(c.values.size());
    const RecipeCounts want = fake_quantize(c.values.data(), ref.data(), c.rows, c.cols, recipe);
    const RecipeCounts have =
        host_model_fake_quantize(c.values.data(), got.data(), c.rows, c.cols, recipe);
    EXPECT_TRUE(same_values(ref, got));
    EXPECT_TRUE(same_counts(want, have, 0.0));
  }
}

// The cases reach what they are meant to: each rule decides some element somewhere.
TEST(CudaRecipeCasesTest, ReachEveryRule) {
  RecipeCounts sum;
  std::uint64_t all_zero_underflow = 0;
  for (const std::string& text : recipe_case_texts()) {
    const Recipe recipe = *parse_recipe(text);
    for (const TensorCase& c : tensor_cases()) {
      const RecipeCounts k = fake_quantize(c.values.data(), nullptr, c.rows, c.cols, recipe);
      sum.underflow += k.underflow;
      sum.subnormal += k.subnormal;
      sum.saturated += k.saturated;
      sum.overflow += k.overflow;
      sum.zero_blocks += k.zero_blocks;
      sum.nan_blocks += k.nan_blocks;
      sum.saturated_blocks += k.saturated_blocks;
      if (recipe.scaling == Scaling::kNVFP4 && c.name == "scale_edges") {
        all_zero_underflow += k.underflow;
      }
    }
  }
  EXPECT_GT(sum.underflow, 0u);
  EXPECT_GT(sum.subnormal, 0u);
  EXPECT_GT(sum.saturated, 0u);
  EXPECT_GT(sum.overflow, 0u);
  EXPECT_GT(sum.zero_blocks, 0u);
  EXPECT_GT(sum.nan_blocks, 0u);
  EXPECT_GT(sum.saturated_blocks, 0u);
  EXPECT_GT(all_zero_underflow, 0u);
  // mx:ceil on an amax of FP32 max decodes it to Inf: overflow without a NaN block.
  std::vector<float> top(32, 1.0f);
  top[3] = std::numeric_limits<float>::max();
  const RecipeCounts ceil = fake_quantize(top.data(), nullptr, 1, 32, *parse_recipe("mxfp4:ceil"));
  EXPECT_EQ(ceil.nan_blocks, 0u);
  EXPECT_EQ(ceil.overflow, 1u);
}

INSTANTIATE_TEST_SUITE_P(Recipes, CudaRecipeHostModelTest, ::testing::ValuesIn(recipe_case_texts()),
                         recipe_test_name);

}  // namespace
}  // namespace ampscope::cuda::testing
