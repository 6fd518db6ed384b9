// Scaled recipes (recipe.h): hand-derived cases, each with its arithmetic in a comment, for
// every scale edge; the fast element rounding against round_to; FP16/BF16 against FP32;
// AmaxHistory; parsing. tests/kernels/recipe_reference_test.py checks the same rules against a
// NumPy implementation written from the specifications, through `ampscope stats`.
#include "ampscope/recipe.h"

#include <gtest/gtest.h>
#include <xmmintrin.h>

#include <bit>
#include <cmath>
#include <cstddef>
#include <limits>
#include <random>
#include <vector>

#include "ampscope/check.h"
#include "ampscope/convert.h"
#include "expect_same_stats.h"

namespace ampscope {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kFloatMax = std::numeric_limits<float>::max();

Recipe recipe(std::string_view text) {
  std::string error;
  const std::optional<Recipe> r = parse_recipe(text, &error);
  EXPECT_TRUE(r.has_value()) << text << ": " << error;
  return r.value_or(Recipe{});
}

struct Result {
  RecipeCounts counts;
  std::vector<float> out;
};

Result run(std::string_view text, const std::vector<float>& x, std::size_t rows = 1,
           std::size_t cols = 0) {
  if (cols == 0) cols = x.size() / rows;
  Result r;
  r.out.assign(x.size(), -12345.0f);
  r.counts = fake_quantize(x.data(), r.out.data(), rows, cols, recipe(text));
  return r;
}

// A block of `n` copies of `fill` with `values` at its start.
std::vector<float> block(std::vector<float> values, std::size_t n = 32, float fill = 0.0f) {
  values.resize(n, fill);
  return values;
}

bool same_bits(float a, float b) {
  return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
}

// ---- The element rounding ------------------------------------------------------------------

// Delayed scaling with s = 1 rounds each value by the fast path and multiplies by fl32(1/1) = 1,
// so its output must be round_to(x, element, kSaturating) bit for bit: checked over every FP32
// binade an element can reach (and two beyond), at every point of the element's grid, the
// midpoints, the quarter points and one FP32 ulp either side of each, plus random bit patterns.
TEST(RecipeTest, FastElementRoundingEqualsRoundTo) {
  for (const Format f :
       {Format::kE4M3, Format::kE5M2, Format::kE3M2, Format::kE2M3, Format::kE2M1}) {
    const FormatInfo& fi = format_info(f);
    SCOPED_TRACE(fi.name);
    std::vector<float> x;
    for (int e = fi.min_subnormal_exponent - 4; e <= fi.max_exponent + 2; ++e) {
      const std::uint32_t step = 1u << (23 - fi.mantissa_bits - 2);
      for (std::uint32_t m = 0; m < (1u << 23); m += step) {
        for (const std::int32_t d : {-1, 0, 1}) {
          const auto bits = static_cast<std::uint32_t>((e + 127) << 23) + m + d;
          x.push_back(std::bit_cast<float>(bits));
          x.push_back(-std::bit_cast<float>(bits));
        }
      }
    }
    std::mt19937 rng(7);
    for (int i = 0; i < 200000; ++i) {
      const float v = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));
      if (std::isfinite(v)) x.push_back(v);
    }
    x.push_back(0.0f);
    x.push_back(-0.0f);
    x.push_back(kFloatMax);
    x.push_back(0x1p-149f);
    Recipe r;
    r.scaling = Scaling::kDelayed;
    r.element = f;
    r.scale = 1.0f;
    std::vector<float> out(x.size());
    fake_quantize(x.data(), out.data(), 1, x.size(), r);
    std::size_t mismatches = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const float want = round_to(x[i], f, OverflowMode::kSaturating);
      if (!same_bits(out[i], want) && ++mismatches < 5) {
        ADD_FAILURE() << std::hexfloat << x[i] << " -> " << out[i] << ", round_to " << want;
      }
    }
    EXPECT_EQ(mismatches, 0u);
  }
}

// ---- MX: the scale at each edge ------------------------------------------------------------

// amax exactly 1 = 2^0: X = 2^(0 - 8) = 2^-8 (E4M3's emax is 8). 1 / X = 256 = 1.000 x 2^8 is
// exact, so 1 comes back as 1; the scale's binade is -8.
TEST(RecipeTest, MxAmaxAPowerOfTwo) {
  const Result r = run("mxfp8_e4m3", block({1.0f, -0.5f}));
  EXPECT_EQ(r.out[0], 1.0f);
  EXPECT_EQ(r.out[1], -0.5f);
  EXPECT_EQ(r.counts.saturated, 0u);
  EXPECT_EQ(r.counts.blocks, 1u);
  EXPECT_EQ(r.counts.scale_histogram.min_exponent, -8);
  EXPECT_EQ(r.counts.scale_histogram.count_at(-8), 1u);
  EXPECT_EQ(r.counts.values, 32u);
  EXPECT_EQ(r.counts.amax, 1.0);
}

// amax just below 2 (0x1.fffffep0): floor(log2) = 0 still, X = 2^-8, y = 511.99997, which rounds
// to 512 > 448: saturated to 448, decoded 448 * 2^-8 = 1.75. With :ceil, X =
// 2^ceil(log2(1.99999988 / 448)) = 2^ceil(-7.807) = 2^-7: y = 255.99998 rounds to 256, decoded 2.
TEST(RecipeTest, MxAmaxJustBelowAPowerOfTwoSaturatesWithFloorNotCeil) {
  const float just_below_2 = 0x1.fffffep0f;
  const Result floor = run("mxfp8_e4m3", block({just_below_2}));
  EXPECT_EQ(floor.out[0], 1.75f);
  EXPECT_EQ(floor.counts.saturated, 1u);
  EXPECT_EQ(floor.counts.saturated_blocks, 1u);
  EXPECT_EQ(floor.counts.scale_histogram.count_at(-8), 1u);
  const Result ceil = run("mxfp8_e4m3:ceil", block({just_below_2}));
  EXPECT_EQ(ceil.out[0], 2.0f);
  EXPECT_EQ(ceil.counts.saturated, 0u);
  EXPECT_EQ(ceil.counts.scale_histogram.count_at(-7), 1u);
}

