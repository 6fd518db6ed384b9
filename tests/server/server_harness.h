// Test harness for ampscope-server, over the real binary on loopback (ServerProcess, from
// ampscope::test_support): gRPC clients for both services, an agent stream that collects the
// server's messages on a reader thread, what the server stored read back, its /metrics, and
// builders of consistent reports.
#pragma once

#include <grpcpp/grpcpp.h>

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
#include "ampscope/testing/child_process.h"
#include "ampscope/testing/files.h"
#include "ampscope/testing/server_process.h"
#include "ampscope/v1/query.grpc.pb.h"
#include "ampscope/v1/telemetry.grpc.pb.h"

namespace ampscope::testing {

using namespace std::chrono_literals;

struct ClientOptions {
  std::string token;              // sent as "authorization: Bearer <token>" when set
  std::string tls_ca;             // PEM root certificate: TLS when set
  std::string tls_host_override;  // SNI / certificate name to expect
  std::string tls_cert;           // PEM client certificate chain, for mutual TLS
  std::string tls_key;            // PEM private key of tls_cert
};

// Plaintext, sending `token`.
inline ClientOptions with_token(std::string token) {
  ClientOptions o;
  o.token = std::move(token);
  return o;
}

std::shared_ptr<grpc::Channel> make_channel(const std::string& address,
                                            const ClientOptions& options = {});
void add_auth(grpc::ClientContext* context, const ClientOptions& options);

// What the server stored, through the Query service. Every stored report of `run` (all ranks),
// in step order, with their tensors; fails the test on an error.
std::vector<v1::StepReport> stored_reports(const std::string& address, const std::string& run);
// nullopt on an error (an unknown run as well), so that a test can poll.
std::optional<v1::GetRunResponse> get_run(const std::string& address, const std::string& run);
std::optional<v1::GetPolicyResponse> get_policy(const std::string& address, const std::string& run);
// Query.DeleteRun: its status, and its answer in *out when given.
grpc::Status delete_run(const std::string& address, const std::string& run,
                        const ClientOptions& options = {}, v1::DeleteRunResponse* out = nullptr);

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

// A TensorStats of FP16 values with exactly the given counts, consistent with the server's rules:
// `counts` per binade from `min_exponent` as measured at `scale`, three zeros, `nan` NaN and
// `pos_inf` +Inf, and targets[0] FP16 with `underflow` and `overflow`.
v1::TensorStats crafted_tensor(const std::string& name, v1::TensorRole role, int min_exponent,
                               std::vector<std::uint64_t> counts, double scale,
                               std::uint64_t nan = 0, std::uint64_t pos_inf = 0,
                               std::uint64_t underflow = 0, std::uint64_t overflow = 0);

// A valid report of `tensors` gradient tensors (weight_grad and activation_grad alternating).
v1::StepReport make_report(const std::string& run_id, std::uint32_t rank, std::uint64_t seq,
                           std::int64_t step, int tensors = 4, double loss_scale = 65536.0);

// One agent of `run` (rank 0) on its own stream: its Hello, the reports seq `from`..`to`
// (make_report with step = seq and `tensors` each), their Ack, and a clean end. Fails the test
// when a step does not happen.
void send_reports(const std::shared_ptr<grpc::Channel>& channel, const std::string& run,
                  std::uint64_t from, std::uint64_t to, int tensors = 1);

}  // namespace ampscope::testing
