#include "server_harness.h"
#include "ampscope/proto/stats_codec.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#ifndef AMPSCOPE_SERVER_BINARY
#error "AMPSCOPE_SERVER_BINARY must name the ampscope-server executable"
#endif

extern char** environ;

namespace ampscope::testing {
namespace {

// An idle client connection answers the server's shutdown GOAWAY ping only when something polls
// it; in a test process with no call in flight that is gRPC's backup poller, every 5 s by
// default, which would hold every graceful shutdown for that long. Set before gRPC starts.
const bool kFastBackupPoll = [] {
  setenv("GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS", "50", /*overwrite=*/0);
  return true;
}();

pid_t spawn(const std::vector<std::string>& argv, const std::filesystem::path& log,
            const std::filesystem::path& err_log = {}) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (err_log.empty()) {
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  } else {
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_log.c_str(),
                                     O_WRONLY | O_CREAT | O_APPEND, 0644);
  }
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return -1;
  return pid;
}

// Waits for `pid` up to `timeout`; the exit code, 128 + signal, or -1 when still running.
int wait_for(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
      return -1;
    }
    if (r < 0) return -1;
    if (std::chrono::steady_clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(5ms);
  }
}

}  // namespace

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "ampscope-server-test-XXXXXX");
  if (mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

int run_command(const std::vector<std::string>& argv, std::string* output,
                std::chrono::milliseconds timeout) {
  TempDir dir;
  const std::filesystem::path log = dir / "output.txt";
  const pid_t pid = spawn(argv, log);
  if (pid < 0) return -1;
  int code = wait_for(pid, timeout);
  if (code == -1) {
    ::kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  if (output != nullptr) *output += read_text(log);
  return code;
}

CommandResult run_process(const std::vector<std::string>& argv, std::chrono::milliseconds timeout) {
  TempDir dir;
  CommandResult result;
  const pid_t pid = spawn(argv, dir / "out.txt", dir / "err.txt");
  if (pid < 0) return result;
  result.code = wait_for(pid, timeout);
  if (result.code == -1) {
    ::kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  result.out = read_text(dir / "out.txt");
  result.err = read_text(dir / "err.txt");
  return result;
}

ServerProcess::ServerProcess(const std::filesystem::path& dir, const std::filesystem::path& db,
                             std::vector<std::string> extra) {
  static int counter = 0;
  const std::string tag = std::to_string(::getpid()) + "-" + std::to_string(++counter);
  const std::filesystem::path ready = dir / ("ready-" + tag + ".json");
  log_path_ = dir / ("server-" + tag + ".log");
  std::vector<std::string> argv = {AMPSCOPE_SERVER_BINARY,
                                   "--listen",
                                   "127.0.0.1:0",
                                   "--metrics-listen",
                                   "127.0.0.1:0",
                                   "--db",
                                   db.string(),
                                   "--ready-file",
                                   ready.string(),
                                   "--shutdown-timeout",
                                   "10s"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  pid_ = spawn(argv, log_path_);
  if (pid_ < 0) {
    ADD_FAILURE() << "cannot start " << AMPSCOPE_SERVER_BINARY;
    throw std::runtime_error("spawn failed");
  }
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (!std::filesystem::exists(ready)) {
    if (!running() || std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << "ampscope-server did not start; its log:\n" << log();
      kill9();
      throw std::runtime_error("server did not start");
    }
    std::this_thread::sleep_for(10ms);
  }
  const nlohmann::json j = nlohmann::json::parse(read_text(ready));
  grpc_ = j.at("grpc").get<std::string>();
  metrics_ = j.at("metrics").get<std::string>();
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

bool ServerProcess::running() {
  if (pid_ <= 0) return false;
  int status = 0;
  const pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    pid_ = -1;
    return false;
  }
  return true;
}

int ServerProcess::wait_exit(std::chrono::milliseconds timeout) {
  const int code = wait_for(pid_, timeout);
  if (code != -1) pid_ = -1;
  return code;
}

int ServerProcess::terminate(std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return -1;
  ::kill(pid_, SIGTERM);
  const int code = wait_exit(timeout);
  if (code == -1) kill9();
  return code;
}

void ServerProcess::kill9() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

std::string ServerProcess::log() const { return read_text(log_path_); }

std::shared_ptr<grpc::Channel> make_channel(const std::string& address,
                                            const ClientOptions& options) {
  grpc::ChannelArguments args;
  // Each channel owns its connection, which closes with it: a connection left idle in gRPC's
  // global pool would hold the server's graceful shutdown until its GOAWAY ping times out.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  if (!options.tls_host_override.empty()) {
    args.SetSslTargetNameOverride(options.tls_host_override);
  }
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (!options.tls_ca.empty()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options.tls_ca;
    creds = grpc::SslCredentials(ssl);
  } else {
    creds = grpc::InsecureChannelCredentials();
  }
  return grpc::CreateCustomChannel(address, creds, args);
}

void add_auth(grpc::ClientContext* context, const ClientOptions& options) {
  if (!options.token.empty()) context->AddMetadata("authorization", "Bearer " + options.token);
}

AgentStream::AgentStream(std::shared_ptr<grpc::Channel> channel, const ClientOptions& options) {
  add_auth(&context_, options);
  stream_ = v1::Telemetry::NewStub(channel)->Attach(&context_);
  reader_ = std::thread([this] { read_loop(); });
}

AgentStream::~AgentStream() {
  context_.TryCancel();
  reader_.join();
}

void AgentStream::read_loop() {
  v1::ServerMessage m;
  while (stream_->Read(&m)) {
    std::lock_guard lock(mu_);
    received_.push_back(m);
    cv_.notify_all();
  }
  grpc::Status status = stream_->Finish();
  std::lock_guard lock(mu_);
  status_ = status;
  ended_ = true;
  cv_.notify_all();
}

bool AgentStream::send_message(const v1::AgentMessage& message) { return stream_->Write(message); }

bool AgentStream::send_hello(const v1::Hello& hello) {
  v1::AgentMessage m;
  *m.mutable_hello() = hello;
  return send_message(m);
}

bool AgentStream::send(const v1::StepReport& report) {
  v1::AgentMessage m;
  *m.mutable_report() = report;
  return send_message(m);
}

grpc::Status AgentStream::finish(std::chrono::milliseconds timeout) {
  stream_->WritesDone();
  return wait_end(timeout);
}

grpc::Status AgentStream::wait_end(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return ended_; })) {
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "test: stream did not end");
  }
  return status_;
}

