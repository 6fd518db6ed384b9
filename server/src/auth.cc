#include "auth.h"

#include <fstream>
#include <optional>
#include <sstream>

#include "ampscope/check.h"
#include "ampscope/secret_file.h"
#include "log.h"
#include "validation.h"

namespace ampscope::server {
namespace {

constexpr std::string_view kBearer = "Bearer ";

std::optional<AccessRole> parse_role(std::string_view word) {
  if (word == "agent") return AccessRole::kAgent;
  if (word == "reader") return AccessRole::kReader;
  if (word == "admin") return AccessRole::kAdmin;
  return std::nullopt;
}

// "an agent", "a reader", "an admin"
std::string with_article(AccessRole role) {
  return std::string(role == AccessRole::kReader ? "a " : "an ") +
         std::string(access_role_name(role));
}

// "an agent token", "a reader token", "an admin token"
std::string token_of(AccessRole role) { return with_article(role) + " token"; }

// "an admin token", "a reader or admin token": who may make a call that needs `role`.
std::string tokens_allowed(AccessRole role) {
  if (role == AccessRole::kAdmin) return token_of(role);
  return with_article(role) + " or admin token";
}

std::vector<std::string_view> words_of(std::string_view line) {
  std::vector<std::string_view> words;
  std::size_t i = 0;
  while (i < line.size()) {
    const std::size_t b = line.find_first_not_of(" \t", i);
    if (b == std::string_view::npos) break;
    std::size_t e = line.find_first_of(" \t", b);
    if (e == std::string_view::npos) e = line.size();
    words.push_back(line.substr(b, e - b));
    i = e;
  }
  return words;
}

// Tokens travel in an HTTP header and a basic-auth password: printable ASCII, no spaces.
bool printable_token(std::string_view token) {
  for (char c : token) {
    if (c < '!' || c > '~') return false;
  }
  return true;
}

}  // namespace

std::string_view access_role_name(AccessRole role) {
  switch (role) {
    case AccessRole::kAgent:
      return "agent";
    case AccessRole::kReader:
      return "reader";
    case AccessRole::kAdmin:
      return "admin";
  }
  return "unknown";
}

bool constant_time_equal(std::string_view presented, std::string_view secret) {
  if (secret.empty()) return presented.empty();
  volatile std::size_t diff = presented.size() ^ secret.size();
  for (std::size_t i = 0; i < presented.size(); ++i) {
    diff = diff | static_cast<unsigned char>(presented[i] ^ secret[i % secret.size()]);
  }
  return diff == 0;
}

std::vector<TokenGrant> parse_token_file(std::string_view text, const std::string& origin) {
  std::vector<TokenGrant> grants;
  std::vector<int> lines;  // where each grant was written
  std::optional<int> bare_line;
  std::istringstream in{std::string(text)};
  int n = 0;
  for (std::string raw; std::getline(in, raw);) {
    ++n;
    if (!raw.empty() && raw.back() == '\r') raw.pop_back();
    const std::vector<std::string_view> words = words_of(raw);
    if (words.empty() || words[0].front() == '#') continue;
    const std::string where = origin + " line " + std::to_string(n) + ": ";
    TokenGrant g;
    if (words.size() == 1) {
      if (parse_role(words[0]))
        throw Error(where + "role " + std::string(words[0]) + " without a token");
      bare_line = n;
      g.token = std::string(words[0]);
    } else {
      const std::optional<AccessRole> role = parse_role(words[0]);
      if (!role)
        throw Error(where +
                    "expected ROLE TOKEN [RUN_ID_PREFIX], ROLE one of agent, reader, admin");
      if (words.size() > 3) throw Error(where + "more than ROLE TOKEN [RUN_ID_PREFIX]");
      g.role = *role;
      g.token = std::string(words[1]);
      if (words.size() == 3) {
        if (g.role != AccessRole::kAgent) {
          throw Error(where + "a run-id prefix limits agent tokens only, not " + token_of(g.role));
        }
        if (std::optional<Violation> v = check_run_id(words[2], "run-id prefix")) {
          throw Error(where + v->message);
        }
        g.run_id_prefix = std::string(words[2]);
      }
    }
    if (!printable_token(g.token)) {
      throw Error(where + "a token may use only printable ASCII characters without spaces");
    }
    for (std::size_t i = 0; i < grants.size(); ++i) {
      if (grants[i].token == g.token) {
        throw Error(where + "the same token as line " + std::to_string(lines[i]));
      }
    }
    grants.push_back(std::move(g));
    lines.push_back(n);
  }
  if (grants.empty()) throw Error(origin + ": no token in it");
  if (bare_line && grants.size() > 1) {
    throw Error(origin + " line " + std::to_string(*bare_line) +
                ": a bare token (no role) must be the file's only entry; write ROLE TOKEN");
  }
  return grants;
}

std::vector<TokenGrant> read_token_file(const std::string& path) {
  const std::string origin = "--auth-token-file '" + path + "'";
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(origin + ": cannot read it");
  std::stringstream text;
  text << in.rdbuf();
  if (const std::string exposed = secret_file_exposure(path); !exposed.empty()) {
    log_warning(origin, ": ", exposed);
  }
  return parse_token_file(text.str(), origin);
}

Authenticator::Authenticator(std::vector<TokenGrant> grants) : grants_(std::move(grants)) {}

const TokenGrant* Authenticator::find(std::string_view presented) const {
  const TokenGrant* match = nullptr;
  for (const TokenGrant& g : grants_) {
    const bool equal = constant_time_equal(presented, g.token);
    match = equal ? &g : match;
  }
  return match;
}

grpc::Status Authenticator::authorize(const grpc::ServerContextBase& context, std::string_view rpc,
                                      AccessRole needed, Principal* who) const {
  if (!enabled()) {
    *who = Principal{};
    return grpc::Status::OK;
  }
  const auto& metadata = context.client_metadata();
  const auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "missing 'authorization: Bearer <token>' metadata");
  }
  const std::string_view value(it->second.data(), it->second.size());
  const TokenGrant* grant =
      value.substr(0, kBearer.size()) == kBearer ? find(value.substr(kBearer.size())) : nullptr;
  if (grant == nullptr) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "invalid bearer token");
  }
  *who = Principal{grant->role, grant->run_id_prefix};  // also when refused: for the log
  if (grant->role != AccessRole::kAdmin && grant->role != needed) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        std::string(rpc) + " needs " + tokens_allowed(needed) + "; this is " +
                            token_of(grant->role));
  }
  return grpc::Status::OK;
}