// amax 480: floor(log2 480) = 8, X = 2^(8-8) = 1, y = 480 = 1.111 x 2^8 is beyond E4M3's 448:
// saturated. With :ceil, X = 2^ceil(log2(480/448)) = 2^ceil(0.0995) = 2: y = 240 = 1.111 x 2^7,
// exact, decoded 480. amax 448 exactly: X = 1 both ways (log2(448/448) = 0), nothing saturates.
TEST(RecipeTest, MxE4M3Amax480SaturatesUnderFloorScale) {
  const Result floor = run("mxfp8_e4m3", block({480.0f, 1.0f}));
  EXPECT_EQ(floor.out[0], 448.0f);
  EXPECT_EQ(floor.counts.saturated, 1u);
  EXPECT_EQ(floor.counts.scale_histogram.count_at(0), 1u);
  const Result ceil = run("mxfp8_e4m3:ceil", block({480.0f, 1.0f}));
  EXPECT_EQ(ceil.out[0], 480.0f);
  EXPECT_EQ(ceil.counts.saturated, 0u);
  EXPECT_EQ(ceil.counts.scale_histogram.count_at(1), 1u);
  const Result exact = run("mxfp8_e4m3", block({448.0f}));
  EXPECT_EQ(exact.out[0], 448.0f);
  EXPECT_EQ(exact.counts.saturated, 0u);
  EXPECT_EQ(exact.counts.scale_histogram.count_at(0), 1u);
}

// E8M0's bottom: amax 2^-140 (an FP32 subnormal) gives 2^(-140 - 8) = 2^-148, clamped to 2^-127.
// Then 2^-140 / 2^-127 = 2^-13 is below half of E4M3's smallest subnormal (2^-10): underflow;
// 2^-136 / 2^-127 = 2^-9, the smallest subnormal: subnormal, decoded 2^-136 exactly.
TEST(RecipeTest, MxScaleClampsAtE8M0Minimum) {
  const Result r = run("mxfp8_e4m3", block({0x1p-140f, 0x1p-136f}, 32));
  // amax is 2^-136 here: 2^(-136-8) = 2^-144, still clamped to 2^-127.
  EXPECT_EQ(r.counts.scale_histogram.min_exponent, -127);
  EXPECT_EQ(r.counts.scale_histogram.count_at(-127), 1u);
  EXPECT_EQ(r.counts.underflow, 1u);
  EXPECT_EQ(r.counts.subnormal, 1u);
  EXPECT_EQ(r.out[0], 0.0f);
  EXPECT_EQ(r.out[1], 0x1p-136f);
}

// E8M0's top, 2^127, is out of reach of FP32 data: floor(log2 amax) <= 127 and every element's
// emax >= 2, so X <= 2^125 (E2M1, amax = FP32 max); :ceil gives 2^ceil(log2(FLT_MAX / 6)) =
// 2^ceil(125.4) = 2^126. FP32 max / 2^125 = 0x1.fffffep2 = 7.99999952 rounds to 8 > 6: saturated.
// Under :ceil, FP32 max / 2^126 = 3.99999976 rounds to 4, and 4 x 2^126 = 2^128 is beyond FP32:
// a finite value decoded to Inf, counted as overflow (and left out of the SQNR sums).
TEST(RecipeTest, MxLargestReachableScale) {
  const Result floor = run("mxfp4", block({kFloatMax}));
  EXPECT_EQ(floor.counts.scale_histogram.count_at(125), 1u);
  EXPECT_EQ(floor.counts.saturated, 1u);
  EXPECT_EQ(floor.out[0], 0x1.8p127f);  // 6 * 2^125
  const Result ceil = run("mxfp4:ceil", block({kFloatMax}));
  EXPECT_EQ(ceil.counts.scale_histogram.count_at(126), 1u);
  EXPECT_EQ(ceil.counts.saturated, 0u);
  EXPECT_EQ(ceil.counts.overflow, 1u);
  EXPECT_EQ(ceil.out[0], kInf);
  EXPECT_EQ(ceil.counts.signal_sq, 0.0);
  const Result e4m3 = run("mxfp8_e4m3", block({kFloatMax}));
  EXPECT_EQ(e4m3.counts.scale_histogram.count_at(119), 1u);  // 127 - 8
}

// A block with amax 1 (X = 2^-8): 2^-18 / X = 2^-10 is exactly half E4M3's smallest subnormal
// 2^-9, a tie that rounds to 0 (even): underflow. 3 x 2^-19 / X = 1.5 x 2^-10 rounds up to 2^-9:
// subnormal. 2^-14 / X = 2^-6 is E4M3's min normal: neither.
TEST(RecipeTest, MxUnderflowFarBelowTheBlockAmax) {
  const Result r = run("mxfp8_e4m3", block({1.0f, 0x1p-18f, 3 * 0x1p-19f, 0x1p-14f}));
  EXPECT_EQ(r.counts.underflow, 1u);
  EXPECT_EQ(r.counts.subnormal, 1u);
  EXPECT_EQ(r.out[1], 0.0f);
  EXPECT_EQ(r.out[2], 0x1p-17f);
  EXPECT_EQ(r.out[3], 0x1p-14f);
}

// MXFP4 (E2M1: 0, 0.5, 1, 1.5, 2, 3, 4, 6; emax 2). amax 5: floor(log2 5) = 2, X = 2^0 = 1.
//   5    tie of 4 (1.0 x 2^2) and 6 (1.1 x 2^2): even -> 4
//   2.5  tie of 2 and 3: even -> 2
//   0.75 tie of 0.5 (subnormal, fraction 1) and 1 (fraction 0): even -> 1
//   0.3  nearest 0.5: subnormal
//   0.25 tie of 0 and 0.5: even -> 0, underflow
// amax 7 in another block: X = 1, 7 is the tie of 6 and 8 (the next binade): 8 > 6, saturated.
TEST(RecipeTest, MxFp4Block) {
  std::vector<float> x = block({5.0f, 2.5f, 0.75f, 0.3f, -0.25f});
  const std::vector<float> second = block({7.0f});
  x.insert(x.end(), second.begin(), second.end());
  const Result r = run("mxfp4", x);
  EXPECT_EQ(r.out[0], 4.0f);
  EXPECT_EQ(r.out[1], 2.0f);
  EXPECT_EQ(r.out[2], 1.0f);
  EXPECT_EQ(r.out[3], 0.5f);
  EXPECT_TRUE(same_bits(r.out[4], -0.0f));
  EXPECT_EQ(r.out[32], 6.0f);
  EXPECT_EQ(r.counts.underflow, 1u);
  EXPECT_EQ(r.counts.subnormal, 1u);
  EXPECT_EQ(r.counts.saturated, 1u);
  EXPECT_EQ(r.counts.saturated_blocks, 1u);
  EXPECT_EQ(r.counts.blocks, 2u);
  EXPECT_EQ(r.counts.scale_histogram.count_at(0), 2u);
}

