#include "query_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <iostream>
#include <sstream>

#include "ampscope/proto/tls_failure.h"
#include "ampscope/proto/vocabulary_codec.h"
#include "ampscope/proto/wire_time.h"
#include "ampscope/secret_file.h"
#include "command.h"

namespace ampscope::cli {
namespace {

std::string read_file(const std::string& path, const char* option) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ServerError(std::string(option) + " '" + path + "': cannot read it");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A file holding a secret that others may read: a warning, the command still runs.
void warn_if_exposed(const std::string& path, const char* option) {
  if (const std::string exposed = secret_file_exposure(path); !exposed.empty()) {
    std::cerr << "ampscope: warning: " << option << " '" << path << "': " << exposed << "\n";
  }
}

std::string first_line_trimmed(const std::string& text) {
  const std::string line = text.substr(0, text.find('\n'));
  const auto b = line.find_first_not_of(" \t\r");
  const auto e = line.find_last_not_of(" \t\r");
  return b == std::string::npos ? "" : line.substr(b, e - b + 1);
}

std::string lower_suffix(const std::string& enum_name, const std::string& prefix) {
  std::string s = enum_name.rfind(prefix, 0) == 0 ? enum_name.substr(prefix.size()) : enum_name;
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

}  // namespace

void add_server_options(CLI::App* command, ServerArgs& args) {
  command->add_option("--server", args.server, "ampscope-server address host:port")
      ->capture_default_str();
  command->add_option("--token-file", args.token_file,
                      "File whose first line is the server's bearer token");
  command->add_option("--tls-ca", args.tls_ca,
                      "PEM file of the CA that signed the server's certificate (enables TLS)");
  command->add_option("--tls-cert", args.tls_cert,
                      "PEM client certificate, for a server that requires one (mutual TLS; "
                      "enables TLS, with --tls-key)");
  command->add_option("--tls-key", args.tls_key, "PEM private key of --tls-cert");
  command->add_option("--timeout", args.timeout_s, "Seconds to wait for each answer")
      ->capture_default_str();
  command->add_flag("--json", args.json, "Machine-readable JSON output");
}

QueryClient::QueryClient(const ServerArgs& args)
    : address_(args.server),
      timeout_(static_cast<std::int64_t>(std::max(0.1, args.timeout_s) * 1000)) {
  if (!args.token_file.empty()) {
    token_ = first_line_trimmed(read_file(args.token_file, "--token-file"));
    warn_if_exposed(args.token_file, "--token-file");
    if (token_.empty()) throw ServerError("--token-file '" + args.token_file + "': no token");
  }
  if (args.tls_cert.empty() != args.tls_key.empty()) {
    throw UsageError("--tls-cert and --tls-key go together: give both or neither");
  }
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (!args.tls_ca.empty() || !args.tls_cert.empty()) {
    // Without --tls-ca the server's certificate is checked against the system's CAs.
    grpc::SslCredentialsOptions ssl;
    if (!args.tls_ca.empty()) ssl.pem_root_certs = read_file(args.tls_ca, "--tls-ca");
    if (!args.tls_cert.empty()) {
      ssl.pem_cert_chain = read_file(args.tls_cert, "--tls-cert");
      ssl.pem_private_key = read_file(args.tls_key, "--tls-key");
      warn_if_exposed(args.tls_key, "--tls-key");
    }
    creds = grpc::SslCredentials(ssl);
    tls_ = true;
  } else {
    creds = grpc::InsecureChannelCredentials();
  }
  grpc::ChannelArguments channel_args;
  channel_args.SetMaxReceiveMessageSize(256 << 20);
  stub_ = v1::Query::NewStub(grpc::CreateCustomChannel(address_, creds, channel_args));
}

void QueryClient::prepare(grpc::ClientContext* context) const {
  // Fail fast (no wait_for_ready): nobody listening is reported at once, not at the deadline.
  context->set_deadline(std::chrono::system_clock::now() + timeout_);
  if (!token_.empty()) context->AddMetadata("authorization", "Bearer " + token_);
}

void QueryClient::fail(const grpc::Status& status, const std::string& what) const {
  const std::string detail = status.error_message();
  if (const std::string tls = proto::tls_failure(status, tls_); !tls.empty()) {
    throw ServerError("cannot connect to ampscope-server at " + address_ + ": " + tls +
                      (tls_ ? " (--tls-ca, --tls-cert, --tls-key)" : " (--tls-ca)"));
  }
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      throw ServerError("cannot reach ampscope-server at " + address_ + " (" + detail +
                        "); is it running? (--server)");
    case grpc::StatusCode::UNAUTHENTICATED:
      throw ServerError("ampscope-server at " + address_ + " refused the credentials: " + detail +
                        " (--token-file)");
    case grpc::StatusCode::PERMISSION_DENIED:
      throw ServerError("ampscope-server at " + address_ + " does not allow it: " + detail +
                        " (--token-file)");
    case grpc::StatusCode::NOT_FOUND:
      throw ServerError(detail + " (ampscope-server at " + address_ + "; see 'ampscope runs')");
    default:
      throw ServerError(what + " failed: " + detail);
  }
}

template <typename Request, typename Response, typename Call>
Response QueryClient::call(const Request& request, Call method, const std::string& what) {
  grpc::ClientContext context;
  prepare(&context);
  Response response;
  const grpc::Status status = ((*stub_).*method)(&context, request, &response);
  if (!status.ok()) fail(status, what);
  return response;
}

v1::ListRunsResponse QueryClient::list_runs(const v1::ListRunsRequest& request) {
  return call<v1::ListRunsRequest, v1::ListRunsResponse>(request, &v1::Query::Stub::ListRuns,
                                                         "ListRuns");
}

v1::GetRunResponse QueryClient::get_run(const v1::GetRunRequest& request) {
  return call<v1::GetRunRequest, v1::GetRunResponse>(request, &v1::Query::Stub::GetRun, "GetRun");
}

v1::GetStepHistoryResponse QueryClient::get_step_history(
    const v1::GetStepHistoryRequest& request) {
  return call<v1::GetStepHistoryRequest, v1::GetStepHistoryResponse>(
      request, &v1::Query::Stub::GetStepHistory, "GetStepHistory");
}

v1::GetReportsResponse QueryClient::get_reports(const v1::GetReportsRequest& request) {
  return call<v1::GetReportsRequest, v1::GetReportsResponse>(request, &v1::Query::Stub::GetReports,
                                                             "GetReports");
}

v1::GetPolicyResponse QueryClient::get_policy(const v1::GetPolicyRequest& request) {
  return call<v1::GetPolicyRequest, v1::GetPolicyResponse>(request, &v1::Query::Stub::GetPolicy,
                                                           "GetPolicy");
}

v1::DeleteRunResponse QueryClient::delete_run(const v1::DeleteRunRequest& request) {
  return call<v1::DeleteRunRequest, v1::DeleteRunResponse>(request, &v1::Query::Stub::DeleteRun,
                                                           "DeleteRun");
}

nlohmann::ordered_json json_number(double x) {
  return std::isfinite(x) ? nlohmann::ordered_json(x) : nlohmann::ordered_json(nullptr);
}

std::string format_scale(double scale) {
  if (!std::isfinite(scale)) return std::to_string(scale);
  int e = 0;
  const double m = std::frexp(scale, &e);
  if (m == 0.5 && (e - 1 < 0 || e - 1 > 40)) return "2^" + std::to_string(e - 1);
  std::ostringstream os;
  os.precision(scale == std::floor(scale) && std::fabs(scale) < 1e15 ? 17 : 6);
  os << scale;
  return os.str();
}

std::string format_time_ago(std::int64_t unix_ns) {
  if (unix_ns <= 0) return "-";
  const std::int64_t now = proto::unix_now_ns();
  const std::int64_t s = std::max<std::int64_t>(0, (now - unix_ns) / 1'000'000'000);
  if (s < 120) return std::to_string(s) + "s ago";
  if (s < 7200) return std::to_string(s / 60) + "m ago";
  if (s < 172800) return std::to_string(s / 3600) + "h ago";
  return std::to_string(s / 86400) + "d ago";
}

std::string role_name(v1::TensorRole role) {
  const auto r = proto::from_proto(role);
  return r ? std::string(ampscope::role_name(*r)) : "unspecified";
}

std::string format_name(v1::Format format) {
  const auto f = proto::from_proto(format);
  return f ? std::string(ampscope::format_name(*f)) : "unspecified";
}

std::string agreement_name(v1::PolicyAgreement agreement) {
  return lower_suffix(v1::PolicyAgreement_Name(agreement), "POLICY_AGREEMENT_");
}

std::string mode_name(v1::PolicyMode mode) {
  std::string s = lower_suffix(v1::PolicyMode_Name(mode), "POLICY_MODE_");
  std::replace(s.begin(), s.end(), '_', '-');
  return s;
}

}  // namespace ampscope::cli
