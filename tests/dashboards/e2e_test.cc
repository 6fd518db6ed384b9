// End to end, every piece real: ampscope-server on loopback, Debian's Prometheus with the
// shipped prometheus.yml (pointed at the server and the Alertmanager, intervals cut to 1 s) and
// alert rules, Debian's Alertmanager with the shipped alertmanager.yml (its webhooks pointed at
// a receiver in this process, its waits cut to a second), and ampscope-train with the agent
// attached, an injected NaN and shrunken gradients (FP16 underflow).
// Then Prometheus' HTTP API must hold the loss-scale, non-finite and underflow series with the
// values the run produced (compared with the trainer's --log-json and with the server's own
// /metrics), and the NaN alert must reach the webhook (critical route, with the run, the rank
// and the runbook link) and resolve once the run goes on without new non-finite values. Ports
// are chosen at run time; every process runs in its own process group and is killed when the
// test ends, whether it passed, failed or crashed (ampscope/testing/child_process.h).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <thread>

#include "alertmanager_process.h"
#include "ampscope/testing/child_process.h"
#include "ampscope/testing/files.h"
#include "ampscope/testing/server_process.h"
#include "ampscope/testing/wait_until.h"
#include "dashboard_queries.h"
#include "prometheus_process.h"
#include "server_harness.h"
#include "webhook_receiver.h"

#ifndef AMPSCOPE_TRAIN_BIN
#error "AMPSCOPE_TRAIN_BIN must name the ampscope-train executable"
#endif

namespace ampscope::testing {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kRun = "e2e-nan";
constexpr int kSteps = 40;
constexpr int kNanStep = 25;

// A scalar from an instant vector with exactly one series; NaN (and a test failure) otherwise.
double single_value(const json& result, const std::string& what) {
  if (result.size() != 1) {
    ADD_FAILURE() << what << ": expected one series, got " << result.dump();
    return std::nan("");
  }
  return std::stod(result.at(0).at("value").at(1).get<std::string>());
}

std::vector<json> read_log(const fs::path& path) {
  std::vector<json> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(json::parse(line));
  }
  return lines;
}

// Replaces every `from` in `text`; returns how many.
int replace_all(std::string& text, const std::string& from, const std::string& to) {
  int n = 0;
  for (std::size_t at = text.find(from); at != std::string::npos;
       at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
    ++n;
  }
  return n;
}

// Replaces every match of `pattern` in `text` with `to`; returns how many.
int replace_matches(std::string& text, const std::string& pattern, const std::string& to) {
  const std::regex re(pattern);
  const auto n =
      std::distance(std::sregex_iterator(text.begin(), text.end(), re), std::sregex_iterator());
  text = std::regex_replace(text, re, to);
  return static_cast<int>(n);
}

// In the rule of `alert` only (from its "- alert:" line to the next), replaces every `from`;
// returns how many, or -1 when the rule is missing.
int replace_in_rule(std::string& rules, const std::string& alert, const std::string& from,
                    const std::string& to) {
  const std::size_t begin = rules.find("- alert: " + alert + "\n");
  if (begin == std::string::npos) return -1;
  const std::size_t end = rules.find("- alert: ", begin + 1);
  std::string rule = rules.substr(begin, end == std::string::npos ? end : end - begin);
  const int n = replace_all(rule, from, to);
  rules.replace(begin, end == std::string::npos ? std::string::npos : end - begin, rule);
  return n;
}

// The alert of a webhook notification whose labels include all of `labels`; null when none.
const json* find_alert(const WebhookReceiver::Post& post,
                       const std::map<std::string, std::string>& labels) {
  if (!post.body.is_object() || !post.body.contains("alerts")) return nullptr;
  for (const json& alert : post.body.at("alerts")) {
    bool all = true;
    for (const auto& [name, value] : labels) {
      all = all && alert.at("labels").value(name, "") == value;
    }
    if (all) return &alert;
  }
  return nullptr;
}

std::string dump_posts(const WebhookReceiver& receiver) {
  std::string out;
  for (const WebhookReceiver::Post& p : receiver.posts()) {
    out += p.path + " " + p.body.dump() + "\n";
  }
  return out.empty() ? "(no notification)\n" : out;
}

// The value of one series of the server's own /metrics.
double server_value(const std::string& metrics_address, const std::string& name,
                    const std::map<std::string, std::string>& labels) {
  return sample_value(parse_samples(scrape(metrics_address)), name, labels);
}

