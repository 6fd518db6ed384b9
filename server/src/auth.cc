#include "auth.h"

#include <fstream>

#include "ampscope/check.h"

namespace ampscope::server {

bool constant_time_equal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  volatile unsigned char diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = diff | static_cast<unsigned char>(a[i] ^ b[i]);
  }
  return diff == 0;
}

Authenticator::Authenticator(std::string token) : token_(std::move(token)) {}

grpc::Status Authenticator::check(const grpc::ServerContextBase& context) const {
  if (token_.empty()) return grpc::Status::OK;
  const auto& metadata = context.client_metadata();
  const auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "missing 'authorization: Bearer <token>' metadata");
  }
  const std::string_view value(it->second.data(), it->second.size());
  constexpr std::string_view kPrefix = "Bearer ";
  if (value.size() < kPrefix.size() || value.substr(0, kPrefix.size()) != kPrefix ||
      !constant_time_equal(value.substr(kPrefix.size()), token_)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "invalid bearer token");
  }
  return grpc::Status::OK;
}

std::string read_token_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("--auth-token-file '" + path + "': cannot read it");
  std::string line;
  std::getline(in, line);
  const auto first = line.find_first_not_of(" \t\r\n");
  const auto last = line.find_last_not_of(" \t\r\n");
  if (first == std::string::npos) throw Error("--auth-token-file '" + path + "': no token in it");
  return line.substr(first, last - first + 1);
}

}  // namespace ampscope::server
