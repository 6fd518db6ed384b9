// The real ampscope-server on loopback: ingest and query, acknowledgement only after commit
// (kill -9 right after an ack, restart, everything acknowledged is there), duplicates dropped
// on replay (also across a restart), graceful shutdown that loses nothing it received, and
// retention that forgets the runs it deletes (and never deletes one whose agent is connected).
#include <gtest/gtest.h>

#include <set>
#include <thread>

#include "ampscope/testing/wait_until.h"
#include "server_harness.h"

namespace ampscope::testing {
namespace {

class ServerIngestTest : public ::testing::Test {
 protected:
  std::filesystem::path db() const { return dir_ / "store.db"; }
  std::unique_ptr<v1::Query::Stub> query(const ServerProcess& s) {
    return v1::Query::NewStub(make_channel(s.address()));
  }
  v1::GetReportsResponse reports(const ServerProcess& s, const std::string& run,
                                 std::int64_t from = 0, std::int64_t to = 0) {
    v1::GetReportsRequest q;
    q.set_run_id(run);
    q.set_from_step(from);
    q.set_to_step(to);
    q.set_limit(10000);
    v1::GetReportsResponse out;
    grpc::ClientContext ctx;
    const grpc::Status st = query(s)->GetReports(&ctx, q, &out);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return out;
  }
  TempDir dir_;
};

TEST_F(ServerIngestTest, StoresReportsAndAnswersQueries) {
  ServerProcess server(dir_.path(), db());
  for (std::uint32_t rank = 0; rank < 2; ++rank) {
    AgentStream agent(make_channel(server.address()));
    ASSERT_TRUE(agent.send_hello(make_hello("run-a", rank, 2)));
    for (std::uint64_t seq = 1; seq <= 10; ++seq) {
      v1::StepReport r = make_report("run-a", rank, seq, static_cast<std::int64_t>(seq - 1));
      if (seq == 4) {
        r.set_found_inf(true);
        r.set_skipped(true);
        r.set_grad_norm(std::numeric_limits<double>::infinity());
        r.set_scale_after(32768.0);
        r.mutable_first_offender()->set_tensor("h1.mlp.fc.out.grad");
        r.mutable_first_offender()->set_role(v1::TENSOR_ROLE_ACTIVATION_GRAD);
        r.mutable_first_offender()->set_order(7);
      }
      ASSERT_TRUE(agent.send(r));
    }
    ASSERT_TRUE(agent.wait_ack(10).has_value());
    EXPECT_TRUE(agent.finish().ok());
  }
  auto stub = query(server);
  {
    v1::ListRunsResponse runs;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->ListRuns(&ctx, v1::ListRunsRequest(), &runs).ok());
    ASSERT_EQ(runs.runs_size(), 1);
    const v1::RunSummary& s = runs.runs(0);
    EXPECT_EQ(s.run_id(), "run-a");
    EXPECT_EQ(s.world_size(), 2u);
    EXPECT_EQ(s.reports(), 20u);
    EXPECT_EQ(s.steps(), 10u);
    EXPECT_EQ(s.first_step(), 0);
    EXPECT_EQ(s.last_step(), 9);
    EXPECT_EQ(s.skipped_steps(), 1u);
  }
  {
    v1::GetRunRequest q;
    q.set_run_id("run-a");
    v1::GetRunResponse run;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->GetRun(&ctx, q, &run).ok());
    ASSERT_EQ(run.agents_size(), 2);
    EXPECT_EQ(run.agents(1).last_seq(), 10u);
    ASSERT_EQ(run.skipped_steps_size(), 1);
    EXPECT_EQ(run.skipped_steps(0).step(), 3);
    EXPECT_EQ(run.skipped_steps(0).first_offender().tensor(), "h1.mlp.fc.out.grad");
    EXPECT_NE(run.skipped_steps(0).why().find("h1.mlp.fc.out.grad"), std::string::npos);
    ASSERT_EQ(run.first_offenders_size(), 2);  // both ranks reported one at step 3
    // Scale 65536 until step 3, then 32768 was never used by a report (scale_after only):
    // the timeline follows loss_scale of rank 0.
    ASSERT_GE(run.scale_timeline_size(), 1);
    EXPECT_EQ(run.scale_timeline(0).loss_scale(), 65536.0);
  }
  const v1::GetReportsResponse range = reports(server, "run-a", 2, 4);
  ASSERT_EQ(range.reports_size(), 6);  // steps 2..4, two ranks
  EXPECT_EQ(range.reports(0).report().step(), 2);
  EXPECT_EQ(range.reports(0).report().rank(), 0u);
  EXPECT_EQ(range.reports(5).report().step(), 4);
  EXPECT_EQ(range.reports(0).report().tensors_size(), 0);  // include_tensors not asked

