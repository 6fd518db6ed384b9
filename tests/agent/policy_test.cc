#include "policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <initializer_list>
#include <memory>
#include <stdexcept>
#include <thread>

#include "ampscope/testing/files.h"
#include "ampscope/text.h"
#include "policy_fakes.h"
#include "spool.h"

namespace ampscope::agent {
namespace {

using testing::FakeScaler;
using testing::update;

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

std::string check(const v1::PolicyUpdate& u, ScalerSettings s = {}) {
  const FakeOverrides overrides;
  return validate_update(u, "run", s, true, &overrides);
}

// A trainer whose FP32 overrides work per layer while it reports tensors: the attention core
// computes the scores and the probabilities, the head its logits. What throws is a bug in the
// trainer's mapping.
class MappingOverrides final : public PrecisionOverrides {
 public:
  std::vector<std::string> capable_layers() const override {
    return {"h0.attn.core", "h1.attn.core", "lm_head"};
  }
  std::string layer_of(std::string_view tensor) const override {
    if (tensor == "boom") throw std::runtime_error("no such block");
    for (const char* block : {"h0", "h1"}) {
      const std::string b = block;
      if (tensor == b + ".attn.scores" || tensor == b + ".attn.probs") return b + ".attn.core";
    }
    if (tensor == "logits" || tensor == "lm_head") return "lm_head";
    return {};
  }
  std::string replace(const std::vector<std::string>& l, std::int64_t from) override {
    layers = l;
    step = from;
    ++calls;
    return {};
  }
  std::vector<std::string> layers;
  std::int64_t step = -1;
  int calls = 0;
};

v1::PolicyUpdate fp32_update(const std::string& id, std::int64_t step,
                             std::initializer_list<const char*> tensors) {
  return testing::set_update(id, step, testing::SetField::kFp32Tensors, tensors);
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

TEST(PolicyValidationTest, Fp32TensorsMapToTheLayersThatComputeThemOnceEach) {
  const MappingOverrides overrides;
  const auto u = fp32_update("1", 5, {"h1.attn.scores", "h1.attn.probs", "logits",
                                      "h0.attn.scores", "lm_head"});
  std::vector<std::string> layers;
  EXPECT_EQ(validate_update(u, "run", {}, true, &overrides, &layers), "");
  EXPECT_EQ(layers, (std::vector<std::string>{"h1.attn.core", "lm_head", "h0.attn.core"}));
}

TEST(PolicyValidationTest, ATensorThatNoLayerComputesRefusesTheWholeUpdate) {
  const MappingOverrides overrides;
  auto u = fp32_update("1", 5, {"h1.attn.scores", "h1.mlp.gelu"});
  u.set_loss_scale(1024);
  EXPECT_EQ(validate_update(u, "run", {}, true, &overrides),
            "fp32_tensors[1]: 'h1.mlp.gelu' is not a layer the trainer can compute in FP32");
  const auto boom = fp32_update("2", 5, {"boom"});
  EXPECT_EQ(validate_update(boom, "run", {}, true, &overrides),
            "fp32_tensors[0]: 'boom': mapping it to a layer failed: no such block");
}

TEST(PolicyValidationTest, TheDefaultMappingTakesCapableLayersByTheirOwnName) {
  const FakeOverrides overrides;  // capable: h0.mlp.fc, lm_head; no layer_of of its own
  std::vector<std::string> layers;
  EXPECT_EQ(validate_update(fp32_update("1", 5, {"lm_head", "h0.mlp.fc", "lm_head"}), "run", {},
                            true, &overrides, &layers),
            "");
  EXPECT_EQ(layers, (std::vector<std::string>{"lm_head", "h0.mlp.fc"}));
  EXPECT_NE(validate_update(fp32_update("2", 5, {"h0.mlp.fc.out"}), "run", {}, true, &overrides)
                .find("fp32_tensors[0]: 'h0.mlp.fc.out' is not a layer"),
            std::string::npos);
  EXPECT_EQ(validate_update(fp32_update("3", 5, {"lm_head"}), "run", {}, true, nullptr),
            "fp32_tensors: no FP32 override set is attached to the agent");
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

TEST_F(PolicyApplierTest, TheFp32SetAppliedIsTheLayersOfTheRecommendedTensors) {
  MappingOverrides mapping;
  PolicyApplier a(config, nullptr, &notices);
  a.attach_scaler(&scaler);
  a.attach_overrides(&mapping);
  a.receive(fp32_update("1", 3, {"h0.attn.scores", "h0.attn.probs", "logits"}));
  std::vector<PolicyOutcome> out;
  a.begin_step(3, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].applied) << out[0].reason;
  EXPECT_EQ(mapping.step, 3);
  EXPECT_EQ(mapping.layers, (std::vector<std::string>{"h0.attn.core", "lm_head"}));
  // One name no layer computes: the update, its scale included, is refused as a whole.
  auto bad = fp32_update("2", 4, {"h1.attn.scores", "h1.mlp.gelu"});
  bad.set_loss_scale(512);
  a.receive(bad);
  out.clear();
  a.begin_step(4, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_FALSE(out[0].applied);
  EXPECT_EQ(out[0].reason,
            "fp32_tensors[1]: 'h1.mlp.gelu' is not a layer the trainer can compute in FP32");
  EXPECT_EQ(mapping.calls, 1);
  EXPECT_TRUE(scaler.changes.empty());
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

// What the server sent comes back in a report, whose rules take an outcome's policy_id as 1..64
// bytes and its reason as at most 512, both clean text (ampscope/text.h); the server refuses an
// outcome that breaks them.
TEST_F(PolicyApplierTest, OutcomesKeepToTheReportsRulesWhateverTheUpdateHeld) {
  auto other_run = update("4", 10);
  other_run.set_run_id("other\nrun");
  auto long_id = update(std::string(1000, '7'), 10);
  long_id.set_loss_scale(3000);
  auto no_id = update("", 10);
  auto bad_tensor = fp32_update("5", 10, {"h0\x01\x7f"});
  bad_tensor.set_fp32_tensors(0, std::string(2000, 'x') + "\n");
  for (const auto& u : {other_run, long_id, no_id, bad_tensor}) applier.receive(u);
  std::vector<PolicyOutcome> out;
  applier.begin_step(10, &out);
  ASSERT_EQ(out.size(), 4u);
  const auto printable = [](const std::string& s) { return text::is_clean_text(s); };
  for (const PolicyOutcome& o : out) {
    EXPECT_FALSE(o.applied);
    EXPECT_FALSE(o.policy_id.empty());
    EXPECT_LE(o.policy_id.size(), 64u);
    EXPECT_LE(o.reason.size(), 512u);
    EXPECT_TRUE(printable(o.policy_id) && printable(o.reason)) << o.policy_id << ": " << o.reason;
  }
  const auto has = [&](const std::string& id, const std::string& reason_start) {
    return std::any_of(out.begin(), out.end(), [&](const PolicyOutcome& o) {
      return o.policy_id == id && o.reason.starts_with(reason_start);
    });
  };
  EXPECT_TRUE(has("4", "run_id: 'other\\x0arun' is not this run ('run')"));
  // Cut to the limit with a hash of the whole (text::clean_text), so long ids stay apart.
  const std::string long_id_sent = text::clean_text(std::string(1000, '7'), 64);
  EXPECT_EQ(long_id_sent.substr(0, 56), std::string(55, '7') + "~");
  EXPECT_TRUE(has(long_id_sent, "loss_scale: must be a finite power of two"));
  EXPECT_TRUE(has("(none)", "policy_id: must not be empty"));
  EXPECT_TRUE(has("5", "fp32_tensors[0]: '" + std::string(119, 'x') + "~"));
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

// Two ranks of a per-step agreeing run, each with its own applier and scaler; the host's max
// all-reduce of {-received_seq, fallback} is done here by hand.
class AgreementTest : public ::testing::Test {
 protected:
  struct Rank {
    explicit Rank(const AgentConfig& c) : applier(c, nullptr, &notices) {
      applier.attach_scaler(&scaler);
      applier.set_connected(true);
    }
    Notices notices;
    FakeScaler scaler;
    PolicyApplier applier;
    std::vector<std::vector<PolicyOutcome>> outcomes;  // by step
  };
  AgreementTest() {
    config.run_id = "run";
    config.world_size = 2;
    config.policy_agreement = PolicyAgreementMode::kPerStep;
  }
  void make() {
    r0 = std::make_unique<Rank>(config);
    r1 = std::make_unique<Rank>(config);
  }
  // One step on both ranks: begin, then the step's reduction.
  void step(std::int64_t s) {
    for (Rank* r : {r0.get(), r1.get()}) {
      r->outcomes.resize(static_cast<std::size_t>(s) + 1);
      r->applier.begin_step(s, &r->outcomes[static_cast<std::size_t>(s)]);
    }
    const PolicyVote a = r0->applier.vote(), b = r1->applier.vote();
    const PolicyVote agreed{std::min(a.received_seq, b.received_seq), a.fallback || b.fallback};
    EXPECT_EQ(r0->applier.agreed(agreed), "");
    EXPECT_EQ(r1->applier.agreed(agreed), "");
  }
  static v1::PolicyUpdate numbered(std::uint64_t seq, std::int64_t effective, double scale) {
    auto u = update(std::to_string(100 + seq), effective);
    u.set_seq(seq);
    u.set_loss_scale(scale);
    return u;
  }
  AgentConfig config;
  Notices notices_;
  std::unique_ptr<Rank> r0, r1;
};

TEST_F(AgreementTest, ALateRankMakesEveryRankApplyLateButTogether) {
  make();
  step(0);
  const auto u = numbered(1, 2, 1024);
  r0->applier.receive(u);  // rank 0 in time for step 2
  for (std::int64_t s = 1; s <= 4; ++s) step(s);
  // Rank 1's copy arrives during step 4: nobody applied it yet, nobody refused it.
  EXPECT_TRUE(r0->scaler.changes.empty());
  EXPECT_TRUE(r1->scaler.changes.empty());
  r1->applier.receive(u);
  step(5);  // the reduction after step 4 did not include it yet
  EXPECT_TRUE(r0->scaler.changes.empty());
  step(6);
  for (Rank* r : {r0.get(), r1.get()}) {
    ASSERT_EQ(r->scaler.changes.size(), 1u);
    EXPECT_EQ(r->scaler.changes[0].effective_from_step, 6);
    EXPECT_EQ(r->scaler.s.scale, 1024);
    ASSERT_EQ(r->outcomes[6].size(), 1u);
    EXPECT_TRUE(r->outcomes[6][0].applied);
    EXPECT_EQ(r->outcomes[6][0].policy_id, "101");
    EXPECT_EQ(r->applier.step_seq(), 1u);
  }
}

TEST_F(AgreementTest, AnUpdateForALaterStepWaitsForItsStepOnEveryRank) {
  make();
  r0->applier.receive(numbered(1, 5, 4096));
  r1->applier.receive(numbered(1, 5, 4096));
  for (std::int64_t s = 0; s <= 5; ++s) step(s);
  for (Rank* r : {r0.get(), r1.get()}) {
    ASSERT_EQ(r->scaler.changes.size(), 1u);
    EXPECT_EQ(r->scaler.changes[0].effective_from_step, 5);
  }
}

TEST_F(AgreementTest, UpdatesApplyInSeqOrderUpToTheAgreedOne) {
  make();
  for (Rank* r : {r0.get(), r1.get()}) {
    r->applier.receive(numbered(1, 0, 512));
    r->applier.receive(numbered(2, 0, 256));
  }
  r0->applier.receive(numbered(3, 0, 128));  // only rank 0 has 3
  step(0);
  step(1);
  for (Rank* r : {r0.get(), r1.get()}) {
    ASSERT_EQ(r->scaler.changes.size(), 2u);
    EXPECT_EQ(r->scaler.s.scale, 256);
    EXPECT_EQ(r->applier.step_seq(), 2u);
  }
}

TEST_F(AgreementTest, ValidationAtTheAgreedStepGivesEveryRankTheSameOutcome) {
  make();
  for (Rank* r : {r0.get(), r1.get()}) {
    r->scaler.s.max_scale = 1024;
    r->applier.receive(numbered(1, 0, 4096));  // above max_scale: refused, on both
  }
  step(0);
  step(1);
  for (Rank* r : {r0.get(), r1.get()}) {
    ASSERT_EQ(r->outcomes[1].size(), 1u);
    EXPECT_FALSE(r->outcomes[1][0].applied);
    EXPECT_NE(r->outcomes[1][0].reason.find("outside"), std::string::npos);
  }
}

TEST_F(AgreementTest, AnUpdateWithoutSeqIsRefused) {
  make();
  auto u = update("7", 0);
  u.set_loss_scale(512);
  r0->applier.receive(u);
  step(0);
  step(1);
  ASSERT_EQ(r0->outcomes[0].size(), 1u);
  EXPECT_NE(r0->outcomes[0][0].reason.find("seq: missing"), std::string::npos);
  EXPECT_TRUE(r0->scaler.changes.empty());
}

TEST_F(AgreementTest, AnAgreedSeqAboveWhatThisRankHoldsIsRefused) {
  make();
  EXPECT_NE(r0->applier.agreed({3, false}).find("above the 0 this rank received"),
            std::string::npos);
}

TEST_F(AgreementTest, EveryRankFallsBackOnTheStepAnyRankAskedFor) {
  config.policy_fallback_after = std::chrono::milliseconds(1);
  make();
  for (Rank* r : {r0.get(), r1.get()}) {
    r->scaler.s.growth_interval = 2000;
    auto u = numbered(1, 0, 1024);
    u.set_growth_interval(1000000);
    r->applier.receive(u);
  }
  step(0);
  step(1);
  ASSERT_EQ(r0->scaler.s.growth_interval, 1000000);
  ASSERT_EQ(r1->scaler.s.growth_interval, 1000000);
  r0->applier.set_connected(false);  // only rank 0 loses the server
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  step(2);  // rank 0's wish goes into this step's reduction
  EXPECT_EQ(r0->scaler.s.growth_interval, 1000000);
  step(3);
  for (Rank* r : {r0.get(), r1.get()}) {
    EXPECT_EQ(r->scaler.s.growth_interval, 2000);
    EXPECT_EQ(r->scaler.changes.back().effective_from_step, 3);
  }
  EXPECT_FALSE(r1->applier.vote().fallback);
}

TEST_F(AgreementTest, WithoutAgreementSeveralRanksRefuseUpdates) {
  config.policy_agreement = PolicyAgreementMode::kAuto;  // world_size 2: none
  PolicyApplier a(config, nullptr, &notices_);
  FakeScaler scaler;
  a.attach_scaler(&scaler);
  a.receive(numbered(1, 3, 1024));
  std::vector<PolicyOutcome> out;
  a.begin_step(0, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_FALSE(out[0].applied);
  EXPECT_NE(out[0].reason.find("without a per-step agreement"), std::string::npos);
  EXPECT_TRUE(scaler.changes.empty());
  EXPECT_NE(a.agreed({0, false}).find("not per_step"), std::string::npos);
}

TEST_F(AgreementTest, AHostThatStopsAgreeingIsToldUpdatesWait) {
  make();
  r0->applier.receive(numbered(1, 0, 512));
  std::vector<PolicyOutcome> out;
  for (std::int64_t s = 0; s < 100; ++s) r0->applier.begin_step(s, &out);
  EXPECT_TRUE(out.empty());
  ASSERT_EQ(r0->notices.all().size(), 1u);
  EXPECT_NE(r0->notices.all()[0].find("no agreed vote for 100 steps"), std::string::npos);
}

TEST_F(AgreementTest, AReceiveDelayHoldsAnUpdateBack) {
  config.policy_receive_delay = std::chrono::milliseconds(30);
  make();
  r0->applier.receive(numbered(1, 0, 512));
  EXPECT_EQ(r0->applier.vote().received_seq, 0u);
  std::this_thread::sleep_for(std::chrono::milliseconds(40));
  EXPECT_EQ(r0->applier.vote().received_seq, 1u);
}

TEST_F(AgreementTest, IndependentRanksApplyOnTheirOwnAndCanDiverge) {
  config.policy_agreement = PolicyAgreementMode::kIndependent;
  make();
  const auto u = numbered(1, 2, 1024);
  r0->applier.receive(u);
  std::vector<PolicyOutcome> out0, out1;
  r0->applier.begin_step(2, &out0);
  r1->applier.receive(u);  // too late for step 2
  r1->applier.begin_step(3, &out1);
  EXPECT_EQ(r0->scaler.s.scale, 1024);
  ASSERT_EQ(out1.size(), 1u);
  EXPECT_FALSE(out1[0].applied);
  EXPECT_NE(r1->scaler.s.scale, 1024);
}

}  // namespace
}  // namespace ampscope::agent
