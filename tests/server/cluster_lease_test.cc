// Run leases in the shared store (cluster/lease_ownership.h), on both back ends (a real
// PostgreSQL from postgres_harness.h, and a SQLite file), then two real servers in this process
// sharing one PostgreSQL database:
//   - one owner per run; the others name it; a graceful release hands a run over at once;
//   - the heartbeat keeps a lease; a lease left by a process that died expires after its ttl
//     and another server takes it (the epoch rises); the same address under a new process
//     waits for its old lease instead of redirecting to itself;
//   - a lost connection is UNAVAILABLE once, then the lease connects again;
//   - two ranks of a run, one sent to each server: both end at the run's owner, every step
//     stored once, and the other server answers queries about the run from the shared store;
//   - a run taken over while its old owner streams: the old owner's commit is fenced, the new
//     owner restores the run from the store, every step stored once;
//   - PostgreSQL stopped and started again under a streaming agent: nothing acknowledged while
//     it is away, nothing lost.
#include <gtest/gtest.h>

#include <map>
#include <mutex>

#include "ampscope/agent/agent.h"
#include "ampscope/server/server.h"
#include "ampscope/testing/net.h"
#include "ampscope/testing/postgres.h"
#include "ampscope/testing/wait_until.h"
#include "lease_ownership.h"
#include "postgres_harness.h"
#include "server_harness.h"
#include "store_backends.h"

