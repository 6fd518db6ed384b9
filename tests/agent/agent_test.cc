// The Agent in-process, without a server: what it measures and spools for steps it is shown.
#include "ampscope/agent/agent.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "ampscope/convert.h"
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

// Runs `steps` steps; `poison(step, tensors)` may put NaN/Inf into them first.
template <typename Poison>
void run_steps(Agent& agent, int steps, Poison poison, double scale = 1024.0) {
  for (int step = 0; step < steps; ++step) {
    auto tensors = make_step_tensors();
    poison(step, tensors);
    if (agent.begin_step(step)) {
      int order = 0;
      for (const auto& t : tensors) agent.observe(view_of(t, order++, scale));
    }
    // As a trainer would: a non-finite value anywhere makes the step's gradients non-finite.
    bool nonfinite = false;
    for (const auto& t : tensors) {
      for (auto h : t.fp16) nonfinite = nonfinite || (h & 0x7c00) == 0x7c00;
    }
    StepInfo info;
    info.step = step;
    info.found_inf = info.skipped = nonfinite;
    info.loss = 2.0;
    info.loss_scale = scale;
    info.scale_after = scale;
    info.lr = 1e-3;
    info.tokens = 256;
    if (step % 2 == 1) info.val_loss = 1.5 + step;  // evaluated every other step
    agent.end_step(info);
  }
}

void set(std::vector<FakeTensor>& ts, const std::string& name, std::size_t i, std::uint16_t bits) {
  for (auto& t : ts) {
    if (t.name == name) t.fp16[i] = bits;
  }
}

constexpr std::uint16_t kNaN = 0x7e00, kPosInf = 0x7c00, kNegInf = 0xfc00;

TEST(AgentTest, CountsEveryGradientEveryStepAndSpoolsEachStepOnce) {
  TempDir dir;
  auto c = base_config(dir, "counts");
  {
    auto agent = make_agent(c);
    run_steps(*agent, 5, [](int, auto&) {});
    EXPECT_TRUE(agent->shutdown(std::chrono::milliseconds(0)).ok());
    EXPECT_EQ(agent->counters().reports_spooled, 5u);
  }
  const auto reports = testing::read_spool(dir / "spool", "counts");
  ASSERT_EQ(reports.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    const auto& r = reports[i];
    EXPECT_EQ(r.seq(), std::uint64_t(i + 1));
    EXPECT_EQ(r.step(), i);
    EXPECT_FALSE(r.has_first_offender());
    EXPECT_EQ(r.has_val_loss(), i % 2 == 1);
    if (r.has_val_loss()) {
      EXPECT_EQ(r.val_loss(), 1.5 + i);
    }
    // The gradients (counted by default); not the weight or the activations.
    ASSERT_EQ(r.tensors_size(), 3);
    for (const auto& t : r.tensors()) {
      EXPECT_EQ(t.level(), v1::STATS_LEVEL_COUNTS);
      EXPECT_FALSE(t.has_histogram());
      EXPECT_EQ(t.numel(), 256u);
      EXPECT_TRUE(t.role() == v1::TENSOR_ROLE_ACTIVATION_GRAD ||
                  t.role() == v1::TENSOR_ROLE_WEIGHT_GRAD);
      EXPECT_GT(t.max_abs(), 0.0);
      // What the trainer said about where its weight gradients are held, and nothing else.
      EXPECT_EQ(t.has_held(), t.role() == v1::TENSOR_ROLE_WEIGHT_GRAD) << t.name();
      if (t.has_held()) {
        EXPECT_EQ(t.held(), v1::FORMAT_FP32);
      }
    }
  }
}

