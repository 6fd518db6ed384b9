// The store's schema 4 (report_counts, val_loss and tensor_core_active_ratio, the upgrade of a
// version-3 SQLite store) and the web UI's series (StoreReader::run_series, tensor_series,
// recent_reports) over a store with known reports (webui_fixture.h), on each back end.
#include <gtest/gtest.h>

#include <limits>
#include <numeric>

#include "store_backends.h"
#include "webui_fixture.h"

namespace ampscope::server {
namespace {

using webui_fixture::kSecond;
using webui_fixture::write_web_run;

// Every report_counts row of the store, summed per (role, format).
std::map<std::pair<int, int>, ReportCounts> stored_counts(const StoreLocation& store) {
  const auto c = store.connect();
  Statement s = c->prepare(
      "SELECT role, format, sum(checked), sum(underflow), sum(overflow), sum(subnormal), "
      "sum(nonfinite) FROM report_counts GROUP BY role, format");
  std::map<std::pair<int, int>, ReportCounts> out;
  while (s.step()) {
    const int role = static_cast<int>(s.column_int(0));
    const int format = static_cast<int>(s.column_int(1));
    out[{role, format}] = ReportCounts{role,
                                       format,
                                       static_cast<std::uint64_t>(s.column_int(2)),
                                       static_cast<std::uint64_t>(s.column_int(3)),
                                       static_cast<std::uint64_t>(s.column_int(4)),
                                       static_cast<std::uint64_t>(s.column_int(5)),
                                       static_cast<std::uint64_t>(s.column_int(6))};
  }
  return out;
}
std::int64_t count_rows(const StoreLocation& store, const std::string& sql) {
  return store.connect()->query_int(sql);
}

class StoreSeriesTest : public StoreBackendTest {
 protected:
  std::map<std::pair<int, int>, ReportCounts> stored_counts() {
    return server::stored_counts(store_);
  }
  std::int64_t count_rows(const std::string& sql) { return server::count_rows(store_, sql); }
  RunView run(const SeriesRequest& q) {
    StoreReader reader(path());
    std::optional<RunView> v = reader.run_series("web", q);
    EXPECT_TRUE(v.has_value());
    return v ? *v : RunView{};
  }
};
INSTANTIATE_STORE_BACKENDS(StoreSeriesTest);

void expect_web_counts(const std::map<std::pair<int, int>, ReportCounts>& counts) {
  ASSERT_EQ(counts.size(), 4u);
  const ReportCounts& ln = counts.at({v1::TENSOR_ROLE_WEIGHT, v1::FORMAT_BF16});
  EXPECT_EQ(ln.checked, 950u);
  EXPECT_EQ(ln.nonfinite, 2u);
  const ReportCounts& attn = counts.at({v1::TENSOR_ROLE_ACTIVATION_GRAD, v1::FORMAT_FP16});
  EXPECT_EQ(attn.checked, 1900u);
  EXPECT_EQ(attn.underflow, 190u);
  EXPECT_EQ(attn.overflow, 19u);
  EXPECT_EQ(attn.nonfinite, 4u);
  const ReportCounts& fc = counts.at({v1::TENSOR_ROLE_WEIGHT_GRAD, v1::FORMAT_FP16});
  EXPECT_EQ(fc.checked, 1140u);
  EXPECT_EQ(fc.underflow, 38u);
  EXPECT_EQ(fc.subnormal, 95u);
  EXPECT_EQ(fc.overflow, 0u);
  EXPECT_EQ(counts.at({v1::TENSOR_ROLE_WEIGHT_GRAD, v1::FORMAT_FP32}).checked, 6u);
}

TEST(ReportCountsTest, GroupsTensorsByRoleAndTargetFormat) {
  v1::StepReport r = webui_fixture::web_report(0, 0);
  v1::TensorStats* no_target = r.add_tensors();
  no_target->set_name("loss");
  no_target->set_role(v1::TENSOR_ROLE_LOSS);
  no_target->set_numel(1);
  no_target->set_nan(1);
  const std::vector<ReportCounts> groups = count_report(r);
  ASSERT_EQ(groups.size(), 5u);  // in the order of the groups' first tensors
  EXPECT_EQ(groups[0].role, v1::TENSOR_ROLE_WEIGHT_GRAD);
  EXPECT_EQ(groups[0].format, v1::FORMAT_FP16);
  EXPECT_EQ(groups[0].checked, 60u);
  EXPECT_EQ(groups[0].underflow, 2u);
  EXPECT_EQ(groups[0].subnormal, 5u);
  EXPECT_EQ(groups[1].role, v1::TENSOR_ROLE_ACTIVATION_GRAD);
  EXPECT_EQ(groups[1].overflow, 1u);
  EXPECT_EQ(groups[2].format, v1::FORMAT_BF16);
  EXPECT_EQ(groups[3].format, v1::FORMAT_FP32);
  EXPECT_EQ(groups[3].checked, 6u);
  // Without targets: nothing checked, its non-finite values still counted, under format 0.
  EXPECT_EQ(groups[4].role, v1::TENSOR_ROLE_LOSS);
  EXPECT_EQ(groups[4].format, 0);
  EXPECT_EQ(groups[4].checked, 0u);
  EXPECT_EQ(groups[4].nonfinite, 1u);
}

TEST_P(StoreSeriesTest, InsertReportFillsTheNewColumnsAndCounts) {
  {
    StoreWriter w(StoreOptions{path(), true});
    write_web_run(w);
  }
  expect_web_counts(stored_counts());
  EXPECT_EQ(count_rows("SELECT count(*) FROM reports WHERE val_loss IS NOT NULL"), 2);
  EXPECT_EQ(count_rows("SELECT count(*) FROM reports WHERE tensor_core_active_ratio = 0.5"), 10);
  EXPECT_EQ(count_rows("SELECT count(*) FROM reports WHERE tensor_core_active_ratio IS NULL"), 9);
}

TEST(SqliteStoreSeriesTest, Version3StoreUpgradesWithTheCountsOfItsReports) {
  const StoreLocation store(Backend::kSqlite);
  const std::string& path = store.path();
  {
    StoreWriter w(StoreOptions{path, true});
    write_web_run(w);
  }
  {
    // Back to version 3's layout, as a server before version 4 wrote it (and without version
    // 5's index, version 6's run_leases and version 7's quantizer_totals).
    store.connect()->exec(
        "DROP TABLE quantizer_totals; DROP TABLE run_leases; DROP INDEX merged_steps_offender; "
        "DROP TRIGGER reports_take_counts; DROP TABLE report_counts; DROP INDEX reports_series; "
        "CREATE INDEX reports_by_step ON reports (run, step, rank); "
        "ALTER TABLE reports DROP COLUMN val_loss; "
        "ALTER TABLE reports DROP COLUMN tensor_core_active_ratio; PRAGMA user_version = 3;");
  }
  { StoreWriter w(StoreOptions{path, true}); }
  EXPECT_EQ(count_rows(store, "PRAGMA user_version"), kSchemaVersion);
  expect_web_counts(stored_counts(store));
  EXPECT_EQ(count_rows(store, "SELECT count(*) FROM reports WHERE val_loss = 7.5 AND step = 4"), 1);
  EXPECT_EQ(count_rows(store, "SELECT count(*) FROM reports WHERE tensor_core_active_ratio = 0.5"),
            10);
  StoreReader reader(path);
  const std::optional<RunView> v = reader.run_series("web", SeriesRequest{});
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->steps.size(), 10u);
}

TEST_P(StoreSeriesTest, DeleteRunAndRetentionTakeTheCounts) {
  StoreWriter w(StoreOptions{path(), true});
  write_web_run(w);
  v1::StepReport other = webui_fixture::web_report(0, 0);
  other.set_run_id("other");
  w.begin();
  w.upsert_run(testing::make_hello("other"), webui_fixture::now_ns());
  w.insert_report(other, other.SerializeAsString(), webui_fixture::now_ns());
  w.commit();
  EXPECT_EQ(count_rows("SELECT count(*) FROM report_counts"), 19 * 3 + 1 + 4);

  w.begin();
  ASSERT_TRUE(w.delete_run("web").has_value());
  w.commit();
  EXPECT_EQ(count_rows("SELECT count(*) FROM report_counts"), 4);
  // Retention by age takes the other run's only report, and its counts with it.
  w.apply_retention(kSecond, 0, webui_fixture::now_ns() + 10 * kSecond);
  EXPECT_EQ(count_rows("SELECT count(*) FROM reports"), 0);
  EXPECT_EQ(count_rows("SELECT count(*) FROM report_counts"), 0);
}

TEST(StepBucketsTest, CutsTheRangeIntoCeilingSizedBuckets) {
  StepBuckets b = StepBuckets::cut(0, 9, 4);  // 10 steps, 4 points: 3 steps a bucket
  EXPECT_EQ(b.bucket_steps, 3);
  EXPECT_EQ(b.buckets, 4);
  b = StepBuckets::cut(0, 9, 10);
  EXPECT_EQ(b.bucket_steps, 1);
  EXPECT_EQ(b.buckets, 10);
  b = StepBuckets::cut(0, 9, 1000);
  EXPECT_EQ(b.bucket_steps, 1);
  EXPECT_EQ(b.buckets, 10);
  b = StepBuckets::cut(2, 7, 4);
  EXPECT_EQ(b.bucket_steps, 2);
  EXPECT_EQ(b.buckets, 3);
  b = StepBuckets::cut(5, 5, 1000);
  EXPECT_EQ(b.bucket_steps, 1);
  EXPECT_EQ(b.buckets, 1);
  b = StepBuckets::cut(0, 99'999, 1000);
  EXPECT_EQ(b.bucket_steps, 100);
  EXPECT_EQ(b.buckets, 1000);
  b = StepBuckets::cut(0, 100'000, 1000);
  EXPECT_EQ(b.bucket_steps, 101);
  EXPECT_EQ(b.buckets, 991);
  b = StepBuckets::cut(6, 5, 10);
  EXPECT_EQ(b.buckets, 0);
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  b = StepBuckets::cut(0, kMax, 4000);  // no overflow
  EXPECT_EQ(b.bucket_steps, kMax / 4000 + 1);
  EXPECT_EQ(b.buckets, 4000);
}

TEST_P(StoreSeriesTest, StepSeriesWithAWidthThatDoesNotDivideTheSteps) {
  {
    StoreWriter w(StoreOptions{path(), true});
    write_web_run(w);
  }
  const RunView v = run(SeriesRequest{std::nullopt, std::nullopt, 4});
  EXPECT_EQ(v.range.from, 0);
  EXPECT_EQ(v.range.to, 9);
  EXPECT_EQ(v.range.bucket_steps, 3);
  ASSERT_EQ(v.steps.size(), 4u);
  const std::int64_t firsts[] = {0, 3, 6, 9};
  const std::int64_t lasts[] = {2, 5, 8, 9};
  const std::int64_t reports[] = {6, 6, 6, 1};
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(v.steps[i].step, firsts[i]);
    EXPECT_EQ(v.steps[i].last_step, lasts[i]);
    EXPECT_EQ(v.steps[i].reports, reports[i]);
  }
  // Steps 6..8: the NaN loss of rank 1 at step 6 is left out: (4 + 3 + 2 + 4 + 3) / 5.
  EXPECT_DOUBLE_EQ(*v.steps[2].loss, 3.2);
  EXPECT_EQ(*v.steps[2].loss_min, 2.0);
  EXPECT_EQ(*v.steps[2].loss_max, 4.0);
  EXPECT_EQ(v.steps[2].scale_min, 24576.0);
  EXPECT_EQ(v.steps[2].scale_max, 32768.0);
  EXPECT_EQ(v.steps[2].scale_last, 24576.0);
  EXPECT_EQ(v.steps[1].scale_last, 65536.0);
  EXPECT_FALSE(v.steps[0].val_loss.has_value());
  EXPECT_EQ(*v.steps[1].val_loss, 7.5);
  EXPECT_FALSE(v.steps[2].val_loss.has_value());
  EXPECT_EQ(*v.steps[3].val_loss, 6.5);
  EXPECT_EQ(v.steps[0].skipped, 0);
  EXPECT_EQ(v.steps[1].skipped, 1);  // step 5, both ranks: one step
  EXPECT_EQ(v.steps[2].skipped, 1);  // step 6, rank 1
  EXPECT_EQ(v.steps[1].found_inf, 1);
  EXPECT_EQ(v.summary.skipped_steps(), 2u);
}

TEST_P(StoreSeriesTest, RangeInsideTheRunAndEdges) {
  {
    StoreWriter w(StoreOptions{path(), true});
    write_web_run(w);
  }
  RunView v = run(SeriesRequest{2, 7, 4});
  EXPECT_EQ(v.range.bucket_steps, 2);
  EXPECT_EQ(v.range.buckets, 3);
  ASSERT_EQ(v.steps.size(), 3u);
  EXPECT_EQ(v.steps[0].step, 2);
  EXPECT_EQ(v.steps[0].last_step, 3);
  EXPECT_EQ(v.steps[2].last_step, 7);
  ASSERT_EQ(v.scale_changes.size(), 2u);  // the scale at `from`, then its change at 6
  EXPECT_EQ(v.scale_changes[0].step(), 2);
  EXPECT_EQ(v.scale_changes[1].step(), 6);
  EXPECT_EQ(v.scale_changes[1].loss_scale(), 32768.0);

  v = run(SeriesRequest{5, 5, 1000});  // one step
  ASSERT_EQ(v.steps.size(), 1u);
  EXPECT_EQ(v.steps[0].reports, 2);
  ASSERT_EQ(v.skips.size(), 1u);
  EXPECT_EQ(v.skips[0].step(), 5);
  EXPECT_EQ(v.offenders.size(), 2u);

  v = run(SeriesRequest{20, 30, 1000});  // past the run: buckets, but nothing in them
  EXPECT_EQ(v.range.buckets, 11);
  EXPECT_TRUE(v.steps.empty());
  EXPECT_TRUE(v.counts.empty());
  EXPECT_TRUE(v.ranks.empty());
  EXPECT_TRUE(v.skips.empty());
  EXPECT_EQ(v.summary.last_step(), 9);
}

TEST_P(StoreSeriesTest, CountSeriesSumToTheTotalsAtEveryWidth) {
  {
    StoreWriter w(StoreOptions{path(), true});
    write_web_run(w);
  }
  for (std::int64_t width : {1, 3, 4, 7, 10, 1000}) {
    const RunView v = run(SeriesRequest{std::nullopt, std::nullopt, width});
    ASSERT_EQ(v.counts.size(), 4u) << width;
    std::map<std::pair<int, int>, ReportCounts> sums;
    for (const CountSeries& s : v.counts) {
      ReportCounts& sum = sums[{s.role, s.format}];
      sum.role = s.role;
      sum.format = s.format;
      EXPECT_LE(static_cast<std::int64_t>(s.points.size()), v.range.buckets);
      for (const CountPoint& p : s.points) {
        sum.checked += p.checked;
        sum.underflow += p.underflow;
        sum.overflow += p.overflow;
        sum.subnormal += p.subnormal;
        sum.nonfinite += p.nonfinite;
      }
    }
    expect_web_counts(sums);
  }
  // By role, then format; each point at its bucket's first step.
  const RunView v = run(SeriesRequest{std::nullopt, std::nullopt, 4});
  EXPECT_EQ(v.counts[0].role, v1::TENSOR_ROLE_WEIGHT);
  EXPECT_EQ(v.counts[2].format, v1::FORMAT_FP32);
  EXPECT_EQ(v.counts[3].format, v1::FORMAT_FP16);
  ASSERT_EQ(v.counts[3].points.size(), 4u);
  EXPECT_EQ(v.counts[3].points[3].step, 9);
  EXPECT_EQ(v.counts[3].points[3].checked, 60u);
  EXPECT_EQ(v.counts[3].points[0].checked, 360u);
  ASSERT_EQ(v.counts[2].points.size(), 1u);  // after unscaling: step 0 only
  EXPECT_EQ(v.counts[2].points[0].step, 0);
}

TEST_P(StoreSeriesTest, RankSeriesAverageEachRankOverItsBuckets) {
  {
    StoreWriter w(StoreOptions{path(), true});
    write_web_run(w);
  }
  const RunView v = run(SeriesRequest{std::nullopt, std::nullopt, 4});
  ASSERT_EQ(v.ranks.size(), 2u);
  EXPECT_EQ(v.ranks[0].rank, 0u);
  ASSERT_EQ(v.ranks[0].points.size(), 4u);
  EXPECT_EQ(v.ranks[0].points[3].step, 9);
  EXPECT_EQ(*v.ranks[0].points[0].step_time_s, 0.125);
  EXPECT_EQ(*v.ranks[0].points[0].tensor_core_active_ratio, 0.5);
  ASSERT_EQ(v.ranks[1].points.size(), 3u);  // rank 1 has no step 9
  EXPECT_EQ(*v.ranks[1].points[2].step_time_s, 0.375);
  EXPECT_FALSE(v.ranks[1].points[2].tensor_core_active_ratio.has_value());
}

TEST_P(StoreSeriesTest, ListsOfTheRun) {
  {
    StoreWriter w(StoreOptions{path(), true});
    write_web_run(w);
  }
  const RunView v = run(SeriesRequest{});
  ASSERT_EQ(v.skips.size(), 2u);
  EXPECT_EQ(v.skips[0].step(), 5);
  EXPECT_EQ(v.skips[0].rank(), 0u);
  EXPECT_EQ(v.skips[0].scale_after(), 32768.0);
  EXPECT_EQ(v.skips[0].first_offender().tensor(), "h0.mlp.fc.weight");
  EXPECT_EQ(v.skips[1].step(), 6);
  EXPECT_EQ(v.skips[1].rank(), 1u);
  EXPECT_EQ(v.skips[1].first_offender().tensor(), "h1.attn.out");
  ASSERT_EQ(v.offenders.size(), 3u);
  EXPECT_EQ(v.offenders[0].step(), 5);
  EXPECT_EQ(v.offenders[1].rank(), 1u);
  EXPECT_EQ(v.offenders[2].step(), 6);
  ASSERT_EQ(v.scale_changes.size(), 3u);
  EXPECT_EQ(v.scale_changes[2].step(), 8);
  EXPECT_EQ(v.scale_changes[2].loss_scale(), 24576.0);
  ASSERT_EQ(v.decisions.size(), 1u);
  EXPECT_EQ(v.decisions[0].applications_size(), 2);
  // The worst tensors: non-finite first, then by overflow ratio.
  ASSERT_EQ(v.tensors.size(), 3u);
  EXPECT_EQ(v.tensors[0].name(), "h1.attn.out");
  EXPECT_EQ(v.tensors[1].name(), "h0.ln.weight");
  EXPECT_EQ(v.tensors[2].name(), "h0.mlp.fc.weight");
  ASSERT_EQ(v.agents.size(), 2u);
  EXPECT_EQ(v.agents[1].mean_step_time_s(), 0.375);
  EXPECT_GT(v.max_report_id, 0);
  StoreReader reader(path());
  EXPECT_EQ(reader.max_report_id("web"), v.max_report_id);
  EXPECT_FALSE(reader.max_report_id("nope").has_value());
  EXPECT_FALSE(reader.run_series("nope", SeriesRequest{}).has_value());
}

// Decisions follow the range asked for (the page marks them on its charts): a long run's latest
// ones would leave a zoomed-in earlier range without its own.
TEST_P(StoreSeriesTest, DecisionsAreThoseEffectiveInTheRange) {
  {
    StoreWriter w(StoreOptions{path(), true});
    write_web_run(w);  // one decision, effective from step 6
  }
  SeriesRequest up_to_6;
  up_to_6.from = 0;
  up_to_6.to = 6;
  SeriesRequest after_6;
  after_6.from = 7;
  EXPECT_EQ(run(up_to_6).decisions.size(), 1u);
  EXPECT_EQ(run(after_6).decisions.size(), 0u);
  SeriesRequest only_6;
  only_6.from = 6;
  only_6.to = 6;
  ASSERT_EQ(run(only_6).decisions.size(), 1u);
  EXPECT_EQ(run(only_6).decisions[0].update().effective_from_step(), 6);
}

TEST_P(StoreSeriesTest, TensorColumnsAreTheLatestFullSampleOfEachBucket) {
  {
    StoreWriter w(StoreOptions{path(), true});
    write_web_run(w);
  }
  StoreReader reader(path());
  TensorRequest q{"h0.mlp.fc.weight", v1::TENSOR_ROLE_WEIGHT_GRAD, std::nullopt, {}};
  q.range.width = 10;
  std::optional<TensorSeries> s = reader.tensor_series("web", q);
  ASSERT_TRUE(s.has_value());
  // The latest FULL sample's phase; FULL on even steps, and step 7 from the flight recorder.
  EXPECT_EQ(s->phase, v1::TENSOR_PHASE_BACKWARD);
  std::vector<std::int64_t> steps;
  for (const TensorSample& c : s->columns) steps.push_back(c.step);
  EXPECT_EQ(steps, (std::vector<std::int64_t>{0, 2, 4, 6, 7, 8}));
  for (const TensorSample& c : s->columns) {
    EXPECT_EQ(c.rank, 0u);
    EXPECT_EQ(c.from_flight_recorder, c.step == 7);
    EXPECT_EQ(c.stats.level(), v1::STATS_LEVEL_FULL);
  }
  EXPECT_EQ(s->columns[4].stats.histogram().counts_size(), 3);
  EXPECT_EQ(s->columns[4].stats.histogram().counts(0), 1u);

  q.range.width = 4;  // buckets 0-2, 3-5, 6-8, 9: step 9 has no FULL sample
  s = reader.tensor_series("web", q);
  steps.clear();
  for (const TensorSample& c : s->columns) steps.push_back(c.step);
  EXPECT_EQ(steps, (std::vector<std::int64_t>{2, 4, 8}));

  q.phase = v1::TENSOR_PHASE_AFTER_UNSCALE;
  q.range.width = 10;
  s = reader.tensor_series("web", q);
  ASSERT_EQ(s->columns.size(), 1u);
  EXPECT_EQ(s->columns[0].step, 0);
  EXPECT_EQ(s->columns[0].stats.scale(), 1.0);

  q.phase.reset();
  q.range = SeriesRequest{7, 7, 10};
  s = reader.tensor_series("web", q);
  ASSERT_EQ(s->columns.size(), 1u);
  EXPECT_TRUE(s->columns[0].from_flight_recorder);

  q.name = "no.such.tensor";
  s = reader.tensor_series("web", q);
  ASSERT_TRUE(s.has_value());
  EXPECT_TRUE(s->columns.empty());
  EXPECT_FALSE(reader.tensor_series("nope", q).has_value());
}

TEST_P(StoreSeriesTest, RecentReportsAreThoseReceivedInTheWindow) {
  StoreWriter w(StoreOptions{path(), true});
  v1::StepReport old = webui_fixture::web_report(0, 0);
  old.set_run_id("old");
  w.begin();
  w.upsert_run(testing::make_hello("old"), webui_fixture::now_ns() - 3600 * kSecond);
  w.insert_report(old, old.SerializeAsString(), webui_fixture::now_ns() - 3600 * kSecond);
  w.commit();
  write_web_run(w, 60 * kSecond);
  StoreReader reader(path());
  const auto recent = reader.recent_reports(webui_fixture::now_ns() - 600 * kSecond);
  ASSERT_EQ(recent.size(), 1u);  // "old" was not seen in the window
  const RecentReports& web = recent.at("web");
  EXPECT_EQ(web.steps, 10);
  EXPECT_EQ(web.skipped_steps, 2);
  EXPECT_TRUE(web.nonfinite_loss);
  EXPECT_EQ(*web.last_loss_scale, 24576.0);
  std::map<std::pair<int, int>, ReportCounts> counts;
  for (const ReportCounts& c : web.counts) counts[{c.role, c.format}] = c;
  expect_web_counts(counts);
  // One run only.
  EXPECT_EQ(reader.recent_reports(webui_fixture::now_ns() - 600 * kSecond, "web").size(), 1u);
  EXPECT_EQ(reader.recent_reports(webui_fixture::now_ns() - 600 * kSecond, "old").size(), 0u);
  // A window that starts after the run's reports: none of them.
  EXPECT_EQ(reader.recent_reports(webui_fixture::now_ns() - 30 * kSecond).size(), 0u);
}

TEST_P(StoreSeriesTest, AlertsWindowIsTheSameFoldedIntoTheSeriesOrScannedAlone) {
  {
    StoreWriter w(StoreOptions{path(), true});
    write_web_run(w);
  }
  StoreReader reader(path());
  const std::int64_t since = webui_fixture::now_ns() - 600 * kSecond;
  const RecentReports alone = reader.recent_reports(since, "web").at("web");
  EXPECT_EQ(alone.steps, 10);
  // The whole run (folded into the series' scans), and ranges that do not hold the window
  // (scanned alone).
  for (const SeriesRequest& q : {SeriesRequest{}, SeriesRequest{std::nullopt, std::nullopt, 3},
                                 SeriesRequest{2, 7, 4}, SeriesRequest{0, 5, 10}}) {
    const std::optional<RunView> v = reader.run_series("web", q, since);
    ASSERT_TRUE(v.has_value() && v->recent.has_value());
    const RecentReports& r = *v->recent;
    EXPECT_EQ(r.steps, alone.steps);
    EXPECT_EQ(r.skipped_steps, alone.skipped_steps);
    EXPECT_EQ(r.nonfinite_loss, alone.nonfinite_loss);
    EXPECT_EQ(r.last_loss_scale, alone.last_loss_scale);
    EXPECT_EQ(r.divergent_steps, alone.divergent_steps);
    ASSERT_EQ(r.counts.size(), alone.counts.size());
    for (std::size_t i = 0; i < r.counts.size(); ++i) {
      EXPECT_EQ(r.counts[i].role, alone.counts[i].role);
      EXPECT_EQ(r.counts[i].format, alone.counts[i].format);
      EXPECT_EQ(r.counts[i].checked, alone.counts[i].checked);
      EXPECT_EQ(r.counts[i].underflow, alone.counts[i].underflow);
      EXPECT_EQ(r.counts[i].nonfinite, alone.counts[i].nonfinite);
    }
  }
  EXPECT_FALSE(reader.run_series("web", SeriesRequest{})->recent.has_value());
  const std::optional<RunView> late =
      reader.run_series("web", SeriesRequest{}, webui_fixture::now_ns() + kSecond);
  ASSERT_TRUE(late->recent.has_value());
  EXPECT_EQ(late->recent->steps, 0);
  EXPECT_TRUE(late->recent->counts.empty());
}

}  // namespace
}  // namespace ampscope::server
