// The flight recorder through the whole agent, streaming to a stand-in for the server on
// loopback: the K steps before an event (a NaN, a skipped step, underflow rising above the
// alert threshold) reach the server once, with the event's report, and nothing else does.
#include <gtest/gtest.h>

#include <map>

#include "ampscope/agent/agent.h"
#include "ampscope/convert.h"
#include "ampscope/testing/files.h"
#include "fake_step.h"
#include "hostile_server.h"

namespace ampscope::agent {
namespace {

using ampscope::testing::TempDir;
using testing::base_config;
using testing::FakeTensor;
using testing::HostileServer;
using testing::make_step_tensors;
using testing::view_of;

constexpr std::size_t kSteps = 4;  // flight_recorder_steps

// Which step goes wrong, and how.
struct Faults {
  std::int64_t nan_at = -1;        // a NaN in h0.mlp.fc.grad
  std::int64_t skip_at = -1;       // skipped without a non-finite value
  std::int64_t underflow_from = -1;  // the weight gradient's values below E4M3's smallest
};

class FlightRecorderAgentTest : public ::testing::Test {
 protected:
  // Runs `steps` steps of the fake model with the weight gradients recorded in full every step,
  // then shuts down; returns the reports the server received, by step.
  std::map<std::int64_t, v1::StepReport> run(int steps, const Faults& f,
                                             Format compute = Format::kFP16) {
    AgentConfig c = base_config(dir_, "flight");
    c.server = server_.address();
    c.flush_timeout = std::chrono::seconds(20);
    c.flight_recorder_steps = kSteps;
    c.flight_recorder_roles = {TensorRole::kWeightGrad};
    RunInfo info;
    info.trainer = "flight_recorder_agent_test";
    info.compute_format = compute;
    std::unique_ptr<Agent> agent;
    const Status created = Agent::create(c, info, &agent);
    EXPECT_TRUE(created.ok()) << created.message;
    if (!agent) return {};
    for (int step = 0; step < steps; ++step) {
      std::vector<FakeTensor> tensors = make_step_tensors();
      for (FakeTensor& t : tensors) {
        if (t.name == "h0.mlp.fc.grad" && step == f.nan_at) t.fp16[7] = 0x7e00;
        if (t.name == "h0.weight.grad" && f.underflow_from >= 0) {
          // Binade -2 before, binade -12 (below E4M3's 2^-9 and its rounding) from then on.
          const float value = step < f.underflow_from ? 0.3f : 3e-4f;
          for (auto& h : t.fp16) h = fp32_to_fp16(value);
        }
      }
      if (agent->begin_step(step)) {
        int order = 0;
        for (const FakeTensor& t : tensors) agent->observe(view_of(t, order++, 1024.0));
      }
      StepInfo s;
      s.step = step;
      s.found_inf = step == f.nan_at;
      s.skipped = step == f.nan_at || step == f.skip_at;
      s.loss = 2.0;
      s.loss_scale = s.scale_after = 1024.0;
      s.lr = 1e-3;
      agent->end_step(s);
    }
    const Status down = agent->shutdown(std::chrono::seconds(20));
    EXPECT_TRUE(down.ok()) << down.message;
    std::map<std::int64_t, v1::StepReport> by_step;
    for (const v1::StepReport& r : server_.reports()) by_step[r.step()] = r;
    EXPECT_EQ(by_step.size(), static_cast<std::size_t>(steps));
    return by_step;
  }

  // Checks that report `at` carries the history of steps [at - kSteps, at), each with the
  // weight gradient in full, and that no other report carries any.
  static void expect_history_at(const std::map<std::int64_t, v1::StepReport>& reports,
                                std::int64_t at, v1::FlightEvent event) {
    for (const auto& [step, r] : reports) {
      if (step != at) {
        EXPECT_EQ(r.history_size(), 0) << "step " << step;
        EXPECT_EQ(r.flight_event(), v1::FLIGHT_EVENT_UNSPECIFIED) << "step " << step;
        continue;
      }
      EXPECT_EQ(r.flight_event(), event);
      ASSERT_EQ(r.history_size(), static_cast<int>(kSteps));
      for (int i = 0; i < r.history_size(); ++i) {
        const v1::HistoryStep& h = r.history(i);
        EXPECT_EQ(h.step(), at - static_cast<std::int64_t>(kSteps) + i);
        EXPECT_EQ(h.loss_scale(), 1024.0);
        ASSERT_EQ(h.tensors_size(), 1);
        const v1::TensorStats& t = h.tensors(0);
        EXPECT_EQ(t.name(), "h0.weight.grad");
        EXPECT_EQ(t.level(), v1::STATS_LEVEL_FULL);
        std::uint64_t binned = 0;
        for (auto n : t.histogram().counts()) binned += n;
        EXPECT_EQ(binned, 256u);
        EXPECT_EQ(t.targets_size(), 1);
      }
    }
  }

  TempDir dir_;
  HostileServer server_{HostileServer::Behaviour{}};
};

TEST_F(FlightRecorderAgentTest, ShipsTheKStepsBeforeAnInjectedNaNOnce) {
  const auto reports = run(12, Faults{.nan_at = 9});
  ASSERT_EQ(reports.size(), 12u);
  expect_history_at(reports, 9, v1::FLIGHT_EVENT_NONFINITE);
  // The recorded weight gradient is reported as the sampling says (counts) outside the event.
  for (const auto& t : reports.at(2).tensors()) {
    if (t.name() == "h0.weight.grad") {
      EXPECT_EQ(t.level(), v1::STATS_LEVEL_COUNTS);
    }
  }
}

TEST_F(FlightRecorderAgentTest, NothingIsShippedWithoutAnEvent) {
  const auto reports = run(12, Faults{});
  ASSERT_EQ(reports.size(), 12u);
  expect_history_at(reports, -1, v1::FLIGHT_EVENT_UNSPECIFIED);
}

TEST_F(FlightRecorderAgentTest, ASkippedStepShipsTheHistory) {
  const auto reports = run(10, Faults{.skip_at = 6});
  ASSERT_EQ(reports.size(), 10u);
  expect_history_at(reports, 6, v1::FLIGHT_EVENT_SKIPPED);
}

TEST_F(FlightRecorderAgentTest, UnderflowRisingAboveTheAlertThresholdShipsTheHistory) {
  const auto reports = run(10, Faults{.underflow_from = 7}, Format::kE4M3);
  ASSERT_EQ(reports.size(), 10u);
  expect_history_at(reports, 7, v1::FLIGHT_EVENT_UNDERFLOW);
  // The history shows the values where they were before they fell.
  ASSERT_EQ(reports.at(7).history_size(), static_cast<int>(kSteps));
  EXPECT_EQ(reports.at(7).history(0).tensors(0).histogram().min_exponent(), -2);
}

}  // namespace
}  // namespace ampscope::agent