// MXFP6 E3M2 (max 28, emax 4) and E2M3 (max 7.5, emax 2) and MXFP8 E5M2 (max 57344, emax 15).
// E3M2, amax 30: X = 2^(4 - 4) = 1, 30 is the tie of 28 (1.11 x 2^4) and 32: 32 > 28,
// saturated. E2M3, amax 7.75: X = 1, tie of 7.5 and 8 -> 8, saturated. E5M2, amax 61440:
// floor(log2) = 15, X = 1, tie of 57344 and 65536 -> 65536, saturated to 57344.
TEST(RecipeTest, MxFp6AndE5M2SaturateOnTheTieAboveMax) {
  EXPECT_EQ(run("mxfp6_e3m2", block({30.0f})).out[0], 28.0f);
  EXPECT_EQ(run("mxfp6_e2m3", block({7.75f})).out[0], 7.5f);
  EXPECT_EQ(run("mxfp8_e5m2", block({61440.0f})).out[0], 57344.0f);
  EXPECT_EQ(run("mxfp6_e3m2", block({30.0f})).counts.saturated, 1u);
  // 29 is nearer 28: no saturation, and the ceil scale 2^ceil(log2(30/28)) = 2 gives 15 -> 16.
  EXPECT_EQ(run("mxfp6_e3m2", block({29.0f})).counts.saturated, 0u);
  EXPECT_EQ(run("mxfp6_e3m2:ceil", block({30.0f})).out[0], 32.0f);
}

// A NaN or Inf anywhere in a block gives it scale NaN: all of its elements decode to NaN, its
// finite ones (zeros too) are counted as overflow, they add nothing to the SQNR sums.
TEST(RecipeTest, MxNaNAndInfBlocks) {
  std::vector<float> x = block({1.0f, kNaN, 2.0f});  // 31 finite values, 1 NaN
  const std::vector<float> inf = block({-kInf, 3.0f});
  const std::vector<float> fine = block({1.0f});
  x.insert(x.end(), inf.begin(), inf.end());
  x.insert(x.end(), fine.begin(), fine.end());
  const Result r = run("mxfp8_e4m3", x);
  EXPECT_EQ(r.counts.nan_blocks, 2u);
  EXPECT_EQ(r.counts.overflow, 62u);
  EXPECT_EQ(r.counts.nonfinite, 2u);
  EXPECT_EQ(r.counts.values, 94u);
  EXPECT_EQ(r.counts.amax, 3.0);
  EXPECT_EQ(r.counts.signal_sq, 1.0);  // the third block's 1 only
  EXPECT_EQ(r.counts.scale_histogram.total(), 1u);
  for (int i = 0; i < 64; ++i) EXPECT_TRUE(std::isnan(r.out[i])) << i;
  EXPECT_EQ(r.out[64], 1.0f);
}

// A block of zeros keeps its zeros (signs too), has no scale in the histogram, counts nothing.
TEST(RecipeTest, ZeroBlocks) {
  std::vector<float> x = block({-0.0f});
  const std::vector<float> other = block({4.0f});
  x.insert(x.end(), other.begin(), other.end());
  for (const char* text : {"mxfp8_e4m3", "nvfp4:block=1x32", "e4m3:tile=1x32"}) {
    SCOPED_TRACE(text);
    const Result r = run(text, x);
    EXPECT_EQ(r.counts.blocks, 2u);
    EXPECT_EQ(r.counts.zero_blocks, 1u);
    EXPECT_EQ(r.counts.scale_histogram.total(), 1u);
    EXPECT_EQ(r.counts.underflow, 0u);
    EXPECT_TRUE(same_bits(r.out[0], -0.0f));
    EXPECT_EQ(r.out[32], 4.0f);
  }
}

// ---- NVFP4 ---------------------------------------------------------------------------------

// Tensor amax 2688 = 448 x 6, so g = 2688 / 2688 = 1 and block codes are the E4M3 values of
// amax_block / 6:
//   block 0, amax 2688: code 448, d = 448; 2688 / 448 = 6 exact.
//   block 1, amax 6: code 1, d = 1; 5 -> tie of 4 and 6 -> 4.
//   block 2, amax 6 x 3 x 2^-10: amax / 6 = 1.5 x 2^-9, between E4M3 subnormals 2^-9 and 2^-8,
//            a tie -> 2^-8 (even); 4.5 x 2^-8 / 2^-8 = 4.5 -> 4, decoded 2^-6.
//   block 3, amax 6 x 2^-12: amax / 6 = 2^-12 < 2^-10 (half E4M3's smallest subnormal): code 0,
//            the block quantises to zeros and its 2 nonzero values count as underflow.
TEST(RecipeTest, Nvfp4TwoLevelScaling) {
  std::vector<float> x;
  for (const std::vector<float>& b :
       {block({2688.0f}, 16), block({6.0f, 5.0f}, 16), block({6 * 3 * 0x1p-10f}, 16),
        block({6 * 0x1p-12f, -0x1p-13f}, 16)}) {
    x.insert(x.end(), b.begin(), b.end());
  }
  const Result r = run("nvfp4", x);
  EXPECT_EQ(r.counts.tensor_scale, 1.0);
  EXPECT_EQ(r.out[0], 2688.0f);
  EXPECT_EQ(r.out[16], 6.0f);
  EXPECT_EQ(r.out[17], 4.0f);
  EXPECT_EQ(r.out[32], 0x1p-6f);
  EXPECT_EQ(r.out[48], 0.0f);
  EXPECT_TRUE(same_bits(r.out[49], -0.0f));
  EXPECT_EQ(r.counts.underflow, 2u);
  EXPECT_EQ(r.counts.blocks, 4u);
  // Scale binades: 448 -> 8, 1 -> 0, 2^-8 -> -8; the code-0 block has none.
  EXPECT_EQ(r.counts.scale_histogram.count_at(8), 1u);
  EXPECT_EQ(r.counts.scale_histogram.count_at(0), 1u);
  EXPECT_EQ(r.counts.scale_histogram.count_at(-8), 1u);
  EXPECT_EQ(r.counts.scale_histogram.total(), 3u);
}

