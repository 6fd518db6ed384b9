// Server log: one line per event on stderr, "<UTC time> <level> <message>". Thread-safe (one
// write(2) per line).
#pragma once

#include <functional>
#include <sstream>
#include <string>
#include <string_view>

namespace ampscope::server {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

void set_log_level(LogLevel level);
bool log_enabled(LogLevel level);
void log_line(LogLevel level, std::string_view message);

// Sends gRPC core's own log lines (gpr_log, otherwise raw lines on stderr in gRPC's format)
// to this log: gRPC's errors as warnings, its info as debug. A TLS handshake gRPC refused is
// one warning that names the reason in the operator's terms ("TLS handshake refused: the client
// sent no certificate (mutual TLS: --tls-client-ca)"), and `on_tls_refusal` is called for it.
// gRPC does not tell its log which client it was. Process-wide (gRPC has one log function);
// the last call wins; an empty function counts nothing.
void route_grpc_log(std::function<void()> on_tls_refusal);

// The warning route_grpc_log writes for gRPC's line `message` ("Handshake failed with fatal
// error SSL_ERROR_SSL: ...: peer did not return a certificate."), or "" when it is not a
// refused handshake.
std::string tls_refusal_text(std::string_view message);

template <typename... Args>
void log(LogLevel level, const Args&... args) {
  if (!log_enabled(level)) return;
  std::ostringstream os;
  (os << ... << args);
  log_line(level, os.str());
}

template <typename... Args>
void log_info(const Args&... args) {
  log(LogLevel::kInfo, args...);
}
template <typename... Args>
void log_warning(const Args&... args) {
  log(LogLevel::kWarning, args...);
}
template <typename... Args>
void log_error(const Args&... args) {
  log(LogLevel::kError, args...);
}

}  // namespace ampscope::server
