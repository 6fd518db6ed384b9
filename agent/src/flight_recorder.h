// The flight recorder: the full statistics of the last steps that their reports did not carry
// in full, kept so that the report of a step that goes wrong can carry the history that led to
// it (docs/agent.md, "Flight recorder"; StepReport.history on the wire).
//
// Each measured step passes through on_step() in step order. A step is an event when a tensor
// held a non-finite value (or the scaler found one), when its update was skipped, or when the
// underflowing share of a role's values rose above proto::kUnderflowEventRatio (the previous
// measured step of that role was at or below it). The steps kept so far go out with the event
// step's report, once: they leave the recorder, so the next event sends only what was kept
// after this one. (The event step's own report stays as the sampling made it: its non-finite
// tensors are full by the sampling's escalation.) Otherwise the step's
// samples that hold full statistics and are reported at less (device tensors, statistics handed
// over by observe_stats, the roles of flight_recorder_roles) are kept, oldest evicted first.
//
// Memory bound: at most max_steps steps, max_bytes accounted bytes (footprint(): the sample's
// struct, name, shape, histogram bins and target counts, as allocated to their size) and
// kMaxTensors samples; a step that alone exceeds a bound keeps its first samples that fit.
//
// Owner: the delivery worker thread (one record at a time); nothing here is shared.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "record.h"

namespace ampscope::agent {

enum class FlightEvent : std::uint8_t { kNone, kNonfinite, kSkipped, kUnderflow };

struct RecordedStep {
  std::int64_t step = 0;
  double loss_scale = 1.0;
  std::vector<TensorSample> samples;  // measured, full statistics, in execution order
  std::uint64_t bytes = 0;            // footprint() of the samples
};

// What one report carries: the event and the steps before it, oldest first.
struct FlightHistory {
  FlightEvent event = FlightEvent::kNone;
  std::vector<RecordedStep> steps;
};

class FlightRecorder {
 public:
  // The server's bound on tensors in one report's history.
  static constexpr std::size_t kMaxTensors = 65536;

  // max_steps 0: the recorder is off (no event is looked for, nothing kept).
  FlightRecorder(std::size_t max_steps, std::uint64_t max_bytes);

  // A measured step, in step order. On an event: moves the steps kept so far into *history
  // (event set; steps empty when none were kept). Otherwise keeps the step's full samples
  // reported at less; *history is left empty. The record itself is not changed.
  void on_step(const StepRecord& record, FlightHistory* history);

  static std::uint64_t footprint(const TensorSample& s);

  std::size_t steps() const { return ring_.size(); }
  std::size_t tensors() const { return tensors_; }
  std::uint64_t bytes() const { return bytes_; }
  // Samples that did not fit at all (a step beyond a bound on its own).
  std::uint64_t dropped_samples() const { return dropped_samples_; }

 private:
  FlightEvent event_of(const StepRecord& record);
  void keep(const StepRecord& record);
  void evict_oldest();

  std::size_t max_steps_;
  std::uint64_t max_bytes_;
  std::deque<RecordedStep> ring_;
  std::uint64_t bytes_ = 0;
  std::size_t tensors_ = 0;
  std::uint64_t dropped_samples_ = 0;
  // Per role: whether its latest measured underflow share was above the threshold.
  std::vector<bool> above_;
};

}  // namespace ampscope::agent
