// The device fake_quantize (ampscope/cuda/recipe.h) against the CPU's: every recipe over tensors
// that reach every rule (recipe_cases.h), out of place, in place and counts only. Dequantised
// values and counts bit for bit; the FP64 squared sums within 1e-9 relative (the device adds
// the same terms in another order). quantize_codes' FP8 codes against the same values, and
// cuBLASLt's FP8 GEMM of such codes against the product of the dequantised values. Skips itself
// without a device.
#include "ampscope/cuda/recipe.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ampscope/check.h"
#include "ampscope/cuda/cublaslt.h"
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

// quantize_codes: the per-tensor FP8 recipes' codes times the decode scale are the CPU's
// dequantised values, with its counts; the transposed layout holds the same codes.
TEST_P(CudaRecipeTest, CodesMatchCpuFakeQuantize) {
  const Recipe recipe = *parse_recipe(GetParam());
  if (!has_fp8_codes(recipe)) GTEST_SKIP() << "not a per-tensor FP8 recipe";
  Stream stream;
  for (const TensorCase& c : tensor_cases()) {
    SCOPED_TRACE(c.name);
    const std::size_t n = c.values.size();
    std::vector<float> ref(n);
    const RecipeCounts want =
        ::ampscope::fake_quantize(c.values.data(), ref.data(), c.rows, c.cols, recipe);
    DeviceBuffer x(n * sizeof(float)), codes(n), transposed(n), decode(2 * sizeof(float));
    x.upload(0, c.values.data(), n * sizeof(float));
    const auto* xd = reinterpret_cast<const float*>(x.at(0));
    auto* dd = reinterpret_cast<float*>(decode.at(0));
    RecipeCounts have;
    quantize_codes(xd, codes.at(0), dd, c.rows, c.cols, false, recipe, &have, stream.get());
    quantize_codes(xd, transposed.at(0), dd + 1, c.rows, c.cols, true, recipe, nullptr,
                   stream.get());
    stream.synchronize();
    EXPECT_TRUE(same_counts(want, have, kSumRtol));
    const std::vector<float> d = decode.download<float>(0, 2);
    EXPECT_EQ(d[0], 1.0f / static_cast<float>(want.tensor_scale));
    EXPECT_EQ(d[1], d[0]);
    const std::vector<std::uint8_t> plain = codes.download<std::uint8_t>(0, n);
    const std::vector<std::uint8_t> t = transposed.download<std::uint8_t>(0, n);
    std::vector<float> got(n);
    for (std::size_t i = 0; i < n; ++i) {
      got[i] = ::ampscope::decode(plain[i], recipe.element) * d[0];
      if (!std::isfinite(ref[i])) {
        EXPECT_FALSE(std::isfinite(got[i])) << i;
        got[i] = ref[i];
      }
      EXPECT_EQ(t[i % c.cols * c.rows + i / c.cols], plain[i]) << i;
    }
    EXPECT_TRUE(same_values(ref, got));
  }
}

class CudaRecipeDeviceTest : public DeviceTest<> {};

// cuBLASLt's FP8 GEMM (CublasLt with E4M3/E5M2 operands) against the product of the dequantised
// values in FP64: equal within FP32 accumulation's rounding (1e-5 of sum |a||b| per entry).
// Skips on a device without FP8 GEMMs (before sm_89).
TEST_F(CudaRecipeDeviceTest, Fp8GemmEqualsTheDequantisedProduct) {
  if (!CublasLt::fp8_supported()) GTEST_SKIP() << "no FP8 GEMMs on this device";
  constexpr std::int64_t m = 48, n = 32, k = 64;
  std::vector<float> a(m * k), b(n * k);
  for (std::size_t i = 0; i < a.size(); ++i) {
    a[i] = std::ldexp(1.0f + static_cast<float>(i % 13) / 16.0f, static_cast<int>(i % 11) - 6) *
           (i % 3 == 0 ? -1.0f : 1.0f);
  }
  for (std::size_t i = 0; i < b.size(); ++i) {
    b[i] = std::ldexp(1.0f + static_cast<float>(i % 7) / 8.0f, static_cast<int>(i % 17) - 20) *
           (i % 5 == 0 ? -1.0f : 1.0f);
  }
  for (const auto& [ra, rb] : {std::pair{"e4m3:current", "e4m3:current"},
                               std::pair{"e5m2:current", "e4m3:scale=3.5"},
                               std::pair{"e4m3:current", "e5m2:current"}}) {
    SCOPED_TRACE(std::string(ra) + " x " + rb);
    const Recipe qa = *parse_recipe(ra), qb = *parse_recipe(rb);
    std::vector<float> da(a.size()), db(b.size());
    ::ampscope::fake_quantize(a.data(), da.data(), m, k, qa);
    ::ampscope::fake_quantize(b.data(), db.data(), n, k, qb);
    Stream stream;
    DeviceBuffer xa(a.size() * sizeof(float)), xb(b.size() * sizeof(float));
    DeviceBuffer ca(a.size()), cb(b.size()), scales(2 * sizeof(float)), c(m * n * sizeof(float));
    xa.upload(0, a.data(), a.size() * sizeof(float));
    xb.upload(0, b.data(), b.size() * sizeof(float));
    auto* s = reinterpret_cast<float*>(scales.at(0));
    quantize_codes(reinterpret_cast<const float*>(xa.at(0)), ca.at(0), s, m, k, false, qa,
                   nullptr, stream.get());
    quantize_codes(reinterpret_cast<const float*>(xb.at(0)), cb.at(0), s + 1, n, k, false, qb,
                   nullptr, stream.get());
    CublasLt blas;
    GemmArgs g;
    g.m = m;
    g.n = n;
    g.k = k;
    g.operand = qa.element;
    g.operand_b = qb.element;
    g.a_scale = s;
    g.b_scale = s + 1;
    g.a = ca.at(0);
    g.lda = k;
    g.b = cb.at(0);
    g.b_transposed = true;
    g.ldb = k;
    g.c = reinterpret_cast<float*>(c.at(0));
    g.ldc = n;
    blas.gemm(g, stream.get());
    stream.synchronize();
    const std::vector<float> got = c.download<float>(0, m * n);
    for (std::int64_t i = 0; i < m; ++i) {
      for (std::int64_t j = 0; j < n; ++j) {
        double want = 0.0, scale = 0.0;
        for (std::int64_t l = 0; l < k; ++l) {
          want += static_cast<double>(da[i * k + l]) * db[j * k + l];
          scale += std::abs(static_cast<double>(da[i * k + l]) * db[j * k + l]);
        }
        EXPECT_NEAR(got[i * n + j], want, 1e-5 * scale + 1e-30) << i << "," << j;
      }
    }
  }
  // Both E5M2, or b not transposed: refused, naming the rule.
  GemmArgs bad;
  bad.m = bad.n = bad.k = 16;
  bad.operand = bad.operand_b = Format::kE5M2;
  bad.lda = bad.ldb = bad.ldc = 16;
  bad.b_transposed = true;
  DeviceBuffer any(1024);
  bad.a = bad.b = any.at(0);
  bad.c = reinterpret_cast<float*>(any.at(0));
  bad.a_scale = bad.b_scale = reinterpret_cast<const float*>(any.at(0));
  CublasLt blas;
  EXPECT_THROW(blas.gemm(bad, nullptr), Error);
  bad.operand = Format::kE4M3;
  bad.b_transposed = false;
  EXPECT_THROW(blas.gemm(bad, nullptr), Error);
}

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