  {
    v1::GetRunRequest q;
    q.set_run_id("no-such-run");
    v1::GetRunResponse run;
    grpc::ClientContext ctx;
    const grpc::Status st = stub->GetRun(&ctx, q, &run);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_NE(st.error_message().find("no-such-run"), std::string::npos);
  }
  {
    v1::GetReportsRequest q;
    q.set_run_id("bad run id!");
    v1::GetReportsResponse out;
    grpc::ClientContext ctx;
    const grpc::Status st = stub->GetReports(&ctx, q, &out);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(st.error_message().find("run_id"), std::string::npos);
  }
  EXPECT_EQ(server.terminate(), 0);
}

TEST_F(ServerIngestTest, PagesReportsInStepOrderAndTailsInArrivalOrder) {
  ServerProcess server(dir_.path(), db());
  AgentStream agent(make_channel(server.address()));
  ASSERT_TRUE(agent.send_hello(make_hello("run-p")));
  for (std::uint64_t seq = 1; seq <= 25; ++seq) {
    ASSERT_TRUE(agent.send(make_report("run-p", 0, seq, static_cast<std::int64_t>(seq), 1)));
  }
  ASSERT_TRUE(agent.wait_ack(25).has_value());
  auto stub = query(server);
  std::vector<std::int64_t> steps;
  std::string token;
  do {
    v1::GetReportsRequest q;
    q.set_run_id("run-p");
    q.set_limit(10);
    q.set_page_token(token);
    v1::GetReportsResponse out;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->GetReports(&ctx, q, &out).ok());
    for (const auto& r : out.reports()) steps.push_back(r.report().step());
    token = out.next_page_token();
  } while (!token.empty());
  ASSERT_EQ(steps.size(), 25u);
  for (std::size_t i = 0; i < steps.size(); ++i) EXPECT_EQ(steps[i], static_cast<int>(i) + 1);

  v1::GetReportsRequest q;
  q.set_run_id("run-p");
  q.set_order(v1::REPORT_ORDER_ARRIVAL);
  q.set_latest(true);
  q.set_limit(3);
  v1::GetReportsResponse last;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub->GetReports(&ctx, q, &last).ok());
  ASSERT_EQ(last.reports_size(), 3);
  EXPECT_EQ(last.reports(0).report().seq(), 23u);
  EXPECT_EQ(last.reports(2).report().seq(), 25u);
  EXPECT_LT(last.reports(0).report_id(), last.reports(2).report_id());
}

TEST_F(ServerIngestTest, AcknowledgedReportsSurviveKill9) {
  std::uint64_t acked = 0;
  {
    ServerProcess server(dir_.path(), db());
    AgentStream agent(make_channel(server.address()));
    ASSERT_TRUE(agent.send_hello(make_hello("run-k")));
    for (std::uint64_t seq = 1; seq <= 200; ++seq) {
      ASSERT_TRUE(agent.send(make_report("run-k", 0, seq, static_cast<std::int64_t>(seq), 2)));
      if (seq == 120) {
        // The moment an ack arrives, the process dies without any chance to flush.
        const std::optional<std::uint64_t> ack = agent.wait_ack(1);
        ASSERT_TRUE(ack.has_value());
        server.kill9();
        acked = agent.highest_ack();
        break;
      }
    }
  }
  ASSERT_GT(acked, 0u);
  ServerProcess restarted(dir_.path(), db());
  const v1::GetReportsResponse stored = reports(restarted, "run-k");
  ASSERT_GE(stored.reports_size(), static_cast<int>(acked));
  for (std::uint64_t i = 0; i < acked; ++i) {
    EXPECT_EQ(stored.reports(static_cast<int>(i)).report().seq(), i + 1);
  }
  // The restored last seq: a new stream is told where the server is.
  AgentStream agent(make_channel(restarted.address()));
  ASSERT_TRUE(agent.send_hello(make_hello("run-k")));
  const std::optional<std::uint64_t> first = agent.wait_ack(0);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(*first, static_cast<std::uint64_t>(stored.reports_size()));
}

