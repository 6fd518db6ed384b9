// Loss scalers replayed on scripted found_inf sequences against the reference algorithms of
// the published sources, transcribed here independently of the implementation: PyTorch's
// _amp_update_scale_ (scale and factors: float scale times double factor, stored as float) and
// Megatron-LM's DynamicGradScaler.update. Also the handle's bounds checks and scheduling, and
// the LR schedule.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "ampscope/check.h"
#include "ampscope/trainer/hooks.h"
#include "ampscope/trainer/loss_scaler.h"
#include "ampscope/trainer/lr_schedule.h"
#include "ampscope/trainer/rng.h"

namespace ampscope::trainer {
namespace {

struct RefPoint {
  float scale;
  std::int64_t growth_tracker;
  int hysteresis_tracker;
};

// torch/amp/grad_scaler.py + aten AmpKernels: _amp_update_scale_.
std::vector<RefPoint> pytorch_reference(float scale, double growth, double backoff,
                                        std::int64_t interval, const std::vector<bool>& infs) {
  std::vector<RefPoint> out;
  std::int64_t tracker = 0;
  for (bool found_inf : infs) {
    if (found_inf) {
      scale = static_cast<float>(scale * backoff);
      tracker = 0;
    } else {
      const std::int64_t successful = tracker + 1;
      if (successful == interval) {
        const auto new_scale = static_cast<float>(scale * growth);
        if (std::isfinite(new_scale)) scale = new_scale;
        tracker = 0;
      } else {
        tracker = successful;
      }
    }
    out.push_back({scale, tracker, 0});
  }
  return out;
}

// megatron/core/optimizer/grad_scaler.py: DynamicGradScaler.update.
std::vector<RefPoint> megatron_reference(float scale, float min_scale, double growth,
                                         double backoff, std::int64_t interval, int hysteresis,
                                         const std::vector<bool>& infs) {
  std::vector<RefPoint> out;
  std::int64_t growth_tracker = 0;
  int hysteresis_tracker = hysteresis;
  for (bool found_inf : infs) {
    if (found_inf) {
      growth_tracker = 0;
      hysteresis_tracker -= 1;
      if (hysteresis_tracker <= 0) {
        scale = std::max(static_cast<float>(scale * backoff), min_scale);
      }
    } else {
      growth_tracker += 1;
      if (growth_tracker == interval) {
        growth_tracker = 0;
        hysteresis_tracker = hysteresis;
        scale = static_cast<float>(scale * growth);
      }
    }
    out.push_back({scale, growth_tracker, hysteresis_tracker});
  }
  return out;
}

std::vector<bool> pattern(const char* s) {
  std::vector<bool> v;
  for (; *s != 0; ++s) v.push_back(*s == 'X');
  return v;
}

std::vector<bool> random_pattern(std::uint64_t seed, int n, int one_in) {
  Rng rng(seed);
  std::vector<bool> v;
  for (int i = 0; i < n; ++i) v.push_back(rng.uniform_int(static_cast<std::uint64_t>(one_in)) == 0);
  return v;
}

TEST(LossScalerTest, DynamicMatchesPyTorchReferenceOnScriptedSequences) {
  const std::vector<std::vector<bool>> scripts = {
      pattern("...X....X..XX.........X.X.X......"), pattern("XXXXXXXX........"),
      random_pattern(1, 500, 7), random_pattern(2, 500, 3)};
  for (std::size_t k = 0; k < scripts.size(); ++k) {
    ScalerConfig c = ScalerConfig::pytorch_defaults();
    c.growth_interval = 4;
    auto scaler = std::make_unique<LossScaler>(c);
    const auto ref = pytorch_reference(65536.0f, 2.0, 0.5, 4, scripts[k]);
    for (std::size_t i = 0; i < ref.size(); ++i) {
      scaler->update(scripts[k][i]);
      ASSERT_EQ(scaler->scale(), ref[i].scale) << "script " << k << " step " << i;
      ASSERT_EQ(scaler->state().growth_tracker, ref[i].growth_tracker) << "script " << k;
    }
  }
}

TEST(LossScalerTest, DynamicWithOddFactorsRoundsLikeTheReference) {
  ScalerConfig c = ScalerConfig::pytorch_defaults();
  c.init_scale = 1000.0f;
  c.growth_factor = 1.7;
  c.backoff_factor = 0.3;
  c.growth_interval = 2;
  auto scaler = std::make_unique<LossScaler>(c);
  const auto infs = random_pattern(3, 300, 4);
  const auto ref = pytorch_reference(1000.0f, 1.7, 0.3, 2, infs);
  for (std::size_t i = 0; i < ref.size(); ++i) {
    scaler->update(infs[i]);
    ASSERT_EQ(scaler->scale(), ref[i].scale) << "step " << i;
  }
}

TEST(LossScalerTest, DynamicDefaultsAreGradScalers) {
  const ScalerConfig c = ScalerConfig::pytorch_defaults();
  EXPECT_EQ(c.kind, ScalerKind::kDynamic);
  EXPECT_EQ(c.init_scale, 65536.0f);
  EXPECT_EQ(c.growth_factor, 2.0);
  EXPECT_EQ(c.backoff_factor, 0.5);
  EXPECT_EQ(c.growth_interval, 2000);
  EXPECT_EQ(c.min_scale, 0.0f);  // no floor: the scale may fall below 1
  auto s = std::make_unique<LossScaler>(c);
  for (int i = 0; i < 1999; ++i) s->update(false);
  EXPECT_EQ(s->scale(), 65536.0f);
  s->update(false);
  EXPECT_EQ(s->scale(), 131072.0f);
  for (int i = 0; i < 20; ++i) s->update(true);
  EXPECT_EQ(s->scale(), 0.125f);
}

TEST(LossScalerTest, DynamicNeverGrowsPastFiniteFp32) {
  ScalerConfig c = ScalerConfig::pytorch_defaults();
  c.init_scale = 0x1p127f;
  c.growth_interval = 1;
  auto s = std::make_unique<LossScaler>(c);
  for (int i = 0; i < 5; ++i) {
    s->update(false);
    EXPECT_EQ(s->scale(), 0x1p127f);
    EXPECT_EQ(s->state().growth_tracker, 0);
  }
  const auto ref = pytorch_reference(0x1p127f, 2.0, 0.5, 1, pattern("....."));
  EXPECT_EQ(ref.back().scale, 0x1p127f);
}

TEST(LossScalerTest, HysteresisMatchesMegatronReferenceOnScriptedSequences) {
  const std::vector<std::vector<bool>> scripts = {
      pattern("X.X..XX...XXX......X"), pattern("XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX"),
      random_pattern(4, 600, 5), random_pattern(5, 600, 2)};
  for (std::size_t k = 0; k < scripts.size(); ++k) {
    ScalerConfig c = ScalerConfig::megatron_defaults();
    c.growth_interval = 5;
    auto scaler = std::make_unique<LossScaler>(c);
    const auto ref = megatron_reference(4294967296.0f, 1.0f, 2.0, 0.5, 5, 2, scripts[k]);
    for (std::size_t i = 0; i < ref.size(); ++i) {
      scaler->update(scripts[k][i]);
      const auto st = scaler->state();
      ASSERT_EQ(st.scale, ref[i].scale) << "script " << k << " step " << i;
      ASSERT_EQ(st.growth_tracker, ref[i].growth_tracker) << "script " << k << " step " << i;
      ASSERT_EQ(st.hysteresis_tracker, ref[i].hysteresis_tracker) << "script " << k;
    }
  }
}

TEST(LossScalerTest, HysteresisToleratesOneInfAndStopsAtMinScale) {
  ScalerConfig c = ScalerConfig::megatron_defaults();
  c.init_scale = 8.0f;
  auto s = std::make_unique<LossScaler>(c);
  s->update(true);
  EXPECT_EQ(s->scale(), 8.0f);  // hysteresis 2: the first inf only spends the budget
  s->update(true);
  EXPECT_EQ(s->scale(), 4.0f);
  for (int i = 0; i < 10; ++i) s->update(true);
  EXPECT_EQ(s->scale(), 1.0f);  // min_scale
}

TEST(LossScalerTest, StaticNeverChanges) {
  auto s = std::make_unique<LossScaler>(ScalerConfig::static_scale(128.0f));
  for (bool inf : random_pattern(6, 100, 2)) {
    s->update(inf);
    EXPECT_EQ(s->scale(), 128.0f);
  }
}

TEST(LossScalerTest, InvalidConfigsAreRejected) {
  ScalerConfig c;
  c.growth_factor = 1.0;
  EXPECT_NE(validate(c).find("growth_factor"), std::string::npos);
  c = {};
  c.backoff_factor = 1.0;
  EXPECT_NE(validate(c).find("backoff_factor"), std::string::npos);
  c = {};
  c.growth_interval = 0;
  EXPECT_NE(validate(c).find("growth_interval"), std::string::npos);
  c = {};
  c.init_scale = std::numeric_limits<float>::infinity();
  EXPECT_NE(validate(c).find("init_scale"), std::string::npos);
  EXPECT_THROW(std::make_unique<LossScaler>(c), Error);
}

TEST(ScalerHandleTest, ReadsFullStateAndAppliesUpdateAtItsStep) {
  ScalerHandle h(ScalerConfig::pytorch_defaults());
  ScalerUpdate u;
  u.effective_from_step = 3;
  u.scale = 1024.0f;
  u.growth_interval = 10;
  ASSERT_EQ(h.schedule(u), "");
  EXPECT_EQ(h.pending_updates(), 1u);
  for (std::int64_t step = 0; step < 3; ++step) {
    EXPECT_EQ(h.begin_step(step), 65536.0f);
    h.end_step(false);
  }
  EXPECT_EQ(h.begin_step(3), 1024.0f);
  const ScalerState st = h.state();
  EXPECT_EQ(st.config.growth_interval, 10);
  EXPECT_EQ(st.growth_tracker, 0);
  EXPECT_EQ(h.pending_updates(), 0u);
  EXPECT_EQ(h.end_step(true), 512.0f);
  EXPECT_EQ(h.next_step(), 4);
}

TEST(ScalerHandleTest, RejectsOutOfBoundsAndPastUpdates) {
  ScalerConfig c = ScalerConfig::megatron_defaults();
  c.max_scale = 0x1p40f;
  ScalerHandle h(c);
  h.begin_step(0);
  h.end_step(false);
  ScalerUpdate u;
  u.effective_from_step = 5;
  u.scale = 0.5f;  // below min_scale 1
  EXPECT_NE(h.schedule(u).find("outside"), std::string::npos);
  u.scale = 0x1p41f;  // above max_scale
  EXPECT_NE(h.schedule(u).find("outside"), std::string::npos);
  u.scale = std::numeric_limits<float>::quiet_NaN();
  EXPECT_NE(h.schedule(u).find("finite"), std::string::npos);
  u.scale = 64.0f;
  u.backoff_factor = 2.0;
  EXPECT_NE(h.schedule(u).find("backoff_factor"), std::string::npos);
  u.backoff_factor.reset();
  u.hysteresis = 0;
  EXPECT_NE(h.schedule(u).find("hysteresis"), std::string::npos);
  u.hysteresis.reset();
  u.effective_from_step = 0;  // step 0 already ran
  EXPECT_NE(h.schedule(u).find("before"), std::string::npos);
  u.effective_from_step = 1;
  EXPECT_EQ(h.schedule(u), "");
  EXPECT_EQ(h.begin_step(1), 64.0f);
}

TEST(ScalerHandleTest, KindChangeKeepsScaleAndIsThreadSafe) {
  ScalerHandle h(ScalerConfig::static_scale(1.0f));
  std::thread controller([&h] {
    for (int i = 0; i < 200; ++i) (void)h.state();
    ScalerUpdate u;
    u.effective_from_step = 0;
    u.kind = ScalerKind::kDynamic;
    u.scale = 256.0f;
    u.growth_interval = 1;
    EXPECT_EQ(h.schedule(u), "");
  });
  controller.join();
  EXPECT_EQ(h.begin_step(0), 256.0f);
  EXPECT_EQ(h.end_step(false), 512.0f);
  EXPECT_EQ(h.state().config.kind, ScalerKind::kDynamic);
}

// The trainer's path: the back end computes the update from the state begin_step left and the
// handle adopts it; the result equals the handle's own update, step for step.
TEST(ScalerHandleTest, AdoptingAnUpdateComputedElsewhereEqualsItsOwn) {
  for (ScalerConfig config : {ScalerConfig::pytorch_defaults(), ScalerConfig::megatron_defaults()}) {
    config.growth_interval = 2;
    ScalerHandle own(config), adopting(config);
    const bool infs[] = {false, true, false, false, false, true, true, false};
    for (std::int64_t step = 0; step < 8; ++step) {
      own.begin_step(step);
      adopting.begin_step(step);
      auto elsewhere = std::make_unique<LossScaler>(config);
      elsewhere->restore(adopting.state());
      elsewhere->update(infs[step]);
      const ScalerState s = elsewhere->state();
      EXPECT_EQ(adopting.end_step(s), own.end_step(infs[step]));
      EXPECT_EQ(adopting.state(), own.state()) << "step " << step;
      EXPECT_EQ(adopting.next_step(), own.next_step());
    }
  }
}

TEST(LrScheduleTest, WarmupThenCosineToMin) {
  LrSchedule s{.max_lr = 1.0f, .min_lr = 0.1f, .warmup_steps = 4, .total_steps = 14};
  EXPECT_FLOAT_EQ(s.at(0), 0.25f);
  EXPECT_FLOAT_EQ(s.at(3), 1.0f);
  EXPECT_FLOAT_EQ(s.at(4), 1.0f);
  EXPECT_NEAR(s.at(9), 0.55f, 1e-6);  // half-way through the cosine
  EXPECT_FLOAT_EQ(s.at(14), 0.1f);
  EXPECT_FLOAT_EQ(s.at(100), 0.1f);
  for (std::int64_t i = 4; i < 14; ++i) EXPECT_GE(s.at(i), s.at(i + 1));
}

TEST(Fp32OverrideSetTest, ActivatesFromStepAndRejectsUnknownLayers) {
  Fp32OverrideSet set({"h0.mlp.fc", "lm_head"});
  EXPECT_EQ(set.add("h0.mlp.fc", 5), "");
  EXPECT_NE(set.add("h9.mlp.fc", 0), "");
  EXPECT_NE(set.add("lm_head", -1), "");
  EXPECT_FALSE(set.active("h0.mlp.fc", 4));
  EXPECT_TRUE(set.active("h0.mlp.fc", 5));
  EXPECT_FALSE(set.active("lm_head", 5));
  EXPECT_EQ(set.add("*", 7), "");
  EXPECT_TRUE(set.active("lm_head", 7));
  EXPECT_TRUE(set.remove("*"));
  EXPECT_FALSE(set.active("lm_head", 7));
}

}  // namespace
}  // namespace ampscope::trainer
