#include "policy.h"

#include <gtest/gtest.h>

#include "ampscope/testing/files.h"
#include "spool.h"

namespace ampscope::agent {
namespace {

// A scaler that accepts what a real one would and records when it was asked.
class FakeScaler final : public ScalerControl {
 public:
  ScalerSettings settings() const override { return s; }
  std::string schedule(const ScalerChange& c) override {
    changes.push_back(c);
    if (c.scale) s.scale = *c.scale;
    if (c.growth_interval) s.growth_interval = *c.growth_interval;
    return refuse;
  }
  ScalerSettings s;
  std::vector<ScalerChange> changes;
  std::string refuse;
};

class FakeOverrides final : public PrecisionOverrides {
 public:
  std::vector<std::string> capable_layers() const override { return {"h0.mlp.fc", "lm_head"}; }
  std::string replace(const std::vector<std::string>& l, std::int64_t from) override {
    layers = l;
    step = from;
    return {};
  }
  std::vector<std::string> layers;
  std::int64_t step = -1;
};

v1::PolicyUpdate update(const std::string& id, std::int64_t step) {
  v1::PolicyUpdate u;
  u.set_policy_id(id);
  u.set_run_id("run");
  u.set_effective_from_step(step);
  return u;
}

std::string check(const v1::PolicyUpdate& u, ScalerSettings s = {}) {
  return validate_update(u, "run", s, true, {"h0.mlp.fc"}, true);
}

TEST(PolicyValidationTest, AcceptsAPowerOfTwoWithinBounds) {
  auto u = update("1", 5);
  u.set_loss_scale(1024);
  u.set_growth_interval(100);
  EXPECT_EQ(check(u), "");
}

TEST(PolicyValidationTest, RefusesWhatIsNotAPowerOfTwo) {
  auto u = update("1", 5);
  u.set_loss_scale(1000);
  EXPECT_NE(check(u).find("loss_scale: must be a finite power of two"), std::string::npos);
  u.set_loss_scale(std::numeric_limits<double>::infinity());
  EXPECT_NE(check(u).find("loss_scale"), std::string::npos);
  auto m = update("2", 5);
  m.set_min_scale(3);
  EXPECT_NE(check(m).find("min_scale"), std::string::npos);
}

TEST(PolicyValidationTest, RefusesAScaleOutsideTheBounds) {
  ScalerSettings s;
  s.min_scale = 1;
  s.max_scale = 65536;
  auto u = update("1", 5);
  u.set_loss_scale(131072);
  EXPECT_NE(check(u, s).find("outside [1, 65536]"), std::string::npos) << check(u, s);
  u.set_max_scale(262144);  // the update's own bound wins
  EXPECT_EQ(check(u, s), "");
  auto v = update("2", 5);
  v.set_min_scale(1024);
  v.set_max_scale(512);
  EXPECT_NE(check(v).find("below min_scale"), std::string::npos);
}

TEST(PolicyValidationTest, RefusesBadFactorsAndUnknownLayers) {
  auto g = update("1", 5);
  g.set_growth_factor(0.5);
  EXPECT_NE(check(g).find("growth_factor"), std::string::npos);
  auto b = update("2", 5);
  b.set_backoff_factor(1.5);
  EXPECT_NE(check(b).find("backoff_factor"), std::string::npos);
  auto i = update("3", 5);
  i.set_growth_interval(0);
  EXPECT_NE(check(i).find("growth_interval"), std::string::npos);
  auto f = update("4", 5);
  f.set_fp32_tensors_set(true);
  f.add_fp32_tensors("h9.nope");
  EXPECT_NE(check(f).find("fp32_tensors[0]"), std::string::npos);
  auto r = update("5", 5);
  r.set_run_id("other");
  EXPECT_NE(check(r).find("run_id"), std::string::npos);
}

class PolicyApplierTest : public ::testing::Test {
 protected:
  PolicyApplierTest() {
    config.run_id = "run";
    applier.attach_scaler(&scaler);
    applier.attach_overrides(&overrides);
  }
  AgentConfig config;
  Notices notices;
  FakeScaler scaler;
  FakeOverrides overrides;
  PolicyApplier applier{config, nullptr, &notices};
};

TEST_F(PolicyApplierTest, AppliesExactlyAtTheEffectiveStep) {
  auto u = update("9", 7);
  u.set_loss_scale(2048);
  u.set_fp32_tensors_set(true);
  u.add_fp32_tensors("lm_head");
  applier.receive(u);
  std::vector<PolicyOutcome> out;
  for (std::int64_t step = 5; step < 7; ++step) {
    applier.begin_step(step, &out);
    EXPECT_TRUE(out.empty());
    EXPECT_TRUE(scaler.changes.empty());
  }
  applier.begin_step(7, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].applied);
  EXPECT_EQ(out[0].policy_id, "9");
  ASSERT_EQ(scaler.changes.size(), 1u);
  EXPECT_EQ(scaler.changes[0].effective_from_step, 7);
  EXPECT_EQ(*scaler.changes[0].scale, 2048);
  EXPECT_EQ(overrides.step, 7);
  EXPECT_EQ(overrides.layers, std::vector<std::string>{"lm_head"});
  EXPECT_EQ(applier.applied(), 1u);
}

TEST_F(PolicyApplierTest, RefusesOnArrivalAndReportsAtTheNextStep) {
  auto u = update("3", 50);
  u.set_loss_scale(3000);
  applier.receive(u);
  std::vector<PolicyOutcome> out;
  applier.begin_step(10, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_FALSE(out[0].applied);
  EXPECT_NE(out[0].reason.find("power of two"), std::string::npos);
  EXPECT_TRUE(scaler.changes.empty());
  EXPECT_EQ(applier.refused(), 1u);
}

TEST_F(PolicyApplierTest, RefusesAnUpdateWhoseStepHasPassed) {
  std::vector<PolicyOutcome> out;
  applier.begin_step(20, &out);
  auto u = update("4", 20);
  u.set_loss_scale(1024);
  applier.receive(u);  // arrives while step 20 runs
  applier.begin_step(21, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_FALSE(out[0].applied);
  EXPECT_NE(out[0].reason.find("had begun"), std::string::npos) << out[0].reason;
  EXPECT_TRUE(scaler.changes.empty());
}

TEST_F(PolicyApplierTest, TheScalersOwnRefusalIsReported) {
  scaler.refuse = "scale 1024 outside [min_scale 4096, max_scale 65536]";
  auto u = update("5", 2);
  u.set_loss_scale(1024);
  applier.receive(u);
  std::vector<PolicyOutcome> out;
  applier.begin_step(2, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_FALSE(out[0].applied);
  EXPECT_EQ(out[0].reason, scaler.refuse);
}

TEST_F(PolicyApplierTest, AnIdIsHandledOnceAlsoAcrossRestarts) {
  ampscope::testing::TempDir dir;
  SpoolOptions o;
  o.dir = dir.path().string();
  std::string error;
  std::vector<std::string> n;
  auto spool = Spool::open(o, &error, &n);
  ASSERT_TRUE(spool);
  {
    PolicyApplier a(config, spool.get(), &notices);
    a.attach_scaler(&scaler);
    auto u = update("11", 1);
    u.set_loss_scale(512);
    a.receive(u);
    a.receive(u);  // the server repeats the policy in force on a new stream
    std::vector<PolicyOutcome> out;
    a.begin_step(1, &out);
    EXPECT_EQ(out.size(), 1u);
  }
  PolicyApplier b(config, spool.get(), &notices);  // a restarted process, same spool
  b.attach_scaler(&scaler);
  auto u = update("11", 1);
  u.set_loss_scale(512);
  b.receive(u);
  std::vector<PolicyOutcome> out;
  b.begin_step(30, &out);
  EXPECT_TRUE(out.empty());
}

TEST_F(PolicyApplierTest, FallsBackToTheLocalConfigurationWhenTheServerIsGone) {
  config.policy_fallback_after = std::chrono::milliseconds(1);
  scaler.s.growth_interval = 2000;
  PolicyApplier a(config, nullptr, &notices);
  a.attach_scaler(&scaler);
  a.set_connected(true);
  auto u = update("1", 1);
  u.set_growth_interval(1000000);
  a.receive(u);
  std::vector<PolicyOutcome> out;
  a.begin_step(1, &out);
  EXPECT_EQ(scaler.s.growth_interval, 1000000);
  a.set_connected(false);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  a.begin_step(2, &out);
  EXPECT_EQ(scaler.s.growth_interval, 2000);
  ASSERT_FALSE(notices.all().empty());
  EXPECT_NE(notices.all().back().find("local scaler"), std::string::npos);
}

}  // namespace
}  // namespace ampscope::agent
