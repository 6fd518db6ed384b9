// Several servers, one owner per run (docs/server.md, "Several servers"): real servers in this
// process on loopback, each with a scripted RunOwnership standing in for the shared store's
// (the Hello path and everything after it are the real code), and real agents.
//   - a server that does not own the run answers the Hello with a Redirect to the owner and
//     FAILED_PRECONDITION naming it, and keeps nothing of the stream; UNAVAILABLE when nobody
//     can tell the owner;
//   - the agent follows the redirect to a second server and every report is stored there once;
//   - a first address that is down: the second one of the list gets the reports;
//   - servers that send the agent round in circles: at most Transport::kMaxRedirects redirects
//     in a row, then a notice and the backoff; an owner that cannot be reached: a notice;
//   - --advertise-address and its default.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <mutex>

#include "ampscope/agent/agent.h"
#include "ampscope/check.h"
#include "ampscope/server/server.h"
#include "ampscope/testing/net.h"
#include "run_ownership.h"
#include "server_harness.h"

namespace ampscope::testing {
namespace {

using Clock = std::chrono::steady_clock;
using server::RunClaim;

// Answers the n-th claim (from 0) as `script` says, and keeps when each came.
class ScriptedOwnership final : public server::RunOwnership {
 public:
  explicit ScriptedOwnership(std::function<RunClaim(int)> script) : script_(std::move(script)) {}
  RunClaim claim(const std::string&) override {
    std::lock_guard lock(mu_);
    times_.push_back(Clock::now());
    return script_(static_cast<int>(times_.size()) - 1);
  }
  void release_all() override {}
  std::vector<Clock::time_point> claims() const {
    std::lock_guard lock(mu_);
    return times_;
  }

 private:
  const std::function<RunClaim(int)> script_;
  mutable std::mutex mu_;
  std::vector<Clock::time_point> times_;
};

// A real server in this process on 127.0.0.1 (any free port), its store under `dir`.
class InProcessServer {
 public:
  InProcessServer(const std::filesystem::path& dir,
                  std::shared_ptr<server::RunOwnership> ownership = nullptr) {
    server::ServerOptions o;
    o.listen = "127.0.0.1:0";
    o.metrics_listen = "";
    o.db_path = (dir / "store.db").string();
    o.ownership = std::move(ownership);
    server_ = server::Server::create(std::move(o));
    bound_ = server_->start();
  }
  ~InProcessServer() {
    server_->shutdown(std::chrono::seconds(5));
    server_->wait();
  }
  const std::string& address() const { return bound_.grpc; }
  const server::BoundAddresses& bound() const { return bound_; }

