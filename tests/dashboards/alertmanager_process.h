// A real Alertmanager (Debian's `prometheus-alertmanager` package) for tests: the given
// configuration, its own data directory, a free loopback port, cluster mode off (no gossip
// port, no peers), and amtool to check configurations. The process runs in its own process
// group and is killed with the test (ChildProcess).
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "ampscope/testing/child_process.h"

namespace ampscope::testing {

// The executables from PATH; empty when the package is not installed.
std::string alertmanager_binary();
std::string amtool_binary();

class AlertmanagerProcess {
 public:
  // Writes `config_yaml` to dir/alertmanager.yml, starts Alertmanager with its data under
  // dir/data and waits until it is ready. Throws std::runtime_error, whose message includes
  // Alertmanager's log, when it cannot.
  AlertmanagerProcess(const std::filesystem::path& dir, const std::string& config_yaml);
  ~AlertmanagerProcess();

  // "127.0.0.1:PORT"
  const std::string& address() const { return address_; }
  // Stops it (SIGTERM, then SIGKILL); returns the exit code. Idempotent.
  int stop();
  std::string log_tail() const;

 private:
  std::unique_ptr<ChildProcess> process_;
  std::string address_;
};

}  // namespace ampscope::testing
