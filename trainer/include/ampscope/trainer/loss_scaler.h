// The trainer's loss scaler and the handle through which an outside controller steers it. The
// rules (static; dynamic = PyTorch GradScaler; hysteresis = Megatron-LM DynamicGradScaler) are
// ampscope/loss_scale.h's, shared with the CUDA kernel and the policy engine; update() is called
// once per effective batch (after gradient accumulation).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ampscope/loss_scale.h"

namespace ampscope::trainer {

// A scaler's rule and the scale it starts from.
struct ScalerConfig : LossScaleRule {
  float init_scale = kGradScalerInitScale;

  // PyTorch GradScaler defaults, Megatron defaults (init 2^32, window 1000, min 1), static.
  static ScalerConfig pytorch_defaults();
  static ScalerConfig megatron_defaults();
  static ScalerConfig static_scale(float scale);
  friend bool operator==(const ScalerConfig&, const ScalerConfig&) = default;
};

// Empty when valid, otherwise a one-line reason naming the field.
std::string validate(const ScalerConfig& config);

// The rule's moving state (scale and trackers) with the configuration it runs under.
struct ScalerState : LossScaleState {
  ScalerConfig config;
  friend bool operator==(const ScalerState&, const ScalerState&) = default;
};

// One scaler: its configuration's rule applied to its state. Not thread-safe on its own; the
// trainer reaches it through a ScalerHandle.
class LossScaler {
 public:
  // Starts at config.init_scale. Throws ampscope::Error when validate(config) fails.
  explicit LossScaler(const ScalerConfig& config);
  ScalerKind kind() const { return state_.config.kind; }
  float scale() const { return state_.scale; }
  void update(bool found_inf) { update_loss_scale_state(state_, state_.config, found_inf); }
  const ScalerState& state() const { return state_; }
  // Restores a state produced by state(); throws ampscope::Error when its config is invalid.
  void restore(const ScalerState& state);

 private:
  ScalerState state_;
};

// A change an outside controller asks for (ampscope/loss_scale.h's rules for merging and
// validating it); unset fields keep their value. Applied at the start of the first step >=
// effective_from_step.
struct ScalerUpdate : LossScaleChange {
  std::int64_t effective_from_step = 0;
};

// The trainer's scaler behind a lock: the training thread calls begin_step()/scale()/end_step();
// any other thread may call state() and schedule().
// Thread safety: all members are thread-safe.
class ScalerHandle {
 public:
  explicit ScalerHandle(const ScalerConfig& config);

  // Full state and the step it belongs to (the next step to run).
  ScalerState state() const;
  std::int64_t next_step() const;
  // Validates and queues an update. Returns an empty string when accepted, otherwise a one-line
  // reason (bad factor, interval < 1, scale not finite or outside [min_scale, max_scale],
  // effective step already past). Accepted updates apply in effective-step order.
  std::string schedule(const ScalerUpdate& update);
  std::size_t pending_updates() const;

  // Training thread: applies due updates for `step` and returns the scale to use.
  float begin_step(std::int64_t step);
  float scale() const;
  // Training thread: one update per effective batch; returns the scale after it.
  float end_step(bool found_inf);
  // The same update, computed elsewhere by this scaler's own rule from the state begin_step
  // left (the back end's update_loss_scale): adopts it and returns the scale after it.
  float end_step(const LossScaleState& updated);

  // Checkpointing: the state and pending updates are replaced.
  void restore(const ScalerState& state, std::int64_t next_step);

 private:
  std::string apply_locked(const ScalerUpdate& update);
  mutable std::mutex mu_;
  LossScaler scaler_;
  std::vector<ScalerUpdate> pending_;
  std::int64_t next_step_ = 0;
};

}  // namespace ampscope::trainer