TEST(AgentTest, FullStepsCarryHistogramsAndTargets) {
  TempDir dir;
  auto c = base_config(dir, "full");
  c.sampling.full_every = 2;
  {
    auto agent = make_agent(c);
    run_steps(*agent, 3, [](int, auto&) {});
  }
  const auto reports = testing::read_spool(dir / "spool", "full");
  ASSERT_EQ(reports.size(), 3u);
  EXPECT_EQ(reports[0].tensors_size(), 7);  // the weight too
  for (const auto& t : reports[0].tensors()) {
    EXPECT_EQ(t.level(), v1::STATS_LEVEL_FULL);
    ASSERT_TRUE(t.has_histogram());
    std::uint64_t total = 0;
    for (auto n : t.histogram().counts()) total += n;
    EXPECT_EQ(total, t.numel() - t.zeros() - t.nan() - t.pos_inf() - t.neg_inf());
    ASSERT_EQ(t.targets_size(), 1);
    EXPECT_EQ(t.targets(0).format(), v1::FORMAT_FP16);
    EXPECT_EQ(t.targets(0).scale_log2(), 0);
  }
  EXPECT_EQ(reports[1].tensors(0).level(), v1::STATS_LEVEL_COUNTS);
  EXPECT_EQ(reports[2].tensors(0).level(), v1::STATS_LEVEL_FULL);
}

TEST(AgentTest, FirstOffenderIsTheFirstNonFiniteTensorInExecutionOrder) {
  TempDir dir;
  auto c = base_config(dir, "offender");
  ASSERT_EQ(set_option(c, "sample_count_roles", "activation,activation_grad,weight_grad,loss"), "");
  {
    auto agent = make_agent(c);
    run_steps(*agent, 4, [](int step, auto& ts) {
      if (step == 1) {  // a NaN in an activation, later an Inf in a gradient
        set(ts, "h0.mlp.fc", 17, kNaN);
        set(ts, "h0.weight.grad", 3, kPosInf);
      }
      if (step == 2) {  // gradients only: the earlier in order wins, not the bigger count
        set(ts, "h0.weight.grad", 0, kNaN);
        set(ts, "h0.weight.grad", 1, kNaN);
        set(ts, "logits.grad", 5, kNegInf);
      }
    });
  }
  const auto r = testing::read_spool(dir / "spool", "offender");
  ASSERT_EQ(r.size(), 4u);
  EXPECT_FALSE(r[0].has_first_offender());
  ASSERT_TRUE(r[1].has_first_offender());
  EXPECT_EQ(r[1].first_offender().tensor(), "h0.mlp.fc");
  EXPECT_EQ(r[1].first_offender().role(), v1::TENSOR_ROLE_ACTIVATION);
  EXPECT_EQ(r[1].first_offender().order(), 2u);
  ASSERT_TRUE(r[2].has_first_offender());
  EXPECT_EQ(r[2].first_offender().tensor(), "logits.grad");
  EXPECT_EQ(r[2].first_offender().role(), v1::TENSOR_ROLE_ACTIVATION_GRAD);
  EXPECT_EQ(r[2].first_offender().order(), 4u);
  EXPECT_FALSE(r[3].has_first_offender());

  // Step 1: full from the offender on (earlier tensors keep their counts), and step 2 (the
  // step after) is a full step.
  for (const auto& t : r[1].tensors()) {
    const bool after = t.order() >= 2;
    EXPECT_EQ(t.level(), after ? v1::STATS_LEVEL_FULL : v1::STATS_LEVEL_COUNTS) << t.name();
  }
  for (const auto& t : r[1].tensors()) {
    if (t.name() == "h0.mlp.fc") {
      EXPECT_EQ(t.nan(), 1u);
    } else if (t.name() == "h0.weight.grad") {
      EXPECT_EQ(t.pos_inf(), 1u);
    }
  }
  EXPECT_EQ(r[2].tensors_size(), 7);
  for (const auto& t : r[2].tensors()) EXPECT_EQ(t.level(), v1::STATS_LEVEL_FULL);
}

