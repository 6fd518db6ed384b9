// The device fake_quantize's rules (recipe_rules.h as nvcc compiles them) run against the CPU's
// fake_quantize: every recipe over tensors that reach every rule (recipe_cases.h), and the FP8
// codes quantize_codes writes for a real FP8 GEMM (recipe_codes.cuh). Needs no GPU.
// The host model visits elements in the CPU's order, so even the FP64 sums must be equal.
#include "recipe_host_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
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

// quantize_codes' elements: per-tensor FP8 recipes written as codes and a decode scale, which a
// real FP8 GEMM multiplies. Each code times the decode scale is fake_quantize's value bit for
// bit (a non-finite input stays non-finite), the counts are fake_quantize's, and the transposed
// layout holds the same codes at the transposed places.
TEST_P(CudaRecipeHostModelTest, CodesTimesTheDecodeScaleAreTheDequantisedValues) {
  const Recipe recipe = *parse_recipe(GetParam());
  if (recipe.scaling != Scaling::kCurrent && recipe.scaling != Scaling::kDelayed) return;
  if (recipe.element != Format::kE4M3 && recipe.element != Format::kE5M2) return;
  for (const TensorCase& c : tensor_cases()) {
    SCOPED_TRACE(c.name);
    const std::size_t n = c.values.size();
    std::vector<float> ref(n);
    const RecipeCounts want = fake_quantize(c.values.data(), ref.data(), c.rows, c.cols, recipe);
    std::vector<std::uint8_t> codes(n), transposed(n);
    float decode = 0.0f, decode_t = 0.0f;
    const RecipeCounts have = host_model_quantize_codes(c.values.data(), codes.data(), &decode,
                                                        c.rows, c.cols, false, recipe);
    host_model_quantize_codes(c.values.data(), transposed.data(), &decode_t, c.rows, c.cols, true,
                              recipe);
    EXPECT_TRUE(same_counts(want, have, 0.0));
    EXPECT_EQ(decode, 1.0f / static_cast<float>(want.tensor_scale));
    EXPECT_EQ(decode_t, decode);
    std::vector<float> got(n);
    for (std::size_t i = 0; i < n; ++i) {
      got[i] = ampscope::decode(codes[i], recipe.element) * decode;
      if (!std::isfinite(ref[i])) {
        EXPECT_FALSE(std::isfinite(got[i])) << i;
        got[i] = ref[i];
      }
      EXPECT_EQ(transposed[i % c.cols * c.rows + i / c.cols], codes[i]) << i;
    }
    EXPECT_TRUE(same_values(ref, got));
  }
}

// Every FP8 pattern that is a finite value, under a scale of 1, is its own code.
TEST(CudaRecipeCodesTest, EveryFiniteFp8ValueIsItsOwnCode) {
  for (const char* text : {"e4m3:scale=1", "e5m2:scale=1"}) {
    SCOPED_TRACE(text);
    const Recipe recipe = *parse_recipe(text);
    std::vector<float> values;
    std::vector<std::uint8_t> patterns;
    for (unsigned bits = 0; bits < 256; ++bits) {
      const float v = ampscope::decode(bits, recipe.element);
      if (!std::isfinite(v)) continue;
      values.push_back(v);
      patterns.push_back(static_cast<std::uint8_t>(bits));
    }
    ASSERT_EQ(values.size(), recipe.element == Format::kE4M3 ? 254u : 248u);
    std::vector<std::uint8_t> codes(values.size());
    float decode = 0.0f;
    const RecipeCounts counts = host_model_quantize_codes(values.data(), codes.data(), &decode, 1,
                                                          values.size(), false, recipe);
    EXPECT_EQ(decode, 1.0f);
    EXPECT_EQ(codes, patterns);
    EXPECT_EQ(counts.saturated + counts.underflow, 0u);
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
