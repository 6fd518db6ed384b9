#include "process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <thread>

extern char** environ;

namespace ampscope::agent::testing {

Process::Process(std::vector<std::string> argv, std::filesystem::path log) : log_(std::move(log)) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  if (posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), environ) != 0) pid_ = -1;
  posix_spawn_file_actions_destroy(&actions);
  EXPECT_GT(pid_, 0) << "cannot start " << argv[0];
}

Process::~Process() {
  if (pid_ > 0 && !status_) {
    ::kill(pid_, SIGKILL);
    wait(10s);
  }
}

bool Process::running() {
  if (pid_ <= 0 || status_) return false;
  return !wait(0ms).has_value();
}

std::optional<int> Process::wait(std::chrono::milliseconds timeout) {
  if (status_) return status_;
  if (pid_ <= 0) return -1;
  const auto end = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int st = 0;
    const pid_t r = ::waitpid(pid_, &st, WNOHANG);
    if (r == pid_) {
      status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      return status_;
    }
    if (std::chrono::steady_clock::now() >= end) return std::nullopt;
    std::this_thread::sleep_for(10ms);
  }
}

void Process::kill9() {
  if (pid_ > 0 && !status_) {
    ::kill(pid_, SIGKILL);
    wait(10s);
  }
}

std::string Process::log() const {
  std::ifstream in(log_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    socklen_t len = sizeof(a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

Server::Server(std::filesystem::path dir, int port, std::vector<std::string> flags)
    : dir_(std::move(dir)), port_(port), flags_(std::move(flags)) {}

Server::~Server() = default;

bool Server::start() {
  kill9();
  const auto ready = dir_ / ("ready-" + std::to_string(starts_) + ".json");
  std::filesystem::remove(ready);
  std::vector<std::string> argv = {AMPSCOPE_SERVER_BINARY, "--listen",     address(),
                                   "--metrics-listen",     "",             "--db",
                                   (dir_ / "store.db").string(), "--ready-file", ready.string(),
                                   "--log-level",          "warn"};
  argv.insert(argv.end(), flags_.begin(), flags_.end());
  process_ = std::make_unique<Process>(argv, dir_ / "server.log");
  ++starts_;
  // The port was free a moment ago; a restart may need a moment for the old socket.
  const bool up = wait_until(
      [&] { return std::filesystem::exists(ready) || !process_->running(); }, 20s);
  if (!up || !std::filesystem::exists(ready)) {
    ADD_FAILURE() << "ampscope-server did not start:\n" << log();
    return false;
  }
  return true;
}

void Server::kill9() {
  if (process_) process_->kill9();
}

std::string Server::log() const { return process_ ? process_->log() : ""; }

namespace {
std::unique_ptr<v1::Query::Stub> query(const std::string& address) {
  return v1::Query::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}
}  // namespace

std::vector<v1::StepReport> stored_reports(const std::string& address, const std::string& run) {
  auto client = query(address);
  std::vector<v1::StepReport> out;
  std::string token;
  for (int page = 0; page < 1000; ++page) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 20s);
    v1::GetReportsRequest req;
    req.set_run_id(run);
    req.set_include_tensors(true);
    req.set_limit(10000);
    req.set_page_token(token);
    v1::GetReportsResponse resp;
    const grpc::Status s = client->GetReports(&ctx, req, &resp);
    if (!s.ok()) {
      ADD_FAILURE() << "GetReports(" << run << "): " << s.error_message();
      return out;
    }
    for (const auto& r : resp.reports()) out.push_back(r.report());
    token = resp.next_page_token();
    if (token.empty()) break;
  }
  return out;
}

std::optional<v1::GetRunResponse> get_run(const std::string& address, const std::string& run) {
  auto client = query(address);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 20s);
  v1::GetRunRequest req;
  req.set_run_id(run);
  req.set_limit(1000);
  v1::GetRunResponse resp;
  if (!client->GetRun(&ctx, req, &resp).ok()) return std::nullopt;
  return resp;
}

std::optional<v1::GetPolicyResponse> get_policy(const std::string& address,
                                                const std::string& run) {
  auto client = query(address);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 20s);
  v1::GetPolicyRequest req;
  req.set_run_id(run);
  v1::GetPolicyResponse resp;
  if (!client->GetPolicy(&ctx, req, &resp).ok()) return std::nullopt;
  return resp;
}

std::size_t count_lines(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::size_t n = 0;
  std::string line;
  while (std::getline(in, line)) n += line.empty() ? 0 : 1;
  return n;
}

}  // namespace ampscope::agent::testing