 private:
  std::unique_ptr<server::Server> server_;
  server::BoundAddresses bound_;
};

// An agent of `run` whose reports go to `servers` (the agent's `server` option), with a short
// backoff so that the tests see several rounds quickly.
std::unique_ptr<agent::Agent> make_agent(const TempDir& dir, const std::string& run,
                                         const std::string& servers) {
  agent::AgentConfig c;
  c.run_id = run;
  c.server = servers;
  c.spool_dir = (dir / "spool").string();
  c.sampling.full_every = 0;
  c.backoff_initial = std::chrono::milliseconds(400);
  c.backoff_max = std::chrono::milliseconds(400);
  c.connect_timeout = std::chrono::milliseconds(1000);
  std::unique_ptr<agent::Agent> a;
  agent::RunInfo info;
  info.trainer = "cluster_test";
  const agent::Status s = agent::Agent::create(c, info, &a);
  EXPECT_TRUE(s.ok()) << s.message;
  return a;
}

void run_steps(agent::Agent& agent, int steps) {
  for (int step = 0; step < steps; ++step) {
    agent.begin_step(step);
    agent::StepInfo info;
    info.step = step;
    info.loss = 2.0;
    info.loss_scale = info.scale_after = 1024.0;
    info.lr = 1e-3;
    agent.end_step(info);
  }
}

// Every step 0..steps-1 stored once, as seq step + 1.
void expect_each_step_once(const std::vector<v1::StepReport>& stored, int steps) {
  ASSERT_EQ(stored.size(), static_cast<std::size_t>(steps));
  for (int i = 0; i < steps; ++i) {
    EXPECT_EQ(stored[i].step(), i);
    EXPECT_EQ(stored[i].seq(), static_cast<std::uint64_t>(i + 1));
  }
}

bool has_notice(const agent::Agent& agent, const std::string& part) {
  const std::vector<std::string> notices = agent.notices();
  return std::any_of(notices.begin(), notices.end(),
                     [&](const std::string& n) { return n.find(part) != std::string::npos; });
}

TEST(ClusterTest, AHelloToANonOwnerIsRedirectedAndLeavesNothing) {
  TempDir dir;
  InProcessServer a(dir.path(), std::make_shared<ScriptedOwnership>([](int) {
                      return RunClaim::elsewhere("owner.example:50051");
                    }));
  AgentStream stream(make_channel(a.address()));
  ASSERT_TRUE(stream.send_hello(make_hello("r1")));
  const grpc::Status status = stream.wait_end();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  // An agent that does not know Redirect sees where to go in the status.
  EXPECT_NE(status.error_message().find("run 'r1' is owned by the ampscope-server at "
                                        "owner.example:50051"),
            std::string::npos)
      << status.error_message();
  const std::vector<v1::ServerMessage> got = stream.messages();
  ASSERT_EQ(got.size(), 1u);
  ASSERT_TRUE(got[0].has_redirect());
  EXPECT_EQ(got[0].redirect().run_id(), "r1");
  EXPECT_EQ(got[0].redirect().owner(), "owner.example:50051");
  EXPECT_FALSE(get_run(a.address(), "r1").has_value()) << "the non-owner filed the run";
}

TEST(ClusterTest, AnOwnerNobodyCanTellIsUnavailable) {
  TempDir dir;
  InProcessServer a(dir.path(), std::make_shared<ScriptedOwnership>([](int) {
                      return RunClaim::unavailable("the store does not answer");
                    }));
  AgentStream stream(make_channel(a.address()));
  ASSERT_TRUE(stream.send_hello(make_hello("r1")));
  const grpc::Status status = stream.wait_end();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(status.error_message().find("the store does not answer"), std::string::npos);
  EXPECT_TRUE(stream.messages().empty());
  EXPECT_FALSE(get_run(a.address(), "r1").has_value());
}

TEST(ClusterTest, TheAgentFollowsTheRedirectAndTheOwnerStoresEveryStepOnce) {
  TempDir dir_a, dir_b, dir_agent;
  InProcessServer b(dir_b.path());
  const std::string owner = b.address();
  auto redirecting =
      std::make_shared<ScriptedOwnership>([owner](int) { return RunClaim::elsewhere(owner); });
  InProcessServer a(dir_a.path(), redirecting);
  auto agent = make_agent(dir_agent, "r2", a.address());
  run_steps(*agent, 20);
  ASSERT_TRUE(agent->shutdown(std::chrono::seconds(20)).ok());
  expect_each_step_once(stored_reports(b.address(), "r2"), 20);
  EXPECT_FALSE(get_run(a.address(), "r2").has_value());
  EXPECT_GE(redirecting->claims().size(), 1u);
  for (const std::string& n : agent->notices()) {
    EXPECT_EQ(n.find("transport:"), std::string::npos) << "unexpected notice: " << n;
  }
}

TEST(ClusterTest, AFirstAddressThatIsDownGivesWayToTheNext) {
  TempDir dir_b, dir_agent;
  InProcessServer b(dir_b.path());
  const std::string down = "127.0.0.1:" + std::to_string(free_loopback_port());
  auto agent = make_agent(dir_agent, "r3", down + "," + b.address());
  run_steps(*agent, 10);
  ASSERT_TRUE(agent->shutdown(std::chrono::seconds(20)).ok());
  expect_each_step_once(stored_reports(b.address(), "r3"), 10);
  EXPECT_TRUE(has_notice(*agent, "cannot connect to " + down));
}

// A and B each say the other owns the run, until B has been asked `rounds` x 2 times: the
// agent follows kMaxRedirects redirects in a row, notices the loop, backs off, and the reports
// reach B once it owns the run.
TEST(ClusterTest, RedirectLoopsAreBoundedAndNoticed) {
  TempDir dir_a, dir_b, dir_agent;
  std::string a_address;  // set before any claim can come
  std::mutex mu;
  auto b_ownership = std::make_shared<ScriptedOwnership>([&](int n) {
    std::lock_guard lock(mu);
    return n < 4 ? RunClaim::elsewhere(a_address) : RunClaim::owned();
  });
  InProcessServer b(dir_b.path(), b_ownership);
  const std::string b_address = b.address();
  auto a_ownership = std::make_shared<ScriptedOwnership>(
      [b_address](int) { return RunClaim::elsewhere(b_address); });
  InProcessServer a(dir_a.path(), a_ownership);
  {
    std::lock_guard lock(mu);
    a_address = a.address();
  }
  auto agent = make_agent(dir_agent, "r4", a.address());
  run_steps(*agent, 5);
  ASSERT_TRUE(agent->shutdown(std::chrono::seconds(30)).ok());
  expect_each_step_once(stored_reports(b.address(), "r4"), 5);
  EXPECT_TRUE(has_notice(*agent, "redirected 4 times in a row for run 'r4', last by " + b_address +
                                     " to " + a_address))
      << ::testing::PrintToString(agent->notices());

  // The Hellos came in bursts of at most 1 + kMaxRedirects, a backoff (at least half of its
  // 400 ms) apart: A, B, A, B; wait; A, B, A, B; wait; A, B (owned).
  std::vector<Clock::time_point> hellos = a_ownership->claims();
  const std::vector<Clock::time_point> b_hellos = b_ownership->claims();
  hellos.insert(hellos.end(), b_hellos.begin(), b_hellos.end());
  std::sort(hellos.begin(), hellos.end());
  ASSERT_EQ(b_hellos.size(), 5u);
  ASSERT_EQ(hellos.size(), 10u);
  std::size_t burst = 1, largest = 1;
  for (std::size_t i = 1; i < hellos.size(); ++i) {
    burst = hellos[i] - hellos[i - 1] >= std::chrono::milliseconds(150) ? 1 : burst + 1;
    largest = std::max(largest, burst);
  }
  EXPECT_LE(largest, 4u);
}

TEST(ClusterTest, AnOwnerThatCannotBeReachedIsNoticed) {
  TempDir dir_a, dir_agent;
  const std::string down = "127.0.0.1:" + std::to_string(free_loopback_port());
  // Redirects to an owner that is down twice, then owns the run (a failover, say).
  auto ownership = std::make_shared<ScriptedOwnership>(
      [down](int n) { return n < 2 ? RunClaim::elsewhere(down) : RunClaim::owned(); });
  InProcessServer a(dir_a.path(), ownership);
  auto agent = make_agent(dir_agent, "r5", a.address());
  run_steps(*agent, 5);
  ASSERT_TRUE(agent->shutdown(std::chrono::seconds(20)).ok());
  expect_each_step_once(stored_reports(a.address(), "r5"), 5);
  EXPECT_TRUE(has_notice(*agent, "cannot reach the owner of run 'r5' at " + down +
                                     " (redirected by " + a.address() + "): cannot connect to " +
                                     down))
      << ::testing::PrintToString(agent->notices());
}

TEST(ClusterTest, TheAdvertisedAddressDefaultsToTheBoundOneUnlessAWildcard) {
  EXPECT_EQ(server::advertised_address("", "127.0.0.1:0", "127.0.0.1:4321"), "127.0.0.1:4321");
  EXPECT_EQ(server::advertised_address("", "0.0.0.0:50051", "0.0.0.0:50051"), "");
  EXPECT_EQ(server::advertised_address("", "[::]:50051", "[::]:50051"), "");
  EXPECT_EQ(server::advertised_address("a.example:50051", "0.0.0.0:50051", "0.0.0.0:50051"),
            "a.example:50051");
  EXPECT_EQ(server::check_advertise_address("a.example:50051"), "");
  EXPECT_EQ(server::check_advertise_address("a.example"), "expected host:port, got 'a.example'");
  EXPECT_NE(server::check_advertise_address("0.0.0.0:50051").find("wildcard"), std::string::npos);

  TempDir dir;
  InProcessServer s(dir.path());
  EXPECT_EQ(s.bound().advertised, s.address());
  server::ServerOptions bad;
  bad.advertise_address = "[::]:50051";
  bad.db_path = (dir / "other.db").string();
  try {
    server::Server::create(bad);
    ADD_FAILURE() << "a wildcard --advertise-address was taken";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("--advertise-address: ", 0), 0u) << e.what();
  }
}

}  // namespace
}  // namespace ampscope::testing