namespace ampscope::server {
namespace {

using namespace std::chrono_literals;
using Kind = RunClaim::Kind;

class LeaseOwnershipTest : public StoreBackendTest {
 protected:
  LeaseOwnershipTest() { StoreWriter make(StoreOptions{path(), true}); }
  std::unique_ptr<LeaseOwnership> lease(const std::string& advertised,
                                        std::chrono::milliseconds ttl = 10s,
                                        std::chrono::milliseconds renew = 3s) {
    return std::make_unique<LeaseOwnership>([this] { return connect(); },
                                            LeaseOwnership::Options{advertised, ttl, renew});
  }
};
INSTANTIATE_STORE_BACKENDS(LeaseOwnershipTest);

TEST_P(LeaseOwnershipTest, OneOwnerPerRunAndTheOthersNameIt) {
  auto a = lease("a.example:50051");
  auto b = lease("b.example:50051");
  EXPECT_EQ(a->claim("r").kind, Kind::kOwned);
  const RunClaim seen = b->claim("r");
  EXPECT_EQ(seen.kind, Kind::kElsewhere);
  EXPECT_EQ(seen.owner, "a.example:50051");
  EXPECT_EQ(b->claim("s").kind, Kind::kOwned);
  EXPECT_EQ(a->claim("s").owner, "b.example:50051");
  EXPECT_EQ(a->claim("r").kind, Kind::kOwned);  // still its own
  EXPECT_EQ(a->epoch("r"), 1);
}

TEST_P(LeaseOwnershipTest, AGracefulReleaseHandsTheRunsOverAtOnce) {
  auto a = lease("a.example:50051");
  auto b = lease("b.example:50051");
  ASSERT_EQ(a->claim("r").kind, Kind::kOwned);
  a->release_all();
  EXPECT_EQ(b->claim("r").kind, Kind::kOwned);
  EXPECT_EQ(a->claim("r").owner, "b.example:50051");
}

TEST_P(LeaseOwnershipTest, TheHeartbeatKeepsALeaseAndADeadOwnersExpires) {
  auto a = lease("a.example:50051", 1500ms, 300ms);
  auto b = lease("b.example:50051", 1500ms, 300ms);
  ASSERT_EQ(a->claim("r").kind, Kind::kOwned);
  std::this_thread::sleep_for(3500ms);  // well past the ttl: only the heartbeat kept it
  EXPECT_EQ(b->claim("r").kind, Kind::kElsewhere);
  a.reset();  // gone without releasing, as after kill -9
  EXPECT_EQ(b->claim("r").kind, Kind::kElsewhere);
  EXPECT_TRUE(testing::wait_until([&] { return b->claim("r").kind == Kind::kOwned; }, 5s));
  EXPECT_EQ(b->epoch("r"), 2);
}

TEST_P(LeaseOwnershipTest, ANewProcessAtTheSameAddressWaitsForItsOldLease) {
  auto first = lease("a.example:50051", 600ms, 150ms);
  ASSERT_EQ(first->claim("r").kind, Kind::kOwned);
  first.reset();
  auto second = lease("a.example:50051", 600ms, 150ms);
  const RunClaim waiting = second->claim("r");
  EXPECT_EQ(waiting.kind, Kind::kUnavailable);
  EXPECT_NE(waiting.reason.find("previous process"), std::string::npos) << waiting.reason;
  EXPECT_TRUE(testing::wait_until([&] { return second->claim("r").kind == Kind::kOwned; }, 5s));
}

// What the ingest is told and asks: a run claimed afresh drops the server's copy (not taken),
// a run the heartbeat finds taken ends its streams (taken); the fence confirms only the runs
// whose row still names this process, and a run it does not confirm is asked of the store again.
TEST_P(LeaseOwnershipTest, TheIngestIsToldWhatIsStaleAndTheFenceConfirmsOnlyOwnRuns) {
  auto a = lease("a.example:50051", 1200ms, 250ms);
  auto b = lease("b.example:50051", 1200ms, 250ms);
  std::mutex mu;
  std::vector<std::pair<std::string, bool>> told;
  a->on_lost([&](const std::string& run, bool taken) {
    std::lock_guard lock(mu);
    told.emplace_back(run, taken);
  });
  ASSERT_EQ(a->claim("r").kind, Kind::kOwned);
  ASSERT_EQ(a->claim("r").kind, Kind::kOwned);  // held: nothing more to drop
  {
    std::lock_guard lock(mu);
    EXPECT_EQ(told, (std::vector<std::pair<std::string, bool>>{{"r", false}}));
  }
  const auto c = connect();
  {
    Transaction tx(*c);
    EXPECT_EQ(a->confirm(*c, {"r", "never"}), (std::set<std::string>{"r"}));
    tx.commit();
  }
  // The row is taken over behind A's back (its expiry forced): the heartbeat says so.
  c->exec("UPDATE run_leases SET expires_ms = 0 WHERE run_id = 'r'");
  ASSERT_EQ(b->claim("r").kind, Kind::kOwned);
  EXPECT_TRUE(testing::wait_until(
      [&] {
        std::lock_guard lock(mu);
        return told.size() == 2;
      },
      5s));
  {
    std::lock_guard lock(mu);
    ASSERT_EQ(told.size(), 2u);
    EXPECT_EQ(told[1], (std::pair<std::string, bool>{"r", true}));
  }
  {
    Transaction tx(*c);
    EXPECT_EQ(a->confirm(*c, {"r"}), (std::set<std::string>{}));
    tx.commit();
  }
  EXPECT_EQ(a->claim("r").owner, "b.example:50051");
}

TEST(LeaseOwnershipPostgresTest, ALostConnectionIsUnavailableOnceThenConnectsAgain) {
  StoreLocation store(Backend::kPostgres);
  { StoreWriter make(StoreOptions{store.path(), true}); }
  LeaseOwnership a([&] { return store.connect(); },
                   LeaseOwnership::Options{"a.example:50051", 10s, 3s});
  ASSERT_EQ(a.claim("r").kind, Kind::kOwned);
  store.connect()->exec(
      "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
      "WHERE datname = current_database() AND pid <> pg_backend_pid()");
  const RunClaim lost = a.claim("s");
  EXPECT_EQ(lost.kind, Kind::kUnavailable);
  EXPECT_NE(lost.reason.find("the shared store"), std::string::npos) << lost.reason;
  EXPECT_EQ(a.claim("s").kind, Kind::kOwned);
}

// A server's leases, with what each claim answered.
class RecordedLeases final : public RunOwnership {
 public:
  explicit RecordedLeases(std::unique_ptr<LeaseOwnership> leases) : leases_(std::move(leases)) {}
  RunClaim claim(const std::string& run_id) override {
    RunClaim c = leases_->claim(run_id);
    std::lock_guard lock(mu_);
    answers_.push_back(c);
    return c;
  }
  void release_all() override { leases_->release_all(); }
  bool runs_move() const override { return leases_->runs_move(); }
  void advertise(const std::string& address) override { leases_->advertise(address); }
  void on_lost(std::function<void(const std::string&, bool)> callback) override {
    leases_->on_lost(std::move(callback));
  }
  std::set<std::string> confirm(Connection& tx, const std::vector<std::string>& runs) override {
    return leases_->confirm(tx, runs);
  }
  std::vector<RunClaim> answers() {
    std::lock_guard lock(mu_);
    return answers_;
  }

