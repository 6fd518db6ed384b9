#include "alertmanager_process.h"

#include <stdexcept>
#include <thread>

#include "ampscope/testing/files.h"
#include "ampscope/testing/net.h"

namespace ampscope::testing {

using namespace std::chrono_literals;

std::string alertmanager_binary() { return find_in_path("prometheus-alertmanager"); }
std::string amtool_binary() { return find_in_path("amtool"); }

AlertmanagerProcess::AlertmanagerProcess(const std::filesystem::path& dir,
                                         const std::string& config_yaml) {
  const std::string binary = alertmanager_binary();
  if (binary.empty()) {
    throw std::runtime_error(
        "prometheus-alertmanager is not installed: install Debian's 'prometheus-alertmanager' "
        "package (./run setup)");
  }
  const std::filesystem::path config = dir / "alertmanager.yml";
  write_text(config, config_yaml);
  // The port is free when chosen but may be taken before Alertmanager binds it: try again then.
  std::string failures;
  for (int attempt = 0; attempt < 3; ++attempt) {
    address_ = "127.0.0.1:" + std::to_string(free_loopback_port());
    const std::filesystem::path log = dir / ("alertmanager-" + std::to_string(attempt) + ".log");
    // An empty --cluster.listen-address turns the gossip cluster off: no second port to
    // collide on, no peers to wait for before notifying.
    process_ = std::make_unique<ChildProcess>(
        std::vector<std::string>{binary, "--config.file=" + config.string(),
                                 "--storage.path=" + (dir / "data").string(),
                                 "--web.listen-address=" + address_,
                                 "--cluster.listen-address=", "--log.level=debug"},
        log);
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (process_->running() && std::chrono::steady_clock::now() < deadline) {
      std::string body;
      if (http_get("http://" + address_ + "/-/ready", &body, 1s) == 200) return;
      std::this_thread::sleep_for(50ms);
    }
    failures += "attempt " + std::to_string(attempt + 1) + " on " + address_ + ":\n" +
                process_->log_tail() + "\n";
    process_->stop(2s);
  }
  process_.reset();
  throw std::runtime_error("alertmanager did not become ready:\n" + failures);
}

AlertmanagerProcess::~AlertmanagerProcess() { stop(); }

int AlertmanagerProcess::stop() {
  if (!process_) return -1;
  return process_->stop(5s);
}

std::string AlertmanagerProcess::log_tail() const {
  return process_ ? process_->log_tail() : std::string();
}

}  // namespace ampscope::testing