TEST_F(ServerIngestTest, ReplayedReportsAreDroppedAsDuplicatesAlsoAfterRestart) {
  {
    ServerProcess server(dir_.path(), db());
    {
      AgentStream agent(make_channel(server.address()));
      ASSERT_TRUE(agent.send_hello(make_hello("run-d")));
      for (std::uint64_t seq = 1; seq <= 10; ++seq) {
        ASSERT_TRUE(agent.send(make_report("run-d", 0, seq, static_cast<std::int64_t>(seq), 1)));
      }
      ASSERT_TRUE(agent.wait_ack(10).has_value());
      EXPECT_TRUE(agent.finish().ok());
    }
    {
      // A reconnecting agent replays its whole spool: 1..15.
      AgentStream replay(make_channel(server.address()));
      v1::Hello hello = make_hello("run-d");
      hello.set_resume_from_seq(1);
      ASSERT_TRUE(replay.send_hello(hello));
      const std::optional<std::uint64_t> first = replay.wait_ack(0);
      ASSERT_TRUE(first.has_value());
      EXPECT_EQ(*first, 10u);
      for (std::uint64_t seq = 1; seq <= 15; ++seq) {
        ASSERT_TRUE(replay.send(make_report("run-d", 0, seq, static_cast<std::int64_t>(seq), 1)));
      }
      ASSERT_TRUE(replay.wait_ack(15).has_value());
      EXPECT_TRUE(replay.finish().ok());
    }
    EXPECT_EQ(reports(server, "run-d").reports_size(), 15);
    v1::ListRunsResponse runs;
    grpc::ClientContext ctx;
    ASSERT_TRUE(query(server)->ListRuns(&ctx, v1::ListRunsRequest(), &runs).ok());
    EXPECT_EQ(runs.runs(0).duplicate_reports(), 10u);
    EXPECT_EQ(server.terminate(), 0);
  }
  ServerProcess restarted(dir_.path(), db());
  AgentStream replay(make_channel(restarted.address()));
  ASSERT_TRUE(replay.send_hello(make_hello("run-d")));
  for (std::uint64_t seq = 10; seq <= 16; ++seq) {
    ASSERT_TRUE(replay.send(make_report("run-d", 0, seq, static_cast<std::int64_t>(seq), 1)));
  }
  ASSERT_TRUE(replay.wait_ack(16).has_value());
  const v1::GetReportsResponse stored = reports(restarted, "run-d");
  ASSERT_EQ(stored.reports_size(), 16);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(stored.reports(i).report().seq(), i + 1u);
}

TEST_F(ServerIngestTest, GracefulShutdownCommitsAndAcknowledgesEverythingReceived) {
  constexpr std::uint32_t kRanks = 4;
  std::vector<std::uint64_t> acked(kRanks, 0);
  std::vector<bool> drained(kRanks, false);  // the stream ended with the server's drain status
  {
    ServerProcess server(dir_.path(), db());
    std::vector<std::unique_ptr<AgentStream>> agents;
    for (std::uint32_t rank = 0; rank < kRanks; ++rank) {
      agents.push_back(std::make_unique<AgentStream>(make_channel(server.address())));
      ASSERT_TRUE(agents.back()->send_hello(make_hello("run-g", rank, kRanks)));
    }
    // Keep every stream busy while SIGTERM arrives.
    std::vector<std::thread> senders;
    std::atomic<bool> stop{false};
    for (std::uint32_t rank = 0; rank < kRanks; ++rank) {
      senders.emplace_back([&, rank] {
        for (std::uint64_t seq = 1; seq <= 400 && !stop; ++seq) {
          if (!agents[rank]->send(
                  make_report("run-g", rank, seq, static_cast<std::int64_t>(seq), 2))) {
            break;
          }
        }
      });
    }
    ASSERT_TRUE(agents[0]->wait_ack(20).has_value());
    EXPECT_EQ(server.terminate(), 0) << server.log();
    stop = true;
    for (auto& t : senders) t.join();
    for (std::uint32_t rank = 0; rank < kRanks; ++rank) {
      const grpc::Status st = agents[rank]->wait_end();
      EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
      acked[rank] = agents[rank]->highest_ack();
      drained[rank] =
          st.error_message().find("everything received is acknowledged") != std::string::npos;
    }
  }
  ServerProcess restarted(dir_.path(), db());
  std::vector<std::uint64_t> stored(kRanks, 0);
  const v1::GetReportsResponse first = reports(restarted, "run-g");
  for (const auto& r : first.reports()) ++stored.at(r.report().rank());
  std::uint64_t total_acked = 0;
  for (std::uint32_t rank = 0; rank < kRanks; ++rank) {
    total_acked += acked[rank];
    // Nothing is acknowledged that was not committed.
    EXPECT_GE(stored[rank], acked[rank]) << "rank " << rank;
    // A stream that ended with the server's drain status received the Ack of everything the
    // server read. When the agent's own write hit the closing connection first ("Broken pipe")
    // the transport drops what was still unread on the client, so the last Acks may be lost
    // there; the agent then replays those reports and the server drops them as duplicates.
    if (drained[rank]) {
      EXPECT_EQ(stored[rank], acked[rank]) << "rank " << rank;
    }
  }
  ASSERT_GT(total_acked, 0u);
  // The replay after a lost Ack: every stored report sent again is a duplicate, nothing new.
  {
    AgentStream agent(make_channel(restarted.address()));
    ASSERT_TRUE(agent.send_hello(make_hello("run-g", 0, kRanks)));
    for (std::uint64_t seq = acked[0] + 1; seq <= stored[0]; ++seq) {
      ASSERT_TRUE(agent.send(make_report("run-g", 0, seq, static_cast<std::int64_t>(seq), 2)));
    }
    if (stored[0] > 0) {
      EXPECT_EQ(agent.wait_ack(stored[0]), std::optional<std::uint64_t>(stored[0]));
    }
    EXPECT_TRUE(agent.finish().ok());
  }
  std::uint64_t after = 0;
  const v1::GetReportsResponse again = reports(restarted, "run-g");
  for (const auto& r : again.reports()) after += r.report().rank() == 0 ? 1 : 0;
  EXPECT_EQ(after, stored[0]);
}

