// The clock of every *_unix_ns field on the wire: nanoseconds since the Unix epoch, from the
// system clock. The agent stamps reports and the server its decisions and receipts with it.
// Thread safety: a pure function of the system clock.
#pragma once

#include <chrono>
#include <cstdint>

namespace ampscope::proto {

inline std::int64_t unix_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace ampscope::proto
