// The run registry on its own: a run's state (settled seqs, totals, policy engine, series) lives
// in one RunState, and forgetting the run drops all of it, its Prometheus series included.
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

TEST(ServerRunRegistryTest, OneStatePerRunFoundByItsId) {
  RunRegistry runs;
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
  RunRegistry runs;
  PolicyHost policy(policy::EngineConfig{}, 1s, runs);
  for (const char* id : {"run-a", "run-b"}) {
    RunState& run = runs.get(id);
    const v1::Hello hello = testing::make_hello(id);
    policy.on_hello(run, hello);
    metrics.on_hello(run, hello);
    metrics.on_report(run, testing::make_report(id, 0, 1, 0));
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
}

}  // namespace
}  // namespace ampscope::server