 private:
  std::unique_ptr<LeaseOwnership> leases_;
  std::mutex mu_;
  std::vector<RunClaim> answers_;
};

// A real server in this process on a port chosen beforehand (its lease must name it before
// it binds), on the shared store.
class LeasedServer {
 public:
  LeasedServer(const std::string& db) : port_(testing::free_loopback_port()) {
    ServerOptions o;
    o.listen = address();
    o.metrics_listen = "";
    o.db_path = db;
    leases_ = std::make_shared<RecordedLeases>(std::make_unique<LeaseOwnership>(
        [db] { return open_store(StoreOptions{db}, StoreRole::kCheckpointer); },
        LeaseOwnership::Options{address(), 10s, 3s}));
    o.ownership = leases_;
    server_ = Server::create(std::move(o));
    server_->start();
  }
  RecordedLeases& leases() { return *leases_; }
  ~LeasedServer() {
    server_->shutdown(5s);
    server_->wait();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  int port_;
  std::shared_ptr<RecordedLeases> leases_;
  std::unique_ptr<Server> server_;
};

std::unique_ptr<agent::Agent> rank_agent(const testing::TempDir& dir, std::uint32_t rank,
                                         const std::string& servers, std::uint32_t world = 2) {
  agent::AgentConfig c;
  c.run_id = "shared";
  c.rank = rank;
  c.world_size = world;
  c.server = servers;
  c.spool_dir = (dir / ("spool-" + std::to_string(rank))).string();
  c.sampling.full_every = 0;
  c.backoff_initial = 100ms;
  c.backoff_max = 500ms;
  std::unique_ptr<agent::Agent> a;
  agent::RunInfo info;
  info.trainer = "cluster_lease_test";
  const agent::Status s = agent::Agent::create(c, info, &a);
  EXPECT_TRUE(s.ok()) << s.message;
  return a;
}

TEST(LeasedServersTest, BothRanksEndAtTheOwnerAndEitherServerAnswersQueries) {
  StoreLocation store(Backend::kPostgres);
  testing::TempDir dir;
  LeasedServer a(store.path());
  LeasedServer b(store.path());
  // Rank 0 reaches A first, which takes the run; rank 1 is given only B, which sends it on.
  auto rank0 = rank_agent(dir, 0, a.address());
  for (int step = 0; step < 3; ++step) {
    rank0->begin_step(step);
    agent::StepInfo info;
    info.step = step;
    info.loss_scale = info.scale_after = 1024.0;
    rank0->end_step(info);
  }
  ASSERT_TRUE(rank0->flush(20s).ok());
  auto rank1 = rank_agent(dir, 1, b.address());
  for (int step = 0; step < 3; ++step) {
    rank1->begin_step(step);
    agent::StepInfo info;
    info.step = step;
    info.loss_scale = info.scale_after = 1024.0;
    rank1->end_step(info);
  }
  ASSERT_TRUE(rank1->shutdown(20s).ok());
  ASSERT_TRUE(rank0->shutdown(20s).ok());
  for (const std::string& at : {a.address(), b.address()}) {
    const std::vector<v1::StepReport> stored = testing::stored_reports(at, "shared");
    ASSERT_EQ(stored.size(), 6u) << at;
    std::map<std::uint32_t, std::vector<std::int64_t>> steps;
    for (const v1::StepReport& r : stored) steps[r.rank()].push_back(r.step());
    EXPECT_EQ(steps[0], (std::vector<std::int64_t>{0, 1, 2})) << at;
    EXPECT_EQ(steps[1], (std::vector<std::int64_t>{0, 1, 2})) << at;
  }
  // Rank 1 reached A through B's redirect: B never owned the run.
  const std::vector<RunClaim> b_answers = b.leases().answers();
  ASSERT_FALSE(b_answers.empty());
  for (const RunClaim& c : b_answers) {
    EXPECT_EQ(c.kind, Kind::kElsewhere);
    EXPECT_EQ(c.owner, a.address());
  }
  EXPECT_GE(a.leases().answers().size(), 2u);  // both ranks' Hellos
  for (const RunClaim& c : a.leases().answers()) EXPECT_EQ(c.kind, Kind::kOwned);
  for (const std::string& n : rank1->notices()) {
    EXPECT_EQ(n.find("transport:"), std::string::npos) << "unexpected notice: " << n;
  }
}

// Steps [from, to) of `agent`, each with one loss scale.
void run_steps(agent::Agent& agent, int from, int to) {
  for (int step = from; step < to; ++step) {
    agent.begin_step(step);
    agent::StepInfo info;
    info.step = step;
    info.loss_scale = info.scale_after = 1024.0;
    agent.end_step(info);
  }
}

// The steps stored for `run`, per rank, in seq order.
std::map<std::uint32_t, std::vector<std::int64_t>> stored_steps(const std::string& address,
                                                                const std::string& run) {
  std::map<std::uint32_t, std::vector<std::int64_t>> steps;
  for (const v1::StepReport& r : testing::stored_reports(address, run)) {
    steps[r.rank()].push_back(r.step());
  }
  return steps;
}

std::vector<std::int64_t> range(int from, int to) {
  std::vector<std::int64_t> v;
  for (int i = from; i < to; ++i) v.push_back(i);
  return v;
}

// A takeover while the old owner still streams: its next commit finds the lease gone (the
// fence), writes nothing more of the run and ends the stream; the agent comes back, is sent to
// the new owner, which restores the run from the store (the agent's settled seq) and takes the
// rest. Every step is stored once.
TEST(LeasedServersTest, AServerThatLostARunWritesNothingMoreAndTheNewOwnerGoesOnFromTheStore) {
  StoreLocation store(Backend::kPostgres);
  testing::TempDir dir;
  LeasedServer a(store.path());
  LeasedServer b(store.path());
  auto rank0 = rank_agent(dir, 0, a.address() + "," + b.address(), 1);
  run_steps(*rank0, 0, 5);
  ASSERT_TRUE(rank0->flush(20s).ok());
  ASSERT_EQ(stored_steps(a.address(), "shared")[0], range(0, 5));

  // A's lease expires in the store (as when A cannot renew it) and B takes the run.
  store.connect()->exec("UPDATE run_leases SET expires_ms = 0 WHERE run_id = 'shared'");
  ASSERT_EQ(b.leases().claim("shared").kind, Kind::kOwned);

  run_steps(*rank0, 5, 10);
  ASSERT_TRUE(rank0->shutdown(20s).ok());
  EXPECT_EQ(stored_steps(b.address(), "shared")[0], range(0, 10));
  EXPECT_GE(rank0->counters().reconnects, 1u);
  // The agent came back to B (by A's redirect, or as the next server of its list): B's claims
  // are the test's and the agent's Hello, and A answered none of its returns as the owner.
  const std::vector<RunClaim> b_answers = b.leases().answers();
  EXPECT_GE(b_answers.size(), 2u);
  for (const RunClaim& c : b_answers) EXPECT_EQ(c.kind, Kind::kOwned) << c.owner << c.reason;
  const std::vector<RunClaim> a_answers = a.leases().answers();
  ASSERT_FALSE(a_answers.empty());
  EXPECT_EQ(a_answers.front().kind, Kind::kOwned);  // its first Hello
  for (std::size_t i = 1; i < a_answers.size(); ++i) {
    EXPECT_EQ(a_answers[i].owner, b.address()) << "claim " << i << ": " << a_answers[i].reason;
  }
}

// PostgreSQL stopped under a streaming agent and started again: nothing is acknowledged
// meanwhile, the agent keeps its reports, and once the database is back the server connects
// anew, restores the run and every step is stored once.
TEST(LeasedServersTest, AServerThatLosesPostgresAcknowledgesNothingAndRecoversLosingNothing) {
  testing::PostgresInstance postgres;
  const std::string db = postgres.create_database();
  { StoreWriter make(StoreOptions{db}); }
  testing::TempDir dir;
  LeasedServer a(db);
  auto rank0 = rank_agent(dir, 0, a.address(), 1);
  run_steps(*rank0, 0, 5);
  ASSERT_TRUE(rank0->flush(20s).ok());

  postgres.stop();
  run_steps(*rank0, 5, 10);
  EXPECT_FALSE(rank0->flush(1500ms).ok());  // nothing new acknowledged while it is away
  EXPECT_EQ(rank0->counters().reports_acked, 5u);

  postgres.start();
  run_steps(*rank0, 10, 12);  // and the run goes on
  ASSERT_TRUE(rank0->shutdown(30s).ok());
  // The query connection finds out it broke at its first query after the outage, which fails;
  // the next one connects anew.
  EXPECT_TRUE(
      testing::wait_until([&] { return testing::get_run(a.address(), "shared").has_value(); }, 5s));
  EXPECT_EQ(stored_steps(a.address(), "shared")[0], range(0, 12));
}

}  // namespace
}  // namespace ampscope::server
