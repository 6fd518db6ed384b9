// The agent's threading contract (agent.h, "Threads"): step calls from several threads are
// serialised by the agent; counters(), notices(), flush() and shutdown() are safe from any
// thread at any time; a step call re-entering the agent from a callback is refused, counted and
// noticed once. Meant to run under ThreadSanitizer too (./run sanitize thread).
#include <gtest/gtest.h>

#include <atomic>
#include <barrier>
#include <set>
#include <thread>
#include <vector>

#include "ampscope/agent/agent.h"
#include "ampscope/testing/files.h"
#include "delivery.h"
#include "fake_step.h"
#include "policy.h"
#include "recorder.h"
#include "spool.h"
#include "spool_reader.h"

namespace ampscope::agent {
namespace {

using ampscope::testing::TempDir;
using testing::base_config;
using testing::FakeTensor;
using testing::make_agent;
using testing::make_step_tensors;
using testing::view_of;

constexpr int kTensorsPerStep = 7;    // make_step_tensors()
constexpr int kGradientsPerStep = 3;  // of them, counted every step by default

StepInfo step_info(std::int64_t step) {
  StepInfo info;
  info.step = step;
  info.loss = 2.0;
  info.loss_scale = info.scale_after = 1024.0;
  return info;
}

// A tensor set with names of its own ("t1/logits.grad"), so the reports show who observed what.
struct NamedTensors {
  explicit NamedTensors(const std::string& prefix) : tensors(make_step_tensors()) {
    for (auto& t : tensors) t.name = prefix + t.name;
  }
  void observe_all(Agent& agent) const {
    int order = 0;
    for (const auto& t : tensors) agent.observe(view_of(t, order++, 1024.0));
  }
  std::vector<FakeTensor> tensors;
};

// Reads counters, notices and flush in a loop from its own thread until stopped, and checks
// what can be checked from outside: the counters only grow.
class Reader {
 public:
  explicit Reader(Agent& agent) : thread_([this, &agent] { run(agent); }) {}
  ~Reader() { stop(); }
  void stop() {
    done_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  int reads() const { return reads_.load(); }
  bool monotonic() const { return monotonic_.load(); }

 private:
  void run(Agent& agent) {
    Counters last;
    while (!done_.load()) {
      const Counters c = agent.counters();
      if (c.steps < last.steps || c.reports_spooled < last.reports_spooled ||
          c.dropped_reports < last.dropped_reports || c.dropped_tensors < last.dropped_tensors ||
          c.training_thread_s < last.training_thread_s) {
        monotonic_.store(false);
      }
      last = c;
      (void)agent.notices();
      (void)agent.flush(std::chrono::milliseconds(0));
      reads_.fetch_add(1);
    }
  }

  std::atomic<bool> done_{false};
  std::atomic<int> reads_{0};
  std::atomic<bool> monotonic_{true};
  std::thread thread_;
};

// PyTorch's pattern: the training thread begins and ends each step; within it, hooks on
// autograd threads observe, several at once. Every observed tensor lands in its step's report.
// `per_set`: the samples one observer's seven tensors give a step; `full_per_set`: how many of
// them have full statistics.
void autograd_threads_observe_within_each_step(const AgentConfig& c, int per_set,
                                               int full_per_set) {
  constexpr int kObservers = 3;
  constexpr int kSteps = 20;
  {
    auto agent = make_agent(c);
    Reader reader(*agent);  // from before the first step to after shutdown
    std::vector<NamedTensors> sets;
    for (int k = 0; k < kObservers; ++k) sets.emplace_back("t" + std::to_string(k) + "/");
    std::barrier sync(kObservers + 1);
    std::vector<std::thread> observers;
    for (int k = 0; k < kObservers; ++k) {
      observers.emplace_back([&, k] {
        for (int step = 0; step < kSteps; ++step) {
          sync.arrive_and_wait();  // the step began
          sets[k].observe_all(*agent);
          sync.arrive_and_wait();  // this step's observes are done
        }
      });
    }
    for (int step = 0; step < kSteps; ++step) {
      agent->begin_step(step);
      sync.arrive_and_wait();
      sync.arrive_and_wait();
      EXPECT_TRUE(agent->end_step(step_info(step)).ok());
    }
    for (auto& t : observers) t.join();
    EXPECT_TRUE(agent->shutdown(std::chrono::milliseconds(0)).ok());
    const Counters k = agent->counters();
    reader.stop();
    EXPECT_GT(reader.reads(), 0);
    EXPECT_TRUE(reader.monotonic());
    EXPECT_EQ(k.steps, static_cast<std::uint64_t>(kSteps));
    EXPECT_EQ(k.reports_spooled, static_cast<std::uint64_t>(kSteps));
    EXPECT_EQ(k.dropped_reports, 0u);
    EXPECT_EQ(k.dropped_tensors, 0u);
    EXPECT_EQ(k.refused_calls, 0u);
  }
  const auto reports = testing::read_spool(c.spool_dir, c.run_id);
  ASSERT_EQ(reports.size(), static_cast<std::size_t>(kSteps));
  for (const auto& r : reports) {
    std::set<std::string> names;
    int full = 0;
    for (const auto& t : r.tensors()) {
      names.insert(t.name());
      full += t.has_histogram() ? 1 : 0;
    }
    EXPECT_EQ(names.size(), static_cast<std::size_t>(kObservers * per_set)) << "step " << r.step();
    EXPECT_EQ(r.tensors_size(), kObservers * per_set) << "step " << r.step();
    EXPECT_EQ(full, kObservers * full_per_set) << "step " << r.step();
  }
}

TEST(AgentThreadsTest, AutogradThreadsObserveConcurrentlyWithinEachStep) {
  TempDir dir;
  autograd_threads_observe_within_each_step(base_config(dir, "autograd"), kGradientsPerStep, 0);
}

TEST(AgentThreadsTest, AutogradThreadsObserveConcurrentlyWithWorkerCopies) {
  TempDir dir;
  auto c = base_config(dir, "autograd-worker");
  c.stats_thread = StatsThread::kWorker;  // full statistics from copies, under worker_max_bytes
  c.sampling.full_every = 1;  // every role, every tensor in full
  autograd_threads_observe_within_each_step(c, kTensorsPerStep, kTensorsPerStep);
}

// No order at all: two threads run whole steps, two more observe whenever they like, one reads
// the counters and flushes, and the transport keeps failing to connect meanwhile. Whatever
// interleaving happens, every end_step is counted once and becomes a report or a counted drop.
TEST(AgentThreadsTest, HammeringStepCallsCountersAndFlushFromManyThreadsStaysConsistent) {
  constexpr int kSteppers = 2;
  constexpr int kObservers = 2;
  constexpr int kStepsEach = 60;
  TempDir dir;
  auto c = base_config(dir, "hammer");
  c.server = "127.0.0.1:1";  // nothing listens: the sender connects and backs off throughout
  c.connect_timeout = std::chrono::milliseconds(50);
  c.backoff_initial = std::chrono::milliseconds(10);
  c.queue_steps = 8;  // small enough to fill now and then
  auto agent = make_agent(c);
  Reader reader(*agent);
  std::atomic<bool> stepping{true};
  std::atomic<std::uint64_t> ended_ok{0};
  std::vector<std::thread> threads;
  for (int s = 0; s < kSteppers; ++s) {
    threads.emplace_back([&, s] {
      const NamedTensors mine("s" + std::to_string(s) + "/");
      for (int i = 0; i < kStepsEach; ++i) {
        const std::int64_t step = i * kSteppers + s;
        if (agent->begin_step(step)) mine.observe_all(*agent);
        if (i % 7 == 0) agent->mark_phase(StepPhase::kOptimizer);
        if (agent->end_step(step_info(step)).ok()) ended_ok.fetch_add(1);
      }
    });
  }
  for (int o = 0; o < kObservers; ++o) {
    threads.emplace_back([&, o] {
      const NamedTensors mine("o" + std::to_string(o) + "/");
      while (stepping.load()) mine.observe_all(*agent);
    });
  }
  for (int s = 0; s < kSteppers; ++s) threads[s].join();
  stepping.store(false);
  for (std::size_t t = kSteppers; t < threads.size(); ++t) threads[t].join();
  agent->flush(std::chrono::milliseconds(0));  // nothing is acknowledged: no server
  agent->shutdown(std::chrono::milliseconds(0));
  const Counters k = agent->counters();
  reader.stop();
  agent.reset();  // lets go of the spool
  EXPECT_TRUE(reader.monotonic());
  EXPECT_EQ(ended_ok.load(), static_cast<std::uint64_t>(kSteppers * kStepsEach));
  EXPECT_EQ(k.steps, static_cast<std::uint64_t>(kSteppers * kStepsEach));
  EXPECT_EQ(k.reports_spooled + k.dropped_reports, k.steps);
  EXPECT_EQ(k.refused_calls, 0u);
  EXPECT_FALSE(k.connected);
  EXPECT_EQ(testing::read_spool(c.spool_dir, c.run_id).size(), k.reports_spooled);
}

// shutdown() from another thread while the training thread is inside its steps: the steps
// after it are refused, everything before it is spooled, and the other calls keep working.
TEST(AgentThreadsTest, ShutdownFromAnotherThreadWhileSteppingEndsCleanly) {
  TempDir dir;
  auto c = base_config(dir, "shutdown-race");
  auto agent = make_agent(c);
  Reader reader(*agent);
  std::atomic<std::uint64_t> ended_ok{0};
  std::atomic<bool> refused{false};
  std::thread training([&] {
    const NamedTensors mine("");
    for (std::int64_t step = 0; !refused.load(); ++step) {
      if (agent->begin_step(step)) mine.observe_all(*agent);
      const Status s = agent->end_step(step_info(step));
      if (s.ok()) {
        ended_ok.fetch_add(1);
      } else {
        EXPECT_EQ(s.code, StatusCode::kFailedPrecondition) << s.message;
        refused.store(true);
      }
    }
  });
  while (ended_ok.load() < 5) std::this_thread::yield();
  std::thread stopper([&] { EXPECT_TRUE(agent->shutdown(std::chrono::milliseconds(0)).ok()); });
  stopper.join();
  training.join();
  EXPECT_TRUE(agent->shutdown(std::chrono::milliseconds(0)).ok());  // idempotent
  EXPECT_FALSE(agent->begin_step(1 << 20));
  const Counters k = agent->counters();
  reader.stop();
  agent.reset();
  EXPECT_TRUE(reader.monotonic());
  EXPECT_EQ(k.steps, ended_ok.load());
  EXPECT_EQ(k.reports_spooled + k.dropped_reports, ended_ok.load());  // drops: the queue filled
  EXPECT_GT(k.reports_spooled, 0u);
  EXPECT_EQ(testing::read_spool(c.spool_dir, c.run_id).size(), k.reports_spooled);
}

// Overrides whose capable_layers() (asked by attach_overrides, under the step lock) calls the
// agent back, as a careless trainer callback might.
class ReenteringOverrides final : public PrecisionOverrides {
 public:
  explicit ReenteringOverrides(Agent** agent) : agent_(agent) {}
  std::vector<std::string> capable_layers() const override {
    Agent& a = **agent_;
    began = a.begin_step(0);
    const FakeTensor t = make_step_tensors().back();
    observed = a.observe(view_of(t, 0, 1.0));
    marked = a.mark_phase(StepPhase::kForward);
    ended = a.end_step(StepInfo{});
    attached = a.attach_scaler(nullptr);
    shut = a.shutdown(std::chrono::milliseconds(0));
    return {"h0.mlp.fc"};
  }
  std::string replace(const std::vector<std::string>&, std::int64_t) override { return {}; }

