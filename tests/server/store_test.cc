// The store on its own, on each back end: schema version and migrations, what survives a
// reopen, the unique (run, rank, seq), queries, retention by age and by size, and deleting one
// run. Then what only one back end has: SQLite's migrations; PostgreSQL's migration lock, its
// errors and its connection strings.
#include "store.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <thread>
#include <tuple>

#include "ampscope/testing/net.h"
#include "pg_connection.h"
#include "server_harness.h"
#include "store_backends.h"

namespace ampscope::server {
namespace {

using testing::make_hello;
using testing::make_report;

constexpr std::int64_t kSecond = 1'000'000'000;

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

using ServerStoreTest = StoreBackendTest;
INSTANTIATE_STORE_BACKENDS(ServerStoreTest);

// Whether the store has a table or index of that name.
bool has_relation(Connection& c, const std::string& name) {
  if (c.backend() == Backend::kSqlite) {
    return c.query_int("SELECT count(*) FROM sqlite_master WHERE name = '" + name + "'") == 1;
  }
  return c.query_int("SELECT CASE WHEN to_regclass('" + name + "') IS NULL THEN 0 ELSE 1 END") == 1;
}

TEST_P(ServerStoreTest, FreshStoreIsMigratedToTheCurrentVersion) {
  StoreWriter w(StoreOptions{path(), true});
  const auto c = connect();
  EXPECT_EQ(schema_version(*c), current_schema_version(backend()));
  for (const char* name : {"reports", "report_counts", "tensor_history", "merged_steps_offender",
                           "reports_series", "run_leases", "quantizer_totals"}) {
    EXPECT_TRUE(has_relation(*c, name)) << name;
  }
  if (backend() == Backend::kSqlite) {
    EXPECT_EQ(c->query_int("PRAGMA auto_vacuum"), 2);  // incremental
  }
}

TEST(SqliteStoreTest, AVersion4StoreGetsTheMergedOffenderIndexAndTheRunLeases) {
  const StoreLocation store(Backend::kSqlite);
  { StoreWriter w(StoreOptions{store.path(), true}); }
  store.connect()->exec(
      "DROP INDEX merged_steps_offender; DROP TABLE run_leases; DROP TABLE quantizer_totals; "
      "PRAGMA user_version = 4;");
  ASSERT_FALSE(has_relation(*store.connect(), "run_leases"));
  { StoreWriter w(StoreOptions{store.path(), true}); }
  const auto c = store.connect();
  EXPECT_EQ(schema_version(*c), kSchemaVersion);
  EXPECT_TRUE(has_relation(*c, "merged_steps_offender"));
  EXPECT_TRUE(has_relation(*c, "run_leases"));
}

// The quantisers' table arrives as a migration of its own on both back ends (SQLite 6 -> 7,
// PostgreSQL 2 -> 3), with what was stored before left as it was.
TEST_P(ServerStoreTest, AStoreBeforeQuantizersGetsTheirTableAndKeepsItsReports) {
  {
    StoreWriter w(StoreOptions{path(), true});
    w.begin();
    w.upsert_run(make_hello("run-q"), kSecond);
    w.upsert_agent(make_hello("run-q"), kSecond);
    w.commit();
    add_reports(w, "run-q", 1, 3, kSecond);
  }
  connect()->exec(backend() == Backend::kSqlite
                      ? "DROP TABLE quantizer_totals; PRAGMA user_version = 6;"
                      : "DROP TABLE quantizer_totals; "
                        "DELETE FROM ampscope_schema WHERE version >= 3;");
  ASSERT_FALSE(has_relation(*connect(), "quantizer_totals"));
  { StoreWriter w(StoreOptions{path(), true}); }
  const auto c = connect();
  EXPECT_EQ(schema_version(*c), current_schema_version(backend()));
  EXPECT_TRUE(has_relation(*c, "quantizer_totals"));
  EXPECT_EQ(c->query_int("SELECT count(*) FROM reports"), 3);
}

TEST_P(ServerStoreTest, StoreFromANewerServerIsRefused) {
  { StoreWriter w(StoreOptions{path(), true}); }
  const std::string newer = std::to_string(current_schema_version(backend()) + 1);
  connect()->exec(backend() == Backend::kSqlite
                      ? "PRAGMA user_version = " + newer
                      : "INSERT INTO ampscope_schema (version) VALUES (" + newer + ")");
  try {
    StoreWriter w(StoreOptions{path(), true});
    FAIL() << "expected StoreError";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("newer"), std::string::npos) << e.what();
  }
}

TEST_P(ServerStoreTest, ReopeningKeepsDataAndDoesNotMigrateAgain) {
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

TEST_P(ServerStoreTest, UniqueRunRankSeq) {
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

TEST_P(ServerStoreTest, DecisionsKeepPerLayerPrecisionAndTheFoldKeepsTheLatest) {
  StoreWriter w(StoreOptions{path(), true});
  w.begin();
  w.upsert_run(make_hello("run-p"), kSecond);
  v1::PolicyUpdate moved;
  moved.set_run_id("run-p");
  moved.set_seq(1);
  moved.set_bf16_gemms_set(true);
  moved.add_bf16_gemms("h0.mlp.fc");
  moved.add_bf16_gemms("h1.mlp.fc");
  moved.set_amax_history_length(8);
  moved.set_reason("bf16 h0.mlp.fc: ...");
  w.insert_decision("run-p", 1, moved);
  v1::PolicyUpdate back;  // h0.mlp.fc back to the recipe, the margin raised
  back.set_run_id("run-p");
  back.set_seq(2);
  back.set_bf16_gemms_set(true);
  back.add_bf16_gemms("h1.mlp.fc");
  back.set_amax_margin(1);
  w.insert_decision("run-p", 2, back);
  w.commit();
  StoreReader reader(path());
  const std::optional<v1::GetPolicyResponse> p = reader.get_policy("run-p");
  ASSERT_TRUE(p.has_value());
  ASSERT_EQ(p->history_size(), 2);
  EXPECT_EQ(p->history(0).update().bf16_gemms_size(), 2);
  EXPECT_EQ(p->history(0).update().amax_history_length(), 8u);
  EXPECT_FALSE(p->history(0).update().has_amax_margin());
  const v1::PolicyUpdate& current = p->current();
  EXPECT_TRUE(current.bf16_gemms_set());
  ASSERT_EQ(current.bf16_gemms_size(), 1);
  EXPECT_EQ(current.bf16_gemms(0), "h1.mlp.fc");
  EXPECT_EQ(current.amax_history_length(), 8u);
  EXPECT_EQ(current.amax_margin(), 1u);
  EXPECT_EQ(current.seq(), 2u);
}

TEST_P(ServerStoreTest, RolledBackWritesLeaveNothing) {
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

TEST_P(ServerStoreTest, RetentionByAgeDeletesOldReportsAndForgottenRuns) {
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

TEST_P(ServerStoreTest, RetentionBySizeKeepsTheStoreUnderTheLimitNewestFirst) {
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

// A tensor's totals keep the format of its latest sample that had a target: samples without
// one (a weight gradient measured after unscaling) add their counts and leave the format.
TEST_P(ServerStoreTest, TensorTotalsKeepTheLatestTargetFormat) {
  StoreWriter w(StoreOptions{path(), true});
  w.begin();
  w.upsert_run(make_hello("run"), kSecond);
  w.upsert_agent(make_hello("run"), kSecond);
  TensorTotals t;
  t.run_id = "run";
  t.name = "h0.w";
  t.role = v1::TENSOR_ROLE_WEIGHT_GRAD;
  t.format = v1::FORMAT_FP16;
  t.samples = 1;
  t.values = 100;
  t.underflow = 7;
  w.add_tensor_totals(t);
  w.commit();
  w.begin();
  t.format = 0;
  t.values = 0;
  t.underflow = 0;
  t.nonfinite = 3;
  w.add_tensor_totals(t);
  w.commit();
  add_reports(w, "run", 1, 1, kSecond);

  const RestoredState state = w.load_state();
  ASSERT_EQ(state.tensors.size(), 1u);
  EXPECT_EQ(state.tensors[0].format, v1::FORMAT_FP16);
  EXPECT_EQ(state.tensors[0].samples, 2u);
  EXPECT_EQ(state.tensors[0].nonfinite, 3u);
  StoreReader reader(path());
  const auto run = reader.get_run("run", 0);
  ASSERT_TRUE(run.has_value());
  ASSERT_GE(run->worst_underflow_size(), 1);
  EXPECT_EQ(run->worst_underflow(0).format(), v1::FORMAT_FP16);
  EXPECT_DOUBLE_EQ(run->worst_underflow(0).underflow_ratio(), 0.07);
}

// add_tensor_totals over many tensors (multi-row statements of at most 50 rows) adds up as
// the same deltas given one at a time: 123 tensors, so 50 + 50 + 23 rows, added twice so that
// the second round updates every row (a format of 0 keeps the stored one, max_abs and
// last_step keep the larger).
TEST_P(ServerStoreTest, ManyTensorTotalsAddUpAsOneAtATime) {
  StoreWriter w(StoreOptions{path(), true});
  w.begin();
  for (const char* run : {"rows", "single"}) {
    w.upsert_run(make_hello(run), kSecond);
    w.upsert_agent(make_hello(run), kSecond);
  }
  w.commit();
  constexpr int kTensors = 123;
  const auto delta = [](int round, int i) {
    TensorTotals t;
    t.name = "layer" + std::to_string(i);
    t.role = i % 2 == 0 ? v1::TENSOR_ROLE_WEIGHT_GRAD : v1::TENSOR_ROLE_ACTIVATION_GRAD;
    t.format = round == 1 && i % 3 == 0 ? 0 : (i % 2 == 0 ? v1::FORMAT_FP16 : v1::FORMAT_BF16);
    t.samples = 1 + round;
    t.values = 100 * static_cast<std::uint64_t>(i) + round;
    t.overflow = i % 5;
    t.underflow = i % 7 + round;
    t.nonfinite = i % 11 == 0 ? 1 : 0;
    t.max_abs = round == 0 ? i * 0.5 : i * 0.25 + (i % 4 == 0 ? 100.0 : 0.0);
    t.last_step = round == 0 ? 10 : 5 + i % 10;
    return t;
  };
  for (int round = 0; round < 2; ++round) {
    std::vector<TensorTotals> deltas;
    for (int i = 0; i < kTensors; ++i) deltas.push_back(delta(round, i));
    std::vector<const TensorTotals*> rows;
    for (TensorTotals& d : deltas) {
      d.run_id = "rows";
      rows.push_back(&d);
    }
    w.begin();
    w.add_tensor_totals(rows);
    for (TensorTotals d : deltas) {
      d.run_id = "single";
      w.add_tensor_totals(d);
    }
    w.commit();
  }
  std::map<std::string, std::map<std::pair<std::string, int>, TensorTotals>> stored;
  for (const TensorTotals& t : w.load_state().tensors) stored[t.run_id][{t.name, t.role}] = t;
  ASSERT_EQ(stored["rows"].size(), static_cast<std::size_t>(kTensors));
  ASSERT_EQ(stored["single"].size(), static_cast<std::size_t>(kTensors));
  for (int i = 0; i < kTensors; ++i) {
    const TensorTotals first = delta(0, i);
    const TensorTotals second = delta(1, i);
    const TensorTotals& r = stored["rows"][{first.name, first.role}];
    const TensorTotals& s = stored["single"][{first.name, first.role}];
    SCOPED_TRACE(first.name);
    EXPECT_EQ(r.format, second.format != 0 ? second.format : first.format);
    EXPECT_EQ(r.samples, 3u);
    EXPECT_EQ(r.values, first.values + second.values);
    EXPECT_EQ(r.overflow, first.overflow + second.overflow);
    EXPECT_EQ(r.underflow, first.underflow + second.underflow);
    EXPECT_EQ(r.nonfinite, first.nonfinite + second.nonfinite);
    EXPECT_EQ(r.max_abs, std::max(first.max_abs, second.max_abs));
    EXPECT_EQ(r.last_step, std::max(first.last_step, second.last_step));
    EXPECT_EQ(std::tie(r.format, r.samples, r.values, r.overflow, r.underflow, r.nonfinite,
                       r.max_abs, r.last_step),
              std::tie(s.format, s.samples, s.values, s.overflow, s.underflow, s.nonfinite,
                       s.max_abs, s.last_step));
  }
}

v1::QuantizerStats quantizer(const std::string& name, v1::TensorRole role, const char* recipe,
                             std::uint64_t values, std::uint64_t underflow,
                             std::uint64_t saturated, double amax, double tensor_scale) {
  v1::QuantizerStats q;
  q.set_name(name);
  q.set_role(role);
  q.set_phase(v1::TENSOR_PHASE_FORWARD);
  q.set_recipe(recipe);
  q.set_element(v1::FORMAT_E4M3);
  q.set_values(values);
  q.set_underflow(underflow);
  q.set_saturated(saturated);
  q.set_amax(amax);
  q.set_tensor_scale(tensor_scale);
  q.set_signal_sq(50.0);
  q.set_error_sq(0.5);
  return q;
}

// A block recipe's sample: `blocks` blocks, one saturated, decode scales 2^lo.. by `binades`.
v1::QuantizerStats block_quantizer(std::uint64_t saturated, double amax, int lo,
                                   std::vector<std::uint64_t> binades) {
  v1::QuantizerStats q =
      quantizer("h0.fc.weight", v1::TENSOR_ROLE_WEIGHT, "mxfp8_e4m3", 64, 0, saturated, amax, 0);
  q.set_blocks(2);
  q.set_saturated_blocks(1);
  q.mutable_scale_histogram()->set_min_exponent(lo);
  for (std::uint64_t n : binades) q.mutable_scale_histogram()->add_counts(n);
  return q;
}

// quantizer_totals: counts and SQNR sums add up over the samples, amax and the scales' ranges
// widen, and the sample of the latest step (not the latest to arrive) names the recipe.
TEST_P(ServerStoreTest, QuantizerTotalsSumTheSamplesAndKeepTheLatestStepsRecipe) {
  StoreWriter w(StoreOptions{path(), true});
  w.begin();
  for (const char* run : {"run-q", "other"}) {
    w.upsert_run(make_hello(run), kSecond);
    w.upsert_agent(make_hello(run), kSecond);
  }
  const auto input = [](const char* recipe, std::uint64_t underflow, double amax, double s) {
    return quantizer("h0.fc.input", v1::TENSOR_ROLE_ACTIVATION, recipe, 100, underflow, 0, amax,
                     s);
  };
  struct Sample {
    std::int64_t step;
    v1::QuantizerStats a, b;
  };
  Sample samples[] = {
      {1, input("e4m3:scale=112", 3, 4, 112), block_quantizer(2, 300, -3, {1, 1})},
      {2, input("e4m3:scale=56", 1, 8, 56), block_quantizer(0, 100, -5, {2})},
      {0, input("e4m3:scale=7", 0, 2, 7), block_quantizer(0, 1, -4, {2})}};
  // The loss cost of two of the input's three samples (the other step did not measure it).
  samples[0].a.set_loss_cost(0.002);
  samples[2].a.set_loss_cost(-0.001);
  std::uint64_t seq = 0;
  for (const Sample& sample : samples) {
    v1::StepReport r = make_report("run-q", 0, ++seq, sample.step, 1);
    *r.add_quantizers() = sample.a;
    *r.add_quantizers() = sample.b;
    w.insert_report(r, r.SerializeAsString(), kSecond);
  }
  v1::StepReport other = make_report("other", 0, 1, 5, 1);
  *other.add_quantizers() = input("e4m3:current", 50, 1, 448);
  w.insert_report(other, other.SerializeAsString(), kSecond);
  w.commit();

  StoreReader reader(path());
  const std::optional<v1::GetRunResponse> run = reader.get_run("run-q", 0);
  ASSERT_TRUE(run.has_value());
  ASSERT_EQ(run->quantizers_size(), 2);
  const v1::QuantizerRecord& a = run->quantizers(0);
  EXPECT_EQ(a.name(), "h0.fc.input");
  EXPECT_EQ(a.role(), v1::TENSOR_ROLE_ACTIVATION);
  EXPECT_EQ(a.phase(), v1::TENSOR_PHASE_FORWARD);
  EXPECT_EQ(a.recipe(), "e4m3:scale=56");  // step 2's, though step 0's arrived after it
  EXPECT_EQ(a.element(), v1::FORMAT_E4M3);
  EXPECT_EQ(a.samples(), 3u);
  EXPECT_EQ(a.values(), 300u);
  EXPECT_EQ(a.underflow(), 4u);
  EXPECT_DOUBLE_EQ(a.underflow_ratio(), 4.0 / 300.0);
  EXPECT_DOUBLE_EQ(a.sqnr_db(), 20.0);  // 10 log10(150 / 1.5)
  EXPECT_EQ(a.amax(), 8.0);
  EXPECT_EQ(a.last_amax(), 8.0);
  EXPECT_EQ(a.tensor_scale_min(), 7.0);
  EXPECT_EQ(a.tensor_scale_max(), 112.0);
  EXPECT_EQ(a.last_tensor_scale(), 56.0);
  EXPECT_FALSE(a.has_scale_binades());
  EXPECT_EQ(a.last_step(), 2);
  EXPECT_EQ(a.loss_cost_samples(), 2u);
  EXPECT_NEAR(a.loss_cost_mean(), 0.0005, 1e-15);
  EXPECT_NEAR(a.loss_cost_stddev(), 0.003 / std::sqrt(2.0), 1e-15);  // of {0.002, -0.001}
  const v1::QuantizerRecord& b = run->quantizers(1);
  EXPECT_EQ(b.name(), "h0.fc.weight");
  EXPECT_EQ(b.loss_cost_samples(), 0u);
  EXPECT_EQ(b.loss_cost_mean(), 0.0);
  EXPECT_EQ(b.recipe(), "mxfp8_e4m3");
  EXPECT_EQ(b.saturated(), 2u);
  EXPECT_DOUBLE_EQ(b.saturated_ratio(), 2.0 / 192.0);
  EXPECT_EQ(b.amax(), 300.0);
  EXPECT_EQ(b.last_amax(), 100.0);
  EXPECT_EQ(b.tensor_scale_max(), 0.0);  // a block recipe has no tensor scale
  ASSERT_TRUE(b.has_scale_binades());
  EXPECT_EQ(b.scale_min_exponent(), -5);
  EXPECT_EQ(b.scale_max_exponent(), -2);
  EXPECT_EQ(b.blocks(), 6u);
  EXPECT_EQ(b.saturated_blocks(), 3u);

  w.begin();
  w.delete_run("run-q");
  w.commit();
  EXPECT_EQ(connect()->query_int("SELECT count(*) FROM quantizer_totals"), 1);  // "other"'s
}

// A store of schema version 7 (PostgreSQL's 3) gets the loss-cost columns and keeps its
// quantisers' totals, which start counting the loss cost from the upgrade.
TEST_P(ServerStoreTest, AStoreBeforeLossCostsKeepsItsQuantizerTotals) {
  const auto add = [&](std::uint64_t seq, std::int64_t step, std::optional<double> cost) {
    StoreWriter w(StoreOptions{path(), true});
    w.begin();
    w.upsert_run(make_hello("run-q"), kSecond);
    w.upsert_agent(make_hello("run-q"), kSecond);
    v1::StepReport r = make_report("run-q", 0, seq, step, 1);
    v1::QuantizerStats q =
        quantizer("h0.fc.doutput", v1::TENSOR_ROLE_ACTIVATION_GRAD, "e5m2:scale=4", 10, 1, 0, 2, 4);
    if (cost) q.set_loss_cost(*cost);
    *r.add_quantizers() = q;
    w.insert_report(r, r.SerializeAsString(), kSecond);
    w.commit();
  };
  add(1, 1, 0.25);
  connect()->exec(backend() == Backend::kSqlite
                      ? "ALTER TABLE quantizer_totals DROP COLUMN loss_cost_samples; "
                        "ALTER TABLE quantizer_totals DROP COLUMN loss_cost_sum; "
                        "ALTER TABLE quantizer_totals DROP COLUMN loss_cost_sq_sum; "
                        "PRAGMA user_version = 7;"
                      : "ALTER TABLE quantizer_totals DROP COLUMN loss_cost_samples, "
                        "DROP COLUMN loss_cost_sum, DROP COLUMN loss_cost_sq_sum; "
                        "DELETE FROM ampscope_schema WHERE version = 4;");
  add(2, 2, 0.5);
  EXPECT_EQ(schema_version(*connect()), current_schema_version(backend()));
  StoreReader reader(path());
  const std::optional<v1::GetRunResponse> run = reader.get_run("run-q", 0);
  ASSERT_TRUE(run.has_value());
  ASSERT_EQ(run->quantizers_size(), 1);
  EXPECT_EQ(run->quantizers(0).samples(), 2u);
  EXPECT_EQ(run->quantizers(0).values(), 20u);
  EXPECT_EQ(run->quantizers(0).loss_cost_samples(), 1u);  // step 1's went with the columns
  EXPECT_EQ(run->quantizers(0).loss_cost_mean(), 0.5);
}

TEST_P(ServerStoreTest, DeleteRunRemovesEveryRowOfThatRunOnly) {
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

  const auto c = connect();
  EXPECT_EQ(c->query_int("SELECT count(*) FROM runs"), 1);
  EXPECT_EQ(c->query_int("SELECT count(*) FROM agents"), 1);
  EXPECT_EQ(c->query_int("SELECT count(*) FROM reports"), 3);
  for (const char* table : {"agent_notices", "tensor_totals", "rejections", "policy_decisions",
                            "policy_applications", "policy_state"}) {
    EXPECT_EQ(c->query_int(std::string("SELECT count(*) FROM ") + table), 0) << table;
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

TEST_P(ServerStoreTest, RetentionNamesTheRunsItDeletedAndSparesThoseToKeep) {
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

// The flight recorder's history: stored in rows of its own (the report's payload leaves it
// out), returned by get_step_history for the tensors that offended at the step together with
// the full samples of earlier reports, and gone with its report.
TEST_P(ServerStoreTest, HistoryIsStoredWithItsReportAndReturnedForTheOffenders) {
  using testing::crafted_tensor;
  using testing::synthetic_tensor;
  const auto weight = [](int lo, std::uint32_t seed) {
    return synthetic_tensor("h0.mlp.fc.weight", v1::TENSOR_ROLE_WEIGHT_GRAD, lo, lo + 6, 1024.0,
                            256, seed);
  };
  StoreWriter w(StoreOptions{path(), true});
  w.begin();
  w.upsert_run(make_hello("run-h"), kSecond);
  for (std::int64_t step = 0; step < 8; ++step) {
    v1::StepReport r = make_report("run-h", 0, static_cast<std::uint64_t>(step + 1), step, 0);
    if (step == 2) *r.add_tensors() = weight(-20, 2);  // a full step of the sampling
    w.insert_report(r, r.SerializeAsString(), kSecond);
  }
  v1::StepReport event = make_report("run-h", 0, 9, 8, 0);
  event.set_found_inf(true);
  event.set_grad_norm(std::numeric_limits<double>::quiet_NaN());
  *event.add_tensors() = crafted_tensor("h0.mlp.fc.weight", v1::TENSOR_ROLE_WEIGHT_GRAD, -10,
                                        {5, 6}, 1024.0, /*nan=*/2);
  *event.add_tensors() = weight(-20, 9);  // another tensor of the step, which did not offend
  event.mutable_tensors(1)->set_name("h1.mlp.fc.weight");
  event.set_flight_event(v1::FLIGHT_EVENT_NONFINITE);
  for (std::int64_t step : {5, 6, 7}) {
    v1::HistoryStep* h = event.add_history();
    h->set_step(step);
    h->set_loss_scale(1024.0);
    *h->add_tensors() = weight(-19 + static_cast<int>(step), static_cast<std::uint32_t>(step));
  }
  const std::int64_t id = w.insert_report(event, event.SerializeAsString(), kSecond);
  w.commit();
  ASSERT_GT(id, 0);

  StoreReader reader(path());
  v1::GetStepHistoryRequest q;
  q.set_run_id("run-h");
  q.set_step(8);
  const std::optional<v1::GetStepHistoryResponse> h = reader.get_step_history(q);
  ASSERT_TRUE(h.has_value());
  ASSERT_EQ(h->reports_size(), 1);
  EXPECT_EQ(h->reports(0).flight_event(), v1::FLIGHT_EVENT_NONFINITE);
  EXPECT_EQ(h->reports(0).tensors_size(), 0);
  EXPECT_EQ(h->reports(0).history_size(), 0);
  ASSERT_EQ(h->tensors_size(), 1);
  EXPECT_EQ(h->tensors(0).stats().name(), "h0.mlp.fc.weight");
  EXPECT_EQ(h->tensors(0).why(), "nan 2, +inf 0, -inf 0");
  ASSERT_EQ(h->history_size(), 4);
  const std::vector<std::pair<std::int64_t, bool>> expected = {
      {2, false}, {5, true}, {6, true}, {7, true}};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(h->history(i).step(), expected[i].first) << i;
    EXPECT_EQ(h->history(i).from_flight_recorder(), expected[i].second) << i;
    EXPECT_EQ(h->history(i).stats().level(), v1::STATS_LEVEL_FULL);
  }
  EXPECT_EQ(h->history(3).stats().histogram().min_exponent(),
            event.history(2).tensors(0).histogram().min_exponent());
  // steps = 2 looks back two steps only.
  q.set_steps(2);
  EXPECT_EQ(reader.get_step_history(q)->history_size(), 2);
  // A tensor asked for by name, whether it offended or not.
  q.set_steps(0);
  q.add_tensors("h1.mlp.fc.weight");
  const auto asked = reader.get_step_history(q);
  ASSERT_EQ(asked->tensors_size(), 1);
  EXPECT_EQ(asked->tensors(0).why(), "");
  EXPECT_FALSE(reader
                   .get_step_history([] {
                     v1::GetStepHistoryRequest u;
                     u.set_run_id("no-such-run");
                     return u;
                   }())
                   .has_value());

  // The stored payload leaves the history out; its rows go with the run.
  v1::GetReportsRequest all;
  all.set_run_id("run-h");
  all.set_from_step(8);
  all.set_include_tensors(true);
  const auto stored = reader.get_reports(all);
  ASSERT_EQ(stored->reports_size(), 1);
  EXPECT_EQ(stored->reports(0).report().history_size(), 0);
  EXPECT_EQ(stored->reports(0).report().tensors_size(), 2);
  const auto c = connect();
  EXPECT_EQ(c->query_int("SELECT count(*) FROM tensor_history"), 3);
  w.begin();
  w.delete_run("run-h");
  w.commit();
  EXPECT_EQ(c->query_int("SELECT count(*) FROM tensor_history"), 0);
}

// --- PostgreSQL only ---------------------------------------------------------------------------

TEST(PostgresStoreTest, AnEmptyDatabaseIsMigratedOnceAndReopensAsIs) {
  const StoreLocation store(Backend::kPostgres);
  const auto c = open_store(StoreOptions{store.path()}, StoreRole::kReader);
  EXPECT_EQ(schema_version(*c), 0);
  { StoreWriter w(StoreOptions{store.path()}); }
  { StoreWriter w(StoreOptions{store.path()}); }
  EXPECT_EQ(schema_version(*c), kPostgresSchemaVersion);
  EXPECT_EQ(c->query_int("SELECT count(*) FROM ampscope_schema"), kPostgresSchemaVersion);
  EXPECT_TRUE(has_relation(*c, "reports_skipped"));
}

// Servers starting together on one database: the advisory lock lets one migrate while the
// others wait, then find the schema current.
TEST(PostgresStoreTest, WritersOpeningOneDatabaseTogetherMigrateItOnce) {
  const StoreLocation store(Backend::kPostgres);
  constexpr int kWriters = 4;
  std::vector<std::string> errors(kWriters);
  std::vector<std::thread> threads;
  for (int i = 0; i < kWriters; ++i) {
    threads.emplace_back([&, i] {
      try {
        StoreWriter w(StoreOptions{store.path()});
        w.begin();
        w.upsert_run(make_hello("run-" + std::to_string(i)), kSecond);
        w.commit();
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(i)] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  const auto c = store.connect();
  EXPECT_EQ(c->query_int("SELECT count(*) FROM ampscope_schema"), kPostgresSchemaVersion);
  EXPECT_EQ(c->query_int("SELECT count(*) FROM runs"), kWriters);
}

TEST(PostgresStoreTest, ARefusedConnectionIsAStoreErrorNamingTheServerNotThePassword) {
  const std::string port = std::to_string(testing::free_loopback_port());
  for (const std::string& db :
       {"postgresql://ampscope:s3cret@127.0.0.1:" + port + "/runs?connect_timeout=5",
        "host=127.0.0.1 port=" + port + " dbname=runs password=s3cret connect_timeout=5"}) {
    try {
      StoreWriter w(StoreOptions{db});
      FAIL() << "expected StoreError for " << db;
    } catch (const StoreError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("cannot connect to"), std::string::npos) << what;
      EXPECT_NE(what.find("127.0.0.1"), std::string::npos) << what;
      EXPECT_NE(what.find("refused"), std::string::npos) << what;
      EXPECT_EQ(what.find("s3cret"), std::string::npos) << what;
    }
  }
}

// A connection the server ends (a restart, a failover, an administrator) fails the statement
// with StoreError; nothing crashes and nothing reconnects behind the store's back.
TEST(PostgresStoreTest, ALostConnectionIsAStoreError) {
  const StoreLocation store(Backend::kPostgres);
  StoreWriter w(StoreOptions{store.path()});
  StoreReader reader(store.path());
  EXPECT_TRUE(reader.list_runs(0).empty());
  store.connect()->exec(
      "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
      "current_database() AND pid != pg_backend_pid()");
  try {
    w.begin();
    w.upsert_run(make_hello("run"), kSecond);
    w.commit();
    FAIL() << "expected StoreError";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("postgresql"), std::string::npos) << e.what();
  }
  w.rollback();  // as the ingest thread does after a failed batch: no throw
  EXPECT_THROW(reader.list_runs(0), StoreError);
}

// A write transaction's statements whose rows nobody reads are pipelined: the first one that
// fails is reported by the commit (with PostgreSQL's message and its SQL), the batch rolls back
// whole and the connection goes on.
TEST(PostgresStoreTest, APipelinedStatementThatFailsFailsTheCommit) {
  const StoreLocation store(Backend::kPostgres);
  { StoreWriter w(StoreOptions{store.path()}); }
  const auto c = store.connect();
  const auto notice = [&](std::int64_t run, std::optional<std::string> text) {
    c->prepare("INSERT INTO agent_notices (run, rank, text) VALUES (?1, 0, ?2)")
        .bind(1, run)
        .bind(2, text)
        .run();
  };
  c->begin_write();
  notice(1, "first");
  notice(2, std::nullopt);  // text is NOT NULL
  notice(3, "after the failure");
  try {
    c->commit();
    FAIL() << "expected StoreError";
  } catch (const StoreError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("INSERT INTO agent_notices"), std::string::npos) << what;
    EXPECT_NE(what.find("not-null"), std::string::npos) << what;
  }
  c->rollback();
  EXPECT_EQ(c->query_int("SELECT count(*) FROM agent_notices"), 0);
  c->begin_write();
  notice(1, "again");
  c->commit();
  EXPECT_EQ(c->query_int("SELECT count(*) FROM agent_notices"), 1);
}

TEST(StoreLocationTest, DbNamesItsBackEnd) {
  EXPECT_EQ(backend_of("runs.db"), Backend::kSqlite);
  EXPECT_EQ(backend_of("/var/lib/ampscope/runs.db"), Backend::kSqlite);
  EXPECT_EQ(backend_of("./host=x.db"), Backend::kSqlite);
  EXPECT_EQ(backend_of("postgresql://db.example/ampscope"), Backend::kPostgres);
  EXPECT_EQ(backend_of("postgres://u@db.example:5433/ampscope?sslmode=verify-full"),
            Backend::kPostgres);
  EXPECT_EQ(backend_of("host=db.example dbname=ampscope sslmode=require"), Backend::kPostgres);
  EXPECT_EQ(backend_of("dbname = ampscope"), Backend::kPostgres);
}

TEST(StoreLocationTest, PrintedLocationsMaskThePassword) {
  EXPECT_EQ(printable_location("runs.db"), "runs.db");
  EXPECT_EQ(printable_location("postgresql://amp:pw@db:5432/runs?sslmode=require"),
            "postgresql://amp:***@db:5432/runs?sslmode=require");
  EXPECT_EQ(printable_location("postgres://db/runs?user=amp&password=pw&sslmode=require"),
            "postgres://db/runs?user=amp&password=***&sslmode=require");
  EXPECT_EQ(printable_location("host=db password=pw dbname=runs"),
            "host=db password=*** dbname=runs");
  EXPECT_EQ(printable_location("host=db password = 'p w\\'x' dbname=runs"),
            "host=db password = *** dbname=runs");
}

TEST(StoreLocationTest, PlaceholdersAreRewrittenOutsideLiteralsOnly) {
  std::vector<bool> named;
  EXPECT_EQ(postgres_placeholders("SELECT ?1, '?2', \"?3\", ?12 -- ?4\n, ?2", &named),
            "SELECT $1, '?2', \"?3\", $12 -- ?4\n, $2");
  ASSERT_EQ(named.size(), 12u);
  EXPECT_TRUE(named[0]);
  EXPECT_TRUE(named[1]);
  EXPECT_FALSE(named[2]);
  EXPECT_TRUE(named[11]);
}

TEST(StoreLocationTest, APasswordFileOthersMayReadIsRefused) {
  testing::TempDir dir;
  const std::string file = (dir / "pgpass").string();
  testing::write_text(file, "s3cret\nignored\n");
  ASSERT_EQ(::chmod(file.c_str(), 0644), 0);
  try {
    read_password_file(file);
    FAIL() << "expected StoreError";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("chmod 600"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("s3cret"), std::string::npos) << e.what();
  }
  ASSERT_EQ(::chmod(file.c_str(), 0600), 0);
  EXPECT_EQ(read_password_file(file), "s3cret");
  EXPECT_THROW(read_password_file((dir / "missing").string()), StoreError);
}

}  // namespace
}  // namespace ampscope::server
