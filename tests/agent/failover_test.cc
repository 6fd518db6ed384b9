// Failover end to end (docs/deploy.md, "What fails over"): a real PostgreSQL, two
// ampscope-server processes sharing it with run leases (ttl 2 s) and the headroom policy, and
// ampscope-train on two ranks under mpirun, each rank's agent given both servers. The run's
// owner is killed with SIGKILL mid-run; once its lease expires the other server takes the run
// over (restoring its settled seqs, rank merge and policy engine from the store), and:
//   - the trainer finishes, every report acknowledged;
//   - every step of every rank is stored exactly once, each rank's seqs gap-free;
//   - every step is merged over both ranks exactly once, none partial, and no rank divergence is
//     reported, nor do the stored reports of the two ranks differ in scale or skip (a healthy
//     run has none; a merge or policy state lost in the move would show);
//   - the policy's decisions are numbered 1, 2, 3, ... across the move, the new owner decides
//     too, and both ranks apply every decision at the same step.
// It prints the takeover time: from the kill to the lease row naming the new owner, and to the
// first report the new owner stored (acknowledged as its commit returns). Skips itself without
// an MPI launcher.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <map>

#include "ampscope/testing/child_process.h"
#include "ampscope/testing/files.h"
#include "ampscope/testing/leased_servers.h"
#include "ampscope/testing/postgres.h"
#include "ampscope/testing/wait_until.h"
#include "trainer_run.h"

#ifndef AMPSCOPE_MPIEXEC
#error "AMPSCOPE_MPIEXEC must name the MPI launcher (empty: none)"
#endif

namespace ampscope::testing {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr const char* kRun = "failover";
constexpr int kSteps = 900;
constexpr int kRanks = 2;

class FailoverTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // Open MPI: two ranks on any machine, and as root in containers.
    setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 1);
    if (::geteuid() == 0) {
      setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
      setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    }
  }
  void SetUp() override {
    if (std::string(AMPSCOPE_MPIEXEC).empty() || !fs::exists(AMPSCOPE_MPIEXEC)) {
      GTEST_SKIP() << "this build has no MPI launcher";
    }
  }
};

std::int64_t as_int(const std::string& s) { return s.empty() ? 0 : std::stoll(s); }