grpc::Status Authenticator::authorize_run(const Principal& who, std::string_view run_id) {
  if (who.run_id_prefix.empty() || run_id.starts_with(who.run_id_prefix)) {
    return grpc::Status::OK;
  }
  return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                      "hello.run_id: this agent token may stream only runs whose id starts with '" +
                          who.run_id_prefix + "', not '" + std::string(run_id) + "'");
}

bool Authenticator::allows_metrics(std::string_view password) const {
  const std::optional<AccessRole> role = role_of(password);
  return role == AccessRole::kReader || role == AccessRole::kAdmin;
}

std::optional<AccessRole> Authenticator::role_of(std::string_view token) const {
  if (!enabled()) return AccessRole::kAdmin;
  const TokenGrant* grant = find(token);
  if (grant == nullptr) return std::nullopt;
  return grant->role;
}

std::optional<AccessRole> Authenticator::role_of_authorization(
    std::string_view header_value) const {
  if (!enabled()) return AccessRole::kAdmin;
  if (header_value.substr(0, kBearer.size()) != kBearer) return std::nullopt;
  return role_of(header_value.substr(kBearer.size()));
}

std::string describe_caller(const grpc::ServerContextBase& context, const Principal& who,
                            const Authenticator& auth) {
  std::string text = auth.enabled() ? token_of(who.role) : "no token (tokens are off)";
  if (const std::shared_ptr<const grpc::AuthContext> tls = context.auth_context()) {
    for (const grpc::string_ref& subject :
         tls->FindPropertyValues(GRPC_X509_SUBJECT_PROPERTY_NAME)) {
      text += ", certificate subject '" + std::string(subject.data(), subject.size()) + "'";
    }
  }
  return text + ", from " + context.peer();
}

}  // namespace ampscope::server
