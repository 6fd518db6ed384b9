// The loss-scale rules of ampscope/loss_scale.h against PyTorch GradScaler's and Megatron-LM's
// documented semantics, step by step, and the one scale-to-exponent rule.
#include "ampscope/loss_scale.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

namespace ampscope {
namespace {

LossScaleState run(LossScaleRule rule, float scale, std::initializer_list<bool> found_infs) {
  LossScaleState s = initial_loss_scale_state(scale, rule);
  for (bool inf : found_infs) update_loss_scale_state(s, rule, inf);
  return s;
}

TEST(LossScaleRuleTest, DefaultsAreGradScalersAndMegatrons) {
  const LossScaleRule g = gradscaler_rule();
  EXPECT_EQ(g.kind, ScalerKind::kDynamic);
  EXPECT_EQ(g.growth_factor, 2.0);
  EXPECT_EQ(g.backoff_factor, 0.5);
  EXPECT_EQ(g.growth_interval, 2000);
  EXPECT_EQ(g.min_scale, 0.0f);
  EXPECT_EQ(kGradScalerInitScale, 65536.0f);
  const LossScaleRule m = megatron_rule();
  EXPECT_EQ(m.kind, ScalerKind::kHysteresis);
  EXPECT_EQ(m.growth_interval, 1000);
  EXPECT_EQ(m.hysteresis, 2);
  EXPECT_EQ(m.min_scale, 1.0f);
  EXPECT_EQ(kMegatronInitScale, 4294967296.0f);
}

TEST(LossScaleRuleTest, StaticNeverChanges) {
  LossScaleRule r;
  r.kind = ScalerKind::kStatic;
  r.growth_interval = 1;
  const LossScaleState s = run(r, 128.0f, {true, false, false, true});
  EXPECT_EQ(s.scale, 128.0f);
}

TEST(LossScaleRuleTest, DynamicGrowsAtTheIntervalAndBacksOffOnInf) {
  LossScaleRule r = gradscaler_rule();
  r.growth_interval = 3;
  // Two clean steps: tracker 2, no growth; the third grows and resets the tracker.
  LossScaleState s = run(r, 1024.0f, {false, false});
  EXPECT_EQ(s.scale, 1024.0f);
  EXPECT_EQ(s.growth_tracker, 2);
  update_loss_scale_state(s, r, false);
  EXPECT_EQ(s.scale, 2048.0f);
  EXPECT_EQ(s.growth_tracker, 0);
  // An inf halves the scale and resets the tracker.
  update_loss_scale_state(s, r, false);
  update_loss_scale_state(s, r, true);
  EXPECT_EQ(s.scale, 1024.0f);
  EXPECT_EQ(s.growth_tracker, 0);
}

TEST(LossScaleRuleTest, DynamicHasNoFloorUnlessAskedAndKeepsAnInfiniteGrowthOut) {
  LossScaleRule r = gradscaler_rule();
  // GradScaler has no minimum: the scale falls below 1.
  EXPECT_EQ(run(r, 1.0f, {true, true, true}).scale, 0.125f);
  r.min_scale = 0.5f;
  EXPECT_EQ(run(r, 1.0f, {true, true, true}).scale, 0.5f);
  // Growth past FP32's range is not taken (the product is Inf); the tracker still resets.
  r = gradscaler_rule();
  r.growth_interval = 1;
  const LossScaleState s = run(r, 0x1p127f, {false});
  EXPECT_EQ(s.scale, 0x1p127f);
  EXPECT_EQ(s.growth_tracker, 0);
  // Nor past max_scale.
  r.max_scale = 1024.0f;
  EXPECT_EQ(run(r, 1024.0f, {false}).scale, 1024.0f);
}

TEST(LossScaleRuleTest, HysteresisBacksOffOnlyAfterTheHysteresisIsSpent) {
  LossScaleRule r = megatron_rule();
  r.growth_interval = 4;
  LossScaleState s = initial_loss_scale_state(65536.0f, r);
  EXPECT_EQ(s.hysteresis_tracker, 2);
  update_loss_scale_state(s, r, true);  // first inf: tracker 1, scale kept
  EXPECT_EQ(s.scale, 65536.0f);
  EXPECT_EQ(s.hysteresis_tracker, 1);
  update_loss_scale_state(s, r, true);  // second: tracker 0, halved
  EXPECT_EQ(s.scale, 32768.0f);
  update_loss_scale_state(s, r, true);  // every further inf halves again
  EXPECT_EQ(s.scale, 16384.0f);
  EXPECT_EQ(s.hysteresis_tracker, -1);
  // A full clean window restores the hysteresis and grows.
  for (int i = 0; i < 4; ++i) update_loss_scale_state(s, r, false);
  EXPECT_EQ(s.scale, 32768.0f);
  EXPECT_EQ(s.hysteresis_tracker, 2);
  EXPECT_EQ(s.growth_tracker, 0);
}

TEST(LossScaleRuleTest, HysteresisStopsAtMinScaleAndCapsGrowthAtMaxScale) {
  LossScaleRule r = megatron_rule();
  r.hysteresis = 1;
  EXPECT_EQ(run(r, 2.0f, {true, true, true}).scale, 1.0f);  // Megatron's floor of 1
  r.growth_interval = 1;
  r.max_scale = 3000.0f;
  EXPECT_EQ(run(r, 2048.0f, {false}).scale, 3000.0f);  // min(4096, max_scale)
  r.max_scale = kFp32MaxScale;
  EXPECT_EQ(run(r, 0x1p127f, {false}).scale, kFp32MaxScale);  // Inf product: max_scale
}

TEST(LossScaleRuleTest, ProductsAreFormedInFp64AndStoredInFp32) {
  LossScaleRule r = gradscaler_rule();
  r.backoff_factor = 0.3;  // not exact in FP32: the FP64 product is rounded once
  EXPECT_EQ(run(r, 1000.0f, {true}).scale, static_cast<float>(1000.0 * 0.3));
  EXPECT_EQ(inverse_scale(3.0f), static_cast<float>(1.0 / 3.0));
}

TEST(ScaleExponentTest, PowersOfTwoMapToTheirExponent) {
  for (int k = -149; k <= 127; ++k) {
    const double s = std::ldexp(1.0, k);
    EXPECT_EQ(scale_exponent(s), k);
    EXPECT_EQ(floor_log2(s), k);
    EXPECT_EQ(ceil_log2(s), k);
    EXPECT_TRUE(is_power_of_two(s));
  }
}

// One rounding rule: down. (A scale of 3 is binade 1, not 2 as rounding to nearest would say;
// 2^k * 1.5 lies in binade k.)
TEST(ScaleExponentTest, OtherScalesRoundDown) {
  EXPECT_EQ(scale_exponent(3.0), 1);
  EXPECT_EQ(scale_exponent(0.75), -1);
  EXPECT_EQ(scale_exponent(65535.0), 15);
  EXPECT_EQ(ceil_log2(3.0), 2);
  EXPECT_FALSE(is_power_of_two(3.0));
  EXPECT_FALSE(is_power_of_two(0.0));
  EXPECT_FALSE(is_power_of_two(std::numeric_limits<double>::infinity()));
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> mantissa(1.0, 2.0);
  std::uniform_int_distribution<int> exponent(-1000, 1000);
  for (int i = 0; i < 10000; ++i) {
    const int e = exponent(rng);
    const double x = std::ldexp(mantissa(rng), e);
    EXPECT_EQ(scale_exponent(x), e) << x;
  }
}

}  // namespace
}  // namespace ampscope
