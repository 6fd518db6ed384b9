// The agent under faults (docs/agent.md, "Faults"): a server that acknowledges what was never
// sent, ends every stream at once, never acknowledges, stalls, holds a finished call open, is
// not an HTTP/2 server at all, refuses the run as another process's, or sends absurd
// PolicyUpdates; a spool directory that cannot be written, and one on a full file system.
// In every case the fake training loop keeps stepping, no step call takes long (the slowest
// call is measured against a generous bound), shutdown ends within flush_timeout_ms and a
// small slack, and what was lost is counted and said.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ampscope/agent/agent.h"
#include "ampscope/testing/files.h"
#include "ampscope/testing/wait_until.h"
#include "fake_step.h"
#include "hostile_server.h"
#include "spool_reader.h"

namespace ampscope::agent {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using ampscope::testing::TempDir;
using ampscope::testing::wait_until;
using testing::HostileServer;
using Clock = std::chrono::steady_clock;

// No step call may take longer than this, whatever the server or the disk does.
constexpr auto kCallBound = 200ms;
// What shutdown may take beyond flush_timeout_ms (docs/agent.md: a few ms measured; the bound
// is generous for a loaded machine, and far below the 3 s connect timeout the tests set).
constexpr auto kShutdownSlack = 400ms;

AgentConfig fault_config(const TempDir& dir, const std::string& run, const std::string& server) {
  AgentConfig c = testing::base_config(dir, run);
  c.server = server;
  c.backoff_initial = 20ms;
  c.backoff_max = 200ms;
  c.connect_timeout = 3s;
  return c;
}

// A fake training loop: every step shows the seven tensors and ends; remembers the slowest
// step call.
class Loop {
 public:
  explicit Loop(Agent& agent) : agent_(agent) {}

  void step() {
    const std::int64_t s = next_++;
    timed([&] {
      if (agent_.begin_step(s)) {
        int order = 0;
        for (const auto& t : tensors_) {
          timed([&] { agent_.observe(testing::view_of(t, order++, 1024.0)); });
        }
      }
    });
    StepInfo info;
    info.step = s;
    info.loss = 2.0;
    info.loss_scale = info.scale_after = 1024.0;
    timed([&] { agent_.end_step(info); });
  }
  void steps(int n) {
    for (int i = 0; i < n; ++i) step();
  }
  void run_for(Clock::duration d) {
    const auto end = Clock::now() + d;
    while (Clock::now() < end) {
      step();
      std::this_thread::sleep_for(2ms);
    }
  }
  std::int64_t steps_done() const { return next_; }
  Clock::duration slowest() const { return slowest_; }

 private:
  template <typename F>
  void timed(F f) {
    const auto t0 = Clock::now();
    f();
    slowest_ = std::max(slowest_, Clock::now() - t0);
  }