TEST_F(FailoverTest, OwnerKilledMidRunTheOtherServerTakesOverEveryStepOnce) {
  TempDir dir;
  PostgresInstance postgres;
  LeasedServers servers(dir.path(), postgres.create_database(), 2, "2s",
                        {"--policy", "headroom", "--policy-lead-steps", "1"});
  PostgresConnection& db = servers.db();
  // Started far too high, the scale is lowered at once; an overflow injected every 50 steps
  // (an outlier no scale avoids) makes the engine restore the scale the local scaler backed off
  // from: decisions on both sides of the kill.
  TrainerRun run{
      .dir = dir.path(),
      .run_id = kRun,
      .server = servers.addresses(),
      .steps = kSteps,
      .extra = {"--threads", "1", "--init-scale", "16777216", "--inject-overflow-every", "50"},
      .batch = 16};
  std::vector<std::string> argv = run.argv();
  argv.insert(argv.begin(), {AMPSCOPE_MPIEXEC, "-np", std::to_string(kRanks)});
  ChildProcess trainer(argv, dir / "train.log");

  const auto count = [&](const std::string& table) {
    return as_int(db.value(
        "SELECT count(*) FROM " + table + " t JOIN runs u ON t.run = u.id WHERE u.run_id = $1",
        {kRun}));
  };
  // Mid-run: a sixth of the steps trained and a decision taken.
  ASSERT_TRUE(wait_until(
      [&] {
        return (count_lines(dir / "log.jsonl") >= kSteps / 6 && count("policy_decisions") >= 1) ||
               !trainer.running();
      },
      120s));
  ASSERT_TRUE(trainer.running()) << "the run ended before the kill:\n" << trainer.log_tail();
  const std::int64_t killed_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                     std::chrono::system_clock::now().time_since_epoch())
                                     .count();
  const std::optional<Takeover> t = servers.kill_owner(kRun, 30s);
  ASSERT_TRUE(t) << "no other server took the run over; the logs:\n"
                 << servers.at(0).log() << servers.at(1).log();
  const std::size_t steps_at_takeover = count_lines(dir / "log.jsonl");
  std::cout << "takeover (lease ttl 2 s): lease after " << t->lease.count()
            << " s, first report stored by the new owner after " << t->first_report.count()
            << " s; the trainer was at step " << steps_at_takeover << " of " << kSteps << "\n";
  EXPECT_EQ(t->epoch, 2) << "one move: the epoch rises once";
  EXPECT_LT(steps_at_takeover, static_cast<std::size_t>(kSteps))
      << "the run must go on after the takeover, for the new owner to decide on live steps";

  ASSERT_EQ(trainer.wait(120s), 0) << trainer.log();
  // Each rank's agent: every report acknowledged, and as many policy updates applied as the
  // other rank's, none refused.
  std::vector<std::string> closing;
  for (const std::string& line : lines_of(trainer.log())) {
    if (line.find("policy updates applied") != std::string::npos) closing.push_back(line);
  }
  ASSERT_EQ(closing.size(), static_cast<std::size_t>(kRanks)) << trainer.log();
  const std::string all_acked = std::to_string(kSteps) +
                                " reports spooled, acknowledged up to seq " +
                                std::to_string(kSteps) + ", 0 dropped";
  for (const std::string& line : closing) {
    EXPECT_NE(line.find(all_acked), std::string::npos) << line;
    EXPECT_NE(line.find(", 0 refused"), std::string::npos) << line;
  }
  const auto applied = [](const std::string& line) {
    const std::size_t end = line.find(" policy updates applied");
    const std::size_t begin = line.rfind(' ', end - 1) + 1;
    return line.substr(begin, end - begin);
  };
  EXPECT_EQ(applied(closing[0]), applied(closing[1])) << closing[0] << "\n" << closing[1];
  EXPECT_EQ(servers.owner(kRun), t->taken_by);
  const std::string new_log = servers.at(t->taken_by).log();
  EXPECT_NE(new_log.find("run '" + std::string(kRun) + "' restored from the store"),
            std::string::npos)
      << new_log;

  const std::string run_key = db.value("SELECT id FROM runs WHERE run_id = $1", {kRun});
  ASSERT_FALSE(run_key.empty());
  // Every (rank, step) once; each rank's seqs 1..kSteps.
  std::map<std::pair<int, int>, int> stored;
  std::map<int, std::vector<std::int64_t>> seqs;
  for (const auto& row : db.query(
           "SELECT rank, step, seq FROM reports WHERE run = $1 ORDER BY rank, seq", {run_key})) {
    stored[{std::stoi(row[0]), std::stoi(row[1])}] += 1;
    seqs[std::stoi(row[0])].push_back(std::stoll(row[2]));
  }
  for (int rank = 0; rank < kRanks; ++rank) {
    std::string not_once;
    for (int step = 0; step < kSteps; ++step) {
      const int n = stored[{rank, step}];
      if (n != 1) not_once += " " + std::to_string(step) + " (x" + std::to_string(n) + ")";
    }
    EXPECT_EQ(not_once, "") << "rank " << rank << ", steps not stored once:" << not_once;
    ASSERT_EQ(seqs[rank].size(), static_cast<std::size_t>(kSteps)) << "rank " << rank;
    for (int i = 0; i < kSteps; ++i) ASSERT_EQ(seqs[rank][i], i + 1) << "rank " << rank;
  }
  EXPECT_EQ(stored.size(), static_cast<std::size_t>(kRanks * kSteps));

  // Every step merged once, over both ranks, none partial; no divergence.
  std::map<int, int> merged;
  std::string partial;
  for (const auto& row : db.query(
           "SELECT step, ranks FROM merged_steps WHERE run = $1 AND partial != 0 ORDER BY step",
           {run_key})) {
    partial += " " + row[0] + " (ranks " + row[1] + ")";
  }
  EXPECT_EQ(partial, "") << "steps merged partial:" << partial;
  for (const auto& row : db.query("SELECT step FROM merged_steps WHERE run = $1", {run_key})) {
    merged[std::stoi(row[0])] += 1;
  }
  int merged_once = 0;
  for (int step = 0; step < kSteps; ++step) merged_once += merged[step] == 1;
  EXPECT_EQ(merged_once, kSteps) << "steps merged other than once";
  EXPECT_EQ(merged.size(), static_cast<std::size_t>(kSteps));
  for (const auto& row :
       db.query("SELECT step, field FROM rank_divergences WHERE run = $1", {run_key})) {
    ADD_FAILURE() << "rank divergence at step " << row[0] << ": " << row[1];
  }

  // What the merge compares, compared here from the stored reports themselves: a step merged
  // partial is not compared there.
  std::string apart;
  for (const auto& row :
       db.query("SELECT a.step FROM reports a JOIN reports b ON b.run = a.run AND b.step = a.step "
                "WHERE a.run = $1 AND a.rank = 0 AND b.rank = 1 AND (a.loss_scale != b.loss_scale "
                "OR a.scale_after != b.scale_after OR a.found_inf != b.found_inf "
                "OR a.skipped != b.skipped) ORDER BY a.step",
                {run_key})) {
    apart += " " + row[0];
  }
  EXPECT_EQ(apart, "") << "steps whose ranks' scales or skips differ:" << apart;
  // Decisions numbered 1, 2, 3, ... across the move, some by the new owner; both ranks apply
  // each at the same step.
  const auto decisions = db.query(
      "SELECT engine_id, id, decided_ns FROM policy_decisions WHERE run = $1 ORDER BY engine_id",
      {run_key});
  int by_new_owner = 0;
  int applied_by_new_owner = 0;
  for (std::size_t i = 0; i < decisions.size(); ++i) {
    const auto& d = decisions[i];
    EXPECT_EQ(as_int(d[0]), static_cast<std::int64_t>(i + 1)) << "policy seq";
    const bool after_kill = as_int(d[2]) > killed_ns;
    by_new_owner += after_kill;
    const auto apps = db.query(
        "SELECT rank, step, applied FROM policy_applications WHERE policy = $1 ORDER BY rank",
        {d[1]});
    if (apps.empty()) continue;  // decided after the last step
    ASSERT_EQ(apps.size(), static_cast<std::size_t>(kRanks)) << "decision " << d[0];
    EXPECT_EQ(apps[0][1], apps[1][1])
        << "decision " << d[0] << " applied at different steps: rank 0 at " << apps[0][1]
        << ", rank 1 at " << apps[1][1];
    EXPECT_EQ(apps[0][2], "1") << "decision " << d[0];
    EXPECT_EQ(apps[1][2], "1") << "decision " << d[0];
    applied_by_new_owner += after_kill;
  }
  std::cout << "policy decisions: " << decisions.size() << ", " << by_new_owner
            << " by the new owner, " << applied_by_new_owner << " of them applied\n";
  EXPECT_GE(static_cast<int>(decisions.size()) - by_new_owner, 1) << "none before the kill";
  EXPECT_GE(applied_by_new_owner, 1) << "the new owner's decisions must reach the ranks";
}

}  // namespace
}  // namespace ampscope::testing
