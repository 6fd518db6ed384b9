// What a failed call's gRPC status says about TLS, for the one line a client shows (the CLI's
// error, the agent's notice). gRPC reports a failed handshake as UNAVAILABLE with OpenSSL's
// reason inside a long message ("failed to connect to all addresses; last error: UNKNOWN:
// ipv4:127.0.0.1:50051: Ssl handshake failed: SSL_ERROR_SSL: error:0A000086:SSL
// routines::certificate verify failed"), and a server that refuses a client certificate under
// TLS 1.3 only closes the connection after the client's side of the handshake ("Socket closed"):
// neither reads as a TLS problem unless someone says so.
//
// Thread safety: pure functions.
#pragma once

#include <grpcpp/grpcpp.h>

#include <string>
#include <string_view>

namespace ampscope::proto {

// OpenSSL's reason in a gRPC message that quotes an OpenSSL error ("... SSL_ERROR_SSL:
// error:0A000086:SSL routines::certificate verify failed." -> "certificate verify failed"):
// the text after "routines::" (or after the last ':'), to the end of its line or a '{', without
// trailing dots and spaces. The server's log and the clients read it the same way.
inline std::string_view openssl_reason(std::string_view text) {
  if (const auto r = text.find("routines::"); r != std::string_view::npos) {
    text.remove_prefix(r + 10);
  } else if (const auto c = text.rfind(':'); c != std::string_view::npos) {
    text.remove_prefix(c + 1);
  }
  text = text.substr(0, text.find_first_of("{\n"));
  while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '.')) text.remove_suffix(1);
  return text;
}

// "" when `status` is not a connection failure that TLS explains. Otherwise one phrase, e.g.
// "TLS handshake failed: certificate verify failed (the server's certificate is not signed by
// the CA this client trusts)". `tls`: whether this client speaks TLS.
inline std::string tls_failure(const grpc::Status& status, bool tls) {
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE) return "";
  const std::string& m = status.error_message();
  const auto has = [&m](std::string_view s) { return m.find(s) != std::string::npos; };
  if (const auto at = m.find("Ssl handshake failed"); at != std::string::npos) {
    const std::string reason(openssl_reason(std::string_view(m).substr(at)));
    std::string why;
    if (reason.find("certificate verify failed") != std::string::npos) {
      why = " (the server's certificate is not signed by the CA this client trusts, or has "
            "expired)";
    } else if (reason.find("wrong version number") != std::string::npos) {
      why = " (the server speaks plaintext: it was started without --tls-cert)";
    } else if (reason.find("alert") != std::string::npos) {
      why = " (the server refused this client's certificate)";
    }
    return "TLS handshake failed: " + reason + why;
  }
  if (has("Peer name") && has("not in peer certificate")) {
    return "TLS handshake failed: the server's certificate does not name the host dialled (its "
           "subjectAltName)";
  }
  if (has("Socket closed") || has("Connection reset")) {
    return tls ? "the server closed the connection after the TLS handshake, which is how a "
                 "server that requires client certificates (mutual TLS) refuses this client's: "
                 "none, one its --tls-client-ca did not sign, or one without the clientAuth "
                 "extended key usage (its log names the reason)"
               : "the server closed the connection at once, which is what a server that speaks "
                 "TLS does to a plaintext client";
  }
  return "";
}

}  // namespace ampscope::proto
