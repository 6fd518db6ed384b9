// Real processes for the agent's end-to-end tests: ampscope-server and ampscope-train as
// children on loopback, killed (SIGKILL) and reaped when their handle goes away, whether the
// test passed or not; and a Query client to read back what the server stored.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ampscope/v1/query.grpc.pb.h"

namespace ampscope::agent::testing {

using namespace std::chrono_literals;

class Process {
 public:
  // Starts argv[0] with the arguments; stdout and stderr go to `log`.
  Process(std::vector<std::string> argv, std::filesystem::path log);
  ~Process();  // SIGKILL and reap if still running
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  bool running();
  // Waits for the exit; returns the exit code, 128 + signal, or nullopt at the timeout.
  std::optional<int> wait(std::chrono::milliseconds timeout);
  void kill9();
  std::string log() const;

 private:
  pid_t pid_ = -1;
  std::optional<int> status_;
  std::filesystem::path log_;
};

// A free TCP port on 127.0.0.1 (bound and released; the tests then bind it again).
int free_port();

// ampscope-server on 127.0.0.1:port with its store in `dir` (kept across restarts).
class Server {
 public:
  Server(std::filesystem::path dir, int port, std::vector<std::string> flags = {});
  ~Server();
  // Starts (or restarts) it and waits until it serves; false (with the log) when it does not.
  bool start();
  void kill9();
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  std::string log() const;

 private:
  std::filesystem::path dir_;
  int port_;
  std::vector<std::string> flags_;
  int starts_ = 0;
  std::unique_ptr<Process> process_;
};

// Every stored report of `run` (all ranks), in step order, with their tensors.
std::vector<v1::StepReport> stored_reports(const std::string& address, const std::string& run);
std::optional<v1::GetRunResponse> get_run(const std::string& address, const std::string& run);
std::optional<v1::GetPolicyResponse> get_policy(const std::string& address,
                                                const std::string& run);

// Lines of a JSON-lines file (the trainer's --log-json); 0 when it does not exist.
std::size_t count_lines(const std::filesystem::path& path);

// Polls `done` every 50 ms until it holds or the timeout passes.
template <typename F>
bool wait_until(F done, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (done()) return true;
    std::this_thread::sleep_for(50ms);
  }
  return done();
}

}  // namespace ampscope::agent::testing
