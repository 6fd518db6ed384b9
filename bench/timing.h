// Wall-clock timing for the benchmarks: a few warm-up rounds, then `reps` timed rounds. Each
// round calls every function once, in order, so slow drift of the machine (other tenants,
// clock changes) affects all of them alike and their ratios stay meaningful.
// The headline figure is the median of the timed rounds; the minimum is kept alongside.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <span>
#include <vector>

namespace ampscope::bench {

struct Timing {
  std::vector<double> seconds;  // one entry per timed round

  double median() const {
    std::vector<double> s = seconds;
    std::sort(s.begin(), s.end());
    const std::size_t m = s.size() / 2;
    return s.size() % 2 == 1 ? s[m] : 0.5 * (s[m - 1] + s[m]);
  }
  double min() const { return *std::min_element(seconds.begin(), seconds.end()); }
};

inline std::vector<Timing> time_interleaved(std::span<const std::function<void()>> fns, int warmup,
                                            int reps) {
  using Clock = std::chrono::steady_clock;
  std::vector<Timing> timings(fns.size());
  for (int round = 0; round < warmup + reps; ++round) {
    for (std::size_t f = 0; f < fns.size(); ++f) {
      const auto start = Clock::now();
      fns[f]();
      const std::chrono::duration<double> elapsed = Clock::now() - start;
      if (round >= warmup) timings[f].seconds.push_back(elapsed.count());
    }
  }
  return timings;
}

}  // namespace ampscope::bench
