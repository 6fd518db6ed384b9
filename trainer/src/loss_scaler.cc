// Static, dynamic (PyTorch GradScaler) and hysteresis (Megatron-LM DynamicGradScaler) loss
// scalers, and the thread-safe handle an outside controller steers them through.
#include "ampscope/trainer/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "ampscope/check.h"

namespace ampscope::trainer {

std::string_view scaler_kind_name(ScalerKind kind) {
  switch (kind) {
    case ScalerKind::kStatic:
      return "static";
    case ScalerKind::kDynamic:
      return "dynamic";
    case ScalerKind::kHysteresis:
      return "hysteresis";
  }
  return "unknown";
}

std::optional<ScalerKind> parse_scaler_kind(std::string_view name) {
  for (auto k : {ScalerKind::kStatic, ScalerKind::kDynamic, ScalerKind::kHysteresis}) {
    if (name == scaler_kind_name(k)) return k;
  }
  return std::nullopt;
}

ScalerConfig ScalerConfig::pytorch_defaults() { return ScalerConfig{}; }

ScalerConfig ScalerConfig::megatron_defaults() {
  ScalerConfig c;
  c.kind = ScalerKind::kHysteresis;
  c.init_scale = 4294967296.0f;  // 2^32
  c.growth_interval = 1000;
  c.hysteresis = 2;
  c.min_scale = 1.0f;
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

bool operator==(const ScalerState& a, const ScalerState& b) {
  const auto& x = a.config;
  const auto& y = b.config;
  return x.kind == y.kind && x.init_scale == y.init_scale && x.growth_factor == y.growth_factor &&
         x.backoff_factor == y.backoff_factor && x.growth_interval == y.growth_interval &&
         x.hysteresis == y.hysteresis && x.min_scale == y.min_scale &&
         x.max_scale == y.max_scale && a.scale == b.scale &&
         a.growth_tracker == b.growth_tracker && a.hysteresis_tracker == b.hysteresis_tracker;
}

namespace {

class ScalerBase : public LossScaler {
 public:
  explicit ScalerBase(const ScalerConfig& c) {
    state_.config = c;
    state_.scale = c.init_scale;
    state_.hysteresis_tracker = c.hysteresis;
  }
  float scale() const override { return state_.scale; }
  ScalerState state() const override { return state_; }
  void restore(const ScalerState& s) override {
    AMPSCOPE_CHECK(s.config.kind == kind(), "scaler state of kind ",
                   scaler_kind_name(s.config.kind), " restored into a ", scaler_kind_name(kind()),
                   " scaler");
    state_ = s;
  }

 protected:
  // scale * factor formed in FP64 and stored in FP32, as the reference kernels do.
  static float times(float scale, double factor) {
    return static_cast<float>(static_cast<double>(scale) * factor);
  }
  ScalerState state_;
};

class StaticScaler final : public ScalerBase {
 public:
  using ScalerBase::ScalerBase;
  ScalerKind kind() const override { return ScalerKind::kStatic; }
  void update(bool) override {}
};

class DynamicScaler final : public ScalerBase {
 public:
  using ScalerBase::ScalerBase;
  ScalerKind kind() const override { return ScalerKind::kDynamic; }
  void update(bool found_inf) override {
    auto& s = state_;
    if (found_inf) {
      // PyTorch has no floor; min_scale (default 0) adds one only when asked for.
      s.scale = std::max(times(s.scale, s.config.backoff_factor), s.config.min_scale);
      s.growth_tracker = 0;
      return;
    }
    const std::int64_t successful = s.growth_tracker + 1;
    if (successful == s.config.growth_interval) {
      const float grown = times(s.scale, s.config.growth_factor);
      if (std::isfinite(grown) && grown <= s.config.max_scale) s.scale = grown;
      s.growth_tracker = 0;
    } else {
      s.growth_tracker = successful;
    }
  }
};

class HysteresisScaler final : public ScalerBase {
 public:
  using ScalerBase::ScalerBase;
  ScalerKind kind() const override { return ScalerKind::kHysteresis; }
  void update(bool found_inf) override {
    auto& s = state_;
    if (found_inf) {
      s.growth_tracker = 0;
      s.hysteresis_tracker -= 1;
      if (s.hysteresis_tracker <= 0) {
        s.scale = std::max(times(s.scale, s.config.backoff_factor), s.config.min_scale);
      }
      return;
    }
    s.growth_tracker += 1;
    if (s.growth_tracker == s.config.growth_interval) {
      s.growth_tracker = 0;
      s.hysteresis_tracker = s.config.hysteresis;
      const float grown = times(s.scale, s.config.growth_factor);
      s.scale = std::isfinite(grown) ? std::min(grown, s.config.max_scale) : s.config.max_scale;
    }
  }
};

}  // namespace

std::unique_ptr<LossScaler> make_loss_scaler(const ScalerConfig& config) {
  const std::string err = validate(config);
  AMPSCOPE_CHECK(err.empty(), "invalid scaler config: ", err);
  switch (config.kind) {
    case ScalerKind::kStatic:
      return std::make_unique<StaticScaler>(config);
    case ScalerKind::kDynamic:
      return std::make_unique<DynamicScaler>(config);
    case ScalerKind::kHysteresis:
      return std::make_unique<HysteresisScaler>(config);
  }
  AMPSCOPE_CHECK(false, "unknown scaler kind");
  return nullptr;
}

ScalerHandle::ScalerHandle(const ScalerConfig& config) : scaler_(make_loss_scaler(config)) {}

ScalerState ScalerHandle::state() const {
  std::lock_guard lock(mu_);
  return scaler_->state();
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
  if (std::string err = check_update(scaler_->state(), update); !err.empty()) return err;
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
  const ScalerState current = scaler_->state();
  if (std::string err = check_update(current, update); !err.empty()) return err;
  const ScalerState next = merged(current, update);
  if (next.config.kind != current.config.kind) {
    auto fresh = make_loss_scaler(next.config);
    fresh->restore(next);
    scaler_ = std::move(fresh);
  } else {
    scaler_->restore(next);
  }
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
  return scaler_->scale();
}

float ScalerHandle::scale() const {
  std::lock_guard lock(mu_);
  return scaler_->scale();
}

float ScalerHandle::end_step(bool found_inf) {
  std::lock_guard lock(mu_);
  scaler_->update(found_inf);
  next_step_ += 1;
  return scaler_->scale();
}

float ScalerHandle::end_step(float scale, int hysteresis_tracker, std::int64_t growth_tracker) {
  std::lock_guard lock(mu_);
  ScalerState s = scaler_->state();
  s.scale = scale;
  s.hysteresis_tracker = hysteresis_tracker;
  s.growth_tracker = growth_tracker;
  scaler_->restore(s);
  next_step_ += 1;
  return scaler_->scale();
}

void ScalerHandle::restore(const ScalerState& state, std::int64_t next_step) {
  std::lock_guard lock(mu_);
  auto fresh = make_loss_scaler(state.config);
  fresh->restore(state);
  scaler_ = std::move(fresh);
  pending_.clear();
  next_step_ = next_step;
}

}  // namespace ampscope::trainer
