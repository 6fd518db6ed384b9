#include "flight_recorder.h"

#include <array>
#include <utility>

#include "ampscope/proto/flight_event.h"

namespace ampscope::agent {
namespace {

bool holds_full(const TensorSample& s) {
  return s.measured && (s.full || s.level == Level::kFull);
}

// A measured sample as the recorder keeps it: no pending work, reported in full when sent.
TensorSample kept_copy(const TensorSample& s) {
  TensorSample k;
  k.name = s.name;
  k.role = s.role;
  k.phase = s.phase;
  k.dtype = s.dtype;
  k.shape = s.shape;
  k.numel = s.numel;
  k.scale = s.scale;
  k.micro_step = s.micro_step;
  k.order = s.order;
  k.level = Level::kFull;
  k.target = s.target;
  k.held = s.held;
  k.measured = true;
  k.full = true;
  k.stats = s.stats;
  return k;
}

}  // namespace

FlightRecorder::FlightRecorder(std::size_t max_steps, std::uint64_t max_bytes)
    : max_steps_(max_steps), max_bytes_(max_bytes), above_(kNumTensorRoles, false) {}

std::uint64_t FlightRecorder::footprint(const TensorSample& s) {
  // A std::string holds up to 15 characters inside itself (libstdc++'s small-string buffer).
  constexpr std::size_t kInlineChars = 15;
  const std::uint64_t name = s.name.size() > kInlineChars ? s.name.size() + 1 : 0;
  return sizeof(TensorSample) + name + s.shape.size() * sizeof(std::int64_t) +
         s.stats.histogram.counts.size() * sizeof(std::uint64_t) +
         s.stats.targets.size() * sizeof(TargetCounts);
}

void FlightRecorder::on_step(const StepRecord& record, FlightHistory* history) {
  history->event = FlightEvent::kNone;
  history->steps.clear();
  if (max_steps_ == 0) return;
  const FlightEvent event = event_of(record);
  if (event == FlightEvent::kNone) {
    keep(record);
    return;
  }
  history->event = event;
  history->steps.reserve(ring_.size());
  for (RecordedStep& step : ring_) history->steps.push_back(std::move(step));
  ring_.clear();
  bytes_ = 0;
  tensors_ = 0;
}

FlightEvent FlightRecorder::event_of(const StepRecord& record) {
  bool nonfinite = record.info.found_inf;
  std::array<bool, kNumTensorRoles> checked{};
  std::array<std::uint64_t, kNumTensorRoles> underflow{};
  std::array<std::uint64_t, kNumTensorRoles> values{};
  for (const TensorSample& s : record.samples) {
    if (!s.measured) continue;
    nonfinite = nonfinite || s.stats.nonfinite() > 0;
    if (!holds_full(s) || s.stats.targets.empty()) continue;
    const int r = static_cast<int>(s.role);
    checked[r] = true;
    underflow[r] += s.stats.targets[0].underflow;
    values[r] += s.stats.finite_nonzero();
  }
  bool rose = false;
  for (int r = 0; r < kNumTensorRoles; ++r) {
    if (!checked[r]) continue;
    const bool above = proto::underflow_above_threshold(underflow[r], values[r]);
    rose = rose || (above && !above_[r]);
    above_[r] = above;
  }
  if (nonfinite) return FlightEvent::kNonfinite;
  if (record.info.skipped) return FlightEvent::kSkipped;
  return rose ? FlightEvent::kUnderflow : FlightEvent::kNone;
}

void FlightRecorder::keep(const StepRecord& record) {
  RecordedStep step;
  step.step = record.info.step;
  step.loss_scale = record.info.loss_scale;
  for (const TensorSample& s : record.samples) {
    // Samples reported in full are on the server already.
    if (!holds_full(s) || s.level == Level::kFull) continue;
    TensorSample k = kept_copy(s);
    const std::uint64_t bytes = footprint(k);
    if (step.bytes + bytes > max_bytes_ || step.samples.size() >= kMaxTensors) {
      ++dropped_samples_;
      continue;
    }
    step.bytes += bytes;
    step.samples.push_back(std::move(k));
  }
  if (step.samples.empty()) return;
  while (!ring_.empty() && (ring_.size() >= max_steps_ || bytes_ + step.bytes > max_bytes_ ||
                            tensors_ + step.samples.size() > kMaxTensors)) {
    evict_oldest();
  }
  bytes_ += step.bytes;
  tensors_ += step.samples.size();
  ring_.push_back(std::move(step));
}

void FlightRecorder::evict_oldest() {
  bytes_ -= ring_.front().bytes;
  tensors_ -= ring_.front().samples.size();
  ring_.pop_front();
}

}  // namespace ampscope::agent
