// The loss-scale rules, written once for the CPU scaler (trainer/src/loss_scaler.cc), the CUDA
// kernel (kernels/cuda/nn_optimizer.cu) and the policy engine, and the one rule that turns a
// scale into a binade exponent.
//
//   kStatic      the scale never changes
//   kDynamic     PyTorch GradScaler: on found_inf scale = max(scale * backoff, min_scale) and
//                growth_tracker = 0; otherwise growth_tracker + 1, and at growth_interval
//                scale *= growth (kept only when finite and <= max_scale), growth_tracker = 0.
//                Defaults 2^16, x2, x0.5, 2000; no minimum (min_scale 0).
//   kHysteresis  Megatron-LM DynamicGradScaler: on found_inf growth_tracker = 0,
//                hysteresis_tracker -= 1 and, once it is <= 0, scale = max(scale * backoff,
//                min_scale); otherwise growth_tracker + 1, and at growth_interval both trackers
//                reset (hysteresis_tracker = hysteresis) and scale = min(scale * growth,
//                max_scale) (max_scale when the product is not finite). Defaults 2^32, x2,
//                x0.5, window 1000, hysteresis 2, min 1.
//
// Products with the factors are formed in FP64 and stored in FP32, as PyTorch's kernels do;
// every comparison is written out (no std::min/max) so that host and device take the same
// branch for every input, NaN included. The state is plain data so that it can live in device
// memory and come back to the host in one copy.
//
// Thread safety: everything here is a pure function or plain data.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>

#include "ampscope/detail/hd.h"
#include "ampscope/vocabulary.h"

