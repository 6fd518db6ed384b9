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

std::string validate(const ScalerConfig& c) {
  if (std::string err = validate_loss_scale_rule(c); !err.empty()) return err;
  if (!(std::isfinite(c.init_scale) && c.init_scale > 0.0f) || c.init_scale < c.min_scale ||
      c.init_scale > c.max_scale) {
    std::ostringstream os;
    os << "init_scale must be finite, > 0 and in [min_scale, max_scale], got " << c.init_scale;
    return os.str();
  }
  return {};
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
// The state after `u` is applied to `s`, or a reason why it cannot be.
std::string merged(const ScalerState& s, const ScalerUpdate& u, ScalerState* out) {
  ScalerState r = s;
  if (std::string err = apply_loss_scale_change(&r.config, &r, u); !err.empty()) return err;
  // init_scale records the scale a restart would use: keep it inside the new bounds.
  r.config.init_scale = r.scale;
  *out = r;
  return {};
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
  ScalerState after;
  if (std::string err = merged(scaler_.state(), update, &after); !err.empty()) return err;
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
  ScalerState after;
  if (std::string err = merged(scaler_.state(), update, &after); !err.empty()) return err;
  scaler_.restore(after);
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