TEST_F(ServerIngestTest, RetentionDeletesReportsOlderThanTheLimitWhileServing) {
  ServerProcess server(dir_.path(), db(),
                       {"--retention-max-age", "1s", "--retention-interval", "200ms"});
  {
    AgentStream agent(make_channel(server.address()));
    ASSERT_TRUE(agent.send_hello(make_hello("run-old")));
    for (std::uint64_t seq = 1; seq <= 5; ++seq) {
      ASSERT_TRUE(agent.send(make_report("run-old", 0, seq, static_cast<std::int64_t>(seq), 1)));
    }
    ASSERT_TRUE(agent.wait_ack(5).has_value());
    EXPECT_TRUE(agent.finish().ok());
  }
  ASSERT_EQ(reports(server, "run-old").reports_size(), 5);
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  int left = 5;
  while (left > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(100ms);
    v1::ListRunsResponse runs;
    grpc::ClientContext ctx;
    ASSERT_TRUE(query(server)->ListRuns(&ctx, v1::ListRunsRequest(), &runs).ok());
    left = runs.runs_size() == 0 ? 0 : static_cast<int>(runs.runs(0).reports());
  }
  EXPECT_EQ(left, 0);
  const std::vector<Sample> m = parse_samples(scrape(server.metrics_address()));
  EXPECT_EQ(sample_value(m, "ampscope_retention_deleted_reports_total"), 5);
}

TEST_F(ServerIngestTest, RetentionForgetsTheRunsItDeletesEverywhere) {
  ServerProcess server(dir_.path(), db(),
                       {"--retention-max-age", "1s", "--retention-interval", "200ms"});
  send_reports(make_channel(server.address()), "run-old", 1, 5);
  EXPECT_FALSE(find_samples(parse_samples(scrape(server.metrics_address())), "ampscope_steps_total",
                            {{"run", "run-old"}})
                   .empty());
  ASSERT_TRUE(wait_until([&] { return !get_run(server.address(), "run-old").has_value(); }, 10s));

  // Its series left /metrics with it.
  for (const Sample& s : parse_samples(scrape(server.metrics_address()))) {
    EXPECT_FALSE(s.labels.contains("run") && s.labels.at("run") == "run-old") << s.name;
  }
  // A new agent of the same run starts afresh: the server remembers none of the old seqs (it
  // answers the Hello with Ack(0)) and stores seq 1.. instead of dropping them as replays.
  AgentStream agent(make_channel(server.address()));
  ASSERT_TRUE(agent.send_hello(make_hello("run-old")));
  ASSERT_TRUE(agent.wait_ack(0).has_value());
  EXPECT_EQ(agent.highest_ack(), 0u);
  for (std::uint64_t seq = 1; seq <= 3; ++seq) {
    ASSERT_TRUE(agent.send(make_report("run-old", 0, seq, static_cast<std::int64_t>(seq), 1)));
  }
  ASSERT_TRUE(agent.wait_ack(3).has_value());
  double duplicates = 0;
  for (const Sample& s : find_samples(parse_samples(scrape(server.metrics_address())),
                                      "ampscope_reports_duplicate_total", {{"run", "run-old"}})) {
    duplicates += s.value;
  }
  EXPECT_EQ(duplicates, 0);
  EXPECT_TRUE(agent.finish().ok());
}