std::uint64_t AgentStream::highest_ack() {
  std::lock_guard lock(mu_);
  std::uint64_t best = 0;
  for (const auto& m : received_) {
    if (m.has_ack()) best = std::max(best, m.ack().persisted_seq());
  }
  return best;
}

std::optional<std::uint64_t> AgentStream::wait_ack(std::uint64_t seq,
                                                   std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  std::uint64_t best = 0;
  bool any = false;
  const bool ok = cv_.wait_for(lock, timeout, [&] {
    for (const auto& m : received_) {
      if (m.has_ack()) {
        any = true;
        best = std::max(best, m.ack().persisted_seq());
      }
    }
    return (any && best >= seq) || ended_;
  });
  if (!ok || !any || best < seq) return std::nullopt;
  return best;
}

std::optional<v1::Reject> AgentStream::wait_reject(std::uint64_t seq,
                                                   std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  std::optional<v1::Reject> found;
  cv_.wait_for(lock, timeout, [&] {
    for (const auto& m : received_) {
      if (m.has_reject() && m.reject().seq() == seq) found = m.reject();
    }
    return found.has_value() || ended_;
  });
  return found;
}

std::optional<v1::PolicyUpdate> AgentStream::wait_policy(std::size_t index,
                                                         std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  std::optional<v1::PolicyUpdate> found;
  cv_.wait_for(lock, timeout, [&] {
    std::size_t n = 0;
    for (const auto& m : received_) {
      if (m.has_policy() && n++ == index) found = m.policy();
    }
    return found.has_value() || ended_;
  });
  return found;
}

std::vector<v1::ServerMessage> AgentStream::messages() {
  std::lock_guard lock(mu_);
  return received_;
}

std::string scrape(const std::string& address) {
  CURL* curl = curl_easy_init();
  std::string body;
  const std::string url = "http://" + address + "/metrics";
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_TIMEOUT, 10L);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(
      curl, CURLOPT_WRITEFUNCTION,
      +[](char* data, std::size_t size, std::size_t n, void* out) -> std::size_t {
        static_cast<std::string*>(out)->append(data, size * n);
        return size * n;
      });
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &body);
  const CURLcode rc = curl_easy_perform(curl);
  long status = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  curl_easy_cleanup(curl);
  EXPECT_EQ(rc, CURLE_OK) << url << ": " << curl_easy_strerror(rc);
  EXPECT_EQ(status, 200) << url;
  return body;
}

