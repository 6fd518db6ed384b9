// Agent::observe_stats: statistics a trainer computed itself (in a fused pass) are recorded
// exactly as the agent's own measurement of the same data would be, and bad ones are refused.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ampscope/agent/agent.h"
#include "ampscope/tensor_stats.h"
#include "ampscope/testing/files.h"
#include "fake_step.h"
#include "spool_reader.h"

namespace ampscope::agent {
namespace {

using ampscope::testing::TempDir;
using testing::base_config;
using testing::FakeTensor;
using testing::make_agent;
using testing::make_step_tensors;
using testing::view_of;

constexpr std::uint16_t kNaN = 0x7e00, kPosInf = 0x7c00;

// What a fused pass computes for `view`: compute_stats of its data with the agent's target.
TensorStats fused_stats(Agent& agent, const TensorView& view) {
  std::vector<TargetSpec> targets;
  if (auto t = agent.stats_target(view)) targets.push_back(*t);
  return compute_stats(view.data, static_cast<std::size_t>(view.shape[0] * view.shape[1]),
                       view.dtype, targets);
}

// Steps 0..steps-1 with the fake model; step 1 holds a NaN in an activation gradient and an
// Inf in the weight gradient. `fused`: shown through observe_stats, without data.
void run(Agent& agent, int steps, bool fused) {
  for (int step = 0; step < steps; ++step) {
    std::vector<FakeTensor> tensors = make_step_tensors();
    if (step == 1) {
      tensors[4].fp16[7] = kNaN;
      tensors[6].fp16[0] = kPosInf;
    }
    if (agent.begin_step(step)) {
      int order = 0;
      for (const FakeTensor& t : tensors) {
        TensorView v = view_of(t, order++, 4096.0);
        if (!fused) {
          ASSERT_TRUE(agent.observe(v).ok());
          continue;
        }
        // A fused pass computes statistics only where the agent wants them.
        if (!agent.stats_target(v)) continue;
        const TensorStats stats = fused_stats(agent, v);
        v.data = nullptr;
        const Status s = agent.observe_stats(v, stats);
        ASSERT_TRUE(s.ok()) << s.message;
      }
    }
    StepInfo info;
    info.step = step;
    info.loss_scale = info.scale_after = 4096.0;
    info.found_inf = info.skipped = step == 1;
    agent.end_step(info);
  }
}

TEST(ObserveStatsTest, ReportsEqualThoseMeasuredFromTheData) {
  for (const char* mode : {"caller", "worker"}) {
    TempDir dir;
    for (const char* run_id : {"data", "fused"}) {
      AgentConfig c = base_config(dir, run_id);
      c.sampling.full_every = 3;  // full steps 0 and 3; step 2 follows the non-finite step 1
      ASSERT_EQ(set_option(c, "sample_count_roles", "activation,activation_grad,weight_grad"),
                "");
      ASSERT_EQ(set_option(c, "stats_thread", mode), "");
      auto agent = make_agent(c);
      run(*agent, 5, std::string(run_id) == "fused");
      for (const std::string& n : agent->notices()) {
        EXPECT_EQ(n.find("observe_stats"), std::string::npos) << n;
      }
    }
    const auto a = testing::read_spool(dir / "spool", "data");
    const auto b = testing::read_spool(dir / "spool", "fused");
    ASSERT_EQ(a.size(), 5u);
    ASSERT_EQ(b.size(), 5u);
    for (std::size_t i = 0; i < a.size(); ++i) {
      std::string names_a, names_b;
      for (const auto& t : a[i].tensors()) names_a += t.name() + " ";
      for (const auto& t : b[i].tensors()) names_b += t.name() + " ";
      ASSERT_EQ(names_a, names_b) << mode << " step " << i;
      for (int k = 0; k < a[i].tensors_size(); ++k) {
        EXPECT_EQ(a[i].tensors(k).SerializeAsString(), b[i].tensors(k).SerializeAsString())
            << mode << " step " << i << " " << a[i].tensors(k).name();
      }
      EXPECT_EQ(a[i].first_offender().SerializeAsString(),
                b[i].first_offender().SerializeAsString());
    }
    // The levels the comparison covered: full, counts escalated by the NaN, counts.
    EXPECT_EQ(a[0].tensors(0).level(), v1::STATS_LEVEL_FULL);
    EXPECT_EQ(a[1].tensors(4).level(), v1::STATS_LEVEL_FULL);  // logits.grad: the NaN
    EXPECT_EQ(a[1].tensors(0).level(), v1::STATS_LEVEL_COUNTS);
    EXPECT_EQ(a[4].tensors(0).level(), v1::STATS_LEVEL_COUNTS);
    EXPECT_EQ(a[1].first_offender().tensor(), "logits.grad");
    ASSERT_EQ(a[0].tensors(6).targets_size(), 1);
    EXPECT_EQ(a[0].tensors(6).targets(0).scale_log2(), 0);  // the gradient carries 2^12
  }
}

TEST(ObserveStatsTest, TheTargetFollowsTheStepsScale) {
  TempDir dir;
  AgentConfig c = base_config(dir, "target");
  c.sampling.full_every = 1;
  auto agent = make_agent(c);
  std::vector<std::int64_t> shape = {4, 4};
  TensorView v;
  v.name = "w.grad";
  v.role = TensorRole::kWeightGrad;
  v.phase = TensorPhase::kBackward;
  v.dtype = Format::kFP32;
  v.shape = shape;
  v.scale = 4096.0;
  EXPECT_FALSE(agent->stats_target(v).has_value());  // outside a step
  ASSERT_TRUE(agent->begin_step(0));
  // Asked before the tensor is shown: the tensor's own scale counts.
  EXPECT_EQ(agent->stats_target(v), (TargetSpec{Format::kFP16, 0}));
  const std::vector<float> scaled(16, 1.0f);
  v.data = scaled.data();
  ASSERT_TRUE(agent->observe(v).ok());
  v.phase = TensorPhase::kAfterUnscale;
  v.scale = 1.0;
  EXPECT_EQ(agent->stats_target(v), (TargetSpec{Format::kFP16, 12}));
  v.role = TensorRole::kWeight;
  v.phase = TensorPhase::kStepStart;
  EXPECT_EQ(agent->stats_target(v), (TargetSpec{Format::kFP16, 0}));
  agent->end_step(StepInfo{});
}

TEST(ObserveStatsTest, BadStatisticsAreRefusedAndNothingIsRecorded) {
  TempDir dir;
  AgentConfig c = base_config(dir, "bad");
  c.sampling.full_every = 1;
  {
    auto agent = make_agent(c);
    std::vector<float> x(16, 0.5f);
    x[3] = 0.0f;
    std::vector<std::int64_t> shape = {16};
    TensorView v;
    v.name = "g";
    v.role = TensorRole::kWeightGrad;
    v.phase = TensorPhase::kBackward;
    v.shape = shape;
    ASSERT_TRUE(agent->begin_step(0));
    const TargetSpec target = *agent->stats_target(v);
    const TensorStats good = compute_stats(x.data(), x.size(), Format::kFP32, {&target, 1});
    auto expect_refused = [&](const TensorStats& s, const std::string& why) {
      const Status st = agent->observe_stats(v, s);
      EXPECT_EQ(st.code, StatusCode::kInvalidArgument) << why;
      EXPECT_NE(st.message.find(why), std::string::npos) << st.message;
    };
    TensorStats s = good;
    s.numel = 17;
    expect_refused(s, "numel 17 but the shape holds 16");
    s = good;
    s.nan = ~std::uint64_t{0};
    expect_refused(s, "add up to more than numel");
    s = good;
    s.histogram.min_exponent = 127;
    s.histogram.counts.push_back(0);
    expect_refused(s, "outside [-149, 127]");
    s = good;
    s.histogram.min_exponent = -3;  // 0.5 is in bin -1
    expect_refused(s, "does not match min_abs_nonzero and max_abs");
    s = good;
    s.histogram.counts.push_back(1);
    expect_refused(s, "does not hold the 15 finite nonzero values");
    s = good;  // counts that wrap around to the right total
    s.histogram.counts = {14, 2, ~std::uint64_t{0}};
    expect_refused(s, "does not hold");
    s = good;
    s.sum = std::numeric_limits<double>::quiet_NaN();
    expect_refused(s, "extrema or sums");
    s = good;
    s.min_abs_nonzero = 0.0;
    expect_refused(s, "extrema or sums");
    s = good;
    s.targets[0].underflow = 16;
    expect_refused(s, "counts more values");
    ASSERT_TRUE(agent->observe_stats(v, good).ok());
    agent->end_step(StepInfo{});
    bool noticed = false;
    for (const auto& n : agent->notices()) noticed |= n.find("observe_stats") != std::string::npos;
    EXPECT_TRUE(noticed);
  }
  const auto r = testing::read_spool(dir / "spool", "bad");
  ASSERT_EQ(r.size(), 1u);
  ASSERT_EQ(r[0].tensors_size(), 1);  // only the good one
  EXPECT_EQ(r[0].tensors(0).numel(), 16u);
  EXPECT_EQ(r[0].tensors(0).zeros(), 1u);
  EXPECT_EQ(r[0].agent().dropped_tensors(), 9u);
}

TEST(ObserveStatsTest, StatisticsWithoutTheTargetAreMeasuredOrReportedWithoutIt) {
  TempDir dir;
  AgentConfig c = base_config(dir, "untargeted");
  c.sampling.full_every = 1;
  {
    auto agent = make_agent(c);
    const std::vector<float> x(16, 1e-6f);
    std::vector<std::int64_t> shape = {16};
    TensorView v;
    v.name = "w.grad";
    v.role = TensorRole::kWeightGrad;
    v.phase = TensorPhase::kBackward;
    v.shape = shape;
    v.scale = 1.0;
    ASSERT_TRUE(agent->begin_step(0));
    const TensorStats untargeted = compute_stats(x.data(), x.size(), Format::kFP32);
    EXPECT_TRUE(agent->observe_stats(v, untargeted).ok());  // no data: reported without it
    v.data = x.data();
    v.order = 1;
    EXPECT_TRUE(agent->observe_stats(v, untargeted).ok());  // measured from the data
    agent->end_step(StepInfo{});
    bool noticed = false;
    for (const auto& n : agent->notices()) noticed |= n.find("counted no fp16") != std::string::npos;
    EXPECT_TRUE(noticed);
  }
  const auto r = testing::read_spool(dir / "spool", "untargeted");
  ASSERT_EQ(r.size(), 1u);
  ASSERT_EQ(r[0].tensors_size(), 2);
  EXPECT_EQ(r[0].tensors(0).level(), v1::STATS_LEVEL_FULL);
  EXPECT_EQ(r[0].tensors(0).targets_size(), 0);
  ASSERT_EQ(r[0].tensors(1).targets_size(), 1);
  EXPECT_EQ(r[0].tensors(1).targets(0).subnormal(), 16u);  // 1e-6 is subnormal in FP16
  EXPECT_EQ(r[0].tensors(0).histogram().SerializeAsString(),
            r[0].tensors(1).histogram().SerializeAsString());
}

TEST(ObserveStatsTest, StatisticsOutsideAStepAreDropped) {
  TempDir dir;
  AgentConfig c = base_config(dir, "unwanted");  // counts only: weights are not measured
  c.flight_recorder_steps = 0;  // (the flight recorder would keep handed-over statistics)
  {
    auto agent = make_agent(c);
    const std::vector<float> x(8, 1.0f);
    std::vector<std::int64_t> shape = {8};
    TensorView v;
    v.name = "w";
    v.role = TensorRole::kWeight;
    v.shape = shape;
    const TensorStats s = compute_stats(x.data(), x.size(), Format::kFP32);
    EXPECT_TRUE(agent->observe_stats(v, s).ok());  // before the first step
    ASSERT_TRUE(agent->begin_step(0));
    EXPECT_FALSE(agent->stats_target(v).has_value());  // nothing measures weights
    agent->end_step(StepInfo{});
    EXPECT_TRUE(agent->observe_stats(v, s).ok());  // between steps
    StepInfo second;
    second.step = 1;
    agent->end_step(second);
  }
  const auto r = testing::read_spool(dir / "spool", "unwanted");
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].tensors_size(), 0);
  EXPECT_EQ(r[1].tensors_size(), 0);
  EXPECT_EQ(r[1].agent().dropped_tensors(), 0u);
}

}  // namespace
}  // namespace ampscope::agent