// A tensor amax that is not 2688: g = fl32(1 / 2688), the block of amax 1 has code
// e4m3(fl32(fl32(1/6) / g)) = e4m3(448.000...) = 448 (the quotient rounds to within FP32 of 448,
// and 448 is E4M3's max either way) and d = fl32(448 x g).
TEST(RecipeTest, Nvfp4PerTensorScale) {
  const Result r = run("nvfp4", block({1.0f, 0.5f}, 16));
  const float g = 1.0f / 2688.0f;
  EXPECT_EQ(r.counts.tensor_scale, static_cast<double>(g));
  const float code = round_to((1.0f / 6.0f) / g, Format::kE4M3, OverflowMode::kSaturating);
  EXPECT_EQ(code, 448.0f);
  const float d = code * g;
  EXPECT_EQ(r.out[0], round_to(1.0f / d, Format::kE2M1, OverflowMode::kSaturating) * d);
  EXPECT_EQ(r.out[1], round_to(0.5f / d, Format::kE2M1, OverflowMode::kSaturating) * d);
  EXPECT_EQ(r.counts.scale_histogram.count_at(std::ilogb(d)), 1u);
}

// ---- Per-tensor recipes --------------------------------------------------------------------

// amax 0: s = 1, zeros stay zeros. amax 2^-149: 448 / 2^-149 overflows FP32, s is clamped to
// FP32 max; 2^-149 x FP32 max = 0x1.fffffep-21 is far below E4M3's 2^-10: underflow.
TEST(RecipeTest, CurrentScalingZeroAndTinyAmax) {
  const Result zeros = run("e4m3:current", {0.0f, -0.0f});
  EXPECT_EQ(zeros.counts.tensor_scale, 1.0);
  EXPECT_EQ(zeros.counts.underflow, 0u);
  EXPECT_TRUE(same_bits(zeros.out[1], -0.0f));
  const Result tiny = run("e4m3:current", {0x1p-149f, 0.0f});
  EXPECT_EQ(tiny.counts.tensor_scale, static_cast<double>(kFloatMax));
  EXPECT_EQ(tiny.counts.underflow, 1u);
  EXPECT_EQ(tiny.out[0], 0.0f);
}

// amax 3: s = fl32(448 / 3), 3 x s rounds (FP32) to within an ulp of 448 and E4M3 to 448:
// decoded 448 x fl32(1 / s). With margin 1, s halves: 3 x s ~ 224, exact in E4M3.
TEST(RecipeTest, CurrentScalingWithMargin) {
  const float s = 448.0f / 3.0f;
  const Result r = run("e4m3:current", {3.0f, 1.0f, -kInf, kNaN});
  EXPECT_EQ(r.counts.tensor_scale, static_cast<double>(s));
  EXPECT_EQ(r.out[0], round_to(3.0f * s, Format::kE4M3, OverflowMode::kSaturating) * (1.0f / s));
  EXPECT_EQ(r.out[1], round_to(1.0f * s, Format::kE4M3, OverflowMode::kSaturating) * (1.0f / s));
  EXPECT_EQ(r.out[2], -kInf);  // non-finite inputs pass through
  EXPECT_TRUE(std::isnan(r.out[3]));
  EXPECT_EQ(r.counts.nonfinite, 2u);
  EXPECT_EQ(r.counts.values, 2u);
  EXPECT_EQ(r.counts.saturated, 0u);
  const Result m = run("e4m3:current:margin=1", {448.0f});
  EXPECT_EQ(m.counts.tensor_scale, 0.5);
  EXPECT_EQ(m.out[0], 448.0f);  // 448 x 0.5 = 224 exact, x fl32(1 / 0.5) = 2
}

// Delayed scale 2 on E4M3: 300 -> 600 saturates (448, decoded 224); 232 -> 464, the tie of 448
// and 480, stays 448 (even) and is not saturated; 240 -> 480 rounds above 448: saturated.
TEST(RecipeTest, DelayedScalingSaturates) {
  const Result r = run("e4m3:scale=2", {300.0f, 232.0f, 240.0f});
  EXPECT_EQ(r.out[0], 224.0f);
  EXPECT_EQ(r.out[1], 224.0f);
  EXPECT_EQ(r.out[2], 224.0f);
  EXPECT_EQ(r.counts.saturated, 2u);
  EXPECT_EQ(r.counts.tensor_scale, 2.0);
  EXPECT_EQ(r.counts.amax, 300.0);
  EXPECT_EQ(r.counts.blocks, 0u);
}

// ---- Tiles and block shapes ----------------------------------------------------------------

// 1x128 tiles on [2, 200]: each row has a 128-wide tile and a ragged 72-wide one, 4 blocks.
// Their amaxes 448, 896, 224, 112 give d = amax / 448 = 1, 2, 0.5, 0.25: binades 0, 1, -1, -2,
// each tile seeing only its own values (row 1's must not see row 0's 896). In the ragged tile,
// 288 / 2 = 144 = 1.001 x 2^7 is exact in E4M3, decoded 288: every value here is exact.
TEST(RecipeTest, Tile1x128WithRaggedEdge) {
  std::vector<float> x(2 * 200, 0.0f);
  x[0] = 448.0f;
  x[128] = 896.0f;
  x[129] = 288.0f;
  x[200] = 224.0f;
  x[200 + 130] = 112.0f;
  const Result r = run("e4m3:tile=1x128", x, 2, 200);
  EXPECT_EQ(r.counts.blocks, 4u);
  for (const int e : {0, 1, -1, -2}) EXPECT_EQ(r.counts.scale_histogram.count_at(e), 1u) << e;
  EXPECT_EQ(r.out[129], 288.0f);
  EXPECT_EQ(r.counts.error_sq, 0.0);
}