TEST(AgentTest, WithDefaultsAForwardFaultShowsAtTheLossAndTheNextStepIsFull) {
  TempDir dir;
  auto c = base_config(dir, "default-offender");
  {
    auto agent = make_agent(c);
    run_steps(*agent, 3, [](int step, auto& ts) {
      if (step == 1) set(ts, "logits", 4, kNaN);
    });
  }
  // Activations are not read on a counts-only step (in a real run the loss, which is counted,
  // shows the fault); the trainer's found_inf makes the next step a full one.
  const auto r = testing::read_spool(dir / "spool", "default-offender");
  ASSERT_EQ(r.size(), 3u);
  for (const auto& t : r[1].tensors()) EXPECT_NE(t.role(), v1::TENSOR_ROLE_ACTIVATION);
  EXPECT_EQ(r[2].tensors_size(), 7) << "the step after a non-finite step measures everything";
}

TEST(AgentTest, WorkerThreadGivesTheSameMeasurements) {
  TempDir dir;
  auto poison = [](int step, auto& ts) {
    if (step == 1) set(ts, "logits", 9, kPosInf);
  };
  for (const char* mode : {"caller", "worker"}) {
    auto c = base_config(dir, mode);
    ASSERT_EQ(set_option(c, "sample_count_roles", "activation,activation_grad,weight_grad"), "");
    ASSERT_EQ(set_option(c, "stats_thread", mode), "");
    auto agent = make_agent(c);
    run_steps(*agent, 3, poison);
  }
  const auto a = testing::read_spool(dir / "spool", "caller");
  const auto b = testing::read_spool(dir / "spool", "worker");
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].tensors_size(), b[i].tensors_size()) << "step " << i;
    for (int k = 0; k < a[i].tensors_size(); ++k) {
      auto x = a[i].tensors(k), y = b[i].tensors(k);
      EXPECT_EQ(x.SerializeAsString(), y.SerializeAsString()) << x.name();
    }
    EXPECT_EQ(a[i].first_offender().SerializeAsString(), b[i].first_offender().SerializeAsString());
  }
  EXPECT_EQ(a[1].first_offender().tensor(), "logits");
}

TEST(AgentTest, GradientTargetsAskAboutTheStepsScale) {
  TempDir dir;
  auto c = base_config(dir, "targets");
  c.sampling.full_every = 1;
  {
    auto agent = make_agent(c);
    agent->begin_step(0);
    std::vector<std::uint16_t> g(16, fp32_to_fp16(1e-3f));
    std::vector<float> unscaled(16, 1e-8f);
    std::vector<std::int64_t> shape = {16};
    TensorView v;
    v.name = "w.grad";
    v.role = TensorRole::kWeightGrad;
    v.phase = TensorPhase::kBackward;
    v.dtype = Format::kFP16;
    v.data = g.data();
    v.shape = shape;
    v.scale = 4096;
    agent->observe(v);
    v.phase = TensorPhase::kAfterUnscale;  // the same gradient, unscaled, in FP32
    v.dtype = Format::kFP32;
    v.data = unscaled.data();
    v.scale = 1;
    v.order = 1;
    agent->observe(v);
    StepInfo info;
    info.loss_scale = info.scale_after = 4096;
    agent->end_step(info);
  }
  const auto r = testing::read_spool(dir / "spool", "targets");
  ASSERT_EQ(r.size(), 1u);
  ASSERT_EQ(r[0].tensors_size(), 2);
  EXPECT_EQ(r[0].tensors(0).targets(0).scale_log2(), 0);   // carries the scale already
  EXPECT_EQ(r[0].tensors(1).targets(0).scale_log2(), 12);  // asked at x 2^12
  EXPECT_EQ(r[0].tensors(1).targets(0).underflow(), 0u);   // 1e-8 * 4096 fits FP16
}

