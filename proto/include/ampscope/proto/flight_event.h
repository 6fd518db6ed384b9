// When a step is an event for the flight recorder (telemetry.proto, FlightEvent): the one
// definition of "alert-worthy underflow", shared by the agent, which ships its history when a
// step crosses it, and the server, which names the offending tensors of a step by it.
// Thread safety: pure functions.
#pragma once

#include <cstdint>

#include "ampscope/v1/stats.pb.h"
#include "stats_codec.h"

namespace ampscope::proto {

// The underflowing share of finite nonzero values (against targets[0]) above which underflow is
// alert-worthy: the AmpscopeUnderflowHigh alert's threshold (dashboards/prometheus/alerts.yml).
inline constexpr double kUnderflowEventRatio = 0.05;

inline bool underflow_above_threshold(std::uint64_t underflow, std::uint64_t values) {
  return values > 0 && static_cast<double>(underflow) > kUnderflowEventRatio *
                                                            static_cast<double>(values);
}

// The share of `t`'s finite nonzero values that underflow in targets[0]; 0 without targets.
inline double underflow_ratio(const v1::TensorStats& t) {
  const std::uint64_t values = finite_nonzero(t);
  if (t.targets_size() == 0 || values == 0) return 0.0;
  return static_cast<double>(t.targets(0).underflow()) / static_cast<double>(values);
}

// Whether a tensor offended in its step: it held a non-finite value, or its underflow share is
// above the threshold.
inline bool offended(const v1::TensorStats& t) {
  if (nonfinite(t) > 0) return true;
  return t.targets_size() > 0 &&
         underflow_above_threshold(t.targets(0).underflow(), finite_nonzero(t));
}

}  // namespace ampscope::proto