// 128x128 blocks on [130, 130]: 4 blocks (128x128, 128x2, 2x128, 2x2), one marker value each.
// Block (0,0) holds 1 at (0,0) and 8 at (127,127): amax 8, d = 8 / 448 = 1/56; the column
// block (0,1) holds 16 at (127,129): d = 16/448; row block (1,0) 32 at (129,0); corner 64 at
// (129,129). Binades: floor(log2(8/448)) = floor(-5.81) = -6, then -5, -4, -3.
TEST(RecipeTest, Tile128x128WithRaggedEdges) {
  const std::size_t n = 130;
  std::vector<float> x(n * n, 0.0f);
  x[0] = 1.0f;
  x[127 * n + 127] = 8.0f;
  x[127 * n + 129] = 16.0f;
  x[129 * n + 0] = 32.0f;
  x[129 * n + 129] = 64.0f;
  const Result r = run("e4m3:tile=128x128", x, n, n);
  EXPECT_EQ(r.counts.blocks, 4u);
  for (const int e : {-6, -5, -4, -3}) EXPECT_EQ(r.counts.scale_histogram.count_at(e), 1u) << e;
  const float d = 8.0f / 448.0f;
  EXPECT_EQ(r.out[0], round_to(1.0f / d, Format::kE4M3, OverflowMode::kSaturating) * d);
  EXPECT_EQ(r.counts.values, n * n);
}

// Blocks of 32x1 run down the columns: on [64, 2], column 0 holds 1 in rows 0-31 (amax 1, X =
// 2^-8) and 256 in rows 32-63 (X = 2^0); column 1 is zeros. The same counts as 1x32 blocks on
// the transpose.
TEST(RecipeTest, MxBlocksDownColumns) {
  std::vector<float> x(64 * 2, 0.0f);
  std::vector<float> t(2 * 64, 0.0f);
  for (std::size_t r = 0; r < 64; ++r) {
    const float v = r < 32 ? 1.0f / static_cast<float>(r + 1) : 256.0f - static_cast<float>(r);
    x[r * 2] = v;
    t[r] = v;
  }
  const Result down = run("mxfp8_e4m3:block=32x1", x, 64, 2);
  const Result across = run("mxfp8_e4m3", t, 2, 64);
  EXPECT_EQ(down.counts.blocks, 4u);
  EXPECT_EQ(down.counts.zero_blocks, 2u);
  EXPECT_EQ(down.counts.scale_histogram.count_at(-8), 1u);
  EXPECT_EQ(down.counts.scale_histogram.count_at(-1), 1u);  // amax 224: floor(log2) 7, 7 - 8
  RecipeCounts a = across.counts;
  a.recipe = down.counts.recipe;
  EXPECT_EQ(down.counts, a);
  for (std::size_t r = 0; r < 64; ++r) EXPECT_EQ(down.out[r * 2], across.out[r]) << r;
}

// Random data at several magnitudes.
std::vector<float> normal_data(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) {
    x[i] = dist(rng) * std::ldexp(1.0f, static_cast<int>(i / 997 % 40) - 20);
  }
  return x;
}

const char* const kAllRecipes[] = {"mxfp8_e4m3",
                                   "mxfp8_e5m2",
                                   "mxfp6_e3m2",
                                   "mxfp6_e2m3",
                                   "mxfp4",
                                   "mxfp4:ceil",
                                   "nvfp4",
                                   "e4m3:current",
                                   "e5m2:current",
                                   "e2m1:current:margin=2",
                                   "e4m3:scale=3.5",
                                   "e4m3:tile=1x128",
                                   "e4m3:tile=128x128",
                                   "mxfp8_e4m3:block=32x1",
                                   "nvfp4:block=16x16"};

// MX output is q * X with q = round_to(x / X, element, saturating), X from the block's own amax:
// checked element by element against that formula written here from the definition.
TEST(RecipeTest, MxOutputIsTheRoundTrip) {
  const std::vector<float> x = normal_data(1000, 3);  // 31 full blocks and a ragged one of 8
  for (const char* text : {"mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4"}) {
    SCOPED_TRACE(text);
    const Recipe rec = recipe(text);
    const Result r = run(text, x);
    for (std::size_t b = 0; b < x.size(); b += 32) {
      const std::size_t end = std::min(x.size(), b + 32);
      float amax = 0.0f;
      for (std::size_t i = b; i < end; ++i) amax = std::max(amax, std::fabs(x[i]));
      const int k = std::max(-127, std::ilogb(amax) - format_info(rec.element).max_exponent);
      for (std::size_t i = b; i < end; ++i) {
        const float q = round_to(std::ldexp(x[i], -k), rec.element, OverflowMode::kSaturating);
        ASSERT_EQ(r.out[i], std::ldexp(q, k)) << i;
      }
    }
  }
}

// Counts-only, in place, FP32 through recipe_counts, and every narrower storage format (FP16,
// BF16, ...: converted, in chunks of strips) all agree with fake_quantize on the same values;
// the in-place output equals the copy.
TEST(RecipeTest, EveryPathAgrees) {
  const std::size_t rows = 300;
  const std::size_t cols = 257;  // prime: every block recipe has ragged edges
  std::vector<float> x = normal_data(rows * cols, 5);
  x[1000] = kNaN;
  x[20000] = kInf;
  for (int fi = 0; fi < kNumFormats; ++fi) {
    const auto dtype = static_cast<Format>(fi);
    if (!is_stats_storage_format(dtype)) continue;
    std::vector<std::byte> bits(x.size() * static_cast<std::size_t>(storage_bytes(dtype)));
    std::vector<float> as_stored = x;
    if (dtype != Format::kFP32) {
      convert_from_fp32(x.data(), bits.data(), x.size(), dtype);
      convert_to_fp32(bits.data(), as_stored.data(), x.size(), dtype);
    }
    for (const char* text : kAllRecipes) {
      SCOPED_TRACE(std::string(text) + " " + std::string(format_name(dtype)));
      const Recipe rec = recipe(text);
      std::vector<float> out(x.size());
      const RecipeCounts want = fake_quantize(as_stored.data(), out.data(), rows, cols, rec);
      const void* data = dtype == Format::kFP32 ? static_cast<const void*>(as_stored.data())
                                                : static_cast<const void*>(bits.data());
      EXPECT_EQ(recipe_counts(data, x.size(), dtype, cols, rec), want);
      EXPECT_EQ(fake_quantize(as_stored.data(), nullptr, rows, cols, rec), want);
      std::vector<float> in_place = as_stored;
      EXPECT_EQ(fake_quantize(in_place.data(), in_place.data(), rows, cols, rec), want);
      for (std::size_t i = 0; i < x.size(); ++i) {
        const bool both_nan = std::isnan(out[i]) && std::isnan(in_place[i]);
        ASSERT_TRUE(same_bits(in_place[i], out[i]) || both_nan) << i;
      }
      EXPECT_EQ(want.values + want.nonfinite, x.size());
      // (FP8 storage turns this data's large values into NaN, and every 128x128 tile with them.)
      if (format_info(dtype).total_bits >= 16) EXPECT_GT(want.sqnr_db(), 0.0);
    }
  }
}

