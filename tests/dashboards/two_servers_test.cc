// Several ampscope-servers behind one Prometheus answer as one server does: two servers share
// one real PostgreSQL (--run-leases, so each run has one owner), each is fed one run and owns
// it, and one real Prometheus scrapes both with the shipped alert rules; one more server on
// its own SQLite store is fed the same two runs and scraped by a second Prometheus. Then:
// - each server exports only the runs it owns (its /metrics), and the one that does not own a
//   run sends its agent to the owner (a Redirect naming it);
// - every per-run series the dashboard or an alert rule reads holds the same values in both
//   Prometheus (labels other than instance and job);
// - every dashboard query answers with the same series in both, and those without a range
//   (whose values do not depend on when each Prometheus happened to scrape) with the same
//   values;
// - the same alerts are active in both, the NaN alert among them for the run the second server
//   owns.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <thread>

#include "ampscope/testing/files.h"
#include "ampscope/testing/postgres.h"
#include "ampscope/testing/server_process.h"
#include "ampscope/testing/wait_until.h"
#include "dashboard_queries.h"
#include "prometheus_process.h"
#include "promql_names.h"
#include "realistic_reports.h"
#include "server_harness.h"

namespace ampscope::testing {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

const fs::path kDashboards = dashboards_dir();
const fs::path kDashboardJson = dashboard_json();
const fs::path kAlertRules = alert_rules();

constexpr std::uint64_t kReports = 12;

// One agent of `run` on `address`: its Hello and kReports realistic reports with a NaN at
// `nan_step`, and a clean end. Empty when every report was acknowledged, else what went wrong.
std::string feed_run(const std::string& address, const std::string& run, std::int64_t nan_step) {
  AgentStream agent(make_channel(address));
  if (!agent.send_hello(make_hello(run))) return "the Hello could not be sent";
  double scale = 65536.0;
  for (std::uint64_t seq = 1; seq <= kReports; ++seq) {
    const v1::StepReport r = realistic_report(run, seq, scale, nan_step);
    if (!agent.send(r)) break;  // the stream ended: its status says why
    scale = r.scale_after();
  }
  const bool acked = agent.wait_ack(kReports).has_value();
  const grpc::Status end = agent.finish();
  if (acked && end.ok()) return "";
  return run + " at " + address + ": " + std::to_string(agent.highest_ack()) + " of " +
         std::to_string(kReports) + " reports acknowledged; the stream ended " +
         std::to_string(end.error_code()) + " " + end.error_message();
}

// A series' identity for comparing two Prometheus: its labels without those of the scrape
// (instance, job), which name the servers and differ by design.
std::string series_key(const json& metric) {
  std::string key;
  for (const auto& [name, value] : metric.items()) {
    if (name == "instance" || name == "job") continue;
    key += name + "=" + value.get<std::string>() + ",";
  }
  return key;
}

// An instant vector as series key -> value ("NaN" and "+Inf" as Prometheus writes them).
// Two series with the same key (a run exported by both servers) make the answer "duplicate".
std::map<std::string, std::string> by_series(const json& result) {
  std::map<std::string, std::string> out;
  for (const json& s : result) {
    const std::string key = series_key(s.value("metric", json::object()));
    const std::string value = s.at("value").at(1).get<std::string>();
    if (!out.emplace(key, value).second) out[key] = "duplicate";
  }
  return out;
}

std::set<std::string> keys_of(const std::map<std::string, std::string>& m) {
  std::set<std::string> out;
  for (const auto& [k, v] : m) out.insert(k);
  return out;
}

std::string dump(const std::map<std::string, std::string>& m) {
  std::string out;
  for (const auto& [k, v] : m) out += "  {" + k + "} " + v + "\n";
  return out.empty() ? "  (none)\n" : out;
}

// The runs that `address`'s /metrics has series of.
std::set<std::string> exported_runs(const std::string& metrics_address) {
  std::set<std::string> runs;
  for (const Sample& s : parse_samples(scrape(metrics_address))) {
    if (auto run = s.labels.find("run"); run != s.labels.end()) runs.insert(run->second);
  }
  return runs;
}

TEST(TwoServersTest, DashboardAndAlertsAnswerAsForOneServer) {
  TempDir dir;
  PostgresInstance postgres;
  const std::string db = postgres.create_database();
  const std::vector<std::string> leases = {"--run-leases", "--lease-ttl", "10s"};
  ServerProcess a(ServerOptions{.dir = dir.path(), .db = db, .flags = leases});
  ServerProcess b(ServerOptions{.dir = dir.path(), .db = db, .flags = leases});
  ServerProcess one(dir.path(), dir / "one.db");

  // The same two runs, each owned by one of the pair, and both on the single server. The NaN
  // of run two-b (server B's) comes at another step than two-a's, so the runs differ.
  ASSERT_EQ(feed_run(a.address(), "two-a", /*nan_step=*/5), "") << a.log();
  ASSERT_EQ(feed_run(b.address(), "two-b", /*nan_step=*/8), "") << b.log();
  ASSERT_EQ(feed_run(one.address(), "two-a", 5), "") << one.log();
  ASSERT_EQ(feed_run(one.address(), "two-b", 8), "") << one.log();

  // Run ownership: B sends an agent of two-a to A, and each exports only its own run.
  {
    AgentStream other(make_channel(b.address()));
    ASSERT_TRUE(other.send_hello(make_hello("two-a")));
    EXPECT_EQ(other.wait_end().error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    const std::vector<v1::ServerMessage> messages = other.messages();
    ASSERT_EQ(messages.size(), 1u);
    EXPECT_EQ(messages[0].redirect().owner(), a.address());
  }
  EXPECT_EQ(exported_runs(a.metrics_address()), std::set<std::string>{"two-a"});
  EXPECT_EQ(exported_runs(b.metrics_address()), std::set<std::string>{"two-b"});
  EXPECT_EQ(exported_runs(one.metrics_address()), (std::set<std::string>{"two-a", "two-b"}));

  PrometheusOptions pair_options;
  pair_options.scrape_targets = {a.metrics_address(), b.metrics_address()};
  pair_options.rule_files = {kAlertRules};
  PrometheusOptions one_options;
  one_options.scrape_targets = {one.metrics_address()};
  one_options.rule_files = {kAlertRules};
  fs::create_directories(dir / "prometheus-pair");
  fs::create_directories(dir / "prometheus-one");
  PrometheusProcess pair(dir / "prometheus-pair", pair_options);
  PrometheusProcess single(dir / "prometheus-one", one_options);
  ASSERT_TRUE(pair.wait_targets_up(20s)) << pair.log_tail();
  ASSERT_TRUE(single.wait_targets_up(20s)) << single.log_tail();

  // The per-run series that the dashboard and the alert rules read.
  const json dashboard = load_json(kDashboardJson);
  std::set<std::string> names;
  for (const Query& q : dashboard_queries(dashboard)) {
    for (const std::string& n : promql_metric_names(q.expr)) names.insert(n);
  }
  for (const json& g : pair.api("rules").at("groups")) {
    for (const json& r : g.at("rules")) {
      for (const std::string& n : promql_metric_names(r.at("query").get<std::string>())) {
        names.insert(n);
      }
    }
  }
  std::set<std::string> per_run;
  for (const Sample& s : parse_samples(scrape(one.metrics_address()))) {
    if (s.labels.contains("run") && names.contains(s.name)) per_run.insert(s.name);
  }
  ASSERT_GT(per_run.size(), 15u);

  // Both Prometheus hold the final values once each has scraped after the last report (and
  // the servers' per-tensor series, refreshed about once a second); until then they may differ.
  const std::string runs = "two-a|two-b";
  std::map<std::string, std::map<std::string, std::string>> pair_series, single_series;
  const auto same_series = [&] {
    bool same = true;
    for (const std::string& name : per_run) {
      const std::string promql = name + "{run=~\"" + runs + "\"}";
      pair_series[name] = by_series(pair.query(promql));
      single_series[name] = by_series(single.query(promql));
      same = same && !single_series[name].empty() && pair_series[name] == single_series[name];
    }
    return same;
  };
  if (!wait_until(same_series, 30s, 500ms)) {
    for (const std::string& name : per_run) {
      EXPECT_EQ(pair_series[name], single_series[name]) << name << " with two servers:\n"
                                                        << dump(pair_series[name]) << "with one:\n"
                                                        << dump(single_series[name]);
    }
  }

  // Every dashboard query that reads per-run series: the same series, and without a range
  // the same values. A range needs two scrapes of the final values in each Prometheus; until
  // then the answers may differ.
  std::vector<std::string> differences;
  int compared = 0;
  const auto same_dashboard = [&] {
    differences.clear();
    compared = 0;
    for (const Query& q : dashboard_queries(dashboard)) {
      bool reads_runs = false;
      for (const std::string& n : promql_metric_names(q.expr)) reads_runs |= per_run.contains(n);
      if (!reads_runs) continue;  // the servers' own series (ack delay, streams): per server
      const std::string promql = substitute_variables(q.expr, dashboard, {{"run", runs}});
      const bool ranged = promql.find('[') != std::string::npos;
      const auto two = by_series(pair.query(promql));
      const auto single_answer = by_series(single.query(promql));
      if (ranged ? keys_of(two) != keys_of(single_answer) : two != single_answer) {
        differences.push_back(q.where + ": " + promql + "\nwith two servers:\n" + dump(two) +
                              "with one:\n" + dump(single_answer));
      }
      ++compared;
    }
    return differences.empty();
  };
  wait_until(same_dashboard, 30s, 500ms);
  for (const std::string& d : differences) ADD_FAILURE() << d;
  EXPECT_GT(compared, 25);

  // The same alerts, pending or firing: the NaN alert for each run, two-b's from server B.
  std::map<std::string, std::string> pair_alerts, single_alerts;
  const std::string nan_alert = "alertname=AmpscopeNonFiniteValues";
  const auto same_alerts = [&] {
    pair_alerts = by_series(pair.query("ALERTS"));
    single_alerts = by_series(single.query("ALERTS"));
    bool b_fires = false;
    for (const auto& [key, value] : pair_alerts) {
      b_fires |= key.find(nan_alert) != std::string::npos &&
                 key.find("alertstate=firing") != std::string::npos &&
                 key.find("run=two-b") != std::string::npos;
    }
    return b_fires && pair_alerts == single_alerts;
  };
  EXPECT_TRUE(wait_until(same_alerts, 30s, 500ms)) << "alerts with two servers:\n"
                                                   << dump(pair_alerts) << "with one:\n"
                                                   << dump(single_alerts);
  bool a_fires = false;
  for (const auto& [key, value] : pair_alerts) {
    a_fires |=
        key.find(nan_alert) != std::string::npos && key.find("run=two-a") != std::string::npos;
  }
  EXPECT_TRUE(a_fires) << dump(pair_alerts);

  EXPECT_EQ(a.terminate(), 0) << a.log();
  EXPECT_EQ(b.terminate(), 0) << b.log();
  EXPECT_EQ(one.terminate(), 0) << one.log();
}

}  // namespace
}  // namespace ampscope::testing
