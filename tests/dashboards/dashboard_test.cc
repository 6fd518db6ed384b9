// The Grafana dashboard, its provisioning and the alert rules as artefacts:
// - the dashboard JSON parses, uses a current schema, has the datasource/run/rank variables,
//   unique panel ids, no overlapping panels, a healthy/unhealthy description on every panel and
//   the panels docs/metrics.md describes, every query is valid PromQL (promtool);
// - every alert docs/metrics.md lists exists with a severity, a runbook and a runbook_url that
//   names the alert's own section of a docs page in this repository (as Prometheus loads them);
// - the Alertmanager configuration passes amtool, its commented receiver examples too, and it
//   routes every alert to the receiver of its severity;
// - every metric name any panel, variable, annotation or alert rule reads is one a real
//   ampscope-server exports: the server runs on loopback, is fed a realistic report stream
//   (every role, NaN, underflow, tensor-core samples, agent counters, policy decisions) and its
//   /metrics is scraped. No hand-written list of names.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "alertmanager_process.h"
#include "ampscope/testing/child_process.h"
#include "ampscope/testing/files.h"
#include "ampscope/testing/server_process.h"
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
const fs::path kAlertmanagerConfig = kDashboards / "alertmanager" / "alertmanager.yml";
const fs::path kRepository = kDashboards.parent_path();

bool is_row(const json& panel) { return panel.value("type", "") == "row"; }

class DashboardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dashboard_ = load_json(kDashboardJson);
    panels_ = all_panels(dashboard_);
  }
  const json* panel_titled(const std::string& part) const {
    for (const json& p : panels_) {
      if (p.value("title", "").find(part) != std::string::npos) return &p;
    }
    return nullptr;
  }
  json dashboard_;
  std::vector<json> panels_;
};

TEST_F(DashboardTest, ParsesWithACurrentSchema) {
  EXPECT_GE(dashboard_.at("schemaVersion").get<int>(), 39);  // Grafana 10.4 and later
  EXPECT_EQ(dashboard_.at("uid"), "ampscope-overview");
  EXPECT_FALSE(dashboard_.at("title").get<std::string>().empty());
  EXPECT_TRUE(dashboard_.contains("time"));
  EXPECT_FALSE(dashboard_.at("panels").empty());
}

TEST_F(DashboardTest, HasDatasourceRunAndRankVariables) {
  const json* ds = find_variable(dashboard_, "datasource");
  ASSERT_NE(ds, nullptr);
  EXPECT_EQ(ds->at("type"), "datasource");
  EXPECT_EQ(ds->at("query"), "prometheus");
  const json* run = find_variable(dashboard_, "run");
  const json* rank = find_variable(dashboard_, "rank");
  ASSERT_NE(run, nullptr);
  ASSERT_NE(rank, nullptr);
  for (const json* v : {run, rank}) {
    EXPECT_EQ(v->at("type"), "query");
    EXPECT_EQ(v->at("datasource").at("uid"), "${datasource}");
    EXPECT_NE(variable_query(*v).find("label_values("), std::string::npos);
  }
  // Ranks are those of the selected runs.
  EXPECT_NE(variable_query(*rank).find("$run"), std::string::npos);
  // Every query goes through the datasource variable.
  for (const json& p : all_panels(dashboard_)) {
    if (is_row(p)) continue;
    EXPECT_EQ(p.at("datasource").at("uid"), "${datasource}") << p.at("title");
    for (const json& t : p.value("targets", json::array())) {
      EXPECT_EQ(t.at("datasource").at("uid"), "${datasource}") << p.at("title");
    }
  }
}

TEST_F(DashboardTest, PanelIdsAreUniqueAndPanelsDoNotOverlap) {
  std::set<int> ids;
  std::vector<std::pair<std::string, json>> boxes;
  for (const json& p : all_panels(dashboard_)) {
    const int id = p.at("id").get<int>();
    EXPECT_TRUE(ids.insert(id).second) << "duplicate panel id " << id;
    boxes.emplace_back(p.value("title", ""), p.at("gridPos"));
  }
  for (std::size_t i = 0; i < boxes.size(); ++i) {
    const json& a = boxes[i].second;
    EXPECT_LE(a.at("x").get<int>() + a.at("w").get<int>(), 24) << boxes[i].first;
    for (std::size_t j = i + 1; j < boxes.size(); ++j) {
      const json& b = boxes[j].second;
      const bool overlap = a.at("x").get<int>() < b.at("x").get<int>() + b.at("w").get<int>() &&
                           b.at("x").get<int>() < a.at("x").get<int>() + a.at("w").get<int>() &&
                           a.at("y").get<int>() < b.at("y").get<int>() + b.at("h").get<int>() &&
                           b.at("y").get<int>() < a.at("y").get<int>() + a.at("h").get<int>();
      EXPECT_FALSE(overlap) << boxes[i].first << " overlaps " << boxes[j].first;
    }
  }
}