TEST_F(ServerIngestTest, RetentionKeepsARunWhoseAgentIsConnected) {
  ServerProcess server(dir_.path(), db(),
                       {"--retention-max-age", "1s", "--retention-interval", "200ms"});
  AgentStream agent(make_channel(server.address()));
  ASSERT_TRUE(agent.send_hello(make_hello("run-quiet")));
  for (std::uint64_t seq = 1; seq <= 2; ++seq) {
    ASSERT_TRUE(agent.send(make_report("run-quiet", 0, seq, static_cast<std::int64_t>(seq), 1)));
  }
  ASSERT_TRUE(agent.wait_ack(2).has_value());
  // Its reports age out; the run, quiet for longer than the limit, stays while its agent is
  // connected, and the agent's next report is stored.
  ASSERT_TRUE(wait_until(
      [&] {
        const std::optional<v1::GetRunResponse> run = get_run(server.address(), "run-quiet");
        return !run || run->summary().reports() == 0;
      },
      10s));
  std::this_thread::sleep_for(1s);
  ASSERT_TRUE(get_run(server.address(), "run-quiet").has_value());
  ASSERT_TRUE(agent.send(make_report("run-quiet", 0, 3, 3, 1)));
  EXPECT_TRUE(agent.wait_ack(3).has_value()) << server.log();
  EXPECT_TRUE(agent.finish().ok());
}

// The ingest shard that settles `run`, as the server logged it at the run's first Hello.
std::optional<int> logged_shard(const ServerProcess& server, const std::string& run) {
  const std::string needle = "run '" + run + "' is settled by ingest shard ";
  const std::string log = server.log();
  const std::size_t at = log.find(needle);
  if (at == std::string::npos) return std::nullopt;
  return std::stoi(log.substr(at + needle.size()));
}

// Two runs on different shards are settled at the same time: each shard's batches take 40 ms
// per item (the test hook, outside the store lock), so 2 x 10 reports take 800 ms one after the
// other and about half of that on two shards. Each run's reports are stored in its order.
TEST_F(ServerIngestTest, RunsOnDifferentShardsIngestConcurrentlyInOrder) {
  constexpr std::uint64_t kReports = 10;
  constexpr auto kItemDelay = 40ms;
  ServerProcess server(dir_.path(), db(),
                       {"--ingest-shards", "4", "--sync", "normal", "--test-ingest-item-delay-us",
                        std::to_string(std::chrono::microseconds(kItemDelay).count())});
  const std::vector<std::string> runs = {"shard-a", "shard-b"};
  std::vector<std::unique_ptr<AgentStream>> agents;
  for (const std::string& run : runs) {
    agents.push_back(std::make_unique<AgentStream>(make_channel(server.address())));
    ASSERT_TRUE(agents.back()->send_hello(make_hello(run)));
    ASSERT_TRUE(agents.back()->wait_ack(0).has_value());
  }
  const std::optional<int> a = logged_shard(server, runs[0]);
  const std::optional<int> b = logged_shard(server, runs[1]);
  ASSERT_TRUE(a && b) << server.log();
  ASSERT_NE(*a, *b) << "the test needs runs on two shards";

  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> senders;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    senders.emplace_back([&, i] {
      for (std::uint64_t seq = 1; seq <= kReports; ++seq) {
        // One report at a time, each its own batch.
        EXPECT_TRUE(
            agents[i]->send(make_report(runs[i], 0, seq, static_cast<std::int64_t>(seq), 2)));
        EXPECT_TRUE(agents[i]->wait_ack(seq).has_value());
      }
    });
  }
  for (std::thread& t : senders) t.join();
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_LT(elapsed, kItemDelay * kReports * runs.size() * 3 / 4)
      << "the shards did not overlap: "
      << std::chrono::duration_cast<std::chrono::milliseconds>(elapsed).count() << " ms";

  for (std::size_t i = 0; i < runs.size(); ++i) {
    EXPECT_TRUE(agents[i]->finish().ok());
    const v1::GetReportsResponse got = reports(server, runs[i]);
    ASSERT_EQ(got.reports_size(), static_cast<int>(kReports)) << runs[i];
    // In step order, and stored (report_id: commit order) in the order they were sent.
    for (int k = 0; k < got.reports_size(); ++k) {
      EXPECT_EQ(got.reports(k).report().seq(), static_cast<std::uint64_t>(k + 1)) << runs[i];
      if (k > 0) EXPECT_GT(got.reports(k).report_id(), got.reports(k - 1).report_id());
    }
  }
}

