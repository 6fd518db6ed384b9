// Names, parsing and validation of the engine's configuration and of a run's scaler.
#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <sstream>

#include "ampscope/policy/policy_engine.h"
#include "numerics.h"

namespace ampscope::policy {
namespace {

std::string lower(std::string_view s) {
  std::string r(s);
  std::transform(r.begin(), r.end(), r.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return r;
}

constexpr std::array<std::string_view, 3> kModeNames = {"observe", "static-params", "headroom"};

// Accumulates the first failure; later checks are skipped once one failed.
class Checker {
 public:
  template <typename T>
  Checker& range(const char* field, T value, T lo, T hi) {
    if (error_.empty() && !(value >= lo && value <= hi)) {
      std::ostringstream os;
      os << field << " must be in [" << lo << ", " << hi << "], got " << value;
      error_ = os.str();
    }
    return *this;
  }
  Checker& that(bool ok, const std::string& message) {
    if (error_.empty() && !ok) error_ = message;
    return *this;
  }
  std::string error() const { return error_; }

 private:
  std::string error_;
};

std::string num(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}

bool finite_positive(double v) { return std::isfinite(v) && v > 0.0; }

void check_settings(Checker& c, const ScalerSettings& s, const std::string& prefix) {
  if (s.loss_scale) {
    c.that(finite_positive(*s.loss_scale) && *s.loss_scale <= kFp32Max,
           prefix + "loss_scale must be finite, > 0 and <= FP32 max, got " + num(*s.loss_scale));
  }
  if (s.growth_interval) {
    c.that(*s.growth_interval >= 1,
           prefix + "growth_interval must be >= 1, got " + std::to_string(*s.growth_interval));
  }
  if (s.growth_factor) {
    c.that(std::isfinite(*s.growth_factor) && *s.growth_factor > 1.0,
           prefix + "growth_factor must be finite and > 1, got " + num(*s.growth_factor));
  }
  if (s.backoff_factor) {
    c.that(*s.backoff_factor > 0.0 && *s.backoff_factor < 1.0,
           prefix + "backoff_factor must be in (0, 1), got " + num(*s.backoff_factor));
  }
  if (s.hysteresis) {
    c.that(*s.hysteresis >= 1,
           prefix + "hysteresis must be >= 1, got " + std::to_string(*s.hysteresis));
  }
  if (s.min_scale) {
    c.that(std::isfinite(*s.min_scale) && *s.min_scale >= 0.0,
           prefix + "min_scale must be finite and >= 0, got " + num(*s.min_scale));
  }
  if (s.max_scale) {
    c.that(finite_positive(*s.max_scale) && *s.max_scale <= kFp32Max,
           prefix + "max_scale must be finite, > 0 and <= FP32 max, got " + num(*s.max_scale));
  }
  if (s.min_scale && s.max_scale) {
    c.that(*s.min_scale <= *s.max_scale,
           prefix + "min_scale " + num(*s.min_scale) + " is above max_scale " + num(*s.max_scale));
  }
  if (s.loss_scale && s.min_scale) {
    c.that(*s.loss_scale >= *s.min_scale, prefix + "loss_scale " + num(*s.loss_scale) +
                                              " is below min_scale " + num(*s.min_scale));
  }
  if (s.loss_scale && s.max_scale) {
    c.that(*s.loss_scale <= *s.max_scale, prefix + "loss_scale " + num(*s.loss_scale) +
                                              " is above max_scale " + num(*s.max_scale));
  }
}

void check_bound(Checker& c, const char* field, double v) {
  c.that(
      is_power_of_two(v) && floor_log2(v) >= -126 && floor_log2(v) <= 127,
      std::string(field) + " must be a power of two in [2^-126, 2^127], got " + num(v));
}

}  // namespace

std::string_view mode_name(PolicyMode mode) {
  const auto i = static_cast<std::size_t>(mode);
  return i < kModeNames.size() ? kModeNames[i] : "unknown";
}

std::optional<PolicyMode> parse_mode(std::string_view name) {
  std::string n = lower(name);
  std::replace(n.begin(), n.end(), '_', '-');
  for (std::size_t i = 0; i < kModeNames.size(); ++i) {
    if (n == kModeNames[i]) return static_cast<PolicyMode>(i);
  }
  return std::nullopt;
}

bool ScalerSettings::empty() const {
  return !loss_scale && !growth_interval && !growth_factor && !backoff_factor && !hysteresis &&
         !min_scale && !max_scale;
}

std::string validate(const EngineConfig& config) {
  Checker c;
  c.that(config.mode == PolicyMode::kObserve || config.mode == PolicyMode::kStaticParams ||
             config.mode == PolicyMode::kHeadroom,
         "mode must be observe, static-params or headroom, got " +
             std::to_string(static_cast<int>(config.mode)));
  c.range("lead_steps", config.lead_steps, 1, 1000000);
  c.range("apply_grace_steps", config.apply_grace_steps, 0, 1000000);

  check_settings(c, config.static_params, "static_params.");
  if (config.mode == PolicyMode::kStaticParams) {
    c.that(!config.static_params.empty(),
           "static_params must set at least one field in static-params mode");
  }

  const HeadroomParams& h = config.headroom;
  c.range("headroom.margin_binades", h.margin_binades, 0, 32);
  c.range("headroom.window_steps", h.window_steps, 1, 1000000);
  c.range("headroom.update_every_steps", h.update_every_steps, 1, 1000000);
  c.range("headroom.raise_after_evaluations", h.raise_after_evaluations, 1, 100000);
  c.range("headroom.min_raise_binades", h.min_raise_binades, 1, 64);
  c.range("headroom.lower_tolerance_binades", h.lower_tolerance_binades, 0, 64);
  check_bound(c, "headroom.min_scale", h.min_scale);
  check_bound(c, "headroom.max_scale", h.max_scale);
  c.that(!(h.min_scale > h.max_scale), "headroom.min_scale " + num(h.min_scale) +
                                           " is above headroom.max_scale " + num(h.max_scale));
  c.range<std::int64_t>("headroom.local_growth_interval", h.local_growth_interval, 0,
                        std::int64_t{1} << 62);
  c.range("headroom.blind_drop_binades", h.blind_drop_binades, 1, 64);

  const Fp32FallbackParams& f = config.fp32_fallback;
  c.range("fp32_fallback.window_reports", f.window_reports, 1, 64);
  c.range("fp32_fallback.min_reports", f.min_reports, 1, f.window_reports);
  c.that(
      f.range_trim_fraction >= 0.0 && f.range_trim_fraction < 0.25,
      "fp32_fallback.range_trim_fraction must be in [0, 0.25), got " + num(f.range_trim_fraction));
  c.range("fp32_fallback.max_tensors", f.max_tensors, 1, 4096);

  const GemmPrecisionParams& g = config.gemm_precision;
  c.range("gemm_precision.window_reports", g.window_reports, 1, 64);
  c.range("gemm_precision.min_reports", g.min_reports, 1, g.window_reports);
  c.that(g.max_underflow_share > 0.0 && g.max_underflow_share <= 1.0,
         "gemm_precision.max_underflow_share must be in (0, 1], got " +
             num(g.max_underflow_share));
  c.that(g.max_saturated_share > 0.0 && g.max_saturated_share <= 1.0,
         "gemm_precision.max_saturated_share must be in (0, 1], got " +
             num(g.max_saturated_share));
  c.range("gemm_precision.sqnr_margin_db", g.sqnr_margin_db, 0.0, 60.0);
  c.range("gemm_precision.max_bf16_share", g.max_bf16_share, 0.0, 1.0);
  c.range("gemm_precision.promote_reports", g.promote_reports, 1, 64);
  c.that(g.promote_factor > 0.0 && g.promote_factor <= 1.0,
         "gemm_precision.promote_factor must be in (0, 1], got " + num(g.promote_factor));
  c.range<std::int64_t>("gemm_precision.min_dwell_steps", g.min_dwell_steps, 0, 1000000);
  c.range("gemm_precision.spike_reports", g.spike_reports, 1, g.window_reports);
  c.that(g.min_loss_cost > 0.0 && g.min_loss_cost <= 1e6,
         "gemm_precision.min_loss_cost must be in (0, 1e6], got " + num(g.min_loss_cost));
  c.range("gemm_precision.loss_cost_reports", g.loss_cost_reports, 2, 1024);
  c.range("gemm_precision.loss_cost_z", g.loss_cost_z, 0.0, 10.0);
  c.range("gemm_precision.max_amax_margin", g.max_amax_margin, 0, 64);
  return c.error();
}

std::string validate(const ScalerConfig& s) {
  // Only the fields the run's kind uses are checked: a Hello that leaves the hysteresis of a
  // dynamic scaler (or the factors of a static one) at 0 describes a valid scaler.
  Checker c;
  c.that(s.kind == ScalerKind::kStatic || s.kind == ScalerKind::kDynamic ||
             s.kind == ScalerKind::kHysteresis,
         "scaler.kind must be static, dynamic or hysteresis");
  c.that(finite_positive(s.scale) && s.scale <= kFp32Max,
         "scaler.scale must be finite, > 0 and <= FP32 max, got " + num(s.scale));
  if (s.kind != ScalerKind::kStatic) {
    c.that(std::isfinite(s.growth_factor) && s.growth_factor > 1.0,
           "scaler.growth_factor must be finite and > 1, got " + num(s.growth_factor));
    c.that(s.backoff_factor > 0.0 && s.backoff_factor < 1.0,
           "scaler.backoff_factor must be in (0, 1), got " + num(s.backoff_factor));
    c.that(s.growth_interval >= 1,
           "scaler.growth_interval must be >= 1, got " + std::to_string(s.growth_interval));
  }
  if (s.kind == ScalerKind::kHysteresis) {
    c.that(s.hysteresis >= 1,
           "scaler.hysteresis must be >= 1, got " + std::to_string(s.hysteresis));
  }
  c.that(std::isfinite(s.min_scale) && s.min_scale >= 0.0,
         "scaler.min_scale must be finite and >= 0, got " + num(s.min_scale));
  c.that(finite_positive(s.max_scale) && s.max_scale <= kFp32Max,
         "scaler.max_scale must be finite, > 0 and <= FP32 max, got " + num(s.max_scale));
  c.that(s.min_scale <= s.max_scale,
         "scaler.min_scale " + num(s.min_scale) + " is above scaler.max_scale " + num(s.max_scale));
  return c.error();
}

}  // namespace ampscope::policy
