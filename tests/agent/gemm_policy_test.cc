// Per-layer precision of FP8/FP4 runs through the policy applier (policy.h): PolicyUpdate's
// bf16_gemms, amax_history_length and amax_margin validated against what attach_gemm_precision
// attached, applied at their step (also under the per-step agreement), refused as a unit, and
// left in place by the fallback.
#include <gtest/gtest.h>

#include <chrono>
#include <initializer_list>
#include <string>
#include <thread>
#include <vector>

#include "policy.h"
#include "policy_fakes.h"

namespace ampscope::agent {
namespace {

using testing::FakeScaler;

// A trainer's BF16 GEMM set: records each replace().
class FakeGemms final : public PrecisionOverrides {
 public:
  std::vector<std::string> capable_layers() const override {
    return {"h0.attn.qkv", "h0.mlp.fc", "h1.mlp.proj"};
  }
  std::string replace(const std::vector<std::string>& l, std::int64_t from) override {
    calls.push_back({l, from});
    return refuse;
  }
  struct Call {
    std::vector<std::string> layers;
    std::int64_t step;
  };
  std::vector<Call> calls;
  std::string refuse;
};

class FakeRecipe final : public RecipeControl {
 public:
  explicit FakeRecipe(bool delayed) : delayed_(delayed) {}
  bool delayed() const override { return delayed_; }
  std::string schedule(const RecipeChange& c) override {
    changes.push_back(c);
    return {};
  }
  std::vector<RecipeChange> changes;

