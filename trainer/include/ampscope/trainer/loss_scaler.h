// Loss scalers and the handle through which an outside controller steers them.
//
//   static      the scale never changes (1 for FP32/BF16 runs without scaling)
//   dynamic     PyTorch GradScaler: on found_inf scale *= backoff and the growth tracker resets;
//               otherwise tracker += 1 and at growth_interval scale *= growth (only if the
//               result is finite and <= max_scale) and the tracker resets. Defaults 2^16, 2,
//               0.5, 2000; no minimum.
//   hysteresis  Megatron-LM DynamicGradScaler: on found_inf the growth tracker resets, the
//               hysteresis tracker drops by one and, once it is <= 0, scale =
//               max(scale * backoff, min_scale); on a clean step tracker += 1 and at
//               growth_interval both trackers reset and scale *= growth (capped at max_scale).
// Products with the factors are formed in FP64 and stored in FP32, as the reference kernels do.
// update() is called once per effective batch (after gradient accumulation).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ampscope::trainer {

enum class ScalerKind { kStatic = 0, kDynamic = 1, kHysteresis = 2 };
std::string_view scaler_kind_name(ScalerKind kind);
std::optional<ScalerKind> parse_scaler_kind(std::string_view name);  // static|dynamic|hysteresis

inline constexpr float kFp32MaxFinite = 3.4028234663852886e38f;

struct ScalerConfig {
  ScalerKind kind = ScalerKind::kDynamic;
  float init_scale = 65536.0f;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  std::int64_t growth_interval = 2000;
  int hysteresis = 2;            // hysteresis scaler only
  float min_scale = 0.0f;        // 0 = no floor (dynamic); Megatron uses 1
  float max_scale = kFp32MaxFinite;

  // PyTorch GradScaler defaults, Megatron defaults (init 2^32, window 1000, min 1), static.
  static ScalerConfig pytorch_defaults();
  static ScalerConfig megatron_defaults();
  static ScalerConfig static_scale(float scale);
};

// Empty when valid, otherwise a one-line reason naming the field.
std::string validate(const ScalerConfig& config);

struct ScalerState {
  ScalerConfig config;
  float scale = 1.0f;
  std::int64_t growth_tracker = 0;
  int hysteresis_tracker = 0;
  friend bool operator==(const ScalerState& a, const ScalerState& b);
};

// One scaler algorithm. Not thread-safe on its own; the trainer reaches it through a
// ScalerHandle.
class LossScaler {
 public:
  virtual ~LossScaler() = default;
  virtual ScalerKind kind() const = 0;
  virtual float scale() const = 0;
  virtual void update(bool found_inf) = 0;
  virtual ScalerState state() const = 0;
  // Restores a state produced by state() of a scaler of the same kind.
  virtual void restore(const ScalerState& state) = 0;
};

// Builds the scaler for config.kind, starting at config.init_scale. Throws ampscope::Error when
// validate(config) fails.
std::unique_ptr<LossScaler> make_loss_scaler(const ScalerConfig& config);

// A change an outside controller asks for; unset fields keep their value. Applied at the start
// of the first step >= effective_from_step.
struct ScalerUpdate {
  std::int64_t effective_from_step = 0;
  std::optional<ScalerKind> kind;
  std::optional<float> scale;
  std::optional<double> growth_factor;
  std::optional<double> backoff_factor;
  std::optional<std::int64_t> growth_interval;
  std::optional<int> hysteresis;
  std::optional<float> min_scale;
  std::optional<float> max_scale;
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
  float end_step(float scale, int hysteresis_tracker, std::int64_t growth_tracker);

  // Checkpointing: the state and pending updates are replaced.
  void restore(const ScalerState& state, std::int64_t next_step);

 private:
  std::string apply_locked(const ScalerUpdate& update);
  mutable std::mutex mu_;
  std::unique_ptr<LossScaler> scaler_;
  std::vector<ScalerUpdate> pending_;
  std::int64_t next_step_ = 0;
};

}  // namespace ampscope::trainer
