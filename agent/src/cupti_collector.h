// The CUPTI collector: tensor-core utilisation of sampled steps with the Range Profiler (one
// user range around the step, user replay, one pass), evaluated with the metric the offline
// check chooses for the device's chip (ampscope/agent/cupti.h).
//
// Only on a GPU: create() says why not otherwise (no CUDA build, no device, no context,
// another profiler holding the counters: CUPTI_ERROR_HARDWARE_BUSY), and the agent reports that
// once as a notice; no value is ever invented. Decoding a range synchronises the context, so
// the agent samples every cupti_every steps only.
// Thread safety: one thread at a time (the recorder's step lock); a range is pushed and popped
// on one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace ampscope::agent {

class CuptiCollector {
 public:
  virtual ~CuptiCollector() = default;
  // For the context current on the calling thread. nullptr with a one-line reason.
  static std::unique_ptr<CuptiCollector> create(std::string* why_not);
  // Opens the range of `step`. False with a reason when CUPTI refuses (the agent stops).
  virtual bool begin(std::int64_t step, std::string* error) = 0;
  // Closes it and returns the share of cycles the tensor pipes were active, in [0, 1]; nullopt
  // with a reason on failure.
  virtual std::optional<double> end(std::string* error) = 0;
};

}  // namespace ampscope::agent
