// End to end, every piece real: ampscope-server on loopback, Debian's Prometheus with the
// shipped prometheus.yml (pointed at the server, intervals cut to 1 s) and alert rules, and
// ampscope-train with the agent attached, an injected NaN and shrunken gradients (FP16 underflow).
// Then Prometheus' HTTP API must hold the loss-scale, non-finite and underflow series with the
// values the run produced (compared with the trainer's --log-json and with the server's own
// /metrics) and fire the NaN alert. Ports are chosen at run time; every process runs in its own
// process group and is killed when the test ends, whether it passed, failed or crashed
// (ampscope/testing/child_process.h).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "ampscope/testing/child_process.h"
#include "ampscope/testing/files.h"
#include "ampscope/testing/server_process.h"
#include "prometheus_process.h"
#include "server_harness.h"

#ifndef AMPSCOPE_DASHBOARDS_DIR
#error "AMPSCOPE_DASHBOARDS_DIR must name the source tree's dashboards/ directory"
#endif
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

// The value of one series of the server's own /metrics.
double server_value(const std::string& metrics_address, const std::string& name,
                    const std::map<std::string, std::string>& labels) {
  return sample_value(parse_samples(scrape(metrics_address)), name, labels);
}

TEST(AlertingE2ETest, InjectedNanReachesPrometheusAndFiresTheAlert) {
  TempDir dir;

  // 1. The server, on ports it picks.
  ServerProcess server(dir.path(), dir / "store.db");
  const std::string& grpc = server.address();
  const std::string& metrics = server.metrics_address();

  // 2. Prometheus with the shipped configuration and rules: scraping this server, every second,
  //    rules evaluated every second.
  const fs::path prom_dir = dir / "prometheus";
  fs::create_directories(prom_dir);
  const fs::path shipped = fs::path(AMPSCOPE_DASHBOARDS_DIR) / "prometheus";
  fs::copy_file(shipped / "alerts.yml", prom_dir / "alerts.yml");
  PrometheusOptions options;
  options.config_yaml = read_text(shipped / "prometheus.yml");
  ASSERT_EQ(replace_all(options.config_yaml, "\"127.0.0.1:9464\"", "\"" + metrics + "\""), 1);
  ASSERT_EQ(replace_all(options.config_yaml, "interval: 15s", "interval: 1s"), 2);
  PrometheusProcess prometheus(prom_dir, options);
  ASSERT_TRUE(prometheus.wait_targets_up(20s)) << prometheus.log_tail();

  // 3. The trainer with the agent: FP16 mixed precision, gradients shrunk into FP16's underflow
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

  // 4. Prometheus has scraped the server after the last report.
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

  // 5. The NaN alert fires, for this run's activation, as critical.
  bool fired = false;
  std::string seen;
  const auto alert_deadline = std::chrono::steady_clock::now() + 20s;
  while (!fired && std::chrono::steady_clock::now() < alert_deadline) {
    seen.clear();
    for (const json& a : prometheus.firing_alerts()) {
      const json& l = a.at("labels");
      seen += l.dump() + "\n";
      fired = fired || (l.value("alertname", "") == "AmpscopeNonFiniteValues" &&
                        l.value("run", "") == kRun && l.value("role", "") == "activation" &&
                        l.value("kind", "") == "nan" && l.value("severity", "") == "critical" &&
                        !a.at("annotations").value("runbook", "").empty());
    }
    if (!fired) std::this_thread::sleep_for(250ms);
  }
  EXPECT_TRUE(fired) << "firing alerts:\n" << seen << prometheus.log_tail();

  EXPECT_EQ(server.terminate(), 0) << server.log();
  prometheus.stop();
}

}  // namespace
}  // namespace ampscope::testing
