// Which tensors of a step are measured, and how much (SamplingConfig in config.h).
//
// Per step, decided at begin_step: every step samples count_roles at the counts level; a full
// step (every full_every steps, and the step after a step that held a non-finite value or
// changed the loss scale) samples full_roles at the full level. Within a step, the first
// non-finite value escalates: that tensor and every later one of the step are measured full
// (the values of earlier tensors are gone by then; they keep their counts). The flight
// recorder's roles (AgentConfig::flight_recorder_roles, when the recorder is on) are measured
// in full on every step whatever the level, and reported at the level.
// A rank that does not send full statistics (SamplingConfig::full_ranks, sends_full_stats in
// config.h) has no full steps: it counts every step and escalates from its own first
// non-finite value on, as every rank does, and nothing more.
// Thread safety: none; the recorder's, used under its step lock.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "ampscope/agent/config.h"
#include "ampscope/agent/interfaces.h"

namespace ampscope::agent {

enum class Level : std::uint8_t { kSkip = 0, kCounts = 1, kFull = 2 };

class Sampler {
 public:
  // `recorded_roles`: the flight recorder's roles (empty when the recorder is off).
  // `full_stats`: whether this rank sends full statistics (sends_full_stats in config.h).
  explicit Sampler(const SamplingConfig& config, const std::vector<TensorRole>& recorded_roles = {},
                   bool full_stats = true);

  // Starts `step`; false when nothing at all is measured this step.
  bool begin_step(std::int64_t step);
  // The level for a tensor of `role` shown in `phase` at this point of the step. Weight
  // gradients after unscaling are the backward-phase ones divided by the scale: they are
  // measured on full steps only.
  Level level(TensorRole role, TensorPhase phase = TensorPhase::kUnknown) const;
  // Whether the flight recorder wants the tensor in full whatever its level. Weight gradients
  // after unscaling are left out, as for counts: they repeat the backward-phase ones.
  bool records(TensorRole role, TensorPhase phase = TensorPhase::kUnknown) const;
  // What is measured: level(), or kFull where records().
  Level measured(TensorRole role, TensorPhase phase = TensorPhase::kUnknown) const {
    return records(role, phase) ? Level::kFull : level(role, phase);
  }
  // A measured tensor held a non-finite value: escalate the rest of the step (when enabled).
  void saw_nonfinite();
  // The step ended; `nonfinite` says whether any tensor or the scaler saw one, `scale_changed`
  // whether the loss scale moved. Decides whether the next step is a full one.
  void end_step(bool nonfinite, bool scale_changed);

  bool full_step() const { return full_step_; }
  std::int64_t step() const { return step_; }

 private:
  SamplingConfig config_;
  bool full_stats_ = true;
  std::array<bool, kNumTensorRoles> count_role_{};
  std::array<bool, kNumTensorRoles> full_role_{};
  std::array<bool, kNumTensorRoles> record_role_{};
  bool counts_any_ = false;
  std::int64_t step_ = -1;
  bool full_step_ = false;
  bool escalated_ = false;
  bool follow_up_ = false;  // the next step is a full one
};

}  // namespace ampscope::agent
