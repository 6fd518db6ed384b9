// Child processes for the dashboard and alerting tests: each runs in its own process group and
// gets SIGKILL when the test process dies (PR_SET_PDEATHSIG), and ChildProcess kills its whole
// group when it goes away, so nothing a test started outlives it, whether it passed, failed or
// crashed. Also: free loopback ports and plain HTTP GETs (libcurl).
//
// Thread safety: a ChildProcess is used by one thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace ampscope::testing {

class ChildProcess {
 public:
  // Starts argv[0] (a path) with stdout and stderr appended to `log`. Throws when it cannot.
  ChildProcess(std::vector<std::string> argv, std::filesystem::path log);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  bool running();
  // Waits up to `timeout`; the exit code, 128 + signal, or -1 when it is still running.
  int wait(std::chrono::milliseconds timeout);
  // SIGTERM to the group, then SIGKILL after `grace`; returns the exit code as wait() does.
  int stop(std::chrono::milliseconds grace = std::chrono::seconds(10));
  std::string log() const;
  // The last `bytes` of the log, for failure messages.
  std::string log_tail(std::size_t bytes = 4000) const;

 private:
  pid_t pid_ = -1;
  int exit_code_ = -1;
  std::filesystem::path log_;
};

// Runs a command to completion (own process group, killed at the timeout); returns its exit
// code (-1 at the timeout) and appends its stdout+stderr to *output.
int run_to_completion(const std::vector<std::string>& argv, std::string* output,
                      std::chrono::milliseconds timeout = std::chrono::seconds(60));

// A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read it, close).
int free_loopback_port();

// GET `url`; returns the HTTP status (0 when the connection failed) and the body in *body.
long http_get(const std::string& url, std::string* body,
              std::chrono::milliseconds timeout = std::chrono::seconds(10));
// Percent-encodes a query parameter value.
std::string url_encode(const std::string& value);

// Looks `name` up in PATH; empty when absent.
std::string find_in_path(const std::string& name);

}  // namespace ampscope::testing
