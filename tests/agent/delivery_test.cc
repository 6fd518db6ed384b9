// Delivery guarantees end to end (docs/agent.md): ampscope-train with the agent and a real
// ampscope-server on loopback, through a server that is absent at first, a server killed with
// SIGKILL mid-run, and a trainer killed with SIGKILL and resumed. Every step arrives exactly
// once. Every process is killed at the end of its test, pass or fail.
#include <gtest/gtest.h>

#include <map>
#include <regex>

#include "ampscope/testing/child_process.h"
#include "ampscope/testing/files.h"
#include "ampscope/testing/net.h"
#include "ampscope/testing/server_process.h"
#include "ampscope/testing/wait_until.h"
#include "server_harness.h"
#include "trainer_run.h"

namespace ampscope::testing {
namespace {

namespace fs = std::filesystem;

// Each step in [0, steps) exactly once, and seqs gap-free from 1.
void expect_every_step_once(const std::vector<v1::StepReport>& reports, int steps) {
  std::map<std::int64_t, int> per_step;
  std::map<std::uint64_t, int> per_seq;
  for (const auto& r : reports) {
    per_step[r.step()] += 1;
    per_seq[r.seq()] += 1;
  }
  EXPECT_EQ(reports.size(), static_cast<std::size_t>(steps));
  for (int s = 0; s < steps; ++s) EXPECT_EQ(per_step[s], 1) << "step " << s;
  std::uint64_t expect = 1;
  for (const auto& [seq, n] : per_seq) {
    EXPECT_EQ(seq, expect++) << "seq gap";
    EXPECT_EQ(n, 1) << "seq " << seq;
  }
}

std::uint64_t spool_bytes(const fs::path& spool) {
  std::uint64_t n = 0;
  if (!fs::exists(spool)) return 0;
  for (const auto& e : fs::recursive_directory_iterator(spool)) {
    if (e.is_regular_file() && e.path().filename().string().rfind("seg-", 0) == 0) {
      n += e.file_size();
    }
  }
  return n;
}

// The share of step time spent inside the agent on the training thread, from the trainer's
// closing line.
double agent_share(const std::string& log) {
  std::smatch m;
  static const std::regex re(R"(training thread ([0-9.]+)% of step time)");
  if (!std::regex_search(log, m, re)) return -1;
  return std::stod(m[1].str()) / 100.0;
}

TEST(DeliveryTest, ServerAbsentThenStartedEveryStepArrivesOnce) {
  TempDir dir;
  const int port = free_loopback_port();  // the trainer starts first, with the address
  TrainerRun run{dir.path(), "absent", "127.0.0.1:" + std::to_string(port), 120, {}};
  ChildProcess trainer(run.argv(), dir / "train.log");
  // Training goes on without the server; the spool fills.
  ASSERT_TRUE(wait_until([&] { return count_lines(dir / "log.jsonl") >= 60 || !trainer.running(); },
                         120s));
  EXPECT_GT(spool_bytes(dir / "spool"), 0u);
  ServerProcess server(trainer_server(dir.path(), {}, port));
  ASSERT_EQ(trainer.wait(120s), 0) << trainer.log();
  EXPECT_EQ(count_lines(dir / "log.jsonl"), 120u);
  expect_every_step_once(stored_reports(server.address(), "absent"), 120);
  const std::string log = trainer.log();
  EXPECT_NE(log.find("120 reports spooled, acknowledged up to seq 120, 0 dropped, 0 reconnects"),
            std::string::npos)
      << log;
  const double share = agent_share(log);
  EXPECT_GE(share, 0.0) << log;
  EXPECT_LT(share, 0.25) << "the agent must not hold up training while the server is away";
}

TEST(DeliveryTest, ServerKilledMidRunAndRestartedEveryStepOnce) {
  TempDir dir;
  ServerProcess server(trainer_server(dir.path()));
  TrainerRun run{dir.path(), "server-killed", server.address(), 300, {}};
  ChildProcess trainer(run.argv(), dir / "train.log");
  ASSERT_TRUE(wait_until(
      [&] {
        auto r = get_run(server.address(), "server-killed");
        return (r && r->summary().reports() >= 40) || !trainer.running();
      },
      120s));
  server.kill9();
  const std::size_t at_kill = count_lines(dir / "log.jsonl");
  std::this_thread::sleep_for(300ms);
  server.restart();  // on the same port: the trainer reconnects to it
  ASSERT_EQ(trainer.wait(120s), 0) << trainer.log();
  EXPECT_LT(at_kill, 300u) << "the server was killed mid-run";
  expect_every_step_once(stored_reports(server.address(), "server-killed"), 300);
  // The agent's own account: one stream after the first (reports already encoded while it
  // was away carry the counter as it was then, so the trainer's closing line is the record).
  EXPECT_NE(trainer.log().find(", 0 dropped, 1 reconnects"), std::string::npos) << trainer.log();
}

TEST(DeliveryTest, TrainerKilledAndResumedReplaysTheSpool) {
  TempDir dir;
  const int port = free_loopback_port();  // no server yet: everything stays in the spool
  const std::string address = "127.0.0.1:" + std::to_string(port);
  TrainerRun run{dir.path(), "trainer-killed", address, 160,
                 {"--checkpoint-dir", (dir / "ckpt").string(), "--checkpoint-every", "20"}};
  {
    ChildProcess trainer(run.argv(), dir / "train1.log");
    ASSERT_TRUE(wait_until([&] { return count_lines(dir / "log.jsonl") >= 70; }, 120s));
    trainer.kill9();
  }
  const std::size_t killed_at = count_lines(dir / "log.jsonl");
  EXPECT_LT(killed_at, 160u);
  EXPECT_GT(spool_bytes(dir / "spool"), 0u);
  ServerProcess server(trainer_server(dir.path(), {}, port));
  run.extra.push_back("--resume");
  ChildProcess resumed(run.argv(), dir / "train2.log");
  ASSERT_EQ(resumed.wait(120s), 0) << resumed.log();
  // The first process's reports came from its spool; the steps between the checkpoint and the
  // kill ran twice but are reported once.
  expect_every_step_once(stored_reports(server.address(), "trainer-killed"), 160);
  auto summary = get_run(server.address(), "trainer-killed");
  ASSERT_TRUE(summary);
  ASSERT_EQ(summary->agents_size(), 1);
  bool replayed = false;
  for (const auto& n : summary->agents(0).notices()) {
    replayed = replayed || n.find("replaying") != std::string::npos;
  }
  EXPECT_TRUE(replayed) << "the resumed agent says it replays its predecessor's spool";
}

}  // namespace
}  // namespace ampscope::testing