// The fused form gives what the two separate calls give: fake_quantize's counts and output (also
// in place, where the statistics must be of the input, not of what replaced it) and
// compute_stats' statistics with the targets (sum_sq within the few ulps compute_stats' own
// splits differ by), on data with every kind of value (NaN, both
// infinities, zeros, FP32 subnormals) and shapes with ragged blocks, larger than the group the
// quantiser keeps in cache.
TEST(RecipeTest, FusedStatisticsEqualTheSeparateComputations) {
  const std::vector<TargetSpec> targets = {{Format::kFP16, 0}, {Format::kE4M3, 3},
                                           {Format::kBF16, -8}};
  struct Shape {
    std::size_t rows, cols;
  };
  for (const Shape shape : {Shape{300, 257}, Shape{1, 40000}, Shape{97, 1}, Shape{0, 16}}) {
    std::vector<float> x = normal_data(shape.rows * shape.cols, 8);
    if (x.size() > 30000) {
      x[1000] = kNaN;
      x[20000] = kInf;
      x[20001] = -kInf;
      x[29999] = 0.0f;
      x[3] = -1e-40f;  // FP32 subnormal
    }
    for (const char* text : kAllRecipes) {
      SCOPED_TRACE(std::string(text) + " " + std::to_string(shape.rows) + "x" +
                   std::to_string(shape.cols));
      const Recipe rec = recipe(text);
      std::vector<float> want_out(x.size()), out(x.size());
      const RecipeCounts want =
          fake_quantize(x.data(), want_out.data(), shape.rows, shape.cols, rec);
      const TensorStats want_stats = compute_stats(x.data(), x.size(), Format::kFP32, targets);
      TensorStats stats, in_place_stats;
      EXPECT_EQ(fake_quantize_with_stats(x.data(), out.data(), shape.rows, shape.cols, rec,
                                         targets, &stats),
                want);
      expect_same_stats(stats, want_stats);
      std::vector<float> in_place = x;
      EXPECT_EQ(fake_quantize_with_stats(in_place.data(), in_place.data(), shape.rows, shape.cols,
                                         rec, targets, &in_place_stats),
                want);
      expect_same_stats(in_place_stats, want_stats);
      for (std::size_t i = 0; i < x.size(); ++i) {
        const bool nan = std::isnan(want_out[i]);
        ASSERT_TRUE((nan && std::isnan(out[i])) || same_bits(out[i], want_out[i])) << i;
        ASSERT_TRUE((nan && std::isnan(in_place[i])) || same_bits(in_place[i], want_out[i])) << i;
      }
    }
  }
}

TEST(RecipeTest, FusedStatisticsRefuseWhatTheSeparateCallsRefuse) {
  const std::vector<float> x(64, 1.0f);
  TensorStats stats;
  EXPECT_THROW(fake_quantize_with_stats(x.data(), nullptr, 2, 32, recipe("mxfp4"), {}, nullptr),
               Error);
  const Recipe bad{Scaling::kMX, Format::kFP16, 1.0f, 0, 1, 32};
  EXPECT_THROW(fake_quantize_with_stats(x.data(), nullptr, 2, 32, bad, {}, &stats), Error);
  const std::vector<TargetSpec> too_far = {{Format::kFP16, kMaxScaleLog2 + 1}};
  EXPECT_THROW(fake_quantize_with_stats(x.data(), nullptr, 2, 32, recipe("mxfp4"), too_far,
                                        &stats),
               Error);
}

// Rows longer than recipe_counts' conversion chunk (2^16) are cut into pieces at block
// boundaries: the counts still equal fake_quantize's on the whole rows, bit for bit.
TEST(RecipeTest, LongRowsCutIntoPiecesAgree) {
  const std::size_t rows = 2;
  const std::size_t cols = 70001;
  const std::vector<float> x = normal_data(rows * cols, 6);
  std::vector<std::uint16_t> bits(x.size());
  std::vector<float> widened(x.size());
  convert_from_fp32(x.data(), bits.data(), x.size(), Format::kBF16);
  convert_to_fp32(bits.data(), widened.data(), x.size(), Format::kBF16);
  for (const char* text : {"mxfp4", "mxfp8_e4m3:ceil", "nvfp4", "e4m3:current", "e5m2:scale=8",
                           "e4m3:tile=1x128", "e4m3:tile=128x128", "mxfp8_e4m3:block=32x1"}) {
    SCOPED_TRACE(text);
    const Recipe rec = recipe(text);
    EXPECT_EQ(recipe_counts(bits.data(), x.size(), Format::kBF16, cols, rec),
              fake_quantize(widened.data(), nullptr, rows, cols, rec));
  }
}

// The host's MXCSR (FTZ|DAZ as torch.set_flush_denormal(True) sets it, round toward zero)
// must not change a result: data with FP32 subnormals and tiny blocks, whose scales and
// elements go through subnormal FP32 arithmetic.
TEST(RecipeTest, ResultsDoNotDependOnMxcsr) {
  std::vector<float> x = normal_data(4096, 8);
  for (std::size_t i = 0; i < 512; ++i) x[i] *= 0x1p-130f;  // FP32 subnormals, tiny blocks
  for (const char* text : kAllRecipes) {
    SCOPED_TRACE(text);
    const Recipe rec = recipe(text);
    std::vector<float> want_out(x.size());
    const RecipeCounts want = fake_quantize(x.data(), want_out.data(), 64, 64, rec);
    for (const unsigned csr : {0x8040u /* FTZ|DAZ */, 0x6000u /* toward zero */}) {
      std::vector<float> out(x.size());
      const unsigned saved = _mm_getcsr();
      _mm_setcsr(saved | csr);
      const RecipeCounts got = fake_quantize(x.data(), out.data(), 64, 64, rec);
      const unsigned after = _mm_getcsr();
      _mm_setcsr(saved);
      EXPECT_EQ(after, saved | csr) << "the caller's MXCSR is given back";
      EXPECT_EQ(got, want) << std::hex << csr;
      for (std::size_t i = 0; i < x.size(); ++i) {
        ASSERT_TRUE(same_bits(out[i], want_out[i]) || std::isnan(out[i])) << i;
      }
    }
  }
  AmaxHistory h(Format::kE4M3, 2, 0);
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | 0x6000u);
  h.push(3.0f);  // 448 / 3 rounds up to nearest, down toward zero
  _mm_setcsr(saved);
  EXPECT_EQ(h.scale(), 448.0f / 3.0f);
}

