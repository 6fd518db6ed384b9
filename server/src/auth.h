// Who may do what on the server: tokens with roles, read from the token file
// (--auth-token-file, docs/security.md).
//
//   agent   streams reports (Telemetry.Attach): for any run, or only for runs whose id starts
//           with the token's run-id prefix
//   reader  the Query service's read RPCs (ListRuns, GetRun, GetReports, GetPolicy,
//           GetStepHistory) and /metrics
//   admin   everything: also DeleteRun, and streaming for any run
//
// Without tokens nothing is checked and every caller acts as an admin. A gRPC call carries its
// token as the metadata "authorization: Bearer <token>"; /metrics takes it as the password of
// HTTP basic auth. A presented token is compared with every configured one, each time in a time
// that depends only on the presented value's length, so that neither a token nor which one
// matched can be learnt from response times. No message and no log line ever holds a token.
//
// Thread safety: an Authenticator is immutable after construction; the rest are pure functions.
#pragma once

#include <grpcpp/grpcpp.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ampscope::server {

enum class AccessRole { kAgent, kReader, kAdmin };

std::string_view access_role_name(AccessRole role);  // "agent", "reader", "admin"

// One line of the token file.
struct TokenGrant {
  AccessRole role = AccessRole::kAdmin;
  std::string token;
  std::string run_id_prefix;  // agent tokens only; empty: any run
};

// The caller of one RPC, once its token was recognised.
struct Principal {
  AccessRole role = AccessRole::kAdmin;
  std::string run_id_prefix;
};

// The token file's text: one grant per line, "ROLE TOKEN [RUN_ID_PREFIX]"; blank lines and
// lines starting with '#' are skipped. A file whose only entry is a bare token (one word) holds
// one admin token, as files did before roles existed. Throws ampscope::Error "<origin> line N:
// ..." on anything else (an unknown role, a prefix on a reader or admin token, a token used
// twice, characters outside printable ASCII); the message never quotes a token.
std::vector<TokenGrant> parse_token_file(std::string_view text, const std::string& origin);

// Reads and parses `path`; throws ampscope::Error naming --auth-token-file and the path when it
// cannot be read. Logs a warning when its group or others may read it.
std::vector<TokenGrant> read_token_file(const std::string& path);

class Authenticator {
 public:
  // No grants: authentication off.
  explicit Authenticator(std::vector<TokenGrant> grants = {});

  bool enabled() const { return !grants_.empty(); }

  // For `rpc` (its name, for the message), which an admin or a `needed` token may make: OK
  // with the caller in *who (also set for PERMISSION_DENIED); UNAUTHENTICATED when the call
  // carries no token or an unknown one; PERMISSION_DENIED naming the role needed ("DeleteRun
  // needs an admin token").
  grpc::Status authorize(const grpc::ServerContextBase& context, std::string_view rpc,
                         AccessRole needed, Principal* who) const;

  // Whether `who` may stream reports of `run_id` (the run is known only at the stream's Hello):
  // OK, or PERMISSION_DENIED naming the token's run-id prefix.
  static grpc::Status authorize_run(const Principal& who, std::string_view run_id);

  // /metrics with HTTP basic auth: whether `password` is a reader or admin token. The user name
  // is not checked (Prometheus' basic_auth needs one; any will do).
  bool allows_metrics(std::string_view password) const;

  // The role of a presented token (the web UI's login form), nullopt for an unknown one.
  // Without tokens: admin.
  std::optional<AccessRole> role_of(std::string_view token) const;
  // The same for an HTTP "Authorization: Bearer <token>" header's value (the web UI); nullopt
  // for another scheme.
  std::optional<AccessRole> role_of_authorization(std::string_view header_value) const;

 private:
  // The grant whose token equals `presented`, after comparing it with every grant.
  const TokenGrant* find(std::string_view presented) const;

  std::vector<TokenGrant> grants_;
};

// Who made a call, for the log (never the token): "an admin token, certificate subject
// 'CN=ops-1', from ipv4:10.0.0.7:51234". `who` is the caller authorize() recognised; with
// tokens off, "no token (tokens are off)". The certificate subject is there under mutual TLS.
std::string describe_caller(const grpc::ServerContextBase& context, const Principal& who,
                            const Authenticator& auth);

// Equality of a presented value with a secret, in a time that depends only on the presented
// value's length: neither where the first difference is nor the secret's length shows.
bool constant_time_equal(std::string_view presented, std::string_view secret);

}  // namespace ampscope::server