  mutable bool began = true;
  mutable Status observed, marked, ended, attached, shut;

 private:
  Agent** agent_;
};

TEST(AgentThreadsTest, ReentryFromACallbackIsRefusedCountedAndNoticedOnce) {
  TempDir dir;
  auto c = base_config(dir, "reentry");
  auto agent = make_agent(c);
  Agent* raw = agent.get();
  ReenteringOverrides overrides(&raw);
  ASSERT_TRUE(agent->attach_overrides(&overrides).ok());  // returns: no deadlock
  EXPECT_FALSE(overrides.began);
  for (const Status* s : {&overrides.observed, &overrides.marked, &overrides.ended,
                          &overrides.attached, &overrides.shut}) {
    EXPECT_EQ(s->code, StatusCode::kFailedPrecondition) << s->message;
    EXPECT_NE(s->message.find("inside"), std::string::npos) << s->message;
  }
  EXPECT_EQ(agent->counters().refused_calls, 6u);
  int said = 0;
  for (const auto& n : agent->notices()) said += n.find("refused") != std::string::npos ? 1 : 0;
  EXPECT_EQ(said, 1);
  // The agent is unharmed: the refused calls left no trace, and the run goes on.
  EXPECT_TRUE(agent->begin_step(0));
  NamedTensors("").observe_all(*agent);
  EXPECT_TRUE(agent->end_step(step_info(0)).ok());
  EXPECT_TRUE(agent->shutdown(std::chrono::milliseconds(0)).ok());
  EXPECT_EQ(agent->counters().steps, 1u);
  EXPECT_EQ(agent->counters().reports_spooled, 1u);
  agent.reset();
  const auto reports = testing::read_spool(c.spool_dir, c.run_id);
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].tensors_size(), kGradientsPerStep);
}

// The realistic re-entry: the scaler's schedule(), called by begin_step when a policy update is
// due, calls back into the recorder. The update is still applied; the calls back are refused.
class ReenteringScaler final : public ScalerControl {
 public:
  ScalerSettings settings() const override { return {}; }
  std::string schedule(const ScalerChange&) override {
    began = recorder->begin_step(1);
    const FakeTensor t = make_step_tensors().back();
    observed = recorder->observe(view_of(t, 0, 1.0));
    ended = recorder->end_step(StepInfo{});
    return {};
  }
  Recorder* recorder = nullptr;
  bool began = true;
  Status observed, ended;
};

TEST(RecorderTest, ReentryFromAScalerCallbackAtBeginStepIsRefused) {
  TempDir dir;
  AgentConfig c = base_config(dir, "run");
  const RunInfo run;
  Notices notices;
  SpoolOptions so;
  so.dir = (dir / "spool").string();
  std::string error;
  std::vector<std::string> repaired;
  auto spool = Spool::open(so, &error, &repaired);
  ASSERT_TRUE(spool) << error;
  PolicyApplier policy(c, spool.get(), &notices);
  Delivery delivery(c, run, std::move(spool), &policy, &notices);
  Recorder recorder(c, run, &notices, &policy, &delivery, -1);
  ReenteringScaler scaler;
  scaler.recorder = &recorder;
  ASSERT_TRUE(recorder.attach_scaler(&scaler).ok());
  v1::PolicyUpdate u;
  u.set_policy_id("1");
  u.set_run_id("run");
  u.set_effective_from_step(0);
  u.set_loss_scale(1024);
  policy.receive(u);

  EXPECT_TRUE(recorder.begin_step(0));
  EXPECT_EQ(policy.applied(), 1u);
  EXPECT_FALSE(scaler.began);
  EXPECT_EQ(scaler.observed.code, StatusCode::kFailedPrecondition);
  EXPECT_EQ(scaler.ended.code, StatusCode::kFailedPrecondition);
  EXPECT_EQ(recorder.refused_calls(), 3u);
  EXPECT_TRUE(recorder.end_step(step_info(0)).ok());
  EXPECT_EQ(recorder.steps(), 1u);
  recorder.close();
  EXPECT_EQ(recorder.end_step(step_info(1)).code, StatusCode::kFailedPrecondition);
  EXPECT_TRUE(delivery.stop(std::chrono::steady_clock::now()).ok());
  Counters k;
  delivery.fill(&k);
  EXPECT_EQ(k.reports_spooled, 1u);
}

}  // namespace
}  // namespace ampscope::agent