TEST(RecipeTest, SqnrDb) {
  RecipeCounts c;
  EXPECT_TRUE(std::isnan(c.sqnr_db()));
  c.signal_sq = 100.0;
  EXPECT_EQ(c.sqnr_db(), std::numeric_limits<double>::infinity());
  c.error_sq = 1.0;
  EXPECT_DOUBLE_EQ(c.sqnr_db(), 20.0);
}

TEST(RecipeTest, RejectsRecipesThatCannotApply) {
  const float x[2] = {1.0f, 2.0f};
  Recipe bad_element;
  bad_element.element = Format::kFP16;
  EXPECT_THROW(fake_quantize(x, nullptr, 1, 2, bad_element), Error);
  Recipe no_block = recipe("mxfp4");
  no_block.block_cols = 0;
  EXPECT_THROW(fake_quantize(x, nullptr, 1, 2, no_block), Error);
  Recipe delayed = recipe("e4m3:scale=2");
  delayed.scale = 0.0f;
  EXPECT_THROW(fake_quantize(x, nullptr, 1, 2, delayed), Error);
  Recipe nv = recipe("nvfp4");
  nv.element = Format::kE4M3;
  EXPECT_THROW(fake_quantize(x, nullptr, 1, 2, nv), Error);
  EXPECT_THROW(recipe_counts(x, 2, Format::kFP32, 3, recipe("mxfp4")), Error);
  EXPECT_THROW(recipe_counts(x, 2, Format::kE2M1, 2, recipe("mxfp4")), Error);
}

// ---- AmaxHistory ---------------------------------------------------------------------------

// E4M3 (max 448), length 3, margin 0, "max": scale = 448 / max(window).
TEST(AmaxHistoryTest, MaxOfTheWindow) {
  AmaxHistory h(Format::kE4M3, 3, 0);
  EXPECT_EQ(h.scale(), 1.0f);
  h.push(2.0f);
  EXPECT_EQ(h.scale(), 224.0f);
  h.push(4.0f);
  EXPECT_EQ(h.scale(), 112.0f);
  h.push(1.0f);
  EXPECT_EQ(h.scale(), 112.0f);  // window (2, 4, 1)
  h.push(1.0f);
  EXPECT_EQ(h.scale(), 112.0f);  // (4, 1, 1)
  h.push(1.0f);
  EXPECT_EQ(h.scale(), 448.0f);  // (1, 1, 1): the spike has left the window
  EXPECT_EQ(std::vector<float>(h.history().begin(), h.history().end()),
            (std::vector<float>{1.0f, 1.0f, 1.0f}));
}

// "most_recent": zero, Inf and NaN amaxes keep the previous scale; a NaN in a "max" window
// keeps it for as long as the NaN stays in the window.
TEST(AmaxHistoryTest, NonPositiveOrNonFiniteAmaxKeepsTheScale) {
  AmaxHistory recent(Format::kE4M3, 4, 0, AmaxHistory::Reduction::kMostRecent);
  recent.push(2.0f);
  EXPECT_EQ(recent.scale(), 224.0f);
  for (const float a : {0.0f, kInf, kNaN}) {
    recent.push(a);
    EXPECT_EQ(recent.scale(), 224.0f) << a;
  }
  recent.push(4.0f);
  EXPECT_EQ(recent.scale(), 112.0f);
  AmaxHistory window(Format::kE4M3, 2, 0);
  window.push(2.0f);
  window.push(kNaN);
  EXPECT_EQ(window.scale(), 224.0f);
  window.push(4.0f);
  EXPECT_EQ(window.scale(), 224.0f);  // (NaN, 4)
  window.push(8.0f);
  EXPECT_EQ(window.scale(), 56.0f);  // (4, 8)
  // An amax so small that 448 / amax overflows FP32: the scale is clamped to FP32 max.
  window.set_length(1);
  window.push(0x1p-149f);
  EXPECT_EQ(window.scale(), kFloatMax);
}

// Margin divides by 2^margin; changing margin or length recomputes from the window then held.
TEST(AmaxHistoryTest, MarginAndLengthChanges) {
  AmaxHistory h(Format::kE5M2, 4, 2);
  h.push(8.0f);
  EXPECT_EQ(h.scale(), 57344.0f / 8.0f / 4.0f);
  h.push(16.0f);
  h.push(2.0f);
  EXPECT_EQ(h.scale(), 57344.0f / 16.0f / 4.0f);
  h.set_margin(0);
  EXPECT_EQ(h.margin(), 0);
  EXPECT_EQ(h.scale(), 57344.0f / 16.0f);
  h.set_length(1);  // keeps the newest: (2)
  EXPECT_EQ(h.history().size(), 1u);
  EXPECT_EQ(h.scale(), 57344.0f / 2.0f);
  h.set_length(3);
  h.push(1.0f);
  EXPECT_EQ(h.history().size(), 2u);
  EXPECT_EQ(h.scale(), 57344.0f / 2.0f);
  EXPECT_THROW(h.set_length(0), Error);
  EXPECT_THROW(h.set_margin(-1), Error);
  EXPECT_THROW(AmaxHistory(Format::kBF16, 4, 0), Error);
}