// Deleting a run works whichever shard settles it, while the runs of the other shards stream on;
// a run deleted starts afresh at its next Hello.
TEST_F(ServerIngestTest, DeletesRunsOnEveryShard) {
  ServerProcess server(dir_.path(), db(), {"--ingest-shards", "4", "--sync", "normal"});
  const std::vector<std::string> runs = {"del-a", "del-b", "del-c", "del-d"};
  for (const std::string& run : runs) send_reports(make_channel(server.address()), run, 1, 3);
  std::set<int> shards;
  for (const std::string& run : runs) {
    const std::optional<int> shard = logged_shard(server, run);
    ASSERT_TRUE(shard.has_value()) << run;
    shards.insert(*shard);
  }
  EXPECT_GE(shards.size(), 3u);

  // A run that keeps streaming on its shard while the others are deleted.
  AgentStream live(make_channel(server.address()));
  ASSERT_TRUE(live.send_hello(make_hello("shard-c")));
  for (std::size_t i = 0; i < runs.size(); ++i) {
    ASSERT_TRUE(live.send(make_report("shard-c", 0, i + 1, static_cast<std::int64_t>(i + 1), 1)));
    EXPECT_TRUE(delete_run(server.address(), runs[i]).ok()) << runs[i];
    EXPECT_FALSE(get_run(server.address(), runs[i]).has_value()) << runs[i];
  }
  ASSERT_TRUE(live.wait_ack(runs.size()).has_value());
  EXPECT_TRUE(live.finish().ok());
  EXPECT_EQ(reports(server, "shard-c").reports_size(), static_cast<int>(runs.size()));

  for (const std::string& run : runs) {
    send_reports(make_channel(server.address()), run, 1, 2);
    const std::optional<v1::GetRunResponse> again = get_run(server.address(), run);
    ASSERT_TRUE(again.has_value()) << run;
    EXPECT_EQ(again->summary().reports(), 2u) << run;
  }
}

// Retention runs on shard 0 and deletes runs of every shard; each is forgotten by its own shard
// (its series leave /metrics, and a new agent of it starts afresh).
TEST_F(ServerIngestTest, RetentionForgetsRunsOfEveryShard) {
  ServerProcess server(dir_.path(), db(),
                       {"--ingest-shards", "4", "--retention-max-age", "1s", "--retention-interval",
                        "200ms", "--sync", "normal"});
  const std::vector<std::string> runs = {"old-a", "old-b", "old-c"};
  for (const std::string& run : runs) send_reports(make_channel(server.address()), run, 1, 3);
  std::set<int> shards;
  for (const std::string& run : runs) {
    const std::optional<int> shard = logged_shard(server, run);
    ASSERT_TRUE(shard.has_value()) << run;
    shards.insert(*shard);
  }
  EXPECT_GE(shards.size(), 2u);
  EXPECT_TRUE(shards.contains(0) && shards.size() > 1) << "runs on shard 0 and on others";
  for (const std::string& run : runs) {
    ASSERT_TRUE(wait_until([&] { return !get_run(server.address(), run).has_value(); }, 10s))
        << run;
  }
  ASSERT_TRUE(wait_until(
      [&] {
        for (const Sample& s : parse_samples(scrape(server.metrics_address()))) {
          if (s.labels.contains("run") && s.labels.at("run").starts_with("old-")) return false;
        }
        return true;
      },
      5s));
  for (const std::string& run : runs) {
    AgentStream agent(make_channel(server.address()));
    ASSERT_TRUE(agent.send_hello(make_hello(run)));
    ASSERT_TRUE(agent.wait_ack(0).has_value());
    EXPECT_EQ(agent.highest_ack(), 0u) << run;
    ASSERT_TRUE(agent.send(make_report(run, 0, 1, 1, 1)));
    ASSERT_TRUE(agent.wait_ack(1).has_value()) << run;
    EXPECT_TRUE(agent.finish().ok());
  }
}

}  // namespace
}  // namespace ampscope::testing
