// What `ampscope runs`, `show` and `tail` share: the --server/--token-file/--tls-ca/--tls-cert/
// --tls-key/--json options and a small client of the server's Query service whose failures are
// one-line messages that say what to do (server unreachable, run unknown, credentials refused).
#pragma once

#include <CLI/CLI.hpp>
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "ampscope/v1/query.grpc.pb.h"

namespace ampscope::cli {

// The server could not answer: unreachable, refused the credentials, does not know the run.
// main() prints the message and exits 1.
class ServerError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ServerArgs {
  std::string server = "127.0.0.1:50051";
  std::string token_file;
  std::string tls_ca;    // PEM file of the CA that signed the server's certificate: TLS
  std::string tls_cert;  // PEM client certificate (mutual TLS), with tls_key: TLS
  std::string tls_key;
  double timeout_s = 10.0;
  bool json = false;
};

void add_server_options(CLI::App* command, ServerArgs& args);

class QueryClient {
 public:
  // Reads the token, CA and client certificate files; throws ServerError naming the file when
  // it cannot, UsageError when --tls-cert and --tls-key are not given together.
  explicit QueryClient(const ServerArgs& args);

  v1::ListRunsResponse list_runs(const v1::ListRunsRequest& request);
  v1::GetRunResponse get_run(const v1::GetRunRequest& request);
  v1::GetReportsResponse get_reports(const v1::GetReportsRequest& request);
  v1::GetPolicyResponse get_policy(const v1::GetPolicyRequest& request);
  v1::DeleteRunResponse delete_run(const v1::DeleteRunRequest& request);
  v1::GetStepHistoryResponse get_step_history(const v1::GetStepHistoryRequest& request);

 private:
  void prepare(grpc::ClientContext* context) const;
  [[noreturn]] void fail(const grpc::Status& status, const std::string& what) const;
  template <typename Request, typename Response, typename Call>
  Response call(const Request& request, Call method, const std::string& what);

  std::string address_;
  std::string token_;
  bool tls_ = false;  // TLS credentials (--tls-ca or --tls-cert)
  std::chrono::milliseconds timeout_;
  std::unique_ptr<v1::Query::Stub> stub_;
};

// NaN and Inf are not JSON: they become null (a diverged loss is still visible as null).
nlohmann::ordered_json json_number(double x);

// Small renderings shared by the commands.
std::string format_scale(double scale);             // "65536", "2^-3", "1000.5"
std::string format_time_ago(std::int64_t unix_ns);  // "12s ago", "3h ago", "-" for 0
std::string role_name(v1::TensorRole role);         // "activation_grad"
std::string format_name(v1::Format format);         // "fp16"
std::string mode_name(v1::PolicyMode mode);         // "headroom"
std::string agreement_name(v1::PolicyAgreement a);  // "per_step" (the agent's option value)

}  // namespace ampscope::cli
