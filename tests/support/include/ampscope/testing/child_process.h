// Child processes for tests. Each runs in its own process group and gets SIGKILL when the test
// process dies (PR_SET_PDEATHSIG); a ChildProcess kills its whole group when it goes away. So
// nothing a test started outlives it, whether it passed, failed or crashed.
//
// Thread safety: a ChildProcess is used by one thread, the one that started it (the death
// signal follows that thread).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

namespace ampscope::testing {

class ChildProcess {
 public:
  // Starts argv[0] (a path) with stdin from /dev/null and stdout and stderr appended to `log`,
  // or stderr to `err_log` when one is given. Throws std::runtime_error when it cannot.
  ChildProcess(std::vector<std::string> argv, std::filesystem::path log,
               std::filesystem::path err_log = {});
  ~ChildProcess();  // SIGKILL to the group, then reaps
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  bool running();
  // Waits up to `timeout`; the exit code, 128 + signal, or -1 when it is still running.
  int wait(std::chrono::milliseconds timeout);
  // SIGTERM to the group, then SIGKILL after `grace`; the exit code as wait() gives it, or -1
  // when it had to be killed.
  int stop(std::chrono::milliseconds grace = std::chrono::seconds(10));
  // SIGKILL to the group now, and reaps.
  void kill9();
  // What it wrote to `log` so far.
  std::string log() const;
  // The last `bytes` of the log, for failure messages.
  std::string log_tail(std::size_t bytes = 4000) const;

 private:
  void reap();
  pid_t pid_ = -1;
  int exit_code_ = -1;
  std::filesystem::path log_;
};

struct CommandResult {
  int code = -1;  // exit code, 128 + signal, or -1 when killed at the timeout
  std::string out;
  std::string err;
};

// Runs a command to completion (a ChildProcess, killed at the timeout), its stdout and stderr
// captured apart.
CommandResult run_process(const std::vector<std::string>& argv,
                          std::chrono::milliseconds timeout = std::chrono::seconds(60));

// As run_process, with stdout and stderr interleaved as written and appended to *output;
// returns the exit code.
int run_to_completion(const std::vector<std::string>& argv, std::string* output,
                      std::chrono::milliseconds timeout = std::chrono::seconds(60));

// Looks `name` up in PATH; empty when absent.
std::string find_in_path(const std::string& name);

}  // namespace ampscope::testing