 private:
  bool delayed_;
};

v1::PolicyUpdate gemm_update(const std::string& id, std::int64_t step,
                             std::initializer_list<const char*> layers) {
  return testing::set_update(id, step, testing::SetField::kBf16Gemms, layers);
}

// The one outcome `a` reports at the start of `step` (a failure, and an empty one, otherwise).
PolicyOutcome outcome_at(PolicyApplier& a, std::int64_t step) {
  std::vector<PolicyOutcome> out;
  a.begin_step(step, &out);
  EXPECT_EQ(out.size(), 1u) << "step " << step;
  return out.size() == 1 ? out[0] : PolicyOutcome{};
}

const std::vector<std::string> kCapable = {"h0.attn.qkv", "h0.mlp.fc", "h1.mlp.proj"};

TEST(GemmValidationTest, Bf16GemmsAreCapableLayersByName) {
  std::vector<std::string> set;
  EXPECT_EQ(validate_gemm_update(gemm_update("1", 0, {"h1.mlp.proj", "h0.mlp.fc", "h1.mlp.proj"}),
                                 &kCapable, false, false, &set),
            "");
  EXPECT_EQ(set, (std::vector<std::string>{"h1.mlp.proj", "h0.mlp.fc"}));
  EXPECT_EQ(validate_gemm_update(gemm_update("2", 0, {}), &kCapable, false, false, &set), "");
  EXPECT_TRUE(set.empty());
  EXPECT_EQ(
      validate_gemm_update(gemm_update("3", 0, {"h0.mlp.fc", "lm_head"}), &kCapable, false, false),
      "bf16_gemms[1]: 'lm_head' is not a GEMM layer the trainer can run in BF16");
  EXPECT_EQ(validate_gemm_update(gemm_update("4", 0, {"h0.mlp.fc"}), nullptr, true, true),
            "bf16_gemms: no GEMM precision set is attached to the agent");
  // Names without bf16_gemms_set say nothing (the FP32 fallback's rule for fp32_tensors).
  v1::PolicyUpdate unset = gemm_update("5", 0, {"nope"});
  unset.set_bf16_gemms_set(false);
  EXPECT_EQ(validate_gemm_update(unset, nullptr, false, false), "");
}

TEST(GemmValidationTest, DelayedSettingsNeedADelayedRecipeAndTheirRanges) {
  v1::PolicyUpdate u;
  u.set_amax_history_length(1024);
  u.set_amax_margin(64);
  EXPECT_EQ(validate_gemm_update(u, nullptr, true, true), "");
  EXPECT_EQ(validate_gemm_update(u, nullptr, true, false),
            "amax_history_length: the run does not use delayed scaling");
  EXPECT_EQ(validate_gemm_update(u, nullptr, false, false),
            "amax_history_length: no recipe control is attached to the agent");
  v1::PolicyUpdate m;
  m.set_amax_margin(65);
  EXPECT_EQ(validate_gemm_update(m, nullptr, true, false),
            "amax_margin: the run does not use delayed scaling");
  EXPECT_EQ(validate_gemm_update(m, nullptr, true, true),
            "amax_margin: must be in [0, 64], got 65");
  v1::PolicyUpdate h;
  h.set_amax_history_length(0);
  EXPECT_EQ(validate_gemm_update(h, nullptr, true, true),
            "amax_history_length: must be in [1, 1024], got 0");
  h.set_amax_history_length(1025);
  EXPECT_EQ(validate_gemm_update(h, nullptr, true, true),
            "amax_history_length: must be in [1, 1024], got 1025");
}

class GemmApplierTest : public ::testing::Test {
 protected:
  GemmApplierTest() { config.run_id = "run"; }
  void attach(PolicyApplier& a, bool delayed_recipe = true) {
    a.attach_scaler(&scaler);
    a.attach_gemm_precision(&gemms, delayed_recipe ? &delayed : &current);
  }
  AgentConfig config;
  Notices notices;
  FakeScaler scaler;
  FakeGemms gemms;
  FakeRecipe delayed{true}, current{false};
};

TEST_F(GemmApplierTest, TheBf16SetAndTheDelayedSettingsApplyAtTheirStep) {
  PolicyApplier a(config, nullptr, &notices);
  attach(a);
  EXPECT_EQ(a.capable_gemms(), kCapable);
  auto u = gemm_update("1", 4, {"h1.mlp.proj", "h0.attn.qkv", "h1.mlp.proj"});
  u.set_amax_history_length(32);
  u.set_amax_margin(2);
  u.set_loss_scale(1024);
  a.receive(u);
  std::vector<PolicyOutcome> out;
  for (std::int64_t s = 2; s < 4; ++s) a.begin_step(s, &out);
  EXPECT_TRUE(out.empty());
  EXPECT_TRUE(gemms.calls.empty());
  EXPECT_TRUE(delayed.changes.empty());
  const PolicyOutcome o = outcome_at(a, 4);
  EXPECT_TRUE(o.applied) << o.reason;
  ASSERT_EQ(gemms.calls.size(), 1u);
  EXPECT_EQ(gemms.calls[0].layers, (std::vector<std::string>{"h1.mlp.proj", "h0.attn.qkv"}));
  EXPECT_EQ(gemms.calls[0].step, 4);
  ASSERT_EQ(delayed.changes.size(), 1u);
  EXPECT_EQ(delayed.changes[0].effective_from_step, 4);
  EXPECT_EQ(delayed.changes[0].amax_history_length, 32);
  EXPECT_EQ(delayed.changes[0].margin, 2);
  ASSERT_EQ(scaler.changes.size(), 1u);
  EXPECT_EQ(scaler.s.scale, 1024);
  // An empty set moves every layer back to the recipe; a margin alone keeps the length.
  auto back = gemm_update("2", 6, {});
  back.set_amax_margin(0);
  a.receive(back);
  const PolicyOutcome o6 = outcome_at(a, 6);
  EXPECT_TRUE(o6.applied) << o6.reason;
  ASSERT_EQ(gemms.calls.size(), 2u);
  EXPECT_TRUE(gemms.calls[1].layers.empty());
  EXPECT_EQ(gemms.calls[1].step, 6);
  ASSERT_EQ(delayed.changes.size(), 2u);
  EXPECT_FALSE(delayed.changes[1].amax_history_length.has_value());
  EXPECT_EQ(delayed.changes[1].margin, 0);
  EXPECT_EQ(a.applied(), 2u);
}

TEST_F(GemmApplierTest, AnUnknownLayerRefusesTheWholeUpdate) {
  PolicyApplier a(config, nullptr, &notices);
  attach(a);
  auto u = gemm_update("1", 3, {"h0.mlp.fc", "h0.attn.core"});
  u.set_loss_scale(512);
  u.set_amax_margin(1);
  a.receive(u);
  EXPECT_EQ(outcome_at(a, 3).reason,
            "bf16_gemms[1]: 'h0.attn.core' is not a GEMM layer the trainer can run in BF16");
  EXPECT_TRUE(gemms.calls.empty());
  EXPECT_TRUE(delayed.changes.empty());
  EXPECT_TRUE(scaler.changes.empty());
  EXPECT_EQ(a.refused(), 1u);
}

TEST_F(GemmApplierTest, WithoutGemmsAttachedOrOnARunWithoutDelayedScalingItIsRefused) {
  PolicyApplier none(config, nullptr, &notices);
  none.attach_scaler(&scaler);
  none.receive(gemm_update("1", 0, {"h0.mlp.fc"}));
  EXPECT_EQ(outcome_at(none, 0).reason,
            "bf16_gemms: no GEMM precision set is attached to the agent");
  EXPECT_TRUE(none.capable_gemms().empty());

  PolicyApplier current_scaling(config, nullptr, &notices);
  attach(current_scaling, false);
  auto u = gemm_update("2", 0, {"h0.mlp.fc"});
  u.set_amax_history_length(8);
  current_scaling.receive(u);
  EXPECT_EQ(outcome_at(current_scaling, 0).reason,
            "amax_history_length: the run does not use delayed scaling");
  EXPECT_TRUE(gemms.calls.empty());
  EXPECT_TRUE(current.changes.empty());
}

TEST_F(GemmApplierTest, TheTrainersRefusalIsTheOutcome) {
  PolicyApplier a(config, nullptr, &notices);
  attach(a);
  gemms.refuse = "the set is locked";
  a.receive(gemm_update("1", 0, {"h0.mlp.fc"}));
  EXPECT_EQ(outcome_at(a, 0).reason, "bf16_gemms: the set is locked");
}

// The fallback restores the local scaler's configuration and nothing else: the layers the policy
// moved to BF16 stay there, and the delayed settings stay as they are.
TEST_F(GemmApplierTest, TheFallbackKeepsTheBf16SetAndTheDelayedSettings) {
  config.policy_fallback_after = std::chrono::milliseconds(1);
  scaler.s.growth_interval = 2000;
  PolicyApplier a(config, nullptr, &notices);
  attach(a);
  a.set_connected(true);
  auto u = gemm_update("1", 1, {"h0.mlp.fc"});
  u.set_growth_interval(1000000);
  u.set_amax_margin(3);
  a.receive(u);
  EXPECT_TRUE(outcome_at(a, 1).applied);
  ASSERT_EQ(gemms.calls.size(), 1u);
  a.set_connected(false);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::vector<PolicyOutcome> out;
  a.begin_step(2, &out);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(scaler.s.growth_interval, 2000);
  EXPECT_EQ(gemms.calls.size(), 1u);
  EXPECT_EQ(delayed.changes.size(), 1u);
}

// Two ranks agreeing per step: the BF16 set applies on the same step on both, at the step the
// agreement reached (the update's own step when both held it in time).
TEST_F(GemmApplierTest, ThePerStepAgreementAppliesTheSetOnTheSameStepOnEveryRank) {
  config.world_size = 2;
  config.policy_agreement = PolicyAgreementMode::kPerStep;
  FakeGemms gemms1;
  FakeRecipe delayed1{true};
  PolicyApplier r0(config, nullptr, &notices), r1(config, nullptr, &notices);
  r0.attach_gemm_precision(&gemms, &delayed);
  r1.attach_gemm_precision(&gemms1, &delayed1);
  auto u = gemm_update("1", 2, {"h0.attn.qkv"});
  u.set_seq(1);
  u.set_amax_history_length(4);
  r0.receive(u);
  r1.receive(u);
  for (std::int64_t s = 0; s <= 2; ++s) {
    std::vector<PolicyOutcome> o0, o1;
    r0.begin_step(s, &o0);
    r1.begin_step(s, &o1);
    if (s == 2) {
      ASSERT_EQ(o0.size(), 1u);
      ASSERT_EQ(o1.size(), 1u);
      EXPECT_TRUE(o0[0].applied) << o0[0].reason;
      EXPECT_TRUE(o1[0].applied) << o1[0].reason;
    }
    const PolicyVote v0 = r0.vote(), v1 = r1.vote();
    const PolicyVote agreed{std::min(v0.received_seq, v1.received_seq), false};
    ASSERT_EQ(r0.agreed(agreed), "");
    ASSERT_EQ(r1.agreed(agreed), "");
  }
  for (const FakeGemms* g : {&gemms, &gemms1}) {
    ASSERT_EQ(g->calls.size(), 1u);
    EXPECT_EQ(g->calls[0].layers, std::vector<std::string>{"h0.attn.qkv"});
    EXPECT_EQ(g->calls[0].step, 2);
  }
  for (const FakeRecipe* r : {&delayed, &delayed1}) {
    ASSERT_EQ(r->changes.size(), 1u);
    EXPECT_EQ(r->changes[0].effective_from_step, 2);
    EXPECT_EQ(r->changes[0].amax_history_length, 4);
  }
}

}  // namespace
}  // namespace ampscope::agent
