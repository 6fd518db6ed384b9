// The SQLite store on its own: schema version and migrations, what survives a reopen, the
// unique (run, rank, seq), queries, retention by age and by size, and deleting one run.
#include "store.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "server_harness.h"

namespace ampscope::server {
namespace {

using testing::make_hello;
using testing::make_report;

constexpr std::int64_t kSecond = 1'000'000'000;

class ServerStoreTest : public ::testing::Test {
 protected:
  std::string path() const { return (dir_ / "store.db").string(); }
  void add_reports(StoreWriter& w, const std::string& run, std::uint64_t from, std::uint64_t to,
                   std::int64_t received_ns, int tensors = 2) {
    w.begin();
    for (std::uint64_t seq = from; seq <= to; ++seq) {
      const v1::StepReport r = make_report(run, 0, seq, static_cast<std::int64_t>(seq), tensors);
      w.insert_report(r, r.SerializeAsString(), received_ns);
      w.set_agent_progress(run, 0, seq, received_ns, nullptr);
    }
    w.commit();
  }
  testing::TempDir dir_;
};

TEST_F(ServerStoreTest, FreshStoreIsMigratedToTheCurrentVersion) {
  StoreWriter w(StoreOptions{path(), true});
  Connection c(path(), false, true);
  EXPECT_EQ(schema_version(c), kSchemaVersion);
  EXPECT_EQ(c.query_int("SELECT count(*) FROM sqlite_master WHERE name = 'reports'"), 1);
  EXPECT_EQ(c.query_int("PRAGMA auto_vacuum"), 2);  // incremental
}

TEST_F(ServerStoreTest, StoreFromANewerServerIsRefused) {
  { StoreWriter w(StoreOptions{path(), true}); }
  {
    Connection c(path(), false, false);
    c.exec("PRAGMA user_version = " + std::to_string(kSchemaVersion + 1));
  }
  try {
    StoreWriter w(StoreOptions{path(), true});
    FAIL() << "expected StoreError";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("newer"), std::string::npos) << e.what();
  }
}

TEST_F(ServerStoreTest, ReopeningKeepsDataAndDoesNotMigrateAgain) {
  {
    StoreWriter w(StoreOptions{path(), true});
    w.begin();
    w.upsert_run(make_hello("run-s"), kSecond);
    w.upsert_agent(make_hello("run-s"), kSecond);
    w.commit();
    add_reports(w, "run-s", 1, 5, 2 * kSecond);
  }
  StoreWriter w(StoreOptions{path(), true});
  const RestoredState state = w.load_state();
  ASSERT_EQ(state.runs.size(), 1u);
  EXPECT_EQ(state.runs[0].hello.world_size(), 1u);
  ASSERT_EQ(state.agents.size(), 1u);
  EXPECT_EQ(state.agents[0].last_seq, 5u);
  EXPECT_EQ(w.reports_after("run-s", 0).size(), 5u);
}

TEST_F(ServerStoreTest, UniqueRunRankSeq) {
  StoreWriter w(StoreOptions{path(), true});
  w.begin();
  w.upsert_run(make_hello("run-s"), kSecond);
  const v1::StepReport r = make_report("run-s", 0, 1, 0, 1);
  EXPECT_GT(w.insert_report(r, r.SerializeAsString(), kSecond), 0);
  EXPECT_EQ(w.insert_report(r, r.SerializeAsString(), kSecond), 0);
  w.commit();
  StoreReader reader(path());
  v1::GetReportsRequest q;
  q.set_run_id("run-s");
  EXPECT_EQ(reader.get_reports(q)->reports_size(), 1);
}

TEST_F(ServerStoreTest, RolledBackWritesLeaveNothing) {
  StoreWriter w(StoreOptions{path(), true});
  w.begin();
  w.upsert_run(make_hello("run-s"), kSecond);
  w.commit();
  w.begin();
  const v1::StepReport r = make_report("run-s", 0, 1, 0, 1);
  w.insert_report(r, r.SerializeAsString(), kSecond);
  w.rollback();
  StoreReader reader(path());
  v1::GetReportsRequest q;
  q.set_run_id("run-s");
  EXPECT_EQ(reader.get_reports(q)->reports_size(), 0);
}

TEST_F(ServerStoreTest, RetentionByAgeDeletesOldReportsAndForgottenRuns) {
  StoreWriter w(StoreOptions{path(), true});
  w.begin();
  w.upsert_run(make_hello("old"), 1 * kSecond);
  w.upsert_agent(make_hello("old"), 1 * kSecond);
  w.upsert_run(make_hello("new"), 100 * kSecond);
  w.upsert_agent(make_hello("new"), 100 * kSecond);
  w.commit();
  add_reports(w, "old", 1, 10, 1 * kSecond);
  add_reports(w, "new", 1, 10, 90 * kSecond);
  add_reports(w, "new", 11, 20, 100 * kSecond);
  const RetentionResult r = w.apply_retention(50 * kSecond, 0, 120 * kSecond);
  EXPECT_EQ(r.deleted_reports, 10);
  EXPECT_EQ(r.deleted_runs, 1);
  StoreReader reader(path());
  const std::vector<v1::RunSummary> runs = reader.list_runs(0);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].run_id(), "new");
  EXPECT_EQ(runs[0].reports(), 20u);
}

