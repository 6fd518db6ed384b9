// A real Prometheus (Debian's `prometheus` package) for tests: a generated configuration that
// scrapes the given targets and loads the given rule files at a short interval, a TSDB in a
// temporary directory, a free loopback port, and its HTTP API (http_get + nlohmann-json).
// The process runs in its own process group and is killed with the test (ChildProcess).
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ampscope/testing/child_process.h"

namespace ampscope::testing {

struct PrometheusOptions {
  std::vector<std::string> scrape_targets;        // host:port serving /metrics
  std::vector<std::filesystem::path> rule_files;  // loaded as they are
  std::string interval = "1s";                    // scrape and rule evaluation
  // When set, the configuration file as it is (the three fields above are ignored). It is
  // written into the directory, so relative rule_files resolve against that directory.
  std::string config_yaml;
};

// The prometheus executable from PATH; empty when it is not installed.
std::string prometheus_binary();
std::string promtool_binary();

// Starts a server of the Prometheus family (they share the /-/ready endpoint): `argv(address)`
// is its command line listening on `address`, a free loopback port; its log goes to
// dir/<name>-<attempt>.log. A port free when chosen may be taken before the server binds it,
// so it tries 3 ports; throws std::runtime_error with their logs when none became ready in 30 s.
std::unique_ptr<ChildProcess> start_when_ready(
    const std::string& name, const std::filesystem::path& dir,
    const std::function<std::vector<std::string>(const std::string& address)>& argv,
    std::string* address);

class PrometheusProcess {
 public:
  // Starts Prometheus with its files under `dir` and waits until it is ready. Throws
  // std::runtime_error, whose message includes Prometheus' log, when it cannot.
  PrometheusProcess(const std::filesystem::path& dir, const PrometheusOptions& options);
  ~PrometheusProcess();

  // "127.0.0.1:PORT"
  const std::string& address() const { return address_; }
  // GET /api/v1/<endpoint> (with its query string); returns "data" of a success response and
  // throws with the error otherwise.
  nlohmann::json api(const std::string& endpoint_and_query);
  // An instant query now: the "result" array of the vector (or scalar) it returns.
  nlohmann::json query(const std::string& promql);
  // Waits until every scrape target reports health "up"; false at the timeout.
  bool wait_targets_up(std::chrono::milliseconds timeout);
  // Stops it (SIGTERM, then SIGKILL); returns the exit code. Idempotent.
  int stop();
  std::string log_tail() const;

 private:
  std::unique_ptr<ChildProcess> process_;
  std::string address_;
};

}  // namespace ampscope::testing
