// The trainer's loss scaler (ampscope/loss_scale.h's rules on a validated configuration) and the
// thread-safe handle an outside controller steers it through.
#include "ampscope/trainer/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "ampscope/check.h"

namespace ampscope::trainer {

ScalerConfig ScalerConfig::pytorch_defaults() { return ScalerConfig{}; }

ScalerConfig ScalerConfig::megatron_defaults() {
  ScalerConfig c;
  static_cast<LossScaleRule&>(c) = megatron_rule();
  c.init_scale = kMegatronInitScale;
  return c;
}

ScalerConfig ScalerConfig::static_scale(float scale) {
  ScalerConfig c;
  c.kind = ScalerKind::kStatic;
  c.init_scale = scale;
  return c;
}

namespace {
bool finite_positive(double x) { return std::isfinite(x) && x > 0.0; }
}  // namespace

std::string validate(const ScalerConfig& c) {
  std::ostringstream os;
  if (!(std::isfinite(c.max_scale) && c.max_scale > 0.0f)) {
    os << "max_scale must be finite and > 0, got " << c.max_scale;
  } else if (!(std::isfinite(c.min_scale) && c.min_scale >= 0.0f && c.min_scale <= c.max_scale)) {
    os << "min_scale must be in [0, max_scale], got " << c.min_scale;
  } else if (!finite_positive(c.init_scale) || c.init_scale < c.min_scale ||
             c.init_scale > c.max_scale) {
    os << "init_scale must be finite, > 0 and in [min_scale, max_scale], got " << c.init_scale;
  } else if (!(std::isfinite(c.growth_factor) && c.growth_factor > 1.0)) {
    os << "growth_factor must be finite and > 1, got " << c.growth_factor;
  } else if (!(c.backoff_factor > 0.0 && c.backoff_factor < 1.0)) {
    os << "backoff_factor must be in (0, 1), got " << c.backoff_factor;
  } else if (c.growth_interval < 1) {
    os << "growth_interval must be >= 1, got " << c.growth_interval;
  } else if (c.hysteresis < 1) {
    os << "hysteresis must be >= 1, got " << c.hysteresis;
  }
  return os.str();
}

LossScaler::LossScaler(const ScalerConfig& config) {
  const std::string err = validate(config);
  AMPSCOPE_CHECK(err.empty(), "invalid scaler config: ", err);
  state_.config = config;
  static_cast<LossScaleState&>(state_) = initial_loss_scale_state(config.init_scale, config);
}

void LossScaler::restore(const ScalerState& s) {
  const std::string err = validate(s.config);
  AMPSCOPE_CHECK(err.empty(), "invalid scaler config: ", err);
  state_ = s;
}

ScalerHandle::ScalerHandle(const ScalerConfig& config) : scaler_(config) {}

ScalerState ScalerHandle::state() const {
  std::lock_guard lock(mu_);
  return scaler_.state();
}

std::int64_t ScalerHandle::next_step() const {
  std::lock_guard lock(mu_);
  return next_step_;
}

namespace {
// The state after `u` is applied to `s` (not yet validated).
ScalerState merged(const ScalerState& s, const ScalerUpdate& u) {
  ScalerState r = s;
  auto& c = r.config;
  if (u.kind) c.kind = *u.kind;
  if (u.growth_factor) c.growth_factor = *u.growth_factor;
  if (u.backoff_factor) c.backoff_factor = *u.backoff_factor;
  if (u.growth_interval) c.growth_interval = *u.growth_interval;
  if (u.hysteresis) c.hysteresis = *u.hysteresis;
  if (u.min_scale) c.min_scale = *u.min_scale;
  if (u.max_scale) c.max_scale = *u.max_scale;
  if (u.scale) r.scale = *u.scale;
  // A new scale or kind starts its trackers afresh; so does a change of interval or hysteresis.
  if (u.scale || u.kind || u.growth_interval) r.growth_tracker = 0;
  if (u.scale || u.kind || u.hysteresis) r.hysteresis_tracker = c.hysteresis;
  // init_scale records the scale a restart would use: keep it inside the new bounds.
  c.init_scale = r.scale;
  return r;
}

std::string check_update(const ScalerState& s, const ScalerUpdate& u) {
  if (u.scale && !(std::isfinite(*u.scale) && *u.scale > 0.0f)) {
    return "scale must be finite and > 0";
  }
  const ScalerState r = merged(s, u);
  if (r.scale < r.config.min_scale || r.scale > r.config.max_scale) {
    std::ostringstream os;
    os << "scale " << r.scale << " outside [min_scale " << r.config.min_scale << ", max_scale "
       << r.config.max_scale << "]";
    return os.str();
  }
  return validate(r.config);
}
}  // namespace

std::string ScalerHandle::schedule(const ScalerUpdate& update) {
  std::lock_guard lock(mu_);
  if (update.effective_from_step < next_step_) {
    std::ostringstream os;
    os << "effective_from_step " << update.effective_from_step << " is before the next step "
       << next_step_;
    return os.str();
  }
  // Checked against the current state; checked again when applied, on the state then.
  if (std::string err = check_update(scaler_.state(), update); !err.empty()) return err;
  auto pos = std::upper_bound(pending_.begin(), pending_.end(), update,
                              [](const ScalerUpdate& a, const ScalerUpdate& b) {
                                return a.effective_from_step < b.effective_from_step;
                              });
  pending_.insert(pos, update);
  return {};
}

std::size_t ScalerHandle::pending_updates() const {
  std::lock_guard lock(mu_);
  return pending_.size();
}

std::string ScalerHandle::apply_locked(const ScalerUpdate& update) {
  const ScalerState current = scaler_.state();
  if (std::string err = check_update(current, update); !err.empty()) return err;
  scaler_.restore(merged(current, update));
  return {};
}

float ScalerHandle::begin_step(std::int64_t step) {
  std::lock_guard lock(mu_);
  next_step_ = step;
  while (!pending_.empty() && pending_.front().effective_from_step <= step) {
    // An update that became invalid since it was queued (the state moved) is dropped.
    (void)apply_locked(pending_.front());
    pending_.erase(pending_.begin());
  }
  return scaler_.scale();
}

float ScalerHandle::scale() const {
  std::lock_guard lock(mu_);
  return scaler_.scale();
}

float ScalerHandle::end_step(bool found_inf) {
  std::lock_guard lock(mu_);
  scaler_.update(found_inf);
  next_step_ += 1;
  return scaler_.scale();
}

float ScalerHandle::end_step(const LossScaleState& updated) {
  std::lock_guard lock(mu_);
  ScalerState s = scaler_.state();
  static_cast<LossScaleState&>(s) = updated;
  scaler_.restore(s);
  next_step_ += 1;
  return scaler_.scale();
}

void ScalerHandle::restore(const ScalerState& state, std::int64_t next_step) {
  std::lock_guard lock(mu_);
  scaler_.restore(state);
  pending_.clear();
  next_step_ = next_step;
}

}  // namespace ampscope::trainer
