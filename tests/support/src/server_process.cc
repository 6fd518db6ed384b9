#include "ampscope/testing/server_process.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <stdexcept>

#include "ampscope/testing/files.h"
#include "ampscope/testing/wait_until.h"

#ifndef AMPSCOPE_SERVER_BINARY
#error "AMPSCOPE_SERVER_BINARY must name the ampscope-server executable"
#endif

namespace ampscope::testing {

using namespace std::chrono_literals;

ServerProcess::ServerProcess(ServerOptions options) : options_(std::move(options)) {
  if (options_.db.empty()) options_.db = options_.dir / "store.db";
  // Several servers may share a directory (one store, a server after another).
  static int counter = 0;
  tag_ = std::to_string(::getpid()) + "-" + std::to_string(++counter);
  log_ = options_.dir / ("server-" + tag_ + ".log");
  start(options_.port);
}

ServerProcess::ServerProcess(const std::filesystem::path& dir, const std::filesystem::path& db,
                             std::vector<std::string> flags)
    : ServerProcess(ServerOptions{.dir = dir, .db = db, .flags = std::move(flags)}) {}

ServerProcess::~ServerProcess() = default;

void ServerProcess::start(int port) {
  const std::filesystem::path ready =
      options_.dir / ("ready-" + tag_ + "-" + std::to_string(starts_++) + ".json");
  std::vector<std::string> argv = {AMPSCOPE_SERVER_BINARY,
                                   "--listen",
                                   "127.0.0.1:" + std::to_string(port),
                                   "--metrics-listen",
                                   "127.0.0.1:0",
                                   "--http-listen",
                                   "127.0.0.1:0",
                                   "--db",
                                   options_.db.string(),
                                   "--ready-file",
                                   ready.string(),
                                   "--shutdown-timeout",
                                   "10s"};
  argv.insert(argv.end(), options_.flags.begin(), options_.flags.end());
  process_ = std::make_unique<ChildProcess>(argv, log_);
  // The server writes the file under another name and renames it: it is whole once it exists.
  wait_until([&] { return std::filesystem::exists(ready) || !process_->running(); }, 30s, 10ms);
  if (!std::filesystem::exists(ready)) {
    ADD_FAILURE() << "ampscope-server did not start; its log:\n" << log();
    process_->kill9();
    throw std::runtime_error("ampscope-server did not start");
  }
  const nlohmann::json j = nlohmann::json::parse(read_text(ready));
  address_ = j.at("grpc").get<std::string>();
  metrics_address_ = j.at("metrics").get<std::string>();
  http_address_ = j.at("http").get<std::string>();
}

int ServerProcess::terminate(std::chrono::milliseconds timeout) {
  if (!process_ || !process_->running()) return -1;
  return process_->stop(timeout);
}

void ServerProcess::kill9() {
  if (process_) process_->kill9();
}

void ServerProcess::restart() {
  kill9();
  start(std::stoi(address_.substr(address_.rfind(':') + 1)));
}

std::string ServerProcess::log() const { return read_text(log_); }

}  // namespace ampscope::testing