TEST(AlertingE2ETest, InjectedNanIsNotifiedThroughAlertmanagerAndResolves) {
  TempDir dir;
  const fs::path shipped = dashboards_dir();

  // 1. The server, on ports it picks.
  ServerProcess server(dir.path(), dir / "store.db");
  const std::string& grpc = server.address();
  const std::string& metrics = server.metrics_address();

  // 2. The webhook receiver, and Alertmanager with the shipped configuration: its webhooks
  //    pointed at the receiver, and a second instead of its production waits before the first
  //    notification and between updates of a group. Repeats stay an hour away, so what arrives
  //    is a firing and then a resolved notification; resolve_timeout stays as shipped, so the
  //    resolution must be Prometheus' (which sends an end time), not a timeout's.
  WebhookReceiver receiver;
  const fs::path am_dir = dir / "alertmanager";
  fs::create_directories(am_dir);
  std::string am_config = read_text(shipped / "alertmanager" / "alertmanager.yml");
  ASSERT_EQ(replace_all(am_config, "http://127.0.0.1:5001/", receiver.base_url() + "/"), 2);
  ASSERT_EQ(replace_matches(am_config, R"(group_wait: \w+)", "group_wait: 1s"), 2);
  ASSERT_EQ(replace_matches(am_config, R"(group_interval: \w+)", "group_interval: 1s"), 1);
  ASSERT_EQ(replace_matches(am_config, R"(repeat_interval: \w+)", "repeat_interval: 1h"), 2);
  AlertmanagerProcess alertmanager(am_dir, am_config);

  // 3. Prometheus with the shipped configuration and rules: scraping this server every second,
  //    rules evaluated every second, alerts sent to this Alertmanager. The NaN alert looks back
  //    5 minutes, so it resolves 5 minutes after the last NaN; the test cuts its windows to 15 s
  //    (15 scrapes) as it cuts the intervals.
  const fs::path prom_dir = dir / "prometheus";
  fs::create_directories(prom_dir);
  std::string rules = read_text(shipped / "prometheus" / "alerts.yml");
  ASSERT_EQ(replace_in_rule(rules, "AmpscopeNonFiniteValues", "[5m]", "[15s]"), 2);
  ASSERT_EQ(replace_in_rule(rules, "AmpscopeNonFiniteValues", "offset 5m", "offset 15s"), 1);
  write_text(prom_dir / "alerts.yml", rules);
  PrometheusOptions options;
  options.config_yaml = read_text(shipped / "prometheus" / "prometheus.yml");
  ASSERT_EQ(replace_all(options.config_yaml, "\"127.0.0.1:9464\"", "\"" + metrics + "\""), 1);
  ASSERT_EQ(
      replace_all(options.config_yaml, "\"127.0.0.1:9093\"", "\"" + alertmanager.address() + "\""),
      1);
  ASSERT_EQ(replace_all(options.config_yaml, "interval: 15s", "interval: 1s"), 2);
  PrometheusProcess prometheus(prom_dir, options);
  ASSERT_TRUE(prometheus.wait_targets_up(20s)) << prometheus.log_tail();
  ASSERT_TRUE(wait_until(
      [&] { return prometheus.api("alertmanagers").at("activeAlertmanagers").size() == 1; }, 20s))
      << prometheus.api("alertmanagers").dump();

  // 4. The trainer with the agent: FP16 mixed precision, gradients shrunk into FP16's underflow
  //    range, full statistics every step, and a NaN in an activation at kNanStep. It runs in two
  //    processes (checkpoint, resume): Prometheus scrapes the first part's clean counters before
  //    the NaN happens, as in a long run, and the agent continues its sequence across processes.
  const std::vector<std::string> train = {AMPSCOPE_TRAIN_BIN,
                                          "--precision",
                                          "amp-fp16",
                                          "--steps",
                                          std::to_string(kSteps),
                                          "--context",
                                          "16",
                                          "--width",
                                          "16",
                                          "--heads",
                                          "2",
                                          "--layers",
                                          "1",
                                          "--batch",
                                          "4",
                                          "--threads",
                                          "1",
                                          "--eval-every",
                                          "0",
                                          "--quiet",
                                          "--grad-shrink",
                                          "1e-6",
                                          "--inject-nan",
                                          "h0.mlp.fc@" + std::to_string(kNanStep),
                                          "--checkpoint-dir",
                                          (dir / "checkpoint").string(),
                                          "--server",
                                          grpc,
                                          "--run-id",
                                          kRun,
                                          "--spool-dir",
                                          (dir / "spool").string(),
                                          "--sample-full-every",
                                          "1"};
  const std::string run_sel = std::string("run=\"") + kRun + "\"";
  const std::string steps_query = "ampscope_steps_total{" + run_sel + "}";
  // Waits until Prometheus has scraped the server after `n` steps.
  auto wait_scraped = [&](int n) {
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    json result;
    do {
      std::this_thread::sleep_for(250ms);
      result = prometheus.query(steps_query);
    } while ((result.size() != 1 ||
              result.at(0).at("value").at(1).get<std::string>() != std::to_string(n)) &&
             std::chrono::steady_clock::now() < deadline);
    return single_value(result, steps_query);
  };
  fs::create_directories(dir / "checkpoint");
  std::string train_output;
  std::vector<std::string> first = train;
  first.insert(first.end(), {"--stop-at", std::to_string(kNanStep), "--log-json",
                             (dir / "train-1.jsonl").string()});
  ASSERT_EQ(run_to_completion(first, &train_output, 90s), 0) << train_output;
  ASSERT_EQ(wait_scraped(kNanStep), kNanStep) << prometheus.log_tail();
  const std::string nan_sel =
      "ampscope_nonfinite_values_total{" + run_sel + ", role=\"activation\", kind=\"nan\"}";
  EXPECT_EQ(single_value(prometheus.query(nan_sel), nan_sel), 0) << "NaN before the injection";

  std::vector<std::string> second = train;
  second.insert(second.end(), {"--resume", "--log-json", (dir / "train-2.jsonl").string()});
  ASSERT_EQ(run_to_completion(second, &train_output, 90s), 0) << train_output;
  std::vector<json> steps = read_log(dir / "train-1.jsonl");
  for (json& s : read_log(dir / "train-2.jsonl")) steps.push_back(std::move(s));
  ASSERT_EQ(steps.size(), static_cast<std::size_t>(kSteps)) << train_output;
  int found_inf = 0, skipped = 0;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    ASSERT_EQ(steps[i].at("step"), i) << "the logs of the two processes do not join";
    found_inf += steps[i].at("found_inf").get<bool>() ? 1 : 0;
    skipped += steps[i].at("skipped").get<bool>() ? 1 : 0;
  }
  ASSERT_TRUE(steps.at(kNanStep).at("found_inf").get<bool>()) << steps.at(kNanStep).dump();
  const double final_scale = steps.back().at("scale_after").get<double>();

  // 5. Prometheus has scraped the server after the last report.
  ASSERT_EQ(wait_scraped(kSteps), kSteps) << prometheus.log_tail();

  // Loss scale: the last value is the trainer's, and every value Prometheus saw is one the
  // trainer had after some step.
  const std::string scale_sel = "ampscope_loss_scale{" + run_sel + ", rank=\"0\"}";
  EXPECT_EQ(single_value(prometheus.query(scale_sel), scale_sel), final_scale);
  std::set<double> trainer_scales;
  for (const json& s : steps) trainer_scales.insert(s.at("scale_after").get<double>());
  const json history = prometheus.query(scale_sel + "[5m]");
  ASSERT_EQ(history.size(), 1u) << history.dump();
  for (const json& sample : history.at(0).at("values")) {
    EXPECT_TRUE(trainer_scales.contains(std::stod(sample.at(1).get<std::string>())))
        << "Prometheus saw loss scale " << sample.dump() << ", which the run never had";
  }

  // Validation loss: evaluated once, after the last step (--eval-every 0), and what Prometheus
  // holds is the trainer's number.
  ASSERT_TRUE(steps.back().contains("val_loss")) << steps.back().dump();
  const double val_loss = steps.back().at("val_loss").get<double>();
  const std::string val_sel = "ampscope_validation_loss{" + run_sel + ", rank=\"0\"}";
  EXPECT_NEAR(single_value(prometheus.query(val_sel), val_sel), val_loss,
              1e-12 * std::abs(val_loss));

  // Steps: skipped and found-Inf counts equal the trainer's.
  for (const auto& [name, expected] :
       {std::pair<std::string, int>{"ampscope_skipped_steps_total", skipped},
        {"ampscope_found_inf_steps_total", found_inf}}) {
    const std::string q = name + "{" + run_sel + "}";
    EXPECT_EQ(single_value(prometheus.query(q), q), expected) << q;
  }

  // Non-finite: the injected NaN in the activation, as the server counted it, and as the first
  // offender of exactly one step.
  const std::map<std::string, std::string> nan_labels = {
      {"run", kRun}, {"rank", "0"}, {"role", "activation"}, {"kind", "nan"}};
  const double nan_values = single_value(prometheus.query(nan_sel), nan_sel);
  EXPECT_GT(nan_values, 0);
  EXPECT_EQ(nan_values, server_value(metrics, "ampscope_nonfinite_values_total", nan_labels));
  const std::string offender_sel =
      "ampscope_first_offenders_total{" + run_sel + ", role=\"activation\"}";
  EXPECT_EQ(single_value(prometheus.query(offender_sel), offender_sel), 1);
  const std::string all_offenders = "sum(ampscope_first_offenders_total{" + run_sel + "})";
  EXPECT_EQ(single_value(prometheus.query(all_offenders), all_offenders), found_inf)
      << "every step that found Inf/NaN has exactly one first offender";

  // Underflow: the shrunken weight gradients underflow FP16, and Prometheus holds what the
  // server counted.
  const std::map<std::string, std::string> grad_labels = {
      {"run", kRun}, {"rank", "0"}, {"role", "weight_grad"}, {"format", "fp16"}};
  const std::string under_sel =
      "ampscope_underflow_values_total{" + run_sel + ", role=\"weight_grad\", format=\"fp16\"}";
  const std::string checked_sel =
      "ampscope_checked_values_total{" + run_sel + ", role=\"weight_grad\", format=\"fp16\"}";
  const double underflow = single_value(prometheus.query(under_sel), under_sel);
  const double checked = single_value(prometheus.query(checked_sel), checked_sel);
  EXPECT_GT(underflow, 0);
  EXPECT_LE(underflow, checked);
  EXPECT_EQ(underflow, server_value(metrics, "ampscope_underflow_values_total", grad_labels));
  EXPECT_EQ(checked, server_value(metrics, "ampscope_checked_values_total", grad_labels));

  // 6. The NaN alert reaches the webhook through the critical route, naming the run, the rank,
  //    the tensor role and the runbook section ...
  const std::map<std::string, std::string> alert_labels = {{"alertname", "AmpscopeNonFiniteValues"},
                                                           {"severity", "critical"},
                                                           {"run", kRun},
                                                           {"rank", "0"},
                                                           {"role", "activation"},
                                                           {"kind", "nan"}};
  const auto notified = [&](const std::string& status) {
    return [&, status](const WebhookReceiver::Post& p) {
      const json* alert = find_alert(p, alert_labels);
      return p.path == "/ampscope/critical" && p.body.value("status", "") == status &&
             alert != nullptr && alert->value("status", "") == status;
    };
  };
  const auto firing = receiver.wait_for(notified("firing"), 60s);
  ASSERT_TRUE(firing.has_value()) << "notifications:\n"
                                  << dump_posts(receiver) << "alertmanager:\n"
                                  << alertmanager.log_tail() << "prometheus:\n"
                                  << prometheus.log_tail();
  EXPECT_EQ(firing->body.value("receiver", ""), "ampscope-critical");
  const json& fired = *find_alert(*firing, alert_labels);
  EXPECT_EQ(fired.at("annotations").value("runbook_url", ""),
            "docs/alerting.md#ampscopenonfinitevalues");
  EXPECT_NE(fired.at("annotations").value("summary", "").find(std::string("run ") + kRun),
            std::string::npos)
      << fired.dump();

  // ... and resolves: the run went on to its last step without another non-finite value, so
  //    once the window has passed Prometheus sends the alert's end and the receiver hears of it.
  const auto resolved = receiver.wait_for(notified("resolved"), 60s);
  ASSERT_TRUE(resolved.has_value()) << "notifications:\n"
                                    << dump_posts(receiver) << "alertmanager:\n"
                                    << alertmanager.log_tail() << "prometheus:\n"
                                    << prometheus.log_tail();
  const json& ended = *find_alert(*resolved, alert_labels);
  EXPECT_EQ(ended.value("fingerprint", ""), fired.value("fingerprint", "")) << ended.dump();
  EXPECT_EQ(ended.value("startsAt", ""), fired.value("startsAt", "")) << ended.dump();
  // Resolved by the run's recovery, not by the series going away: the server still exports
  // the NaN count the alert fired on.
  EXPECT_EQ(server_value(metrics, "ampscope_nonfinite_values_total", nan_labels), nan_values);

  EXPECT_EQ(server.terminate(), 0) << server.log();
  prometheus.stop();
  alertmanager.stop();
}

}  // namespace
}  // namespace ampscope::testing