TEST_F(DashboardTest, EveryPanelDescribesHealthyAndUnhealthy) {
  for (const json& p : all_panels(dashboard_)) {
    if (is_row(p)) continue;
    const std::string d = p.value("description", "");
    EXPECT_NE(d.find("Healthy"), std::string::npos) << p.at("title");
    EXPECT_NE(d.find("Unhealthy"), std::string::npos) << p.at("title");
  }
}

TEST_F(DashboardTest, HasTheDocumentedPanels) {
  for (const char* title :
       {"Training and validation loss", "Loss scale (log2)", "Skipped steps and reasons",
        "Non-finite values by role", "Underflow ratio by format", "Overflow ratio by format",
        "Gradient magnitudes", "Worst tensors (top-K)", "First offenders",
        "Tensor-core utilisation", "Step time", "Agent connectivity", "Agent spool backlog",
        "FP8/FP4 quantisers (top-K)", "FP8/FP4 loss cost per quantiser"}) {
    EXPECT_NE(panel_titled(title), nullptr) << title;
  }
}

TEST_F(DashboardTest, LossPanelShowsTrainingAndValidationLoss) {
  const json* p = panel_titled("Training and validation loss");
  ASSERT_NE(p, nullptr);
  std::set<std::string> names;
  for (const json& t : p->at("targets")) {
    for (const std::string& n : promql_metric_names(t.at("expr").get<std::string>())) {
      names.insert(n);
    }
  }
  EXPECT_EQ(names, (std::set<std::string>{"ampscope_loss", "ampscope_validation_loss"}));
}

TEST_F(DashboardTest, LossScaleIsOnALog2AxisWithPolicyAnnotations) {
  const json* p = panel_titled("Loss scale (log2)");
  ASSERT_NE(p, nullptr);
  const json& scale = p->at("fieldConfig").at("defaults").at("custom").at("scaleDistribution");
  EXPECT_EQ(scale.at("type"), "log");
  EXPECT_EQ(scale.at("log"), 2);
  bool annotated = false;
  for (const json& a : dashboard_.at("annotations").at("list")) {
    if (a.value("expr", "").find("ampscope_policy_last_decision_info") == std::string::npos) {
      continue;
    }
    EXPECT_EQ(a.at("datasource").at("uid"), "${datasource}");
    EXPECT_NE(a.value("textFormat", "").find("{{reason}}"), std::string::npos);
    for (const json& id : a.at("filter").at("ids")) annotated = annotated || id == p->at("id");
  }
  EXPECT_TRUE(annotated) << "no policy-update annotation on the loss-scale panel";
}

TEST_F(DashboardTest, GradientHeatmapAndFormatBoundaries) {
  const json* heat = panel_titled("Gradient magnitudes");
  ASSERT_NE(heat, nullptr);
  EXPECT_EQ(heat->at("type"), "heatmap");
  const json& t = heat->at("targets").at(0);
  EXPECT_EQ(t.at("format"), "heatmap");
  EXPECT_NE(t.at("expr").get<std::string>().find("ampscope_gradient_magnitude_bucket"),
            std::string::npos);
  EXPECT_FALSE(heat->at("options").at("calculate").get<bool>());
  // The companion panel draws the limits of each format as lines on a log2 axis.
  const json* limits = panel_titled("format limits");
  ASSERT_NE(limits, nullptr);
  EXPECT_EQ(limits->at("fieldConfig").at("defaults").at("custom").at("scaleDistribution").at("log"),
            2);
  std::string exprs;
  for (const json& q : limits->at("targets")) exprs += q.at("expr").get<std::string>() + "\n";
  for (const char* bound : {"vector(65504)", "vector(2^-24)", "vector(57344)", "vector(2^-16)",
                            "vector(448)", "vector(2^-9)", "vector(2^-133)"}) {
    EXPECT_NE(exprs.find(bound), std::string::npos) << bound;
  }
  const std::string text = heat->at("description");
  for (const char* format : {"FP16", "BF16", "E5M2", "E4M3"}) {
    EXPECT_NE(text.find(format), std::string::npos) << format;
  }
}

