#include "log.h"

#include <grpc/support/log.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <mutex>

#include "ampscope/proto/tls_failure.h"

namespace ampscope::server {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
constexpr const char* kNames[] = {"DEBUG", "INFO", "WARN", "ERROR"};
}  // namespace

void set_log_level(LogLevel level) { g_level = static_cast<int>(level); }

bool log_enabled(LogLevel level) { return static_cast<int>(level) >= g_level.load(); }

void log_line(LogLevel level, std::string_view message) {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char stamp[32];
  const std::size_t n = std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &tm);
  std::string line(stamp, n);
  char frac[8];
  std::snprintf(frac, sizeof frac, ".%03dZ ", static_cast<int>(ms));
  line += frac;
  line += kNames[static_cast<int>(level)];
  line += ' ';
  line += message;
  line += '\n';
  // One write per line keeps lines whole when several threads log at once.
  [[maybe_unused]] const ssize_t written = ::write(STDERR_FILENO, line.data(), line.size());
}

namespace {

std::mutex g_grpc_mu;
std::function<void()> g_on_tls_refusal;  // guarded by g_grpc_mu

void grpc_log(gpr_log_func_args* args) {
  const std::string_view message(args->message);
  if (std::string text = tls_refusal_text(message); !text.empty()) {
    log_line(LogLevel::kWarning, text);
    std::lock_guard lock(g_grpc_mu);
    if (g_on_tls_refusal) g_on_tls_refusal();
    return;
  }
  const LogLevel level =
      args->severity == GPR_LOG_SEVERITY_ERROR ? LogLevel::kWarning : LogLevel::kDebug;
  if (!log_enabled(level)) return;
  std::string line = "grpc: ";
  line += message;
  log_line(level, line);
}

}  // namespace

std::string tls_refusal_text(std::string_view message) {
  constexpr std::string_view kFailed = "Handshake failed with fatal error";
  if (message.substr(0, kFailed.size()) != kFailed) return "";
  const std::string_view reason = proto::openssl_reason(message.substr(kFailed.size()));
  std::string text = "TLS handshake refused: ";
  if (reason == "peer did not return a certificate") {
    return text + "the client sent no certificate (mutual TLS: --tls-client-ca)";
  }
  text += reason;
  if (reason == "certificate verify failed") {
    text += " (a client certificate that --tls-client-ca did not sign, that has expired, or "
            "without the clientAuth extended key usage)";
  } else if (reason == "wrong version number" || reason == "http request") {
    text += " (a plaintext client on the TLS port)";
  }
  return text;
}

void route_grpc_log(std::function<void()> on_tls_refusal) {
  {
    std::lock_guard lock(g_grpc_mu);
    g_on_tls_refusal = std::move(on_tls_refusal);
  }
  gpr_set_log_function(grpc_log);
}

}  // namespace ampscope::server
