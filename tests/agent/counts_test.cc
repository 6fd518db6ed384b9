// The every-step counting pass against the scalar reference of the full statistics.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "ampscope/convert.h"
#include "ampscope/tensor_stats.h"
#include "counts.h"

namespace ampscope::agent {
namespace {

struct Case {
  Format dtype;
  std::size_t n;
};

// n values of `dtype` storage: normal-ish magnitudes over many binades, zeros of both signs,
// subnormals, +-Inf and NaNs (quiet and signalling, both signs) sprinkled in.
std::vector<unsigned char> make_values(Format dtype, std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> exp(-30.0f, 20.0f);
  std::uniform_int_distribution<int> kind(0, 40);
  const std::size_t width = static_cast<std::size_t>(storage_bytes(dtype));
  std::vector<unsigned char> out(n * width + 1);  // +1: room for an unaligned view
  for (std::size_t i = 0; i < n; ++i) {
    float v = std::exp2(exp(rng)) * ((rng() & 1) ? -1.0f : 1.0f);
    switch (kind(rng)) {
      case 0: v = 0.0f; break;
      case 1: v = -0.0f; break;
      case 2: v = std::numeric_limits<float>::infinity(); break;
      case 3: v = -std::numeric_limits<float>::infinity(); break;
      case 4: v = std::numeric_limits<float>::quiet_NaN(); break;
      case 5: v = -std::numeric_limits<float>::quiet_NaN(); break;
      case 6: v = std::numeric_limits<float>::denorm_min() * 3; break;
      default: break;
    }
    if (dtype == Format::kFP32) {
      std::memcpy(out.data() + i * 4, &v, 4);
    } else {
      const auto bits = static_cast<std::uint16_t>(encode(v, dtype));
      std::memcpy(out.data() + i * 2, &bits, 2);
    }
  }
  return out;
}

void expect_same(const TensorStats& got, const TensorStats& ref) {
  EXPECT_EQ(got.numel, ref.numel);
  EXPECT_EQ(got.zeros, ref.zeros);
  EXPECT_EQ(got.nan, ref.nan);
  EXPECT_EQ(got.pos_inf, ref.pos_inf);
  EXPECT_EQ(got.neg_inf, ref.neg_inf);
  EXPECT_EQ(got.max_abs, ref.max_abs);
}

class CountsTest : public ::testing::TestWithParam<Case> {};

TEST_P(CountsTest, MatchesTheReference) {
  const auto [dtype, n] = GetParam();
  const auto values = make_values(dtype, n, static_cast<std::uint32_t>(n) + 7);
  TensorStats got;
  ASSERT_TRUE(count_nonfinite(values.data(), n, dtype, &got));
  expect_same(got, compute_stats_reference(values.data(), n, dtype));
}

TEST_P(CountsTest, UnalignedMatchesTheReference) {
  const auto [dtype, n] = GetParam();
  auto values = make_values(dtype, n, static_cast<std::uint32_t>(n) + 11);
  std::memmove(values.data() + 1, values.data(), n * static_cast<std::size_t>(storage_bytes(dtype)));
  TensorStats got;
  ASSERT_TRUE(count_nonfinite(values.data() + 1, n, dtype, &got));
  expect_same(got, compute_stats_reference(values.data() + 1, n, dtype));
}

INSTANTIATE_TEST_SUITE_P(
    DtypeBySize, CountsTest,
    ::testing::Values(Case{Format::kFP32, 0}, Case{Format::kFP32, 1}, Case{Format::kFP32, 7},
                      Case{Format::kFP32, 1021}, Case{Format::kFP32, 65537},
                      Case{Format::kFP16, 1}, Case{Format::kFP16, 13}, Case{Format::kFP16, 4099},
                      Case{Format::kFP16, 100003}, Case{Format::kBF16, 3},
                      Case{Format::kBF16, 32768}, Case{Format::kBF16, 70001}),
    [](const auto& info) {
      return std::string(format_name(info.param.dtype)) + "_" + std::to_string(info.param.n);
    });

TEST(CountsTest, RareNonFiniteValuesInLongFiniteTensors) {
  // Blocks without a NaN or an Inf take the fast path, the one block with it the exact one.
  for (Format dtype : {Format::kFP32, Format::kFP16, Format::kBF16}) {
    const std::size_t n = 200003;
    std::vector<unsigned char> values(n * static_cast<std::size_t>(storage_bytes(dtype)));
    for (std::size_t i = 0; i < n; ++i) {
      float v = static_cast<float>(i % 977) * 0.25f - 100.0f;
      if (i == 150001) v = -std::numeric_limits<float>::infinity();
      if (i == 150002) v = std::numeric_limits<float>::quiet_NaN();
      if (dtype == Format::kFP32) {
        std::memcpy(values.data() + i * 4, &v, 4);
      } else {
        const auto bits = static_cast<std::uint16_t>(encode(v, dtype));
        std::memcpy(values.data() + i * 2, &bits, 2);
      }
    }
    TensorStats got;
    ASSERT_TRUE(count_nonfinite(values.data(), n, dtype, &got));
    const TensorStats ref = compute_stats_reference(values.data(), n, dtype);
    expect_same(got, ref);
    EXPECT_EQ(got.neg_inf, 1u);
    EXPECT_EQ(got.nan, 1u);
    // And with nothing non-finite at all.
    const std::size_t finite = 150000;
    ASSERT_TRUE(count_nonfinite(values.data(), finite, dtype, &got));
    expect_same(got, compute_stats_reference(values.data(), finite, dtype));
  }
}

TEST(CountsTest, EverySimdLevelTheCpuHasMatchesTheScalarPath) {
  // The pass is compiled once per level (cpu_features.h); each level the CPU has must give the
  // scalar path's counts on adversarial data, aligned and not, with a tail that is no multiple
  // of any vector width.
  const int max_level = static_cast<int>(max_supported_simd_level());
  for (Format dtype : {Format::kFP32, Format::kFP16, Format::kBF16}) {
    const std::size_t n = 70001;
    auto values = make_values(dtype, n, 29);
    for (const std::size_t offset : {std::size_t{0}, std::size_t{1}}) {
      if (offset == 1) {
        std::memmove(values.data() + 1, values.data(),
                     n * static_cast<std::size_t>(storage_bytes(dtype)));
      }
      TensorStats scalar;
      ASSERT_TRUE(count_nonfinite(values.data() + offset, n, dtype, SimdLevel::kScalar, &scalar));
      expect_same(scalar, compute_stats_reference(values.data() + offset, n, dtype));
      for (int level = 1; level <= max_level; ++level) {
        SCOPED_TRACE(std::string(format_name(dtype)) + " at " +
                     std::string(simd_level_name(static_cast<SimdLevel>(level))));
        TensorStats got;
        ASSERT_TRUE(count_nonfinite(values.data() + offset, n, dtype,
                                    static_cast<SimdLevel>(level), &got));
        expect_same(got, scalar);
      }
    }
  }
}

TEST(CountsTest, EveryFp16PatternOnce) {
  // All 65,536 patterns: exactly 2 zeros, 2 infinities, 2046 NaNs, max 65504.
  std::vector<std::uint16_t> all(65536);
  for (std::uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<std::uint16_t>(i);
  TensorStats got;
  ASSERT_TRUE(count_nonfinite(all.data(), all.size(), Format::kFP16, &got));
  EXPECT_EQ(got.zeros, 2u);
  EXPECT_EQ(got.pos_inf, 1u);
  EXPECT_EQ(got.neg_inf, 1u);
  EXPECT_EQ(got.nan, 2046u);
  EXPECT_EQ(got.max_abs, 65504.0);
}

TEST(CountsTest, Fp8StorageCountsEveryPattern) {
  // Every byte: E4M3 has two zeros, no infinity and one NaN per sign (S.1111.111), max 448;
  // E5M2 two zeros, +-Inf, six NaNs, max 57344.
  std::vector<std::uint8_t> all(256);
  for (std::uint32_t i = 0; i < 256; ++i) all[i] = static_cast<std::uint8_t>(i);
  TensorStats got;
  ASSERT_TRUE(count_nonfinite(all.data(), all.size(), Format::kE4M3, &got));
  EXPECT_EQ(got.numel, 256u);
  EXPECT_EQ(got.zeros, 2u);
  EXPECT_EQ(got.pos_inf + got.neg_inf, 0u);
  EXPECT_EQ(got.nan, 2u);
  EXPECT_EQ(got.max_abs, 448.0);
  ASSERT_TRUE(count_nonfinite(all.data(), all.size(), Format::kE5M2, &got));
  EXPECT_EQ(got.zeros, 2u);
  EXPECT_EQ(got.pos_inf, 1u);
  EXPECT_EQ(got.neg_inf, 1u);
  EXPECT_EQ(got.nan, 6u);
  EXPECT_EQ(got.max_abs, 57344.0);
  std::uint8_t v[4] = {0};
  EXPECT_FALSE(count_nonfinite(v, 4, Format::kE2M1, &got));  // FP4 is not a storage format
}

}  // namespace
}  // namespace ampscope::agent
