// The device fake_quantize (ampscope/cuda/recipe.h) against the CPU's: every recipe over tensors
// that reach every rule (recipe_cases.h), out of place, in place and counts only. Dequantised
// values and counts bit for bit; the FP64 squared sums within 1e-9 relative (the device adds
// the same terms in another order). Skips itself without a device.
#include "ampscope/cuda/recipe.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ampscope/check.h"
#include "cuda_test_util.h"
#include "recipe_cases.h"

namespace ampscope::cuda::testing {
namespace {

constexpr double kSumRtol = 1e-9;

class CudaRecipeTest : public DeviceTest<::testing::TestWithParam<std::string>> {};

TEST_P(CudaRecipeTest, MatchesCpuFakeQuantize) {
  const Recipe recipe = *parse_recipe(GetParam());
  Stream stream;
  for (const TensorCase& c : tensor_cases()) {
    SCOPED_TRACE(c.name);
    const std::size_t bytes = c.values.size() * sizeof(float);
    std::vector<float> ref(c.values.size());
    const RecipeCounts want =
        ::ampscope::fake_quantize(c.values.data(), ref.data(), c.rows, c.cols, recipe);
    DeviceBuffer x(bytes), out(bytes);
    x.upload(0, c.values.data(), bytes);
    const auto* xd = reinterpret_cast<const float*>(x.at(0));
    auto* od = reinterpret_cast<float*>(out.at(0));

    RecipeCounts have;
    fake_quantize(xd, od, c.rows, c.cols, recipe, &have, stream.get());
    EXPECT_TRUE(same_values(ref, out.download<float>(0, c.values.size())));
    EXPECT_TRUE(same_counts(want, have, kSumRtol));

    // Counts only: nothing written, the same counts.
    RecipeCounts counts_only;
    fake_quantize(xd, nullptr, c.rows, c.cols, recipe, &counts_only, stream.get());
    EXPECT_TRUE(same_counts(want, counts_only, kSumRtol));
    EXPECT_TRUE(same_values(c.values, x.download<float>(0, c.values.size())));

    // In place, without counts (returns without waiting).
    auto* xw = reinterpret_cast<float*>(x.at(0));
    fake_quantize(xw, xw, c.rows, c.cols, recipe, nullptr, stream.get());
    stream.synchronize();
    EXPECT_TRUE(same_values(ref, x.download<float>(0, c.values.size())));
  }
}

class CudaRecipeDeviceTest : public DeviceTest<> {};

TEST_F(CudaRecipeDeviceTest, EmptyTensorAndBadRecipe) {
  Stream stream;
  RecipeCounts counts;
  const Recipe current = *parse_recipe("e4m3:current");
  fake_quantize(nullptr, nullptr, 0, 8, current, &counts, stream.get());
  EXPECT_EQ(counts, ::ampscope::fake_quantize(nullptr, nullptr, 0, 8, current));
  EXPECT_EQ(counts.tensor_scale, 1.0);
  Recipe bad = current;
  bad.element = Format::kFP16;
  DeviceBuffer x(64);
  EXPECT_THROW(fake_quantize(reinterpret_cast<const float*>(x.at(0)), nullptr, 1, 16, bad, &counts,
                             stream.get()),
               Error);
}

INSTANTIATE_TEST_SUITE_P(Recipes, CudaRecipeTest, ::testing::ValuesIn(recipe_case_texts()),
                         recipe_test_name);

}  // namespace
}  // namespace ampscope::cuda::testing
