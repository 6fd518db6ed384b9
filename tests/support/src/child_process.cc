#include "ampscope/testing/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "ampscope/testing/files.h"

extern char** environ;

namespace ampscope::testing {
namespace {

using namespace std::chrono_literals;

int decode_status(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

int open_log(const std::filesystem::path& path) {
  return ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
}

}  // namespace

ChildProcess::ChildProcess(std::vector<std::string> argv, std::filesystem::path log,
                           std::filesystem::path err_log)
    : log_(std::move(log)) {
  // Everything the child needs is prepared before fork: the test process has threads (gRPC),
  // so the child may only make async-signal-safe calls until it execs.
  std::vector<char*> args;
  for (std::string& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  const int out_fd = open_log(log_);
  const int err_fd = err_log.empty() ? out_fd : open_log(err_log);
  const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const auto close_fds = [&] {
    ::close(out_fd);
    if (err_fd != out_fd) ::close(err_fd);
    ::close(null_fd);
  };
  if (out_fd < 0 || err_fd < 0 || null_fd < 0) {
    close_fds();
    throw std::runtime_error("cannot open the log of " + argv[0]);
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    close_fds();
    throw std::runtime_error("fork failed");
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the test died before prctl took effect
    ::dup2(null_fd, STDIN_FILENO);
    ::dup2(out_fd, STDOUT_FILENO);
    ::dup2(err_fd, STDERR_FILENO);
    ::execve(args[0], args.data(), environ);
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also from here, so that the group exists before we might signal it
  close_fds();
  pid_ = pid;
}

ChildProcess::~ChildProcess() { kill9(); }

void ChildProcess::reap() {
  // The leader has exited or is being killed. Until it is reaped its group id cannot be
  // reused, so signalling the group reaches only what the child left behind.
  ::kill(-pid_, SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  exit_code_ = decode_status(status);
  pid_ = -1;
}

bool ChildProcess::running() {
  if (pid_ <= 0) return false;
  // Peek without reaping (see reap()).
  siginfo_t info{};
  if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) != 0 ||
      info.si_pid != pid_) {
    return true;
  }
  reap();
  return false;
}

int ChildProcess::wait(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (running()) {
    if (std::chrono::steady_clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(10ms);
  }
  return exit_code_;
}

int ChildProcess::stop(std::chrono::milliseconds grace) {
  if (pid_ <= 0) return exit_code_;
  ::kill(-pid_, SIGTERM);
  const int code = wait(grace);
  if (pid_ <= 0) return code;
  kill9();
  return -1;
}

void ChildProcess::kill9() {
  if (pid_ <= 0) return;
  ::kill(-pid_, SIGKILL);
  reap();
}

std::string ChildProcess::log() const { return read_text(log_); }

std::string ChildProcess::log_tail(std::size_t bytes) const {
  const std::string all = log();
  return all.size() <= bytes ? all : "..." + all.substr(all.size() - bytes);
}

CommandResult run_process(const std::vector<std::string>& argv, std::chrono::milliseconds timeout) {
  const TempDir dir;
  CommandResult result;
  {
    ChildProcess child(argv, dir / "out.txt", dir / "err.txt");
    result.code = child.wait(timeout);
    if (result.code == -1) child.stop(1s);
  }
  result.out = read_text(dir / "out.txt");
  result.err = read_text(dir / "err.txt");
  return result;
}

int run_to_completion(const std::vector<std::string>& argv, std::string* output,
                      std::chrono::milliseconds timeout) {
  const TempDir dir;
  int code = -1;
  {
    ChildProcess child(argv, dir / "output.txt");
    code = child.wait(timeout);
    if (code == -1) child.stop(1s);
  }
  if (output != nullptr) *output += read_text(dir / "output.txt");
  return code;
}

std::string find_in_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    if (dir.empty()) continue;
    const std::filesystem::path candidate = std::filesystem::path(dir) / name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate.string();
  }
  return {};
}

}  // namespace ampscope::testing
