// The run registry on its own: a run's state (settled seqs, totals, policy engine, series) lives
// in one RunState, forgetting the run drops all of it, its Prometheus series included, and only
// the most recently active runs keep series.
#include "run_registry.h"

#include <gtest/gtest.h>

#include "metrics.h"
#include "policy_host.h"
#include "server_harness.h"

namespace ampscope::server {
namespace {

using namespace std::chrono_literals;

// Series of `run` in what /metrics would serve now.
std::size_t series_of(const Metrics& metrics, const std::string& run) {
  std::size_t n = 0;
  for (const prometheus::MetricFamily& family : metrics.registry()->Collect()) {
    for (const prometheus::ClientMetric& m : family.metric) {
      for (const prometheus::ClientMetric::Label& l : m.label) {
        if (l.name == "run" && l.value == run) ++n;
      }
    }
  }
  return n;
}

std::vector<std::string> exported(const RunRegistry& runs) {
  std::vector<std::string> ids;
  for (const RunState* run : runs.exported()) ids.push_back(run->id);
  return ids;
}

TEST(ServerRunRegistryTest, OneStatePerRunFoundByItsId) {
  RunRegistry runs(10);
  EXPECT_EQ(runs.find("run-a"), nullptr);
  RunState& a = runs.get("run-a");
  EXPECT_EQ(&runs.get("run-a"), &a);
  EXPECT_EQ(runs.find("run-a"), &a);
  EXPECT_EQ(a.id, "run-a");
  runs.get("run-b");
  EXPECT_EQ(runs.size(), 2u);
  a.duplicates += 3;
  EXPECT_EQ(runs.duplicates("run-a"), 3u);
  EXPECT_EQ(runs.duplicates("run-b"), 0u);
  EXPECT_EQ(runs.duplicates("no-such-run"), 0u);
}

TEST(ServerRunRegistryTest, ForgettingARunDropsItsStateEngineAndSeries) {
  Metrics metrics("test");
  RunRegistry runs(10);
  PolicyHost policy(policy::EngineConfig{}, 1s, runs);
  for (const char* id : {"run-a", "run-b"}) {
    RunState& run = runs.get(id);
    runs.mark_active(run);
    const v1::Hello hello = testing::make_hello(id);
    policy.on_hello(run, hello);
    metrics.on_hello(run, hello);
    const v1::StepReport r = testing::make_report(id, 0, 1, 0);
    metrics.on_report(run, r, digest_report(r, false));
    run.last_seq[0] = 1;
    run.duplicates += 2;
  }
  ASSERT_NE(runs.find("run-a")->policy, nullptr);
  ASSERT_GT(series_of(metrics, "run-a"), 0u);
  const std::size_t b_series = series_of(metrics, "run-b");
  ASSERT_GT(b_series, 0u);

  EXPECT_TRUE(runs.forget("run-a"));
  EXPECT_EQ(runs.find("run-a"), nullptr);
  EXPECT_EQ(runs.duplicates("run-a"), 0u);
  EXPECT_EQ(series_of(metrics, "run-a"), 0u);
  EXPECT_EQ(series_of(metrics, "run-b"), b_series);
  EXPECT_EQ(runs.size(), 1u);
  EXPECT_EQ(exported(runs), std::vector<std::string>{"run-b"});
  // The engine went with it: snapshots see only run-b.
  for (const PolicySnapshot& s : policy.snapshots(std::chrono::steady_clock::now(), true)) {
    EXPECT_EQ(s.run_id, "run-b");
  }
  EXPECT_FALSE(runs.forget("run-a"));

  // A run that comes back starts afresh.
  RunState& again = runs.get("run-a");
  EXPECT_TRUE(again.last_seq.empty());
  EXPECT_EQ(again.policy, nullptr);
  EXPECT_EQ(again.series, nullptr);
  EXPECT_FALSE(again.exported);
}

TEST(ServerRunRegistryTest, OnlyTheMostRecentlyActiveRunsKeepSeries) {
  Metrics metrics("test");
  RunRegistry runs(2);
  auto report = [&](const std::string& id, bool active) {
    RunState& run = runs.get(id);
    if (active) runs.mark_active(run);
    const v1::StepReport r = testing::make_report(id, 0, 1, 0);
    metrics.on_report(run, r, digest_report(r, false));
  };
  report("run-a", true);
  report("run-b", true);
  EXPECT_EQ(exported(runs), (std::vector<std::string>{"run-b", "run-a"}));
  EXPECT_GT(series_of(metrics, "run-a"), 0u);

  // A third active run: the least recently active one loses its series.
  report("run-c", true);
  EXPECT_EQ(exported(runs), (std::vector<std::string>{"run-c", "run-b"}));
  EXPECT_FALSE(runs.find("run-a")->exported);
  EXPECT_EQ(runs.find("run-a")->series, nullptr);
  EXPECT_EQ(series_of(metrics, "run-a"), 0u);
  EXPECT_GT(series_of(metrics, "run-b"), 0u);

  // Activity reorders; a run that is not exported gets no series from an event alone.
  report("run-b", true);
  EXPECT_EQ(exported(runs), (std::vector<std::string>{"run-b", "run-c"}));
  report("run-a", false);
  EXPECT_EQ(series_of(metrics, "run-a"), 0u);

  // Forgetting an exported run frees its place.
  EXPECT_TRUE(runs.forget("run-c"));
  EXPECT_EQ(exported(runs), std::vector<std::string>{"run-b"});
  report("run-a", true);
  EXPECT_EQ(exported(runs), (std::vector<std::string>{"run-a", "run-b"}));
  EXPECT_GT(series_of(metrics, "run-a"), 0u);
  EXPECT_GT(series_of(metrics, "run-b"), 0u);
}

}  // namespace
}  // namespace ampscope::server
