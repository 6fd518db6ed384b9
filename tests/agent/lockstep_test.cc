// policy_lockstep against a scripted stand-in for ampscope-server, which decides when an Ack and
// a PolicyUpdate go out (the real server answers too quickly to show a late delivery, and
// cannot be told to stop acknowledging). The stand-in keeps the real server's order: the
// updates a report caused, then that report's Ack.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ampscope/agent/agent.h"
#include "ampscope/testing/files.h"
#include "ampscope/v1/telemetry.grpc.pb.h"
#include "fake_step.h"
#include "loopback_server.h"

namespace ampscope::agent {
namespace {

using namespace std::chrono_literals;
using testing::LoopbackServer;
using Clock = std::chrono::steady_clock;
using ampscope::testing::TempDir;

class ScriptedServer final : public v1::Telemetry::Service {
 public:
  std::string address() const { return server_.address(); }

  // The report of `step` causes `update`: `delay` after that report arrived, the update goes
  // out, then the report's Ack. Once.
  void update_after(std::int64_t step, v1::PolicyUpdate update, std::chrono::milliseconds delay) {
    std::lock_guard lock(mu_);
    trigger_step_ = step;
    update_ = std::move(update);
    delay_ = delay;
  }
  // Off: Hellos are acknowledged, reports never.
  void ack_reports(bool on) {
    std::lock_guard lock(mu_);
    ack_reports_ = on;
  }
  // The stream ends (UNAVAILABLE) at the report of `step`, without acknowledging it; from then
  // on new streams are refused at their Hello until accept() is called.
  void break_at(std::int64_t step) {
    std::lock_guard lock(mu_);
    break_step_ = step;
  }
  void accept() {
    std::lock_guard lock(mu_);
    refusing_ = false;
  }
  std::vector<v1::StepReport> reports() const {
    std::lock_guard lock(mu_);
    return reports_;
  }

  grpc::Status Attach(grpc::ServerContext*,
                      grpc::ServerReaderWriter<v1::ServerMessage, v1::AgentMessage>* stream)
      override {
    v1::AgentMessage in;
    while (stream->Read(&in)) {
      std::optional<v1::PolicyUpdate> update;
      std::chrono::milliseconds delay{0};
      bool ack = true;
      std::uint64_t seq = 0;
      {
        std::lock_guard lock(mu_);
        if (in.has_hello()) {
          if (refusing_) return {grpc::StatusCode::UNAVAILABLE, "refusing streams"};
          seq = acked_;
        } else {
          const v1::StepReport& r = in.report();
          if (r.step() == break_step_) {
            break_step_ = -1;
            refusing_ = true;
            return {grpc::StatusCode::UNAVAILABLE, "stream broken by the test"};
          }
          reports_.push_back(r);
          if (r.step() == trigger_step_) {
            trigger_step_ = -1;
            update = update_;
            delay = delay_;
          }
          ack = ack_reports_;
          if (ack) acked_ = std::max(acked_, r.seq());
          seq = acked_;
        }
      }
      if (update) {
        std::this_thread::sleep_for(delay);
        v1::ServerMessage m;
        *m.mutable_policy() = *update;
        if (!stream->Write(m)) break;
      }
      if (ack) {
        v1::ServerMessage m;
        m.mutable_ack()->set_persisted_seq(seq);
        if (!stream->Write(m)) break;
      }
    }
    return grpc::Status::OK;
  }

 private:
  mutable std::mutex mu_;
  std::int64_t trigger_step_ = -1;
  v1::PolicyUpdate update_;
  std::chrono::milliseconds delay_{0};
  bool ack_reports_ = true;
  std::int64_t break_step_ = -1;
  bool refusing_ = false;
  std::uint64_t acked_ = 0;
  std::vector<v1::StepReport> reports_;
  LoopbackServer server_{this, std::chrono::seconds(2)};  // last: shuts down first
};

// A loss scaler that takes every change and remembers it.
class RecordingScaler final : public ScalerControl {
 public:
  ScalerSettings settings() const override {
    std::lock_guard lock(mu_);
    return s_;
  }
  std::string schedule(const ScalerChange& c) override {
    std::lock_guard lock(mu_);
    changes_.push_back(c);
    if (c.scale) s_.scale = *c.scale;
    return {};
  }
  std::vector<ScalerChange> changes() const {
    std::lock_guard lock(mu_);
    return changes_;
  }