TEST(AgentTest, MisuseNeverThrowsAndIsReported) {
  TempDir dir;
  auto c = base_config(dir, "misuse");
  auto agent = make_agent(c);
  TensorView v;
  v.name = "x";
  agent->observe(v);  // outside a step: ignored
  ASSERT_TRUE(agent->begin_step(0));
  std::vector<std::int64_t> shape = {8};
  v.shape = shape;
  v.role = TensorRole::kActivationGrad;
  v.data = nullptr;  // no data
  agent->observe(v);
  std::uint8_t fp8[8] = {0};
  v.data = fp8;
  v.dtype = Format::kE4M3;  // not a storage format the statistics read
  agent->observe(v);
  agent->begin_step(1);  // twice without end_step
  agent->end_step(StepInfo{});
  agent->end_step(StepInfo{});  // without begin_step: still reported
  EXPECT_TRUE(agent->shutdown(std::chrono::milliseconds(0)).ok());
  EXPECT_TRUE(agent->shutdown(std::chrono::milliseconds(0)).ok());  // idempotent
  EXPECT_FALSE(agent->begin_step(2));
  bool saw_skip = false, saw_twice = false;
  for (const auto& n : agent->notices()) {
    saw_skip = saw_skip || n.find("sample skipped") != std::string::npos;
    saw_twice = saw_twice || n.find("without end_step") != std::string::npos;
  }
  EXPECT_TRUE(saw_skip);
  EXPECT_TRUE(saw_twice);
  EXPECT_EQ(agent->counters().reports_spooled, 2u);
}

TEST(AgentTest, ShutdownWithoutAServerEndsAtItsDeadline) {
  TempDir dir;
  auto c = base_config(dir, "deadline");
  c.server = "127.0.0.1:1";  // nothing listens there
  c.connect_timeout = std::chrono::milliseconds(200);
  c.backoff_initial = std::chrono::milliseconds(20);
  auto agent = make_agent(c);
  run_steps(*agent, 3, [](int, auto&) {});
  const auto t0 = std::chrono::steady_clock::now();
  const Status s = agent->shutdown(std::chrono::milliseconds(300));
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(s.code, StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.message.find("3 reports not acknowledged"), std::string::npos) << s.message;
  EXPECT_LT(took, std::chrono::seconds(3));
  EXPECT_EQ(agent->counters().reports_spooled, 3u);
  bool said = false;
  for (const auto& n : agent->notices()) said = said || n.find("cannot connect") != std::string::npos;
  EXPECT_TRUE(said);
}

TEST(AgentTest, CreateRefusesABadConfiguration) {
  AgentConfig c;
  c.run_id = "has space";
  std::unique_ptr<Agent> a;
  const Status s = Agent::create(c, RunInfo{}, &a);
  EXPECT_EQ(s.code, StatusCode::kInvalidArgument);
  EXPECT_NE(s.message.find("run_id"), std::string::npos);
  EXPECT_FALSE(a);
}

TEST(AgentTest, FullSpoolDropsAreCountedAndReported) {
  TempDir dir;
  auto c = base_config(dir, "capped");
  c.spool_max_bytes = 16 << 10;
  c.spool_segment_bytes = 4 << 10;
  c.sampling.full_every = 1;  // large reports
  {
    auto agent = make_agent(c);
    run_steps(*agent, 40, [](int, auto&) {});
    agent->shutdown(std::chrono::milliseconds(0));
    const Counters k = agent->counters();
    EXPECT_GT(k.dropped_reports, 0u);
    EXPECT_EQ(k.dropped_reports + k.reports_spooled, 40u);
  }
  const auto r = testing::read_spool(dir / "spool", "capped");
  ASSERT_FALSE(r.empty());
  EXPECT_EQ(r.back().agent().dropped_reports(), 0u) << "the last spooled was before any drop";
}

TEST(AgentTest, WithoutAGpuDeviceTensorsAreSkippedAndCuptiSaysWhy) {
  TempDir dir;
  auto c = base_config(dir, "nogpu");
  auto agent = make_agent(c);
  agent->begin_step(0);
  agent->end_step(StepInfo{});
  agent->shutdown(std::chrono::milliseconds(0));
  bool cupti = false;
  for (const auto& n : agent->notices()) cupti = cupti || n.rfind("cupti: unavailable: ", 0) == 0;
  EXPECT_TRUE(cupti);
}

}  // namespace
}  // namespace ampscope::agent