std::vector<Sample> parse_samples(const std::string& text) {
  std::vector<Sample> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    Sample s;
    std::size_t i = line.find_first_of("{ ");
    s.name = line.substr(0, i);
    if (i != std::string::npos && line[i] == '{') {
      ++i;
      while (i < line.size() && line[i] != '}') {
        const std::size_t eq = line.find('=', i);
        const std::string key = line.substr(i, eq - i);
        std::string value;
        std::size_t j = eq + 2;  // past ="
        for (; j < line.size() && line[j] != '"'; ++j) {
          if (line[j] == '\\' && j + 1 < line.size()) ++j;
          value += line[j];
        }
        s.labels[key] = value;
        i = j + 1;
        if (i < line.size() && line[i] == ',') ++i;
      }
      ++i;
    }
    const std::string number = line.substr(line.find_first_not_of(' ', i));
    s.value = number == "Nan" || number == "NaN" ? std::nan("") : std::stod(number);
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<Sample> find_samples(const std::vector<Sample>& samples, const std::string& name,
                                 const std::map<std::string, std::string>& labels) {
  std::vector<Sample> out;
  for (const Sample& s : samples) {
    if (s.name != name) continue;
    bool match = true;
    for (const auto& [k, v] : labels) {
      auto it = s.labels.find(k);
      if (it == s.labels.end() || it->second != v) match = false;
    }
    if (match) out.push_back(s);
  }
  return out;
}

double sample_value(const std::vector<Sample>& samples, const std::string& name,
                    const std::map<std::string, std::string>& labels) {
  const std::vector<Sample> found = find_samples(samples, name, labels);
  if (found.size() != 1) {
    std::string want = name + "{";
    for (const auto& [k, v] : labels) want += k + "=" + v + ",";
    ADD_FAILURE() << "expected one sample " << want << "}, found " << found.size();
    return std::nan("");
  }
  return found[0].value;
}

v1::Hello make_hello(const std::string& run_id, std::uint32_t rank, std::uint32_t world_size) {
  v1::Hello h;
  h.set_run_id(run_id);
  h.set_rank(rank);
  h.set_world_size(world_size);
  h.set_host("test-host");
  h.set_trainer("server-test");
  h.set_precision("amp-fp16");
  h.set_compute_format(v1::FORMAT_FP16);
  h.set_agent_version("test");
  v1::ScalerConfig* s = h.mutable_scaler();
  s->set_kind(v1::SCALER_KIND_DYNAMIC);
  s->set_init_scale(65536.0);
  s->set_growth_factor(2.0);
  s->set_backoff_factor(0.5);
  s->set_growth_interval(2000);
  return h;
}

v1::TensorStats to_proto(const TensorStats& s, const std::string& name, v1::TensorRole role,
                         double scale, v1::Format dtype) {
  v1::TensorStats t;
  t.set_name(name);
  t.set_role(role);
  t.set_phase(v1::TENSOR_PHASE_BACKWARD);
  t.set_dtype(dtype);
  t.add_shape(static_cast<std::int64_t>(s.numel));
  t.set_scale(scale);
  ampscope::proto::encode_stats(s, /*full=*/true, &t);
  return t;
}

v1::TensorStats synthetic_tensor(const std::string& name, v1::TensorRole role, int lo_exp,
                                 int hi_exp, double scale, std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> e(lo_exp, hi_exp + 1);
  std::vector<float> values(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double mag = std::exp2(e(rng)) * scale;
    values[i] = static_cast<float>((i % 2 == 0) ? mag : -mag);
  }
  const TargetSpec targets[] = {TargetSpec{Format::kFP16, 0}};
  const TensorStats s = compute_stats(values.data(), n, Format::kFP32, targets);
  return to_proto(s, name, role, scale);
}

v1::StepReport make_report(const std::string& run_id, std::uint32_t rank, std::uint64_t seq,
                           std::int64_t step, int tensors, double loss_scale) {
  v1::StepReport r;
  r.set_run_id(run_id);
  r.set_rank(rank);
  r.set_seq(seq);
  r.set_step(step);
  r.set_loss(2.5);
  r.set_loss_scale(loss_scale);
  r.set_scale_after(loss_scale);
  r.set_grad_norm(1.25);
  r.set_lr(3e-4);
  r.set_step_time_s(0.05);
  r.set_tokens(4096);
  r.set_time_unix_ns(1'700'000'000'000'000'000 + step);
  r.set_optimizer_steps(static_cast<std::uint64_t>(step + 1));
  for (int i = 0; i < tensors; ++i) {
    const bool weight = i % 2 == 0;
    *r.add_tensors() = synthetic_tensor(
        "h" + std::to_string(i / 2) + (weight ? ".mlp.fc.weight" : ".mlp.fc.out.grad"),
        weight ? v1::TENSOR_ROLE_WEIGHT_GRAD : v1::TENSOR_ROLE_ACTIVATION_GRAD, -20, -6, loss_scale,
        256, static_cast<std::uint32_t>(seq * 131 + i));
  }
  return r;
}

}  // namespace ampscope::testing