// A window of zeros keeps the scale an earlier window gave: the amaxes alone cannot rebuild it,
// restore() takes it as saved and goes on exactly as the original.
TEST(AmaxHistoryTest, RestoreTakesTheScaleTheAmaxesCannotSay) {
  AmaxHistory original(Format::kE4M3, 2, 0);
  original.push(4.0f);  // 448 / 4 = 112
  original.push(0.0f);
  original.push(0.0f);  // window (0, 0): keeps 112
  ASSERT_EQ(original.scale(), 112.0f);
  AmaxHistory replayed(Format::kE4M3, 2, 0);
  for (const float a : original.history()) replayed.push(a);
  EXPECT_EQ(replayed.scale(), 1.0f);  // why restore() exists
  AmaxHistory restored(Format::kE4M3, 2, 0);
  restored.restore(original.history(), original.scale());
  EXPECT_EQ(restored.scale(), 112.0f);
  EXPECT_EQ(std::vector<float>(restored.history().begin(), restored.history().end()),
            std::vector<float>(original.history().begin(), original.history().end()));
  for (const float a : {0.0f, 8.0f, 2.0f}) {
    original.push(a);
    restored.push(a);
    EXPECT_EQ(restored.scale(), original.scale()) << a;
  }
  const float three[] = {1.0f, 2.0f, 3.0f};
  EXPECT_THROW(restored.restore(three, 1.0f), Error);  // longer than the length
  EXPECT_THROW(restored.restore({}, 0.0f), Error);
  EXPECT_THROW(restored.restore({}, kInf), Error);
  EXPECT_THROW(restored.restore({}, kNaN), Error);
}

// ---- Parsing -------------------------------------------------------------------------------

TEST(RecipeParseTest, NamesAndRoundTrips) {
  const Recipe mx = recipe("mxfp8_e4m3");
  EXPECT_EQ(mx.scaling, Scaling::kMX);
  EXPECT_EQ(mx.element, Format::kE4M3);
  EXPECT_EQ(mx.block_rows, 1);
  EXPECT_EQ(mx.block_cols, 32);
  EXPECT_EQ(recipe("mxfp4").element, Format::kE2M1);
  EXPECT_EQ(recipe("mxfp6_e3m2").element, Format::kE3M2);
  EXPECT_EQ(recipe("mxfp6_e2m3").element, Format::kE2M3);
  EXPECT_EQ(recipe("mxfp8_e5m2").element, Format::kE5M2);
  const Recipe nv = recipe("NVFP4");
  EXPECT_EQ(nv.scaling, Scaling::kNVFP4);
  EXPECT_EQ(nv.element, Format::kE2M1);
  EXPECT_EQ(nv.block_cols, 16);
  EXPECT_EQ(recipe("e4m3:current:margin=3").margin, 3);
  EXPECT_EQ(recipe("e4m3:scale=112.5").scale, 112.5f);
  EXPECT_EQ(recipe("e4m3:scale=112.5").scaling, Scaling::kDelayed);
  EXPECT_EQ(recipe("mxfp4:ceil").rounding, ScaleRounding::kCeil);
  const Recipe tile = recipe("e5m2:tile=128x128");
  EXPECT_EQ(tile.scaling, Scaling::kTile);
  EXPECT_EQ(tile.block_rows, 128);
  for (const char* text : kAllRecipes) {
    const Recipe r = recipe(text);
    EXPECT_EQ(to_string(r), text);
    EXPECT_EQ(recipe(to_string(r)), r);
  }
  // Scales print in the shortest form that reads back to the same FP32 value.
  Recipe d = recipe("e4m3:scale=1");
  d.scale = 0x1.234568p-100f;
  EXPECT_EQ(recipe(to_string(d)), d);
  EXPECT_EQ(to_string(recipe("mxfp8_e4m3:ceil:block=1x32")), "mxfp8_e4m3:ceil");
  EXPECT_EQ(to_string(recipe("nvfp4:block=1x16")), "nvfp4");
}

TEST(RecipeParseTest, Routing) {
  for (const char* text : {"mxfp4", "nvfp4", "e4m3:current", "MXFP8_E4M3", "fp16:"}) {
    EXPECT_TRUE(looks_like_recipe(text)) << text;
  }
  for (const char* text : {"fp16@16", "e4m3@-3", "bf16", "e5m2"}) {
    EXPECT_FALSE(looks_like_recipe(text)) << text;
  }
}

TEST(RecipeParseTest, ErrorsNameWhatIsWrong) {
  const std::pair<const char*, const char*> cases[] = {
      {"mxfp8_e4m3:block=0x32", "block must be ROWSxCOLS with each from 1 to 65536 (found '0x32')"},
      {"mxfp8_e4m3:block=32", "block must be ROWSxCOLS"},
      {"mxfp8_e4m3:block=1x70000", "block must be ROWSxCOLS"},
      {"mxfp8_e4m3:block=1x32:block=1x32", "block given twice"},
      {"mxfp4:ceil:ceil", "ceil given twice"},
      {"mxfp4:margin=1", "unknown option 'margin=1' for an MX recipe (block=RxC, ceil)"},
      {"nvfp4:ceil", "unknown option 'ceil' for nvfp4 (block=RxC)"},
      {"mxfp9", "unknown recipe 'mxfp9'"},
      {"fp16:current", "unknown recipe 'fp16'"},
      {"e4m3", "a recipe on e4m3 needs current, scale=S or tile=RxC"},
      {"e4m3:", "empty option"},
      {"e4m3::current", "empty option"},
      {"e4m3:current:scale=2", "'scale=2': give one of current, scale=S and tile=RxC, once"},
      {"e4m3:scale=0", "scale must be a finite FP32 number from 2^-126 to FP32 max (found '0')"},
      {"e4m3:scale=inf", "scale must be a finite"},
      {"e4m3:scale=1e39", "scale must be a finite"},
      {"e4m3:scale=x", "scale must be a finite"},
      {"e4m3:current:margin=65", "margin must be an integer from 0 to 64 (found '65')"},
      {"e4m3:current:margin=-1", "margin must be an integer"},
      {"e4m3:current:margin=1:margin=1", "margin given twice"},
      {"e4m3:tile=1x128:margin=1", "margin applies to current scaling only"},
      {"e4m3:tile=0x128", "tile must be ROWSxCOLS"},
      {"e4m3:current:round",
       "unknown option 'round': expected current, margin=M, scale=S or "
       "tile=RxC"},
  };
  for (const auto& [text, message] : cases) {
    std::string error;
    EXPECT_FALSE(parse_recipe(text, &error).has_value()) << text;
    EXPECT_NE(error.find(message), std::string::npos) << text << ": " << error;
  }
  EXPECT_FALSE(parse_recipe("bogus").has_value());  // no error string wanted: no crash
}

}  // namespace
}  // namespace ampscope