TEST_F(DashboardTest, EveryQueryIsValidPromQL) {
  const std::string promtool = promtool_binary();
  ASSERT_FALSE(promtool.empty())
      << "promtool is not installed: install Debian's 'prometheus' package (./run setup)";
  // promtool checks rule files: one recording rule per query (JSON is YAML).
  json rules = json::array();
  int n = 0;
  for (const Query& q : dashboard_queries(dashboard_)) {
    rules.push_back({{"record", "dashboard:query_" + std::to_string(n++)},
                     {"expr", substitute_variables(q.expr, dashboard_)},
                     {"labels", {{"where", q.where}}}});
  }
  ASSERT_GT(n, 20);
  TempDir dir;
  const fs::path file = dir / "dashboard_queries.json";
  write_text(file, json{{"groups", {{{"name", "dashboard"}, {"rules", rules}}}}}.dump(2));
  std::string output;
  EXPECT_EQ(run_to_completion({promtool, "check", "rules", file.string()}, &output), 0) << output;
}

TEST_F(DashboardTest, ProvisioningPointsAtTheDashboardAndAPrometheusDatasource) {
  const std::string datasources =
      read_text(kDashboards / "grafana" / "provisioning" / "datasources" / "ampscope.yaml");
  const std::string providers =
      read_text(kDashboards / "grafana" / "provisioning" / "dashboards" / "ampscope.yaml");
  EXPECT_NE(datasources.find("apiVersion: 1"), std::string::npos);
  EXPECT_NE(datasources.find("type: prometheus"), std::string::npos);
  // The dashboard's datasource variable defaults to the provisioned datasource.
  const json* ds = find_variable(dashboard_, "datasource");
  ASSERT_NE(ds, nullptr);
  const std::string uid = ds->at("current").at("value");
  EXPECT_NE(datasources.find("uid: " + uid), std::string::npos) << uid;
  EXPECT_NE(providers.find("apiVersion: 1"), std::string::npos);
  EXPECT_NE(providers.find("type: file"), std::string::npos);
  EXPECT_NE(providers.find("path: "), std::string::npos);
}

// --- PromQL names --------------------------------------------------------------------------

TEST(PromqlNamesTest, FindsSelectorsNotFunctionsLabelsOrKeywords) {
  using V = std::vector<std::string>;
  EXPECT_EQ(promql_metric_names("ampscope_loss{run=~\"$run\", rank=~\"a|b\"}"), V{"ampscope_loss"});
  EXPECT_EQ(promql_metric_names(
                "sum by (run, le) (rate(a_bucket{role=\"x\"}[5m])) / on (run) group_left(le) "
                "max without (rank) (b offset 5m) > bool 0.5 and c unless d or Inf"),
            (V{"a_bucket", "b", "c", "d"}));
  EXPECT_EQ(promql_metric_names("sum(x) by (run) - histogram_quantile(0.9, y) * 2^-24 + 1e-3"),
            (V{"x", "y"}));
  EXPECT_EQ(promql_metric_names("label_replace(z, \"dst\", \"$1\", \"src\", \"(ampscope_no)\")"),
            V{"z"});
  EXPECT_EQ(promql_metric_names("{__name__=\"named\", run=\"r\"} + vector(1)"), V{"named"});
  EXPECT_EQ(promql_metric_names("max_over_time(q[10m:1m]) # comment ampscope_not"), V{"q"});
  EXPECT_EQ(
      grafana_variable_metric_names("label_values(ampscope_steps_total{run=~\"$run\"}, rank)"),
      V{"ampscope_steps_total"});
  EXPECT_EQ(grafana_variable_metric_names("label_values(run)"), V{});
}

// --- Alert rules as Prometheus loads them --------------------------------------------------

// The rules as Prometheus loaded them, once each has been evaluated (so that `health` says
// whether its query ran without error).
std::vector<json> evaluated_rules(PrometheusProcess& prometheus) {
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  for (;;) {
    std::vector<json> rules;
    bool evaluated = true;
    const json data = prometheus.api("rules");
    for (const json& g : data.at("groups")) {
      for (const json& r : g.at("rules")) {
        rules.push_back(r);
        evaluated = evaluated && r.value("health", "unknown") != "unknown";
      }
    }
    if ((evaluated && !rules.empty()) || std::chrono::steady_clock::now() > deadline) {
      return rules;
    }
    std::this_thread::sleep_for(200ms);
  }
}