 private:
  mutable std::mutex mu_;
  ScalerSettings s_{.scale = 1024.0};
  std::vector<ScalerChange> changes_;
};

v1::PolicyUpdate scale_update(const std::string& id, std::uint64_t seq, std::int64_t step,
                              double scale) {
  v1::PolicyUpdate u;
  u.set_policy_id(id);
  u.set_run_id("lockstep");
  u.set_seq(seq);
  u.set_effective_from_step(step);
  u.set_loss_scale(scale);
  return u;
}

AgentConfig lockstep_config(const TempDir& dir, const std::string& server, bool lockstep,
                            std::chrono::milliseconds timeout) {
  AgentConfig c = testing::base_config(dir, "lockstep");
  c.server = server;
  c.policy_lockstep = lockstep;
  c.policy_lockstep_timeout = timeout;
  c.backoff_initial = 50ms;
  c.backoff_max = 200ms;
  return c;
}

// One step as a trainer shows it: nothing observed, the scale the scaler holds. Returns how
// long begin_step took.
Clock::duration run_step(Agent& agent, const RecordingScaler& scaler, std::int64_t step) {
  const auto t0 = Clock::now();
  agent.begin_step(step);
  const auto took = Clock::now() - t0;
  StepInfo info;
  info.step = step;
  info.loss = 2.0;
  info.loss_scale = info.scale_after = scaler.settings().scale;
  agent.end_step(info);
  return took;
}

bool has_notice(const Agent& agent, const std::string& part) {
  const auto all = agent.notices();
  return std::any_of(all.begin(), all.end(),
                     [&](const std::string& n) { return n.find(part) != std::string::npos; });
}

// The stand-in's report of `step` (the last one, after replays).
std::optional<v1::StepReport> report_of(const ScriptedServer& server, std::int64_t step) {
  std::optional<v1::StepReport> out;
  for (const auto& r : server.reports()) {
    if (r.step() == step) out = r;
  }
  return out;
}

TEST(LockstepTest, AnUpdateDeliveredLateAppliesAtExactlyTheStepItNames) {
  TempDir dir;
  ScriptedServer server;
  // Caused by step 3's report, for step 4, and 200 ms on its way: step 4 would long have begun.
  server.update_after(3, scale_update("p1", 1, 4, 2048), 200ms);
  RecordingScaler scaler;
  AgentConfig c = lockstep_config(dir, server.address(), true, 60s);
  c.flush_timeout = 30s;
  auto agent = testing::make_agent(c);
  ASSERT_TRUE(agent->attach_scaler(&scaler).ok());
  for (std::int64_t step = 0; step < 7; ++step) run_step(*agent, scaler, step);
  const auto changes = scaler.changes();
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].effective_from_step, 4);
  EXPECT_EQ(*changes[0].scale, 2048);
  EXPECT_EQ(agent->counters().policies_applied, 1u);
  EXPECT_EQ(agent->counters().lockstep_timeouts, 0u);
  EXPECT_TRUE(agent->shutdown(30s).ok());
  const auto r4 = report_of(server, 4);
  ASSERT_TRUE(r4);
  ASSERT_EQ(r4->policy_outcomes_size(), 1);
  EXPECT_TRUE(r4->policy_outcomes(0).applied());
  EXPECT_EQ(r4->loss_scale(), 2048) << "the new scale governs step 4";
}

TEST(LockstepTest, WithoutLockstepTheSameDelayMakesTheUpdateLate) {
  TempDir dir;
  ScriptedServer server;
  server.update_after(3, scale_update("p1", 1, 4, 2048), 200ms);
  RecordingScaler scaler;
  auto agent = testing::make_agent(lockstep_config(dir, server.address(), false, 60s));
  ASSERT_TRUE(agent->attach_scaler(&scaler).ok());
  // Steps until the update has arrived and got its outcome (bounded: a minute of steps).
  std::int64_t step = 0;
  for (; step < 6000; ++step) {
    run_step(*agent, scaler, step);
    const Counters k = agent->counters();
    if (k.policies_applied + k.policies_refused > 0) break;
    if (step >= 4) std::this_thread::sleep_for(10ms);
  }
  EXPECT_GT(step, 4);
  EXPECT_TRUE(scaler.changes().empty());
  EXPECT_EQ(agent->counters().policies_applied, 0u);
  EXPECT_EQ(agent->counters().policies_refused, 1u);
}

