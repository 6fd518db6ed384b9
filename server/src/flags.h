// Command-line values of ampscope-server that CLI11 cannot check by itself: durations ("30d",
// "12h", "90m", "45s", "500ms", or plain seconds) and sizes ("512M", "2G", "1048576", binary
// multiples). Both throw ampscope::Error naming the flag on malformed text.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace ampscope::server {

std::chrono::milliseconds parse_duration(const std::string& text, const std::string& flag);
std::uint64_t parse_bytes(const std::string& text, const std::string& flag);

}  // namespace ampscope::server
