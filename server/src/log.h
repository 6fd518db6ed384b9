// Server log: one line per event on stderr, "<UTC time> <level> <message>". Thread-safe (one
// write(2) per line).
#pragma once

#include <sstream>
#include <string>
#include <string_view>

namespace ampscope::server {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

void set_log_level(LogLevel level);
bool log_enabled(LogLevel level);
void log_line(LogLevel level, std::string_view message);

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