// The anchor a Markdown renderer (GitHub's rule) gives a heading: lower case, punctuation other
// than '-' and '_' dropped, spaces to '-'.
std::string markdown_anchor(const std::string& heading) {
  std::string anchor;
  for (const unsigned char c : heading) {
    if (std::isalnum(c) || c == '-' || c == '_') {
      anchor += static_cast<char>(std::tolower(c));
    } else if (c == ' ') {
      anchor += '-';
    }
  }
  return anchor;
}

// The anchors of every heading of a Markdown page, code blocks left out.
std::set<std::string> markdown_anchors(const std::string& page) {
  std::set<std::string> anchors;
  bool in_code = false;
  for (const std::string& line : lines_of(page)) {
    if (line.starts_with("```")) in_code = !in_code;
    const std::size_t level = line.find_first_not_of('#');
    if (in_code || level == 0 || level == std::string::npos || line[level] != ' ') continue;
    anchors.insert(markdown_anchor(line.substr(level + 1)));
  }
  return anchors;
}

TEST(MarkdownAnchorTest, FollowsTheRenderersRule) {
  EXPECT_EQ(markdown_anchor("AmpscopeNonFiniteValues"), "ampscopenonfinitevalues");
  EXPECT_EQ(markdown_anchor("Prometheus -> Alertmanager, receivers"),
            "prometheus---alertmanager-receivers");
  EXPECT_EQ(markdown_anchors("# Title\n```\n# not a heading\n```\n### Runbooks\n#tag\n"),
            (std::set<std::string>{"title", "runbooks"}));
}

TEST(AlertRulesTest, EveryListedAlertHasASeverityAndARunbook) {
  TempDir dir;
  PrometheusOptions options;
  options.rule_files = {kAlertRules};
  PrometheusProcess prometheus(dir.path(), options);
  std::map<std::string, json> alerts;
  for (const json& r : evaluated_rules(prometheus)) {
    EXPECT_EQ(r.value("health", ""), "ok")
        << r.value("name", "") << ": " << r.value("lastError", "");
    if (r.at("type") == "alerting") alerts[r.at("name")] = r;
  }
  for (const char* name : {"AmpscopeNonFiniteValues", "AmpscopeUnderflowHigh", "AmpscopeOverflow",
                           "AmpscopeLossScaleCollapsed", "AmpscopeSkippedStepsHigh",
                           "AmpscopeAgentSilent", "AmpscopeAgentStale",
                           "AmpscopePolicyFallbackEngaged", "AmpscopeTensorCoreUtilisationLow",
                           "AmpscopeQuantizerUnderflowHigh", "AmpscopeQuantizerSaturationHigh",
                           "AmpscopeAmaxPastDelayedScale"}) {
    EXPECT_TRUE(alerts.contains(name)) << name;
  }
  for (const auto& [name, r] : alerts) {
    const std::string severity = r.at("labels").value("severity", "");
    EXPECT_TRUE(severity == "critical" || severity == "warning") << name << ": " << severity;
    const json& a = r.at("annotations");
    for (const char* key : {"summary", "description", "runbook"}) {
      EXPECT_FALSE(a.value(key, "").empty()) << name << " has no " << key;
    }
    EXPECT_GT(a.value("runbook", "").size(), 100u) << name << ": say what it means and what to do";
    // The runbook link: the section named after the alert in a docs page of this repository.
    const std::string url = a.value("runbook_url", "");
    const std::size_t hash = url.find('#');
    ASSERT_NE(hash, std::string::npos) << name << ": runbook_url '" << url << "' has no section";
    const fs::path page = kRepository / url.substr(0, hash);
    const std::string anchor = url.substr(hash + 1);
    EXPECT_TRUE(url.starts_with("docs/") && fs::is_regular_file(page)) << name << ": " << url;
    EXPECT_EQ(anchor, markdown_anchor(name)) << name << ": " << url;
    EXPECT_TRUE(markdown_anchors(read_text(page)).contains(anchor))
        << name << ": " << page << " has no heading for #" << anchor;
  }
}

// --- The Alertmanager configuration ---------------------------------------------------------

