#include "sampling.h"

#include <gtest/gtest.h>

namespace ampscope::agent {
namespace {

TEST(SamplerTest, CountsGradientsEveryStepAndEverythingOnFullSteps) {
  SamplingConfig c;
  c.full_every = 10;
  Sampler s(c);
  EXPECT_TRUE(s.begin_step(0));
  EXPECT_TRUE(s.full_step());
  EXPECT_EQ(s.level(TensorRole::kWeight), Level::kFull);
  s.end_step(false, false);
  EXPECT_TRUE(s.begin_step(1));
  EXPECT_FALSE(s.full_step());
  EXPECT_EQ(s.level(TensorRole::kActivationGrad), Level::kCounts);
  EXPECT_EQ(s.level(TensorRole::kWeightGrad), Level::kCounts);
  EXPECT_EQ(s.level(TensorRole::kWeight), Level::kSkip);
  EXPECT_EQ(s.level(TensorRole::kWeightGrad, TensorPhase::kAfterUnscale), Level::kSkip);
  s.end_step(false, false);
  EXPECT_TRUE(s.begin_step(10));
  EXPECT_EQ(s.level(TensorRole::kWeightGrad, TensorPhase::kAfterUnscale), Level::kFull);
  EXPECT_TRUE(s.full_step());
}

TEST(SamplerTest, NonFiniteEscalatesTheRestOfTheStepAndTheNextStep) {
  SamplingConfig c;
  c.full_every = 0;
  Sampler s(c);
  s.begin_step(3);
  EXPECT_EQ(s.level(TensorRole::kActivationGrad), Level::kCounts);
  EXPECT_EQ(s.level(TensorRole::kActivation), Level::kSkip);
  s.saw_nonfinite();
  EXPECT_EQ(s.level(TensorRole::kActivationGrad), Level::kFull);
  EXPECT_EQ(s.level(TensorRole::kActivation), Level::kFull);
  EXPECT_EQ(s.level(TensorRole::kWeight), Level::kFull);
  s.end_step(true, false);
  s.begin_step(4);
  EXPECT_TRUE(s.full_step());
  s.end_step(false, false);
  s.begin_step(5);
  EXPECT_FALSE(s.full_step());
}

TEST(SamplerTest, ScaleChangeMakesTheNextStepFull) {
  SamplingConfig c;
  c.full_every = 0;
  Sampler s(c);
  s.begin_step(0);
  EXPECT_FALSE(s.full_step());
  s.end_step(false, true);
  s.begin_step(1);
  EXPECT_TRUE(s.full_step());
}

TEST(SamplerTest, EventsCanBeTurnedOff) {
  SamplingConfig c;
  c.full_every = 0;
  c.full_on_nonfinite = false;
  c.full_on_scale_change = false;
  Sampler s(c);
  s.begin_step(0);
  s.saw_nonfinite();
  EXPECT_EQ(s.level(TensorRole::kActivationGrad), Level::kCounts);
  s.end_step(true, true);
  s.begin_step(1);
  EXPECT_FALSE(s.full_step());
}

TEST(SamplerTest, NothingToObserveWithoutCountsOffFullSteps) {
  SamplingConfig c;
  c.counts = false;
  c.full_every = 4;
  Sampler s(c);
  EXPECT_TRUE(s.begin_step(0));
  s.end_step(false, false);
  EXPECT_FALSE(s.begin_step(1));
  EXPECT_EQ(s.level(TensorRole::kWeightGrad), Level::kSkip);
}

// A rank that does not send full statistics (sample_full_ranks): no periodic full step and no
// follow-up step, but the counts every step and the escalation at its own non-finite value.
TEST(SamplerTest, ARankWithoutFullStatisticsCountsAndEscalatesOnly) {
  SamplingConfig c;
  c.full_every = 2;
  Sampler s(c, {}, /*full_stats=*/false);
  EXPECT_TRUE(s.begin_step(0));
  EXPECT_FALSE(s.full_step());
  EXPECT_EQ(s.level(TensorRole::kWeightGrad), Level::kCounts);
  EXPECT_EQ(s.level(TensorRole::kWeight), Level::kSkip);
  s.saw_nonfinite();
  EXPECT_EQ(s.level(TensorRole::kActivationGrad), Level::kFull);
  EXPECT_EQ(s.level(TensorRole::kWeight), Level::kFull);
  s.end_step(true, true);
  EXPECT_TRUE(s.begin_step(1));
  EXPECT_FALSE(s.full_step()) << "no follow-up step after a non-finite value or a scale change";
  EXPECT_EQ(s.level(TensorRole::kWeightGrad), Level::kCounts);
  s.end_step(false, false);
  EXPECT_TRUE(s.begin_step(2));
  EXPECT_FALSE(s.full_step()) << "no periodic full step";

  Sampler chosen(c, {}, /*full_stats=*/true);
  EXPECT_TRUE(chosen.begin_step(2));
  EXPECT_TRUE(chosen.full_step());
}

}  // namespace
}  // namespace ampscope::agent
