#include "prometheus_process.h"

#include <fstream>
#include <stdexcept>
#include <thread>

#include "ampscope/testing/net.h"

namespace ampscope::testing {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

// Prometheus reads YAML; JSON is YAML, and nlohmann writes it without quoting mistakes.
json make_config(const PrometheusOptions& o) {
  json rule_files = json::array();
  for (const auto& f : o.rule_files) rule_files.push_back(std::filesystem::absolute(f).string());
  json scrape_configs = json::array();
  if (!o.scrape_targets.empty()) {
    scrape_configs.push_back({{"job_name", "ampscope"},
                              {"metrics_path", "/metrics"},
                              {"scrape_interval", o.interval},
                              {"scrape_timeout", o.interval},
                              {"static_configs", json::array({{{"targets", o.scrape_targets}}})}});
  }
  return {{"global", {{"scrape_interval", o.interval}, {"evaluation_interval", o.interval}}},
          {"rule_files", rule_files},
          {"scrape_configs", scrape_configs}};
}

}  // namespace

std::unique_ptr<ChildProcess> start_when_ready(
    const std::string& name, const std::filesystem::path& dir,
    const std::function<std::vector<std::string>(const std::string& address)>& argv,
    std::string* address) {
  std::string failures;
  for (int attempt = 0; attempt < 3; ++attempt) {
    *address = "127.0.0.1:" + std::to_string(free_loopback_port());
    const std::filesystem::path log = dir / (name + "-" + std::to_string(attempt) + ".log");
    auto process = std::make_unique<ChildProcess>(argv(*address), log);
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (process->running() && std::chrono::steady_clock::now() < deadline) {
      std::string body;
      if (http_get("http://" + *address + "/-/ready", &body, 1s) == 200) return process;
      std::this_thread::sleep_for(50ms);
    }
    failures += "attempt " + std::to_string(attempt + 1) + " on " + *address + ":\n" +
                process->log_tail() + "\n";
    process->stop(2s);
  }
  throw std::runtime_error(name + " did not become ready:\n" + failures);
}

std::string prometheus_binary() { return find_in_path("prometheus"); }
std::string promtool_binary() { return find_in_path("promtool"); }

PrometheusProcess::PrometheusProcess(const std::filesystem::path& dir,
                                     const PrometheusOptions& options) {
  const std::string binary = prometheus_binary();
  if (binary.empty()) {
    throw std::runtime_error(
        "prometheus is not installed: install Debian's 'prometheus' package (./run setup)");
  }
  const std::filesystem::path config = dir / "prometheus.yml";
  {
    std::ofstream out(config, std::ios::trunc);
    out << (options.config_yaml.empty() ? make_config(options).dump(2) : options.config_yaml)
        << "\n";
  }
  process_ = start_when_ready(
      "prometheus", dir,
      [&](const std::string& address) {
        return std::vector<std::string>{binary,
                                        "--config.file=" + config.string(),
                                        "--storage.tsdb.path=" + (dir / "tsdb").string(),
                                        "--storage.tsdb.retention.time=1h",
                                        "--web.listen-address=" + address,
                                        "--log.level=info"};
      },
      &address_);
}

PrometheusProcess::~PrometheusProcess() { stop(); }

int PrometheusProcess::stop() {
  if (!process_) return -1;
  return process_->stop(5s);
}

std::string PrometheusProcess::log_tail() const {
  return process_ ? process_->log_tail() : std::string();
}

json PrometheusProcess::api(const std::string& endpoint_and_query) {
  std::string body;
  const long status = http_get("http://" + address_ + "/api/v1/" + endpoint_and_query, &body);
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (status != 200 || j.is_discarded() || j.value("status", "") != "success") {
    throw std::runtime_error("prometheus /api/v1/" + endpoint_and_query + ": HTTP " +
                             std::to_string(status) + ": " + body.substr(0, 2000));
  }
  return j.at("data");
}

json PrometheusProcess::query(const std::string& promql) {
  return api("query?query=" + url_encode(promql)).at("result");
}

bool PrometheusProcess::wait_targets_up(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    const json targets = api("targets?state=active").at("activeTargets");
    bool all_up = !targets.empty();
    for (const json& t : targets) all_up = all_up && t.value("health", "") == "up";
    if (all_up) return true;
    std::this_thread::sleep_for(100ms);
  }
  return false;
}

}  // namespace ampscope::testing