namespace ampscope {

inline constexpr float kFp32MaxScale = 3.4028234663852886e38f;  // largest finite FP32

// How a scaler's scale evolves (everything of its configuration but the scale itself).
struct LossScaleRule {
  ScalerKind kind = ScalerKind::kDynamic;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  std::int64_t growth_interval = 2000;
  std::int32_t hysteresis = 2;  // kHysteresis only
  float min_scale = 0.0f;       // 0: no floor
  float max_scale = kFp32MaxScale;
  friend bool operator==(const LossScaleRule&, const LossScaleRule&) = default;
};

// PyTorch GradScaler's defaults (init_scale 2^16) and Megatron-LM's (initial 2^32).
inline constexpr float kGradScalerInitScale = 65536.0f;
inline constexpr float kMegatronInitScale = 4294967296.0f;
constexpr LossScaleRule gradscaler_rule() { return LossScaleRule{}; }
constexpr LossScaleRule megatron_rule() {
  return LossScaleRule{ScalerKind::kHysteresis, 2.0, 0.5, 1000, 2, 1.0f, kFp32MaxScale};
}

// The scaler's evolving state. Layout fixed (16 bytes): the CUDA back end keeps it in device
// memory next to found_inf and reads it back with the step's one copy.
struct LossScaleState {
  float scale = 1.0f;
  std::int32_t hysteresis_tracker = 0;
  std::int64_t growth_tracker = 0;
  friend bool operator==(const LossScaleState&, const LossScaleState&) = default;
};
static_assert(sizeof(LossScaleState) == 16);

// The state a scaler starts in (or restarts in after its scale was set from outside).
constexpr LossScaleState initial_loss_scale_state(float scale, const LossScaleRule& rule) {
  return LossScaleState{scale, rule.hysteresis, 0};
}

namespace detail {
AMPSCOPE_HD inline bool is_finite_float(float x) {
#if defined(__CUDA_ARCH__)
  return isfinite(x);
#else
  return std::isfinite(x);
#endif
}
}  // namespace detail

// scale * factor formed in FP64 and stored in FP32.
AMPSCOPE_HD inline float scale_times(float scale, double factor) {
  return static_cast<float>(static_cast<double>(scale) * factor);
}

// 1 / scale in FP64, cast to FP32 (GradScaler's inv_scale).
AMPSCOPE_HD inline float inverse_scale(float scale) {
  return static_cast<float>(1.0 / static_cast<double>(scale));
}

// One update, once per effective batch (after gradient accumulation).
AMPSCOPE_HD inline void update_loss_scale_state(LossScaleState& s, const LossScaleRule& r,
                                                bool found_inf) {
  switch (r.kind) {
    case ScalerKind::kStatic:
      return;
    case ScalerKind::kDynamic: {
      if (found_inf) {
        const float backed = scale_times(s.scale, r.backoff_factor);
        s.scale = (backed < r.min_scale) ? r.min_scale : backed;
        s.growth_tracker = 0;
        return;
      }
      const std::int64_t successful = s.growth_tracker + 1;
      if (successful == r.growth_interval) {
        const float grown = scale_times(s.scale, r.growth_factor);
        if (detail::is_finite_float(grown) && grown <= r.max_scale) s.scale = grown;
        s.growth_tracker = 0;
      } else {
        s.growth_tracker = successful;
      }
      return;
    }
    case ScalerKind::kHysteresis: {
      if (found_inf) {
        s.growth_tracker = 0;
        s.hysteresis_tracker -= 1;
        if (s.hysteresis_tracker <= 0) {
          const float backed = scale_times(s.scale, r.backoff_factor);
          s.scale = (backed < r.min_scale) ? r.min_scale : backed;
        }
        return;
      }
      s.growth_tracker += 1;
      if (s.growth_tracker == r.growth_interval) {
        s.growth_tracker = 0;
        s.hysteresis_tracker = r.hysteresis;
        const float grown = scale_times(s.scale, r.growth_factor);
        s.scale = detail::is_finite_float(grown) ? ((r.max_scale < grown) ? r.max_scale : grown)
                                                 : r.max_scale;
      }
      return;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Changing a scaler from outside (a policy's update, an operator's setting): every scaler that
// takes changes (the trainer's, the C API's callers such as the PyTorch package) validates and
// merges them with these two functions, so that they accept and refuse the same changes.

// Empty when the rule is valid, otherwise a one-line reason naming the field.
inline std::string validate_loss_scale_rule(const LossScaleRule& r) {
  std::ostringstream os;
  if (!(std::isfinite(r.max_scale) && r.max_scale > 0.0f)) {
    os << "max_scale must be finite and > 0, got " << r.max_scale;
  } else if (!(std::isfinite(r.min_scale) && r.min_scale >= 0.0f && r.min_scale <= r.max_scale)) {
    os << "min_scale must be in [0, max_scale], got " << r.min_scale;
  } else if (!(std::isfinite(r.growth_factor) && r.growth_factor > 1.0)) {
    os << "growth_factor must be finite and > 1, got " << r.growth_factor;
  } else if (!(r.backoff_factor > 0.0 && r.backoff_factor < 1.0)) {
    os << "backoff_factor must be in (0, 1), got " << r.backoff_factor;
  } else if (r.growth_interval < 1) {
    os << "growth_interval must be >= 1, got " << r.growth_interval;
  } else if (r.hysteresis < 1) {
    os << "hysteresis must be >= 1, got " << r.hysteresis;
  }
  return os.str();
}

// A change; unset fields keep their value.
struct LossScaleChange {
  std::optional<ScalerKind> kind;
  std::optional<float> scale;
  std::optional<double> growth_factor;
  std::optional<double> backoff_factor;
  std::optional<std::int64_t> growth_interval;
  std::optional<std::int32_t> hysteresis;
  std::optional<float> min_scale;
  std::optional<float> max_scale;
};

// Applies `change` to *rule and *state: a new scale or kind starts both trackers afresh, a new
// interval the growth tracker, a new hysteresis the hysteresis tracker. Returns empty when the
// result is valid (scale finite, > 0 and within [min_scale, max_scale]; the rule valid);
// otherwise a one-line reason, and *rule and *state are unchanged.
inline std::string apply_loss_scale_change(LossScaleRule* rule, LossScaleState* state,
                                           const LossScaleChange& c) {
  if (c.scale && !(std::isfinite(*c.scale) && *c.scale > 0.0f)) {
    return "scale must be finite and > 0";
  }
  LossScaleRule r = *rule;
  LossScaleState s = *state;
  if (c.kind) r.kind = *c.kind;
  if (c.growth_factor) r.growth_factor = *c.growth_factor;
  if (c.backoff_factor) r.backoff_factor = *c.backoff_factor;
  if (c.growth_interval) r.growth_interval = *c.growth_interval;
  if (c.hysteresis) r.hysteresis = *c.hysteresis;
  if (c.min_scale) r.min_scale = *c.min_scale;
  if (c.max_scale) r.max_scale = *c.max_scale;
  if (c.scale) s.scale = *c.scale;
  if (c.scale || c.kind || c.growth_interval) s.growth_tracker = 0;
  if (c.scale || c.kind || c.hysteresis) s.hysteresis_tracker = r.hysteresis;
  if (s.scale < r.min_scale || s.scale > r.max_scale) {
    std::ostringstream os;
    os << "scale " << s.scale << " outside [min_scale " << r.min_scale << ", max_scale "
       << r.max_scale << "]";
    return os.str();
  }
  if (std::string err = validate_loss_scale_rule(r); !err.empty()) return err;
  *rule = r;
  *state = s;
  return {};
}

// ---------------------------------------------------------------------------------------------
// Scale to exponent. A value x stored under scale s lies at x / s; its binade moves by the
// scale's exponent. Every component uses this one rule: floor(log2(s)), exact (frexp, no
// rounding), so a power-of-two scale maps to its exponent and any other scale to the binade
// its leading bit lies in (2^e <= s < 2^(e+1)).

// floor(log2(x)) for finite x > 0.
inline int floor_log2(double x) {
  int e = 0;
  (void)std::frexp(x, &e);  // x = m * 2^e, m in [0.5, 1)
  return e - 1;
}
inline bool is_power_of_two(double x) {
  if (!(std::isfinite(x) && x > 0.0)) return false;
  int e = 0;
  return std::frexp(x, &e) == 0.5;
}
// ceil(log2(x)) for finite x > 0.
inline int ceil_log2(double x) { return is_power_of_two(x) ? floor_log2(x) : floor_log2(x) + 1; }
// The binade exponent of a loss scale (finite, > 0).
inline int scale_exponent(double scale) { return floor_log2(scale); }

}  // namespace ampscope
