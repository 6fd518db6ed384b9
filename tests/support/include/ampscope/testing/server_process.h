// ampscope-server as a child process on loopback (a ChildProcess: killed with the test). By
// default it binds port 0 for gRPC, /metrics and the web UI, and the harness reads the chosen
// addresses back from its --ready-file, so no port is ever guessed.
//
// Thread safety: a ServerProcess is used by one thread.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "ampscope/testing/child_process.h"

namespace ampscope::testing {

struct ServerOptions {
  std::filesystem::path dir;       // its log and ready files
  std::filesystem::path db;        // the store, kept across restarts; empty: dir / "store.db"
  std::vector<std::string> flags;  // after the harness's own
  // 0: the server picks a free gRPC port. Otherwise this one, for clients that are given the
  // address before the server serves (a trainer started while it is down).
  int port = 0;
};

class ServerProcess {
 public:
  // Starts it and waits until it serves. Fails the test (ADD_FAILURE, with the server's log)
  // and throws std::runtime_error when it does not.
  explicit ServerProcess(ServerOptions options);
  ServerProcess(const std::filesystem::path& dir, const std::filesystem::path& db,
                std::vector<std::string> flags = {});
  ~ServerProcess();

  // host:port of the gRPC services, of /metrics and of the web UI, as of the last start.
  const std::string& address() const { return address_; }
  const std::string& metrics_address() const { return metrics_address_; }
  const std::string& http_address() const { return http_address_; }
  // SIGTERM, then waits up to `timeout`; the exit code, or -1 when it was not running or did
  // not exit in time (then it is killed).
  int terminate(std::chrono::milliseconds timeout = std::chrono::seconds(20));
  void kill9();
  // Kills it if it runs and starts it again on the same store and the same gRPC port, so that
  // clients reconnect to address(). Fails and throws as the constructor does.
  void restart();
  // Everything it logged, every start.
  std::string log() const;

 private:
  void start(int port);
  ServerOptions options_;
  std::filesystem::path log_;
  std::string tag_;
  int starts_ = 0;
  std::unique_ptr<ChildProcess> process_;
  std::string address_;
  std::string metrics_address_;
  std::string http_address_;
};

}  // namespace ampscope::testing
