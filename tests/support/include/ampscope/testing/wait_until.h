// Polling for a condition that another process makes true.
#pragma once

#include <chrono>
#include <thread>

namespace ampscope::testing {

// Polls `done` every `every` until it holds or `timeout` passes; whether it held.
template <typename F>
bool wait_until(F done, std::chrono::milliseconds timeout,
                std::chrono::milliseconds every = std::chrono::milliseconds(50)) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (done()) return true;
    std::this_thread::sleep_for(every);
  }
  return done();
}

}  // namespace ampscope::testing
