// Test harness for ampscope-server: the real binary as a child process on loopback (port 0, the
// chosen ports read back from --ready-file), gRPC clients for both services, an agent stream
// that collects the server's messages on a reader thread, and builders of consistent reports.
// Every process started here is killed and reaped when its ServerProcess goes away, whether the
// test passed or not.
#pragma once

#include <grpcpp/grpcpp.h>
#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ampscope/tensor_stats.h"
#include "ampscope/v1/query.grpc.pb.h"
#include "ampscope/v1/telemetry.grpc.pb.h"

namespace ampscope::testing {

using namespace std::chrono_literals;

class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

std::string read_text(const std::filesystem::path& path);
void write_text(const std::filesystem::path& path, const std::string& text);

// Runs a command to completion; returns its exit code (stdout+stderr appended to *output).
int run_command(const std::vector<std::string>& argv, std::string* output = nullptr,
                std::chrono::milliseconds timeout = 60s);

struct CommandResult {
  int code = -1;  // exit code, 128 + signal, or -1 when killed at the timeout
  std::string out;
  std::string err;
};
CommandResult run_process(const std::vector<std::string>& argv,
                          std::chrono::milliseconds timeout = 60s);

class ServerProcess {
 public:
  // Starts ampscope-server with --listen/--metrics-listen on port 0, --db `db` and `extra`
  // flags; waits until it serves. Fails the test (ADD_FAILURE + throws) when it does not.
  ServerProcess(const std::filesystem::path& dir, const std::filesystem::path& db,
                std::vector<std::string> extra = {});
  ~ServerProcess();

  const std::string& grpc_address() const { return grpc_; }
  const std::string& metrics_address() const { return metrics_; }
  pid_t pid() const { return pid_; }
  bool running();
  // SIGTERM, then waits up to `timeout`; returns the exit code (-1: did not exit, killed).
  int terminate(std::chrono::milliseconds timeout = 20s);
  void kill9();
  std::string log() const;

 private:
  int wait_exit(std::chrono::milliseconds timeout);
  pid_t pid_ = -1;
  std::filesystem::path log_path_;
  std::string grpc_;
  std::string metrics_;
};

struct ClientOptions {
  std::string token;              // sent as "authorization: Bearer <token>" when set
  std::string tls_ca;             // PEM root certificate: TLS when set
  std::string tls_host_override;  // SNI / certificate name to expect
};

std::shared_ptr<grpc::Channel> make_channel(const std::string& address,
                                            const ClientOptions& options = {});
void add_auth(grpc::ClientContext* context, const ClientOptions& options);

// One agent stream with a reader thread that collects everything the server sends.
class AgentStream {
 public:
  AgentStream(std::shared_ptr<grpc::Channel> channel, const ClientOptions& options = {});
  ~AgentStream();

  bool send_hello(const v1::Hello& hello);
  bool send(const v1::StepReport& report);
  bool send_message(const v1::AgentMessage& message);
  // Half-closes, waits for the server to end the stream and returns its status.
  grpc::Status finish(std::chrono::milliseconds timeout = 20s);
  // Waits for the stream to end without half-closing (server-side end).
  grpc::Status wait_end(std::chrono::milliseconds timeout = 20s);

  // Waits until an Ack with persisted_seq >= seq arrived. Returns the highest persisted_seq.
  std::optional<std::uint64_t> wait_ack(std::uint64_t seq, std::chrono::milliseconds timeout = 10s);
  std::uint64_t highest_ack();
  std::optional<v1::Reject> wait_reject(std::uint64_t seq, std::chrono::milliseconds timeout = 10s);
  std::optional<v1::PolicyUpdate> wait_policy(std::size_t index,
                                              std::chrono::milliseconds timeout = 10s);
  std::vector<v1::ServerMessage> messages();

 private:
  void read_loop();
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::AgentMessage, v1::ServerMessage>> stream_;
  std::thread reader_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<v1::ServerMessage> received_;
  bool ended_ = false;
  bool finished_ = false;
  grpc::Status status_;
};

// --- Prometheus ------------------------------------------------------------------------------

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

// GET http://address/metrics with libcurl; fails the test on an HTTP error.
std::string scrape(const std::string& address);
std::vector<Sample> parse_samples(const std::string& text);
// Samples named `name` whose labels include every pair of `labels`.
std::vector<Sample> find_samples(const std::vector<Sample>& samples, const std::string& name,
                                 const std::map<std::string, std::string>& labels = {});
// The value of the single matching sample; fails the test and returns NaN when there is not
// exactly one.
double sample_value(const std::vector<Sample>& samples, const std::string& name,
                    const std::map<std::string, std::string>& labels = {});

// --- Builders --------------------------------------------------------------------------------

v1::Hello make_hello(const std::string& run_id, std::uint32_t rank = 0,
                     std::uint32_t world_size = 1);

// Converts kernels' TensorStats (as the agent would) into the wire message.
v1::TensorStats to_proto(const TensorStats& stats, const std::string& name, v1::TensorRole role,
                         double scale, v1::Format dtype = v1::FORMAT_FP32);

// A consistent TensorStats measured by compute_stats on `n` values whose magnitudes span the
// binades [lo_exp, hi_exp] (times `scale`), with target FP16 at scale 0.
v1::TensorStats synthetic_tensor(const std::string& name, v1::TensorRole role, int lo_exp,
                                 int hi_exp, double scale, std::size_t n = 512,
                                 std::uint32_t seed = 1);

// A valid report of `tensors` gradient tensors (weight_grad and activation_grad alternating).
v1::StepReport make_report(const std::string& run_id, std::uint32_t rank, std::uint64_t seq,
                           std::int64_t step, int tensors = 4, double loss_scale = 65536.0);

}  // namespace ampscope::testing