TEST(LockstepTest, AServerThatNeverAcknowledgesHoldsOneStepForTheTimeoutOnce) {
  TempDir dir;
  ScriptedServer server;
  server.ack_reports(false);
  RecordingScaler scaler;
  constexpr auto kTimeout = 1500ms;
  auto agent = testing::make_agent(lockstep_config(dir, server.address(), true, kTimeout));
  ASSERT_TRUE(agent->attach_scaler(&scaler).ok());
  std::vector<std::int64_t> held;
  for (std::int64_t step = 0; step < 6; ++step) {
    if (run_step(*agent, scaler, step) >= kTimeout) held.push_back(step);
  }
  // Step 0 has nothing before it; step 1 waits for step 0's report and gives up; the later
  // steps do not wait while the acknowledgements lag behind.
  EXPECT_EQ(held, std::vector<std::int64_t>{1});
  EXPECT_EQ(agent->counters().lockstep_timeouts, 1u);
  EXPECT_TRUE(has_notice(*agent, "policy: lockstep gave up before step 1 (no acknowledgement"));
  EXPECT_EQ(agent->counters().steps, 6u);
}

TEST(LockstepTest, ShutdownEndsAWaitAtOnce) {
  TempDir dir;
  ScriptedServer server;
  server.ack_reports(false);
  RecordingScaler scaler;
  auto agent = testing::make_agent(lockstep_config(dir, server.address(), true, 60s));
  ASSERT_TRUE(agent->attach_scaler(&scaler).ok());
  std::atomic<bool> waiting{false};
  Clock::duration took{};
  std::thread trainer([&] {
    run_step(*agent, scaler, 0);
    waiting = true;
    took = run_step(*agent, scaler, 1);  // waits for step 0's Ack, which never comes
  });
  while (!waiting) std::this_thread::sleep_for(5ms);
  std::this_thread::sleep_for(200ms);
  agent->shutdown(0ms);
  trainer.join();
  EXPECT_LT(took, 30s) << "ended by the shutdown, not by the timeout";
  EXPECT_EQ(agent->counters().lockstep_timeouts, 0u) << "an interrupted wait is no timeout";
}

TEST(LockstepTest, ALostStreamEndsTheWaitAndLockstepResumesOnceAcksCatchUp) {
  TempDir dir;
  ScriptedServer server;
  server.break_at(1);  // step 1's report is lost with the stream; new streams are refused
  RecordingScaler scaler;
  AgentConfig c = lockstep_config(dir, server.address(), true, 60s);
  c.flush_timeout = 30s;
  auto agent = testing::make_agent(c);
  ASSERT_TRUE(agent->attach_scaler(&scaler).ok());
  run_step(*agent, scaler, 0);
  run_step(*agent, scaler, 1);
  EXPECT_LT(run_step(*agent, scaler, 2), 30s) << "the lost stream ends the wait, not the timeout";
  EXPECT_EQ(agent->counters().lockstep_timeouts, 1u);
  EXPECT_TRUE(has_notice(*agent, "policy: lockstep gave up before step 2 (the stream to the"));

  // While the server is away steps do not wait; back, it gets the spool replayed.
  std::int64_t step = 3;
  run_step(*agent, scaler, step++);
  server.accept();
  for (; step < 6000; ++step) {
    const Counters k = agent->counters();
    if (k.connected && k.reports_acked >= 2) break;  // caught up with what the wait gave up on
    run_step(*agent, scaler, step);
    std::this_thread::sleep_for(10ms);
  }
  // In step again: an update caused by this step's report, 200 ms late, applies exactly.
  const std::int64_t cause = step;
  server.update_after(cause, scale_update("p2", 1, cause + 1, 4096), 200ms);
  for (std::int64_t s = cause; s < cause + 3; ++s) run_step(*agent, scaler, s);
  const auto changes = scaler.changes();
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].effective_from_step, cause + 1);
  EXPECT_EQ(*changes[0].scale, 4096);
  EXPECT_EQ(agent->counters().lockstep_timeouts, 1u);
  EXPECT_TRUE(agent->shutdown(30s).ok());
}

}  // namespace
}  // namespace ampscope::agent