// The configuration with its commented examples (e-mail, Slack) switched on: every comment
// line in the body whose text is YAML (a key, a list item, or a continuation indented under
// one) loses its "# ". Prose comments start with a word that is not a key.
std::string with_examples_uncommented(const std::string& config) {
  static const std::regex commented_yaml(R"(^(\s*)# ((- )?[a-z_]+:( .*)?|  .*)$)");
  std::string out;
  bool body = false;
  for (const std::string& line : lines_of(config)) {
    body = body || (!line.empty() && line[0] != '#');
    std::smatch m;
    out += body && std::regex_match(line, m, commented_yaml) ? m.str(1) + m.str(2) : line;
    out += "\n";
  }
  return out;
}

CommandResult amtool(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {amtool_binary()};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv, 30s);
}

TEST(AlertmanagerConfigTest, ShippedConfigurationAndItsExamplesPassAmtool) {
  ASSERT_FALSE(amtool_binary().empty())
      << "amtool not found: install Debian's prometheus-alertmanager package (./run setup)";
  const CommandResult shipped = amtool({"check-config", kAlertmanagerConfig.string()});
  EXPECT_EQ(shipped.code, 0) << shipped.out << shipped.err;

  TempDir dir;
  const std::string examples = with_examples_uncommented(read_text(kAlertmanagerConfig));
  for (const char* receiver : {"slack_configs:", "email_configs:", "smtp_smarthost:"}) {
    EXPECT_NE(examples.find(receiver), std::string::npos) << "no example of " << receiver;
  }
  write_text(dir / "alertmanager.yml", examples);
  const CommandResult uncommented = amtool({"check-config", (dir / "alertmanager.yml").string()});
  EXPECT_EQ(uncommented.code, 0) << uncommented.out << uncommented.err << examples;
  EXPECT_NE(uncommented.out.find("3 receivers"), std::string::npos) << uncommented.out;
}

TEST(AlertmanagerConfigTest, RoutesEveryAlertToTheReceiverOfItsSeverity) {
  ASSERT_FALSE(amtool_binary().empty())
      << "amtool not found: install Debian's prometheus-alertmanager package (./run setup)";
  TempDir dir;
  PrometheusOptions options;
  options.rule_files = {kAlertRules};
  PrometheusProcess prometheus(dir.path(), options);
  std::vector<json> alerts;
  for (const json& r : evaluated_rules(prometheus)) {
    if (r.at("type") == "alerting") alerts.push_back(r);
  }
  ASSERT_FALSE(alerts.empty());
  // The receiver amtool picks for an alert with these labels.
  const auto route = [](const std::vector<std::string>& labels) {
    std::vector<std::string> args = {"config", "routes", "test",
                                     "--config.file=" + kAlertmanagerConfig.string()};
    args.insert(args.end(), labels.begin(), labels.end());
    const CommandResult r = amtool(args);
    EXPECT_EQ(r.code, 0) << r.err;
    return lines_of(r.out).empty() ? std::string() : lines_of(r.out).front();
  };
  for (const json& a : alerts) {
    const std::string name = a.at("name");
    const std::string severity = a.at("labels").value("severity", "");
    EXPECT_EQ(route({"alertname=" + name, "severity=" + severity, "run=r", "rank=0"}),
              "ampscope-" + severity)
        << name;
  }
  // Somebody else's alerts are not ampscope's business.
  EXPECT_EQ(route({"alertname=NodeDown", "severity=critical"}), "default");
}

// --- Every metric name is exported by the real server --------------------------------------

std::set<std::string> sample_names(const std::string& text) {
  std::set<std::string> names;
  for (const Sample& s : parse_samples(text)) names.insert(s.name);
  return names;
}

