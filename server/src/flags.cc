#include "flags.h"

#include <charconv>
#include <cmath>

#include "ampscope/check.h"

namespace ampscope::server {
namespace {

// Splits "12.5h" into 12.5 and "h"; false when there is no leading number.
bool split_number(const std::string& text, double* number, std::string* unit) {
  const char* b = text.data();
  const char* e = b + text.size();
  const auto r = std::from_chars(b, e, *number);
  if (r.ec != std::errc() || !std::isfinite(*number) || *number < 0) return false;
  unit->assign(r.ptr, e);
  return true;
}

}  // namespace

std::chrono::milliseconds parse_duration(const std::string& text, const std::string& flag) {
  double n = 0;
  std::string unit;
  if (!split_number(text, &n, &unit)) {
    throw Error(flag + " '" + text + "': expected a duration such as 30d, 12h, 90m, 45s or 500ms");
  }
  double ms = 0;
  if (unit == "ms") {
    ms = n;
  } else if (unit.empty() || unit == "s") {
    ms = n * 1e3;
  } else if (unit == "m") {
    ms = n * 60e3;
  } else if (unit == "h") {
    ms = n * 3600e3;
  } else if (unit == "d") {
    ms = n * 86400e3;
  } else {
    throw Error(flag + " '" + text + "': unknown unit '" + unit + "' (ms, s, m, h, d)");
  }
  return std::chrono::milliseconds(static_cast<std::int64_t>(std::llround(ms)));
}

std::uint64_t parse_bytes(const std::string& text, const std::string& flag) {
  double n = 0;
  std::string unit;
  if (!split_number(text, &n, &unit)) {
    throw Error(flag + " '" + text + "': expected a size such as 512M, 2G or 1048576");
  }
  double factor = 1;
  if (unit.empty() || unit == "B") {
    factor = 1;
  } else if (unit == "K" || unit == "KiB") {
    factor = 1024.0;
  } else if (unit == "M" || unit == "MiB") {
    factor = 1024.0 * 1024;
  } else if (unit == "G" || unit == "GiB") {
    factor = 1024.0 * 1024 * 1024;
  } else if (unit == "T" || unit == "TiB") {
    factor = 1024.0 * 1024 * 1024 * 1024;
  } else {
    throw Error(flag + " '" + text + "': unknown unit '" + unit + "' (K, M, G, T; binary)");
  }
  return static_cast<std::uint64_t>(n * factor);
}

}  // namespace ampscope::server