TEST_F(ServerStoreTest, RetentionBySizeKeepsTheStoreUnderTheLimitNewestFirst) {
  StoreWriter w(StoreOptions{path(), true});
  w.begin();
  w.upsert_run(make_hello("run-s"), kSecond);
  w.upsert_agent(make_hello("run-s"), kSecond);
  w.commit();
  for (int chunk = 0; chunk < 10; ++chunk) {
    add_reports(w, "run-s", chunk * 200 + 1, chunk * 200 + 200, kSecond, 8);
  }
  const std::uint64_t before = w.live_bytes();
  const std::uint64_t limit = before / 3;
  const RetentionResult r = w.apply_retention(0, limit, 2 * kSecond);
  EXPECT_GT(r.deleted_reports, 0);
  EXPECT_LE(w.live_bytes(), limit);
  StoreReader reader(path());
  v1::GetReportsRequest q;
  q.set_run_id("run-s");
  q.set_limit(10000);
  const v1::GetReportsResponse kept = *reader.get_reports(q);
  ASSERT_GT(kept.reports_size(), 0);
  // The newest survive.
  EXPECT_EQ(kept.reports(kept.reports_size() - 1).report().seq(), 2000u);
  // The agent's last seq is kept, so replays of deleted reports are still duplicates.
  EXPECT_EQ(w.load_state().agents[0].last_seq, 2000u);
}

TEST_F(ServerStoreTest, DeleteRunRemovesEveryRowOfThatRunOnly) {
  StoreWriter w(StoreOptions{path(), true});
  w.begin();
  for (const char* run : {"gone", "kept"}) {
    w.upsert_run(make_hello(run), kSecond);
    w.upsert_agent(make_hello(run), kSecond);
  }
  w.commit();
  add_reports(w, "gone", 1, 5, kSecond);
  add_reports(w, "kept", 1, 3, kSecond);
  w.begin();
  w.add_agent_notice("gone", 0, "transport: reconnected");
  TensorTotals t;
  t.run_id = "gone";
  t.name = "h0.w";
  t.role = v1::TENSOR_ROLE_WEIGHT_GRAD;
  t.samples = 1;
  w.add_tensor_totals(t);
  w.insert_rejection("gone", 0, 9, "report.seq", "seq_order", "seq 9 twice", kSecond);
  const std::int64_t decision = w.insert_decision("gone", 1, v1::PolicyUpdate());
  w.upsert_application(decision, 0, 3, true, "");
  w.save_policy_state("gone", "observe", "{}", 0, 0, kSecond);
  w.commit();

  w.begin();
  EXPECT_EQ(w.delete_run("gone"), std::optional<std::int64_t>(5));
  EXPECT_EQ(w.delete_run("no-such-run"), std::nullopt);
  w.commit();

  Connection c(path(), false, true);
  EXPECT_EQ(c.query_int("SELECT count(*) FROM runs"), 1);
  EXPECT_EQ(c.query_int("SELECT count(*) FROM agents"), 1);
  EXPECT_EQ(c.query_int("SELECT count(*) FROM reports"), 3);
  for (const char* table : {"agent_notices", "tensor_totals", "rejections", "policy_decisions",
                            "policy_applications", "policy_state"}) {
    EXPECT_EQ(c.query_int(std::string("SELECT count(*) FROM ") + table), 0) << table;
  }
  StoreReader reader(path());
  EXPECT_FALSE(reader.get_run("gone", 0).has_value());
  EXPECT_EQ(reader.get_run("kept", 0)->summary().reports(), 3u);

  // The same id can start again: a new run, nothing of the old one.
  w.begin();
  w.upsert_run(make_hello("gone"), 2 * kSecond);
  w.upsert_agent(make_hello("gone"), 2 * kSecond);
  w.commit();
  add_reports(w, "gone", 1, 2, 2 * kSecond);
  EXPECT_EQ(reader.get_run("gone", 0)->summary().reports(), 2u);
}

TEST_F(ServerStoreTest, RetentionNamesTheRunsItDeletedAndSparesThoseToKeep) {
  StoreWriter w(StoreOptions{path(), true});
  for (const char* run : {"old-a", "old-b", "connected"}) {
    w.begin();
    w.upsert_run(make_hello(run), kSecond);
    w.upsert_agent(make_hello(run), kSecond);
    w.commit();
    add_reports(w, run, 1, 3, kSecond);
  }
  const RetentionResult r = w.apply_retention(50 * kSecond, 0, 120 * kSecond, {"connected"});
  EXPECT_EQ(r.deleted_reports, 9);
  EXPECT_EQ(r.deleted_runs, 2);
  std::vector<std::string> ids = r.deleted_run_ids;
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(ids, (std::vector<std::string>{"old-a", "old-b"}));
  StoreReader reader(path());
  const std::vector<v1::RunSummary> runs = reader.list_runs(0);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].run_id(), "connected");
}

}  // namespace
}  // namespace ampscope::server
