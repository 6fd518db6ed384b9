// Bearer-token authentication of every RPC. With a token configured, a
// call must carry the metadata "authorization: Bearer <token>"; the comparison takes the same
// time wherever the first difference is, so the token cannot be guessed byte by byte from
// response times.
//
// Thread safety: immutable after construction.
#pragma once

#include <grpcpp/grpcpp.h>

#include <string>
#include <string_view>

namespace ampscope::server {

class Authenticator {
 public:
  // An empty token disables authentication.
  explicit Authenticator(std::string token);

  bool enabled() const { return !token_.empty(); }
  // OK, or UNAUTHENTICATED with a message that says what was missing (never the token).
  grpc::Status check(const grpc::ServerContextBase& context) const;

 private:
  std::string token_;
};

// Constant-time equality for equal lengths; a length difference returns false at once (the
// length of the token is not a secret worth a timing channel).
bool constant_time_equal(std::string_view a, std::string_view b);

// Reads a token file: the first line, surrounding whitespace removed. Throws ampscope::Error when
// the file cannot be read or holds no token.
std::string read_token_file(const std::string& path);

}  // namespace ampscope::server