TEST(ExportedMetricsTest, EveryMetricTheDashboardAndAlertsReadIsExported) {
  const json dashboard = load_json(kDashboardJson);
  // Where each metric name is used.
  std::map<std::string, std::set<std::string>> used;
  for (const Query& q : dashboard_queries(dashboard)) {
    for (const std::string& n : promql_metric_names(q.expr)) used[n].insert(q.where);
  }
  for (const json& v : dashboard.at("templating").at("list")) {
    if (v.value("type", "") != "query") continue;
    for (const std::string& n : grafana_variable_metric_names(variable_query(v))) {
      used[n].insert("variable $" + v.value("name", ""));
    }
  }
  TempDir dir;
  {
    PrometheusOptions options;
    options.rule_files = {kAlertRules};
    PrometheusProcess prometheus(dir.path(), options);
    const std::vector<json> rules = evaluated_rules(prometheus);
    ASSERT_GE(rules.size(), 10u) << prometheus.log_tail();
    for (const json& r : rules) {
      for (const std::string& n : promql_metric_names(r.at("query").get<std::string>())) {
        used[n].insert("alert " + r.at("name").get<std::string>());
      }
    }
  }
  ASSERT_GT(used.size(), 25u);

  // The real server, fed like an agent would: a headroom policy with FP32 fallback so that
  // policy decisions (and their series) happen too.
  ServerProcess server(dir.path(), dir / "store.db",
                       {"--policy", "headroom", "--headroom-every", "1", "--headroom-window", "4",
                        "--headroom-raise-after", "1", "--policy-lead-steps", "1",
                        "--fp32-fallback", "--top-k", "5", "--rank-merge-deadline-ms", "200"});
  const std::string& metrics = server.metrics_address();
  // A run of two ranks: they disagree on step 0's scale_after, rank 1 never reports step 1
  // (merged partial at the deadline).
  AgentStream ranks[2] = {AgentStream(make_channel(server.address())),
                          AgentStream(make_channel(server.address()))};
  for (std::uint32_t rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(ranks[rank].send_hello(make_hello("dash-ranks", rank, 2)));
    v1::StepReport r = make_report("dash-ranks", rank, 1, 0, 1);
    r.set_scale_after(rank == 0 ? 65536.0 : 32768.0);
    ASSERT_TRUE(ranks[rank].send(r));
  }
  ASSERT_TRUE(ranks[0].send(make_report("dash-ranks", 0, 2, 1, 1)));
  {
    AgentStream agent(make_channel(server.address()));
    v1::Hello hello = make_hello("dash-run");
    hello.mutable_scaler()->set_min_scale(1.0);  // a scaler with a minimum (Megatron's)
    ASSERT_TRUE(agent.send_hello(hello));
    double scale = 65536.0;
    constexpr std::uint64_t kReports = 12;
    for (std::uint64_t seq = 1; seq <= kReports; ++seq) {
      v1::StepReport r = realistic_report("dash-run", seq, scale, /*nan_step=*/5);
      // An FP8 GEMM input under delayed scaling: the ampscope_quantizer_* series, the scale's
      // and the loss cost's among them.
      v1::QuantizerStats* q = r.add_quantizers();
      q->set_name("h0.mlp.fc.input");
      q->set_role(v1::TENSOR_ROLE_ACTIVATION);
      q->set_phase(v1::TENSOR_PHASE_FORWARD);
      q->set_recipe("e4m3:scale=112");
      q->set_element(v1::FORMAT_E4M3);
      q->set_values(1024);
      q->set_underflow(seq);
      q->set_amax(3.5);
      q->set_signal_sq(100.0);
      q->set_error_sq(0.1);
      q->set_tensor_scale(112.0);
      q->set_loss_cost(2e-4);  // the ampscope_quantizer_loss_cost_nats series
      ASSERT_TRUE(agent.send(r));
      scale = r.scale_after();
    }
    ASSERT_TRUE(agent.wait_ack(kReports).has_value()) << server.log();
    EXPECT_TRUE(agent.messages().size() > 0);

    // Per-tensor and policy-target series are refreshed about once a second.
    std::set<std::string> exported;
    std::vector<std::string> missing;
    const auto deadline = std::chrono::steady_clock::now() + 15s;
    do {
      std::this_thread::sleep_for(200ms);
      exported = sample_names(scrape(metrics));
      missing.clear();
      for (const auto& [name, where] : used) {
        if (!exported.contains(name)) missing.push_back(name);
      }
    } while (!missing.empty() && std::chrono::steady_clock::now() < deadline);
    // Per-run series are filtered by the selected runs ($run) in every panel.
    std::set<std::string> per_run;
    for (const Sample& s : parse_samples(scrape(metrics))) {
      if (s.labels.contains("run")) per_run.insert(s.name);
    }
    for (const Query& q : dashboard_queries(dashboard)) {
      for (const std::string& n : promql_metric_names(q.expr)) {
        if (per_run.contains(n)) {
          EXPECT_NE(q.expr.find("run=~\"$run\""), std::string::npos) << q.where << ": " << n;
        }
      }
    }
    for (const std::string& name : missing) {
      std::string where;
      for (const std::string& w : used[name]) where += "\n  " + w;
      ADD_FAILURE() << name << " is not exported by ampscope-server; used by:" << where;
    }
    EXPECT_TRUE(agent.finish().ok());
  }
  for (AgentStream& rank : ranks) EXPECT_TRUE(rank.finish().ok());
  EXPECT_EQ(server.terminate(), 0) << server.log();
}

}  // namespace
}  // namespace ampscope::testing
