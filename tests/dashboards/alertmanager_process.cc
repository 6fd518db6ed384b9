#include "alertmanager_process.h"

#include <stdexcept>

#include "ampscope/testing/files.h"
#include "ampscope/testing/net.h"
#include "prometheus_process.h"

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
  // An empty --cluster.listen-address turns the gossip cluster off: no second port to collide
  // on, no peers to wait for before notifying.
  process_ = start_when_ready(
      "alertmanager", dir,
      [&](const std::string& address) {
        return std::vector<std::string>{binary,
                                        "--config.file=" + config.string(),
                                        "--storage.path=" + (dir / "data").string(),
                                        "--web.listen-address=" + address,
                                        "--cluster.listen-address=",
                                        "--log.level=debug"};
      },
      &address_);
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