  Agent& agent_;
  std::vector<testing::FakeTensor> tensors_ = testing::make_step_tensors();
  std::int64_t next_ = 0;
  Clock::duration slowest_{};
};

bool has_notice(const Agent& agent, const std::string& part) {
  const auto all = agent.notices();
  return std::any_of(all.begin(), all.end(),
                     [&](const std::string& n) { return n.find(part) != std::string::npos; });
}

std::string all_notices(const Agent& agent) {
  std::string out;
  for (const auto& n : agent.notices()) out += n + "\n";
  return out;
}

// Shuts the agent down and returns how long that took.
Clock::duration timed_shutdown(std::unique_ptr<Agent>& agent) {
  const auto t0 = Clock::now();
  agent.reset();
  const auto took = Clock::now() - t0;
  std::printf("shutdown took %lld ms\n", static_cast<long long>(
                                              std::chrono::duration_cast<std::chrono::milliseconds>(
                                                  took)
                                                  .count()));
  return took;
}

std::int64_t ms(Clock::duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

// ---- Acks for what was never sent ---------------------------------------------------------------

class AbsurdAckTest : public ::testing::TestWithParam<std::uint64_t> {};

TEST_P(AbsurdAckTest, AnAckBeyondWhatWasSentKeepsTheSpoolAndEndsTheStream) {
  TempDir dir;
  HostileServer::Behaviour b;
  b.first_ack = 0;  // every stream starts honestly from nothing; its first report is answered
  b.absurd_ack = GetParam();  // with the absurd Ack
  HostileServer server(b);
  AgentConfig c = fault_config(dir, "absurd-ack", server.address());
  auto agent = testing::make_agent(c);
  Loop loop(*agent);
  loop.steps(5);
  ASSERT_TRUE(wait_until([&] { return agent->counters().protocol_errors >= 1; }, 10s))
      << all_notices(*agent);
  loop.steps(15);
  const Counters counters = agent->counters();
  EXPECT_EQ(counters.reports_acked, 0u) << "the absurd mark was believed";
  EXPECT_LT(loop.slowest(), kCallBound);
  // Cut, then reconnected with backoff, and cut again: never believed, said once.
  EXPECT_TRUE(wait_until([&] { return agent->counters().protocol_errors >= 2; }, 10s));
  const auto notices = agent->notices();
  EXPECT_EQ(std::count_if(notices.begin(), notices.end(),
                          [](const std::string& n) {
                            return n.find("protocol error") != std::string::npos;
                          }),
            1)
      << all_notices(*agent);
  agent.reset();
  // Nothing the absurd Ack claimed was deleted: every step is in the spool or was acked for
  // real, with seqs from 1 and no wrap.
  const auto spooled = testing::read_spool(dir / "spool", "absurd-ack");
  ASSERT_FALSE(spooled.empty());
  EXPECT_EQ(spooled.back().seq(), 20u);
  EXPECT_EQ(spooled.back().step(), 19);
  for (const auto& r : spooled) EXPECT_LE(r.seq(), 20u);
}

INSTANTIATE_TEST_SUITE_P(Marks, AbsurdAckTest,
                         ::testing::Values(std::uint64_t{1'000'000'000},
                                           std::numeric_limits<std::uint64_t>::max()));

TEST(FaultsTest, AFirstAckBeyondTheSeqSpaceIsAProtocolError) {
  TempDir dir;
  HostileServer::Behaviour b;
  b.first_ack = std::numeric_limits<std::uint64_t>::max();
  HostileServer server(b);
  auto agent = testing::make_agent(fault_config(dir, "first-ack-max", server.address()));
  Loop loop(*agent);
  loop.steps(3);
  ASSERT_TRUE(wait_until([&] { return agent->counters().protocol_errors >= 1; }, 10s))
      << all_notices(*agent);
  loop.steps(3);
  EXPECT_EQ(agent->counters().reports_acked, 0u);
  agent.reset();
  const auto spooled = testing::read_spool(dir / "spool", "first-ack-max");
  ASSERT_EQ(spooled.size(), 6u) << "nothing deleted, nothing renumbered";
  EXPECT_EQ(spooled.front().seq(), 1u);
  EXPECT_EQ(spooled.back().seq(), 6u);
}

TEST(FaultsTest, AFirstAckBeyondAnEmptySpoolIsAdoptedAndNumberingContinuesAfterIt) {
  // A restarted agent whose spool was lost: the server has 10^9, this agent nothing yet.
  TempDir dir;
  HostileServer::Behaviour b;
  b.first_ack = 1'000'000'000;
  HostileServer server(b);
  auto agent = testing::make_agent(fault_config(dir, "adopt", server.address()));
  agent->begin_step(0);  // starts the transport; nothing is spooled before the step ends
  ASSERT_TRUE(wait_until([&] { return agent->counters().connected; }, 10s)) << all_notices(*agent);
  StepInfo info;
  info.step = 0;
  agent->end_step(info);
  Loop loop(*agent);
  loop.steps(2);
  ASSERT_TRUE(wait_until([&] { return server.reports().size() >= 3; }, 10s));
  const auto reports = server.reports();
  EXPECT_EQ(reports.front().seq(), 1'000'000'001u);
  EXPECT_EQ(reports.back().seq(), 1'000'000'003u);
  EXPECT_EQ(agent->counters().protocol_errors, 0u);
}

// ---- Streams that end at once, reconnects -------------------------------------------------------

TEST(FaultsTest, AServerThatEndsEveryStreamCleanlyIsCalledWithBackoffNotInALoop) {
  TempDir dir;
  HostileServer::Behaviour b;
  b.end_after_hello = true;
  HostileServer server(b);
  AgentConfig c = fault_config(dir, "clean-end", server.address());
  c.backoff_initial = 50ms;
  c.backoff_max = 400ms;
  auto agent = testing::make_agent(c);
  Loop loop(*agent);
  loop.run_for(2s);
  const auto times = server.hello_times();
  // Waits of at least half the backoff, doubling from 50 ms to 400 ms: 25 + 50 + 100 + 200 +
  // 200 + ... ms, so at most 13 streams in 2 s (without backoff: hundreds).
  EXPECT_GE(times.size(), 2u);
  EXPECT_LE(times.size(), 13u);
  EXPECT_LT(loop.slowest(), kCallBound);
  const auto t = timed_shutdown(agent);
  EXPECT_LT(t, c.flush_timeout + kShutdownSlack) << ms(t) << " ms";
}

// A refusal (another process streams this run and rank, or the token is wrong or lacks the
// role): printed once, training goes on, and the agent asks again every backoff_max_ms.
class RefusalTest : public ::testing::TestWithParam<grpc::StatusCode> {};

INSTANTIATE_TEST_SUITE_P(FaultsTest, RefusalTest,
                         ::testing::Values(grpc::StatusCode::ALREADY_EXISTS,
                                           grpc::StatusCode::UNAUTHENTICATED,
                                           grpc::StatusCode::PERMISSION_DENIED));

TEST_P(RefusalTest, IsPrintedOnceTrainingGoesOnAndItRetriesAtBackoffMax) {
  TempDir dir;
  HostileServer::Behaviour b;
  b.refuse = grpc::Status(GetParam(),
                          "run already-exists rank 0 is streamed by host other-host pid 4242");
  HostileServer server(b);
  AgentConfig c = fault_config(dir, "already-exists", server.address());
  c.backoff_initial = 10ms;
  c.backoff_max = 300ms;
  c.spool_max_bytes = 64 << 10;  // bounded as usual: the rest is dropped and counted
  c.sampling.full_every = 1;
  ::testing::internal::CaptureStderr();
  auto agent = testing::make_agent(c);
  Loop loop(*agent);
  loop.run_for(1500ms);
  const std::string err = ::testing::internal::GetCapturedStderr();
  const auto first = err.find("other-host pid 4242");
  ASSERT_NE(first, std::string::npos) << err;
  EXPECT_EQ(err.find("other-host pid 4242", first + 1), std::string::npos) << "once: " << err;
  const auto times = server.hello_times();
  ASSERT_GE(times.size(), 2u);
  for (std::size_t i = 1; i < times.size(); ++i) {
    EXPECT_GE(times[i] - times[i - 1], 290ms) << "retry " << i << " came early";
  }
  const Counters counters = agent->counters();
  EXPECT_GT(loop.steps_done(), 100);
  EXPECT_EQ(counters.steps, static_cast<std::uint64_t>(loop.steps_done()));
  EXPECT_GT(counters.dropped_reports, 0u) << "the spool is bounded";
  EXPECT_LE(counters.spool_bytes, c.spool_max_bytes);
  EXPECT_LT(loop.slowest(), kCallBound);
}

// ---- Bounded shutdown ---------------------------------------------------------------------------

TEST(FaultsTest, ShutdownIsBoundedWhenTheServerHoldsAFinishedCallOpen) {
  TempDir dir;
  HostileServer::Behaviour b;
  b.hold_after_half_close = true;
  HostileServer server(b);
  AgentConfig c = fault_config(dir, "held-open", server.address());
  c.flush_timeout = 500ms;
  auto agent = testing::make_agent(c);
  Loop loop(*agent);
  loop.steps(10);
  ASSERT_TRUE(wait_until([&] { return agent->counters().reports_acked == 10; }, 10s));
  const auto t = timed_shutdown(agent);
  EXPECT_LT(t, c.flush_timeout + kShutdownSlack) << ms(t) << " ms; connect_timeout is 3 s";
}

TEST(FaultsTest, ShutdownIsBoundedAgainstAPeerThatNeverSpeaksHttp2) {
  TempDir dir;
  testing::SilentListener peer;
  AgentConfig c = fault_config(dir, "silent-peer", peer.address());
  c.flush_timeout = 500ms;
  auto agent = testing::make_agent(c);
  Loop loop(*agent);
  loop.steps(20);
  EXPECT_LT(loop.slowest(), kCallBound);
  const auto t = timed_shutdown(agent);
  EXPECT_LT(t, c.flush_timeout + kShutdownSlack) << ms(t) << " ms; connect_timeout is 3 s";
  EXPECT_EQ(testing::read_spool(dir / "spool", "silent-peer").size(), 20u);
}

TEST(FaultsTest, AServerThatNeverAcknowledgesLosesNothingAndShutdownIsBounded) {
  TempDir dir;
  HostileServer::Behaviour b;
  b.ack_reports = false;
  HostileServer server(b);
  AgentConfig c = fault_config(dir, "never-acked", server.address());
  c.flush_timeout = 300ms;
  auto agent = testing::make_agent(c);
  Loop loop(*agent);
  loop.steps(50);
  ASSERT_TRUE(wait_until([&] { return server.reports().size() >= 50; }, 10s));
  const Counters counters = agent->counters();
  EXPECT_EQ(counters.reports_acked, 0u);
  EXPECT_EQ(counters.dropped_reports, 0u);
  EXPECT_LT(loop.slowest(), kCallBound);
  const auto t0 = Clock::now();
  const Status s = agent->shutdown(c.flush_timeout);
  const auto t = Clock::now() - t0;
  EXPECT_EQ(s.code, StatusCode::kDeadlineExceeded) << s.message;
  EXPECT_LT(t, c.flush_timeout + kShutdownSlack) << ms(t) << " ms";
  agent.reset();
  EXPECT_EQ(testing::read_spool(dir / "spool", "never-acked").size(), 50u);
}

TEST(FaultsTest, AServerThatNeverAnswersTheHelloDoesNotHoldUpShutdown) {
  TempDir dir;
  HostileServer::Behaviour b;
  b.ack_hello = false;
  HostileServer server(b);
  AgentConfig c = fault_config(dir, "hello-unanswered", server.address());
  c.flush_timeout = 300ms;
  auto agent = testing::make_agent(c);
  Loop loop(*agent);
  loop.steps(10);
  ASSERT_TRUE(wait_until([&] { return !server.hellos().empty(); }, 10s));
  const auto t = timed_shutdown(agent);
  EXPECT_LT(t, c.flush_timeout + kShutdownSlack) << ms(t) << " ms; connect_timeout is 3 s";
}

TEST(FaultsTest, AStalledServerBlocksNeitherTrainingNorShutdown) {
  TempDir dir;
  HostileServer::Behaviour b;
  b.stall_after = 5;
  HostileServer server(b);
  AgentConfig c = fault_config(dir, "stalled", server.address());
  c.flush_timeout = 300ms;
  c.sampling.full_every = 1;  // larger reports, so the stalled stream's windows fill
  auto agent = testing::make_agent(c);
  Loop loop(*agent);
  loop.steps(300);
  EXPECT_EQ(agent->counters().steps, 300u);
  EXPECT_EQ(agent->counters().dropped_reports, 0u);
  EXPECT_LT(loop.slowest(), kCallBound);
  const auto t = timed_shutdown(agent);
  EXPECT_LT(t, c.flush_timeout + kShutdownSlack) << ms(t) << " ms";
  const auto spooled = testing::read_spool(dir / "spool", "stalled");
  ASSERT_FALSE(spooled.empty());
  EXPECT_EQ(spooled.back().seq(), 300u) << "everything not acknowledged stays in the spool";
}

// ---- Absurd PolicyUpdates -----------------------------------------------------------------------

// A scaler that takes every change it is given (the agent must validate them).
class TrustingScaler final : public ScalerControl {
 public:
  // From now on settings() throws.
  void break_it() { broken_ = true; }
  ScalerSettings settings() const override {
    if (broken_) throw std::runtime_error("the trainer's scaler is broken");
    std::lock_guard lock(mu_);
    return s_;
  }
  std::string schedule(const ScalerChange& c) override {
    std::lock_guard lock(mu_);
    if (c.scale) s_.scale = *c.scale;
    scales_.push_back(s_.scale);
    return {};
  }
  std::vector<double> scales() const {
    std::lock_guard lock(mu_);
    return scales_;
  }

 private:
  std::atomic<bool> broken_{false};
  mutable std::mutex mu_;
  ScalerSettings s_{.scale = 1024.0};
  std::vector<double> scales_;
};

v1::PolicyUpdate update(const std::string& id, std::int64_t step) {
  v1::PolicyUpdate u;
  u.set_policy_id(id);
  u.set_effective_from_step(step);
  return u;
}

std::vector<v1::PolicyUpdate> absurd_updates(int* invalid) {
  std::vector<v1::PolicyUpdate> out;
  auto bad_scale = [&](const std::string& id, double scale) {
    auto u = update(id, 3);
    u.set_loss_scale(scale);
    out.push_back(u);
  };
  bad_scale("nan", std::nan(""));
  bad_scale("inf", std::numeric_limits<double>::infinity());
  bad_scale("negative", -1024.0);
  bad_scale("zero", 0.0);
  bad_scale("huge", std::ldexp(1.0, 1000));
  bad_scale("not-a-power-of-two", 3000.0);
  {
    auto u = update("min-above-max", 3);
    u.set_min_scale(65536);
    u.set_max_scale(2);
    out.push_back(u);
  }
  {
    auto u = update("negative-step", -5);
    u.set_loss_scale(2048);
    out.push_back(u);
  }
  {
    auto u = update("ten-thousand-fp32-tensors", 3);
    u.set_fp32_tensors_set(true);
    for (int i = 0; i < 10000; ++i) u.add_fp32_tensors("t" + std::to_string(i));
    out.push_back(u);
  }
  {
    auto u = update("", 3);  // no id
    u.set_loss_scale(2048);
    out.push_back(u);
  }
  {
    auto u = update("other-run", 3);
    u.set_run_id("not-this-run");
    u.set_loss_scale(2048);
    out.push_back(u);
  }
  *invalid = static_cast<int>(out.size());
  // Valid, but odd: an unknown field, a step long past, a step that never comes, an id of 64 KB
  // with control characters.
  {
    auto u = update("unknown-field", 4);
    u.set_loss_scale(4096);
    u.GetReflection()->MutableUnknownFields(&u)->AddVarint(9999, 1);
    out.push_back(u);
  }
  {
    auto u = update("long-past", 0);
    u.set_loss_scale(2048);
    out.push_back(u);
  }
  {
    auto u = update("never", std::numeric_limits<std::int64_t>::max());
    u.set_loss_scale(512);
    out.push_back(u);
  }
  {
    auto u = update(std::string(65536, '\x01') + "id", 5);
    u.set_loss_scale(8192);
    out.push_back(u);
  }
  return out;
}

bool is_power_of_two(double v) {
  int e = 0;
  return std::isfinite(v) && v > 0 && std::frexp(v, &e) == 0.5;
}

TEST(FaultsTest, AbsurdPolicyUpdatesAreRefusedAndTrainingGoesOn) {
  TempDir dir;
  int invalid = 0;
  HostileServer::Behaviour b;
  b.updates = absurd_updates(&invalid);
  HostileServer server(b);
  AgentConfig c = fault_config(dir, "absurd-policy", server.address());
  c.run_id = "absurd-policy";
  auto agent = testing::make_agent(c);
  TrustingScaler scaler;
  ASSERT_TRUE(agent->attach_scaler(&scaler).ok());
  Loop loop(*agent);
  agent->begin_step(0);
  ASSERT_TRUE(wait_until([&] { return agent->counters().connected; }, 10s));
  StepInfo info;
  agent->end_step(info);
  std::this_thread::sleep_for(300ms);  // every update has arrived before step 1
  loop.steps(20);
  const Counters counters = agent->counters();
  ASSERT_TRUE(wait_until([&] { return server.reports().size() >= 21; }, 10s));
  std::string outcomes;
  for (const auto& r : server.reports()) {
    for (const auto& o : r.policy_outcomes()) {
      outcomes += o.policy_id().substr(0, 40) + (o.applied() ? " applied: " : " refused: ") +
                  o.reason().substr(0, 120) + "\n";
    }
  }
  EXPECT_GE(counters.policies_refused, static_cast<std::uint64_t>(invalid)) << outcomes;
  for (double s : scaler.scales()) EXPECT_TRUE(is_power_of_two(s)) << s;
  EXPECT_LT(loop.slowest(), kCallBound);
  EXPECT_EQ(counters.protocol_errors, 0u);
  EXPECT_EQ(server.hellos().size(), 1u) << "a bad update is refused, not a reason to reconnect";
}

TEST(FaultsTest, AFloodOfUpdatesKeepsEveryReportWithinTheServersLimits) {
  // 100 refusals due at one step: a report with more than 64 outcomes is rejected whole by the
  // server, and the step with it.
  TempDir dir;
  HostileServer::Behaviour b;
  for (int i = 0; i < 100; ++i) {
    auto u = update("flood-" + std::to_string(i), 3);
    u.set_loss_scale(std::nan(""));
    b.updates.push_back(u);
  }
  HostileServer server(b);
  auto agent = testing::make_agent(fault_config(dir, "flood", server.address()));
  TrustingScaler scaler;
  ASSERT_TRUE(agent->attach_scaler(&scaler).ok());
  agent->begin_step(0);
  ASSERT_TRUE(wait_until([&] { return agent->counters().connected; }, 10s));
  agent->end_step(StepInfo{});
  std::this_thread::sleep_for(300ms);  // every update has arrived before step 1
  Loop loop(*agent);
  loop.steps(3);
  ASSERT_TRUE(wait_until([&] { return server.reports().size() >= 3; }, 10s));
  for (const auto& r : server.reports()) EXPECT_LE(r.policy_outcomes_size(), 64) << r.step();
  EXPECT_EQ(agent->counters().policies_refused, 100u);
  EXPECT_TRUE(has_notice(*agent, "policy outcomes; a report carries the first 64"))
      << all_notices(*agent);
}

TEST(FaultsTest, AScalerThatThrowsWhenAnUpdateArrivesDoesNotEndTheProcess) {
  TempDir dir;
  HostileServer::Behaviour b;
  auto u = update("p1", 3);
  u.set_loss_scale(2048);
  b.updates = {u};
  HostileServer server(b);
  auto agent = testing::make_agent(fault_config(dir, "throwing-scaler", server.address()));
  TrustingScaler scaler;
  ASSERT_TRUE(agent->attach_scaler(&scaler).ok());
  scaler.break_it();
  Loop loop(*agent);
  loop.step();
  ASSERT_TRUE(wait_until([&] { return has_notice(*agent, "settings() threw"); }, 10s))
      << all_notices(*agent);
  loop.steps(5);
  EXPECT_EQ(agent->counters().policies_refused, 1u);
  EXPECT_EQ(agent->counters().policies_applied, 0u);
}

// ---- Counters on the wire -----------------------------------------------------------------------

TEST(FaultsTest, LockstepTimeoutsTravelInTheReports) {
  TempDir dir;
  HostileServer::Behaviour b;
  b.ack_reports = false;
  HostileServer server(b);
  AgentConfig c = fault_config(dir, "lockstep-wire", server.address());
  c.policy_lockstep = true;
  c.policy_lockstep_timeout = 100ms;
  auto agent = testing::make_agent(c);
  Loop loop(*agent);
  loop.steps(5);
  EXPECT_EQ(agent->counters().lockstep_timeouts, 1u);
  ASSERT_TRUE(wait_until([&] { return server.reports().size() >= 5; }, 10s));
  EXPECT_EQ(server.reports().back().agent().lockstep_timeouts(), 1u);
  ASSERT_FALSE(server.hellos().empty());
  const v1::Hello hello = server.hellos().front();
  EXPECT_EQ(hello.pid(), static_cast<std::uint64_t>(::getpid()));
  EXPECT_GT(hello.process_start_unix_ns(), 0);
}

// ---- The spool's file system --------------------------------------------------------------------

// TMPDIR set for the test's duration (the fallback spool lives under it).
class ScopedTmpdir {
 public:
  explicit ScopedTmpdir(const fs::path& dir) {
    if (const char* old = std::getenv("TMPDIR")) old_ = old;
    fs::create_directories(dir);
    ::setenv("TMPDIR", dir.c_str(), 1);
  }
  ~ScopedTmpdir() {
    if (old_.empty()) {
      ::unsetenv("TMPDIR");
    } else {
      ::setenv("TMPDIR", old_.c_str(), 1);
    }
  }

 private:
  std::string old_;
};

// A tmpfs at `dir` for the test's duration; mounted() false (and why) where that is not allowed.
class ScopedTmpfs {
 public:
  ScopedTmpfs(const fs::path& dir, const std::string& options) : dir_(dir) {
    fs::create_directories(dir);
    if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, options.c_str()) != 0) {
      why_ = std::string("mount -t tmpfs -o ") + options + " failed: " + std::strerror(errno);
    } else {
      mounted_ = true;
    }
  }
  ~ScopedTmpfs() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }
  const std::string& why() const { return why_; }

 private:
  fs::path dir_;
  bool mounted_ = false;
  std::string why_;
};

void expect_replayable_fallback(const TempDir& dir, const AgentConfig& c) {
  ScopedTmpdir tmp(dir / "tmp");
  ::testing::internal::CaptureStderr();
  auto agent = testing::make_agent(c);
  ASSERT_TRUE(agent);
  Loop loop(*agent);
  loop.steps(5);
  const std::string err = ::testing::internal::GetCapturedStderr();
  const fs::path fallback = dir / "tmp" / "ampscope-spool" / c.run_id / "rank-0";
  EXPECT_NE(err.find("ampscope agent: "), std::string::npos) << err;
  EXPECT_NE(err.find(fallback.string()), std::string::npos) << err;
  EXPECT_TRUE(has_notice(*agent, fallback.string())) << all_notices(*agent);
  EXPECT_EQ(agent->counters().dropped_reports, 0u);
  agent.reset();
  EXPECT_EQ(testing::read_spool(dir / "tmp" / "ampscope-spool", c.run_id).size(), 5u);
  // The next process with the same configuration meets the same failure, finds the fallback
  // and replays what this one left.
  ::testing::internal::CaptureStderr();
  auto next = testing::make_agent(c);
  ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(next);
  EXPECT_TRUE(has_notice(*next, "replaying 5 reports")) << all_notices(*next);
}

TEST(FaultsTest, ASpoolDirectoryUnderARegularFileFallsBackToAReplayedLocation) {
  TempDir dir;
  ampscope::testing::write_text(dir / "a-file", "not a directory\n");
  AgentConfig c = testing::base_config(dir, "spool-under-file");
  c.spool_dir = (dir / "a-file" / "spool").string();
  expect_replayable_fallback(dir, c);
}

TEST(FaultsTest, AReadOnlySpoolDirectoryFallsBackToAReplayedLocation) {
  TempDir dir;
  ScopedTmpfs ro(dir / "ro", "ro,size=64k");
  if (!ro.mounted()) GTEST_SKIP() << ro.why();
  AgentConfig c = testing::base_config(dir, "spool-read-only");
  c.spool_dir = (dir / "ro").string();
  expect_replayable_fallback(dir, c);
}

TEST(FaultsTest, AFullFileSystemDropsCountsAndSaysSoAndTrainingGoesOn) {
  TempDir dir;
  ScopedTmpfs full(dir / "small", "size=256k");
  if (!full.mounted()) GTEST_SKIP() << full.why();
  HostileServer::Behaviour b;
  b.ack_reports = false;  // nothing leaves the spool until the test says so
  HostileServer server(b);
  AgentConfig c = fault_config(dir, "full-fs", server.address());
  c.spool_dir = (dir / "small").string();
  c.spool_segment_bytes = 16 << 10;  // acknowledged space comes back a segment at a time
  c.sampling.full_every = 1;  // reports of a few KB
  auto agent = testing::make_agent(c);
  Loop loop(*agent);
  loop.steps(400);
  ASSERT_TRUE(wait_until([&] { return agent->counters().dropped_reports > 0; }, 10s))
      << all_notices(*agent);
  EXPECT_EQ(agent->counters().steps, 400u);
  EXPECT_LT(loop.slowest(), kCallBound);
  EXPECT_TRUE(has_notice(*agent, "dropped and counted")) << all_notices(*agent);
  // Once the server acknowledges again (on the next stream), the space comes back and the
  // reports say what was lost.
  const std::uint64_t dropped = agent->counters().dropped_reports;
  b.ack_reports = true;
  server.set(b);
  server.cut_streams();
  ASSERT_TRUE(wait_until(
      [&] {
        loop.step();
        const auto r = server.reports();
        return !r.empty() && r.back().agent().dropped_reports() >= dropped;
      },
      20s))
      << all_notices(*agent);
  EXPECT_LT(loop.slowest(), kCallBound);
}

}  // namespace
}  // namespace ampscope::agent
