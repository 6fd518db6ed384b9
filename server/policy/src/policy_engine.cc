// The policy engine: reports in, decisions out. Reading order: observe() -> record() (what the
// report says about the scale, per step, in the unscaled domain) -> evaluate() (window ceiling,
// margin, bounds, hysteresis) -> update_fp32_set() -> make_decision().
//
// Why the headroom mode beats a probing scaler: GradScaler learns its ceiling by overflowing
// (one skipped step per probe, every growth_interval, plus the ramp down from its initial
// scale). The binade histograms already say where the ceiling is, so the engine sets the scale
// just below it (margin m), raises it as gradients shrink without waiting for a probe, and
// turns the local scaler's probing off. The local backoff stays as the safety net, and a step
// that overflows anyway is evidence the engine acts on at once.
#include "ampscope/policy/policy_engine.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <sstream>

#include "numerics.h"

namespace ampscope::policy {

using detail::pow2;
using detail::scale_text;

namespace {

constexpr std::uint8_t kOverflowed = 1;
constexpr std::uint8_t kRangeMisfit = 2;
constexpr double kLog2Eps = 1e-9;

std::string binade(int e) { return "2^" + std::to_string(e); }

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string r;
  for (const auto& p : parts) {
    if (!r.empty()) r += sep;
    r += p;
  }
  return r;
}

BinadeHistogram single_bin(int exponent) { return BinadeHistogram{exponent, {1}}; }

int ceiling_for_top(int unscaled_top, Format format) {
  return *overflow_free_scale_log2(single_bin(unscaled_top), format);
}

std::string describe(const TensorInput& t) {
  std::string s = t.name;
  s += " (";
  s += role_name(t.role);
  s += ", ";
  s += format_name(t.format());
  s += ")";
  return s;
}

// What one tensor the loss scale multiplies says about the scale.
struct ScaleFinding {
  enum class Overflow { kNone, kScale, kOutlier };
  std::optional<int> finite_ceiling;  // log2 of the largest scale its finite values allow
  std::optional<int> ceiling;         // the same with the overflow's evidence
  std::optional<int> reaction;        // after an overflow: estimated ceiling for the drop
  Overflow overflow = Overflow::kNone;
  bool blind = false;  // kScale with no finite value left to show how far the values went
  std::string what;
};

// Binades above the format's top that the values of a tensor reach when `overflowed` of its
// `numel` values overflowed there. The tail is taken as exponential in magnitude (Laplace):
// P(|x| > t) = exp(-t / b), so the threshold sits at b ln(numel / overflowed) and the largest
// of numel values near b ln(numel); the top is their ratio above the threshold. A Gaussian's
// tail falls faster, so for ordinary gradients this errs high by about a binade (a safe,
// slightly low scale that the next clean histograms raise again) and heavier tails are still
// covered. One overflowed value: 1 binade up; a quarter of 1,200: 3; all of them: `most`.
int tail_binades(std::uint64_t overflowed, std::uint64_t numel, int most) {
  if (overflowed >= numel || numel < 2) return most;
  const double n = static_cast<double>(numel);
  const double ratio = std::log(n) / std::log(n / static_cast<double>(overflowed));
  const double up = 1.0 + std::floor(std::log2(std::max(ratio, 1.0)));
  return static_cast<int>(std::min(up, static_cast<double>(most)));
}

// The finite values bound the ceiling from above through their top binade. Non-finite values
// are the tricky part: they are not in the histogram, so after an overflow the histogram hides
// how far the values went. Three cases:
//  - the finite top reaches within one binade of the format's top: the tail ran into the
//    threshold; the scale caused it. Evidence: some value reached 2^max_exponent / scale, so
//    the ceiling is at most log2(scale) - 1. For the immediate reaction the top is estimated as
//    the higher of the tail extrapolated from the share of values that overflowed
//    (tail_binades) and the tensor's last clean top in the window plus one binade (gradients
//    move little from step to step); at most blind_drop binades above the format's top.
//  - the finite values stop two or more binades below the format's top: the non-finite values
//    did not come from the tail (an injected or propagated Inf/NaN); no scale avoids them, so
//    they say nothing about the scale (the FP32 fallback still counts them).
//  - nothing finite and some Inf: all of it overflowed; the estimate rests on the clean top, or
//    is blind_drop binades up without one.
// The comparison with the format's top happens at `cast_scale`, the step's loss scale: that is
// where the gradient was held in the format, also for a copy measured after unscaling.
ScaleFinding analyse_scaled(const TensorInput& t, double cast_scale, int blind_drop,
                            std::optional<int> clean_top) {
  ScaleFinding r;
  const Format fmt = t.format();
  const int top_of_format = format_info(fmt).max_exponent;
  const int shift = scale_exponent(t.scale);
  const int cast_shift = scale_exponent(cast_scale);
  const bool has_histogram = t.histogram && !t.histogram->empty();
  std::optional<int> top;  // measured (scaled) domain
  if (has_histogram) top = t.histogram->max_exponent();
  if (t.max_abs && *t.max_abs > 0.0) top = std::max(top.value_or(INT_MIN), floor_log2(*t.max_abs));
  r.what = describe(t);
  if (top) {
    r.finite_ceiling = ceiling_for_top(*top - shift, fmt);
    r.ceiling = r.finite_ceiling;
    r.what += " top binade " + binade(*top - shift) + " unscaled";
  }
  const std::uint64_t nonfinite = t.nonfinite();
  if (nonfinite == 0) {
    // Values finite as stored but counted as overflowing the target: the histogram is complete,
    // its ceiling is exact and already below the scale in use.
    if (t.overflow.value_or(0) > 0) {
      r.overflow = ScaleFinding::Overflow::kScale;
      r.reaction = r.ceiling;
    }
    return r;
  }
  const std::uint64_t infs = t.pos_inf + t.neg_inf;
  const bool outlier = top ? *top - shift + cast_shift <= top_of_format - 2 : infs == 0;
  if (outlier) {
    r.overflow = ScaleFinding::Overflow::kOutlier;
    r.what += ", " + std::to_string(nonfinite) + " non-finite far above its finite values";
    return r;
  }
  r.overflow = ScaleFinding::Overflow::kScale;
  r.blind = !top;
  const int evidence_top = top_of_format - cast_shift;  // an overflowed value reached this binade
  const int evidence = ceiling_for_top(evidence_top, fmt);
  r.ceiling = std::min(r.ceiling.value_or(evidence), evidence);
  // With no clean report of the tensor in the window (a run that started far too high) the
  // tail's shape is all there is: one binade more, so that the drop does not take a second
  // skipped step to finish.
  const int tail = tail_binades(nonfinite, t.numel, blind_drop) + (clean_top ? 0 : 1);
  int estimated_top = evidence_top + std::min(tail, blind_drop);
  std::string basis = std::to_string(nonfinite) + " of " + std::to_string(t.numel) +
                      " overflowed, exponential tail" + (clean_top ? "" : " plus one binade");
  if (clean_top) {
    const int from_clean = std::clamp(*clean_top + 1, evidence_top + 1, evidence_top + blind_drop);
    // Nothing finite: the clean top is the better guess; otherwise the higher is the safer.
    if (!has_histogram || from_clean > estimated_top) {
      estimated_top = from_clean;
      basis = "last clean top " + binade(*clean_top) + " plus one binade";
    }
  }
  r.reaction = ceiling_for_top(estimated_top, fmt);
  r.what += ", non-finite at scale " + scale_text(cast_scale) + ", top estimated at " +
            binade(estimated_top) + " unscaled (" + basis + ")";
  return r;
}

// The non-finite values of a step may not come from the loss scale at all:
//  - the step's first offender is a forward tensor (an activation, the loss, a weight): the
//    forward pass overflowed, and the backward pass spread its Inf/NaN;
//  - a tensor whose every value is non-finite (a norm's gradient, a reduction over all tokens)
//    hides where its values went; when no tensor of the step has finite values up at the
//    format's top but some tensor holds Inf/NaN far above its finite values, the step's
//    non-finite values come from that outlier (an injected or propagated Inf).
// Either way the overflowed tensors are no evidence about the scale: their finite values still
// bound the ceiling, their non-finite ones do not. Without this, every injected spike would
// pull the ceiling blind_drop binades down.
void discount_propagated(std::vector<ScaleFinding>& findings, bool forward_fault) {
  bool outlier = forward_fault, seen_at_top = false;
  for (const ScaleFinding& f : findings) {
    outlier = outlier || f.overflow == ScaleFinding::Overflow::kOutlier;
    seen_at_top = seen_at_top || (f.overflow == ScaleFinding::Overflow::kScale && !f.blind);
  }
  if (!outlier || (seen_at_top && !forward_fault)) return;
  for (ScaleFinding& f : findings) {
    if (f.overflow != ScaleFinding::Overflow::kScale) continue;
    f.overflow = ScaleFinding::Overflow::kOutlier;
    f.ceiling = f.finite_ceiling;
    f.reaction.reset();
    f.what += forward_fault ? ": non-finite values propagated from the forward pass"
                            : ": every value non-finite, propagated from an outlier";
  }
}

std::string settings_text(const ScalerSettings& s) {
  std::vector<std::string> parts;
  if (s.loss_scale) parts.push_back("loss_scale " + scale_text(*s.loss_scale));
  if (s.growth_interval) parts.push_back("growth_interval " + std::to_string(*s.growth_interval));
  if (s.growth_factor) parts.push_back("growth_factor " + scale_text(*s.growth_factor));
  if (s.backoff_factor) parts.push_back("backoff_factor " + scale_text(*s.backoff_factor));
  if (s.hysteresis) parts.push_back("hysteresis " + std::to_string(*s.hysteresis));
  if (s.min_scale) parts.push_back("min_scale " + scale_text(*s.min_scale));
  if (s.max_scale) parts.push_back("max_scale " + scale_text(*s.max_scale));
  return join(parts, ", ");
}

void merge_settings(ScalerSettings& into, const ScalerSettings& from) {
  if (from.loss_scale) into.loss_scale = from.loss_scale;
  if (from.growth_interval) into.growth_interval = from.growth_interval;
  if (from.growth_factor) into.growth_factor = from.growth_factor;
  if (from.backoff_factor) into.backoff_factor = from.backoff_factor;
  if (from.hysteresis) into.hysteresis = from.hysteresis;
  if (from.min_scale) into.min_scale = from.min_scale;
  if (from.max_scale) into.max_scale = from.max_scale;
}

void apply_to(ScalerConfig& c, const ScalerSettings& s) {
  if (s.loss_scale) c.scale = *s.loss_scale;
  if (s.growth_interval) c.growth_interval = *s.growth_interval;
  if (s.growth_factor) c.growth_factor = *s.growth_factor;
  if (s.backoff_factor) c.backoff_factor = *s.backoff_factor;
  if (s.hysteresis) c.hysteresis = *s.hysteresis;
  if (s.min_scale) c.min_scale = *s.min_scale;
  if (s.max_scale) c.max_scale = *s.max_scale;
}

[[noreturn]] void bad_input(const std::string& message) { throw PolicyError(message); }

bool finite_positive(double v) { return std::isfinite(v) && v > 0.0; }

}  // namespace

// ---------------------------------------------------------------------------------------------

PolicyEngine::PolicyEngine(std::string run_id, EngineConfig config, ScalerConfig run_scaler)
    : run_id_(std::move(run_id)), config_(std::move(config)), run_scaler_(run_scaler) {
  if (run_id_.empty()) throw PolicyError("run_id must not be empty");
  if (std::string err = validate(config_); !err.empty()) throw PolicyError(err);
  if (std::string err = validate(run_scaler_); !err.empty()) throw PolicyError(err);
}

void PolicyEngine::set_run_scaler(const ScalerConfig& run_scaler) {
  if (std::string err = validate(run_scaler); !err.empty()) throw PolicyError(err);
  run_scaler_ = run_scaler;
}

std::vector<PolicyDecision> PolicyEngine::observe(const StepInput& input) {
  check_input(input);  // everything below works on a valid report and does not throw
  check_quantizers(input);
  const bool in_window = record(input);
  record_tracks(input);
  record_gemms(input);

  ScalerSettings scaler;
  std::vector<std::string> why;
  switch (config_.mode) {
    case PolicyMode::kObserve:
      if (in_window) evaluate(input, nullptr, nullptr);
      return {};
    case PolicyMode::kStaticParams:
      if (!static_pushed_) {
        scaler = config_.static_params;
        why.push_back("static-params: push the configured scaler (" + settings_text(scaler) +
                      ") on the first report (step " + std::to_string(input.step) + ")");
        static_pushed_ = true;
      }
      break;
    case PolicyMode::kHeadroom:
      if (in_window) evaluate(input, &scaler, &why);
      break;
  }
  const bool fp32_changed = config_.fp32_fallback.enabled && update_fp32_set(&why);
  PolicyDecision recipe;  // amax_history_length and amax_margin only
  bool gemms_changed = false;
  if (config_.gemm_precision.enabled) {
    gemms_changed = update_bf16_set(&why);
    gemms_changed = update_delayed(&recipe, &why) || gemms_changed;
  }
  if (scaler.empty() && !fp32_changed && !gemms_changed) return {};
  return {make_decision(scaler, recipe, join(why, "; "))};
}

void PolicyEngine::check_input(const StepInput& in) const {
  auto field_error = [](const std::string& field, const std::string& what, double got) {
    std::ostringstream os;
    os.precision(17);
    os << field << " " << what << ", got " << got;
    bad_input(os.str());
  };
  if (in.run_id != run_id_) {
    bad_input("run_id '" + in.run_id + "' is not this engine's run '" + run_id_ + "'");
  }
  if (in.rank < 0) field_error("rank", "must be >= 0", in.rank);
  if (in.step < 0) field_error("step", "must be >= 0", static_cast<double>(in.step));
  if (!finite_positive(in.loss_scale))
    field_error("loss_scale", "must be finite and > 0", in.loss_scale);
  if (!finite_positive(in.scale_after)) {
    field_error("scale_after", "must be finite and > 0", in.scale_after);
  }
  for (std::size_t i = 0; i < in.tensors.size(); ++i) {
    const TensorInput& t = in.tensors[i];
    const std::string p = "tensors[" + std::to_string(i) + "].";
    if (t.name.empty()) bad_input(p + "name must not be empty");
    if (static_cast<int>(t.role) > static_cast<int>(TensorRole::kLoss)) {
      field_error(p + "role", "is not a role", static_cast<int>(t.role));
    }
    if (static_cast<int>(t.storage) >= kNumFormats) {
      field_error(p + "storage", "is not a format", static_cast<int>(t.storage));
    }
    if (t.target && static_cast<int>(*t.target) >= kNumFormats) {
      field_error(p + "target", "is not a format", static_cast<int>(*t.target));
    }
    if (!finite_positive(t.scale)) field_error(p + "scale", "must be finite and > 0", t.scale);
    if (t.max_abs && !(std::isfinite(*t.max_abs) && *t.max_abs >= 0.0)) {
      field_error(p + "max_abs", "must be finite and >= 0", *t.max_abs);
    }
    const long double nonfinite = static_cast<long double>(t.nan) + t.pos_inf + t.neg_inf;
    if (nonfinite > t.numel) {
      field_error(p + "nan + pos_inf + neg_inf", "must be <= numel " + std::to_string(t.numel),
                  static_cast<double>(nonfinite));
    }
    if (t.overflow && *t.overflow > t.numel) {
      field_error(p + "overflow", "must be <= numel " + std::to_string(t.numel),
                  static_cast<double>(*t.overflow));
    }
    if (t.underflow && *t.underflow > t.numel) {
      field_error(p + "underflow", "must be <= numel " + std::to_string(t.numel),
                  static_cast<double>(*t.underflow));
    }
    if (t.histogram && !t.histogram->empty()) {
      const BinadeHistogram& h = *t.histogram;
      if (h.min_exponent < kHistogramMinExponent || h.max_exponent() > kHistogramMaxExponent) {
        bad_input(p + "histogram covers binades [" + std::to_string(h.min_exponent) + ", " +
                  std::to_string(h.max_exponent()) + "], outside [" +
                  std::to_string(kHistogramMinExponent) + ", " +
                  std::to_string(kHistogramMaxExponent) + "]");
      }
      long double total = 0;
      for (std::uint64_t c : h.counts) total += c;
      if (total + nonfinite > t.numel) {
        field_error(p + "histogram",
                    "counts plus non-finite must be <= numel " + std::to_string(t.numel),
                    static_cast<double>(total + nonfinite));
      }
    }
  }
}

void PolicyEngine::check_quantizers(const StepInput& in) const {
  for (std::size_t i = 0; i < in.quantizers.size(); ++i) {
    const std::string& name = in.quantizers[i].name;
    const RecipeCounts& q = in.quantizers[i].counts;
    const std::string p = "quantizers[" + std::to_string(i) + "].";
    if (name.empty()) bad_input(p + "name must not be empty");
    if (static_cast<int>(q.recipe.element) >= kNumFormats ||
        format_info(q.recipe.element).total_bits > 8) {
      bad_input(p + "recipe element must be an FP8, FP6 or FP4 format");
    }
    const long double counted = static_cast<long double>(q.underflow) + q.saturated + q.overflow;
    if (counted > q.values) {
      bad_input(p + "underflow + saturated + overflow must be <= values " +
                std::to_string(q.values));
    }
    for (const double v : {q.amax, q.signal_sq, q.error_sq, q.tensor_scale}) {
      if (!(std::isfinite(v) && v >= 0.0)) {
        bad_input(p + "amax, signal_sq, error_sq and tensor_scale must be finite and >= 0");
      }
    }
    for (const float a : in.quantizers[i].amax_history) {
      if (!(std::isfinite(a) && a >= 0.0f)) bad_input(p + "amax_history must be finite, >= 0");
    }
    const std::optional<double>& cost = in.quantizers[i].loss_cost;
    if (cost && !std::isfinite(*cost)) bad_input(p + "loss_cost must be finite");
  }
}

bool PolicyEngine::record(const StepInput& in) {
  if (in.step > latest_step_) {
    latest_step_ = in.step;
    reported_scale_ = in.scale_after;
  } else if (in.step == latest_step_) {
    reported_scale_ = std::min(reported_scale_, in.scale_after);
  }
  const std::int64_t oldest = latest_step_ - config_.headroom.window_steps + 1;
  window_.erase(window_.begin(),
                std::find_if(window_.begin(), window_.end(),
                             [&](const StepSummary& s) { return s.step >= oldest; }));
  if (in.step < oldest) return false;

  auto it = std::lower_bound(window_.begin(), window_.end(), in.step,
                             [](const StepSummary& s, std::int64_t step) { return s.step < step; });
  if (it == window_.end() || it->step != in.step) {
    StepSummary fresh;
    fresh.step = in.step;
    it = window_.insert(it, fresh);
  }
  StepSummary& s = *it;
  s.found_inf = s.found_inf || in.found_inf;
  const std::string at = " at step " + std::to_string(in.step);
  bool saw_nonfinite = false;
  std::vector<ScaleFinding> findings;
  for (const TensorInput& t : in.tensors) {
    if (!is_loss_scaled(t.role)) continue;
    findings.push_back(analyse_scaled(t, in.loss_scale, config_.headroom.blind_drop_binades,
                                      clean_top(t.name)));
  }
  const bool forward_fault = in.first_offender && !is_loss_scaled(in.first_offender->role);
  discount_propagated(findings, forward_fault);
  remember_clean_tops(in);
  for (const ScaleFinding& f : findings) {
    if (f.ceiling && (!s.ceiling_log2 || *f.ceiling < *s.ceiling_log2)) {
      s.ceiling_log2 = f.ceiling;
      s.limiting = f.what + at;
    }
    if (f.overflow != ScaleFinding::Overflow::kNone) saw_nonfinite = true;
    if (f.reaction && (!s.reaction_log2 || *f.reaction < *s.reaction_log2)) {
      s.reaction_log2 = f.reaction;
      s.reaction_why = f.what + at;
    }
  }
  if (in.found_inf && !saw_nonfinite && !forward_fault) {
    // The step overflowed but no reported tensor shows where: the scale used is the evidence.
    const int evidence = scale_exponent(in.loss_scale) - 1;
    const std::string what =
        "found_inf with no reported tensor showing it, scale " + scale_text(in.loss_scale) + at;
    if (!s.ceiling_log2 || evidence < *s.ceiling_log2) {
      s.ceiling_log2 = evidence;
      s.limiting = what;
    }
    if (!s.reaction_log2 || evidence < *s.reaction_log2) {
      s.reaction_log2 = evidence;
      s.reaction_why = what;
    }
  }
  return true;
}

std::optional<int> PolicyEngine::clean_top(const std::string& name) const {
  auto it = std::lower_bound(clean_tops_.begin(), clean_tops_.end(), name,
                             [](const CleanTop& c, const std::string& n) { return c.name < n; });
  if (it == clean_tops_.end() || it->name != name) return std::nullopt;
  if (it->step <= latest_step_ - config_.headroom.window_steps) return std::nullopt;
  return it->top;
}

void PolicyEngine::remember_clean_tops(const StepInput& in) {
  for (const TensorInput& t : in.tensors) {
    if (!is_loss_scaled(t.role) || t.nonfinite() > 0 || t.overflow.value_or(0) > 0) continue;
    std::optional<int> top;
    if (t.histogram && !t.histogram->empty()) top = t.histogram->max_exponent();
    if (t.max_abs && *t.max_abs > 0.0) {
      top = std::max(top.value_or(INT_MIN), floor_log2(*t.max_abs));
    }
    if (!top) continue;
    const int unscaled = *top - scale_exponent(t.scale);
    auto it = std::lower_bound(clean_tops_.begin(), clean_tops_.end(), t.name,
                               [](const CleanTop& c, const std::string& n) { return c.name < n; });
    if (it == clean_tops_.end() || it->name != t.name) {
      clean_tops_.insert(it, CleanTop{t.name, in.step, unscaled});
    } else if (in.step > it->step) {
      *it = CleanTop{t.name, in.step, unscaled};
    } else if (in.step == it->step) {
      it->top = std::max(it->top, unscaled);  // another rank or phase of the same step
    }
  }
}

bool PolicyEngine::overflow_explained_by_scale(double tensor_scale) const {
  const bool engine_sets_scale =
      config_.mode == PolicyMode::kHeadroom ||
      (config_.mode == PolicyMode::kStaticParams && config_.static_params.loss_scale);
  if (!engine_sets_scale) return false;
  // A gradient that overflowed at a scale the engine did not choose (the local ramp, a probe,
  // the time before the first decision) says the scale was wrong, not the tensor's format.
  return !commanded_scale_ || tensor_scale > *commanded_scale_;
}

void PolicyEngine::record_tracks(const StepInput& in) {
  const Fp32FallbackParams& p = config_.fp32_fallback;
  if (!p.enabled) return;
  for (const TensorInput& t : in.tensors) {
    const Format fmt = t.format();
    if (fmt == Format::kFP32) continue;  // nothing to fall back to
    const FormatInfo& f = format_info(fmt);
    std::uint8_t flags = 0;
    // Non-finite values are the tensor's own only when it is the step's first offender (or
    // the step names none); after it they are its values, propagated.
    const bool own_nonfinite =
        t.nonfinite() > 0 && (!in.first_offender || in.first_offender->name == t.name);
    bool overflowed = own_nonfinite || t.overflow.value_or(0) > 0;
    if (overflowed && is_loss_scaled(t.role) && overflow_explained_by_scale(t.scale)) {
      overflowed = false;
    }
    if (overflowed) flags |= kOverflowed;
    int range = 0;
    if (t.histogram && !t.histogram->empty()) {
      range = trimmed_dynamic_range(*t.histogram, p.range_trim_fraction);
      if (range > f.max_exponent - f.min_subnormal_exponent) flags |= kRangeMisfit;
    }
    auto it =
        std::lower_bound(tracks_.begin(), tracks_.end(), t.name,
                         [](const TensorTrack& k, const std::string& n) { return k.name < n; });
    if (it == tracks_.end() || it->name != t.name) {
      TensorTrack fresh;
      fresh.name = t.name;
      it = tracks_.insert(it, std::move(fresh));
    }
    TensorTrack& k = *it;
    k.format = fmt;
    if (t.histogram && !t.histogram->empty()) k.range = range;
    k.reports.add(in.step, flags, p.window_reports);
  }
}

void PolicyEngine::StepFlags::add(std::int64_t step, std::uint8_t flag, int window) {
  auto pos = std::lower_bound(steps.begin(), steps.end(), step);
  const auto idx = static_cast<std::size_t>(pos - steps.begin());
  if (pos != steps.end() && *pos == step) {
    flags[idx] |= flag;  // another rank, phase or micro-step of the same step
    return;
  }
  if (static_cast<int>(steps.size()) >= window && idx == 0) return;  // too old
  steps.insert(pos, step);
  flags.insert(flags.begin() + static_cast<std::ptrdiff_t>(idx), flag);
  if (static_cast<int>(steps.size()) > window) {
    steps.erase(steps.begin());
    flags.erase(flags.begin());
  }
}

int PolicyEngine::StepFlags::count(std::uint8_t mask) const {
  return static_cast<int>(std::count_if(flags.begin(), flags.end(),
                                        [mask](std::uint8_t f) { return (f & mask) != 0; }));
}

std::optional<int> PolicyEngine::window_ceiling(std::string* limiting) const {
  std::optional<int> ceiling;
  for (const StepSummary& s : window_) {
    if (s.ceiling_log2 && (!ceiling || *s.ceiling_log2 < *ceiling)) {
      ceiling = s.ceiling_log2;
      *limiting = s.limiting;
    }
  }
  return ceiling;
}

double PolicyEngine::scale_in_use() const {
  // A decided scale is trusted until its effective step plus the grace period: before that the
  // reports still show the old scale. After it the reports are the truth (they include the
  // local scaler's backoffs, and a decision that never arrived is then decided again).
  // Within the grace period, a report from the effective step on whose scale is above the
  // decided one shows a lowering that did not arrive in time (the local scaler, whose probing
  // the engine stops, cannot have grown past it): decide again at once, not after the grace,
  // since every step at the old scale may overflow again.
  if (commanded_scale_ && latest_step_ < commanded_from_step_ + config_.apply_grace_steps) {
    const bool missed = latest_step_ >= commanded_from_step_ && reported_scale_ > *commanded_scale_;
    if (!missed) return *commanded_scale_;
  }
  return reported_scale_ > 0.0 ? reported_scale_ : run_scaler_.scale;
}

void PolicyEngine::evaluate(const StepInput& in, ScalerSettings* scaler,
                            std::vector<std::string>* why) {
  const HeadroomParams& h = config_.headroom;
  const bool urgent = in.found_inf && in.step > last_reacted_step_;
  const bool regular = in.step >= next_evaluation_step_;
  if (!urgent && !regular) return;
  if (urgent) last_reacted_step_ = in.step;
  if (regular) next_evaluation_step_ = in.step + h.update_every_steps;

  std::string limiting;
  const std::optional<int> ceiling = window_ceiling(&limiting);
  const double in_use = scale_in_use();
  evaluation_.step = latest_step_;
  evaluation_.ceiling_log2 = ceiling;
  evaluation_.scale_in_use = in_use;
  evaluation_.limiting_tensor = limiting;
  if (!ceiling) {
    evaluation_.target_log2.reset();
    return;
  }

  // Bounds: the engine's, inside the run's own [min_scale, max_scale] so that the local scaler
  // accepts the decision. When the two do not overlap the engine's win and are pushed too.
  int lo = floor_log2(h.min_scale), hi = floor_log2(h.max_scale);
  const int run_lo = run_scaler_.min_scale > 0.0 ? ceil_log2(run_scaler_.min_scale) : INT_MIN;
  const int run_hi = floor_log2(run_scaler_.max_scale);
  const bool push_bounds = std::max(lo, run_lo) > std::min(hi, run_hi);
  if (!push_bounds) {
    lo = std::max(lo, run_lo);
    hi = std::min(hi, run_hi);
  }
  int target = std::clamp(*ceiling - h.margin_binades, lo, hi);
  std::string basis = "window of steps " +
                      std::to_string(std::max<std::int64_t>(0, latest_step_ - h.window_steps + 1)) +
                      ".." + std::to_string(latest_step_) + " has ceiling " + binade(*ceiling) +
                      " (" + limiting + "), margin " + std::to_string(h.margin_binades) +
                      " binades, bounds [" + binade(lo) + ", " + binade(hi) + "]";
  // An overflow at a scale above a lowering already decided and not yet due is explained by the
  // old scale: its hard evidence is in the window, but a second estimate (from another step's
  // overflowed tensors, often small ones) would only compound the first one downwards.
  const bool superseded = commanded_scale_ && latest_step_ < commanded_from_step_ &&
                          in.loss_scale > *commanded_scale_;
  // An overflow that was not the scale's (an outlier, a forward-pass overflow): the local
  // scaler backed off anyway, as a safety net must; undo that at once instead of waiting
  // raise_after_evaluations evaluations at half the scale.
  bool restore = false;
  if (urgent && !superseded) {
    auto s = std::find_if(window_.begin(), window_.end(),
                          [&](const StepSummary& x) { return x.step == in.step; });
    restore = s != window_.end() && !s->reaction_log2 && in.scale_after < in.loss_scale &&
              is_power_of_two(in.loss_scale) && scale_exponent(in.loss_scale) <= target &&
              scale_exponent(in.loss_scale) >= lo;
    if (s != window_.end() && s->reaction_log2) {
      const int react = std::clamp(*s->reaction_log2 - h.margin_binades, lo, hi);
      if (react < target) {
        target = react;
        basis = "found_inf at step " + std::to_string(in.step) + ": " + s->reaction_why +
                ", estimated ceiling " + binade(*s->reaction_log2) + ", margin " +
                std::to_string(h.margin_binades) + " binades, bounds [" + binade(lo) + ", " +
                binade(hi) + "]";
      }
    }
  }
  evaluation_.target_log2 = target;

  if (scaler != nullptr) {
    const double log2_in_use = std::log2(in_use);
    if (restore) {
      scaler->loss_scale = in.loss_scale;
      const bool forward = in.first_offender && !is_loss_scaled(in.first_offender->role);
      const std::string cause =
          forward ? "its first offender " + in.first_offender->name + " (" +
                        std::string(role_name(in.first_offender->role)) +
                        ") is in the forward pass"
                  : "its non-finite values lie far above the finite ones (an outlier)";
      why->push_back("headroom: restore " + scale_text(in.scale_after) + " -> " +
                     scale_text(in.loss_scale) + ": the overflow at step " +
                     std::to_string(in.step) + " was not the scale's, " + cause +
                     "; the local backoff is undone; " + basis);
      consecutive_raises_ = 0;
      lowest_raise_target_.reset();
    } else if (log2_in_use - target > h.lower_tolerance_binades + kLog2Eps) {
      scaler->loss_scale = pow2(target);
      why->push_back("headroom: lower " + scale_text(in_use) + " -> " + binade(target) + ": " +
                     basis);
      consecutive_raises_ = 0;
      lowest_raise_target_.reset();
    } else if (regular && !urgent) {
      if (target >= log2_in_use + h.min_raise_binades - kLog2Eps) {
        ++consecutive_raises_;
        lowest_raise_target_ = std::min(lowest_raise_target_.value_or(target), target);
        if (consecutive_raises_ >= h.raise_after_evaluations) {
          scaler->loss_scale = pow2(*lowest_raise_target_);
          why->push_back("headroom: raise " + scale_text(in_use) + " -> " +
                         binade(*lowest_raise_target_) + " after " +
                         std::to_string(consecutive_raises_) +
                         " evaluations in a row allowed at least that; " + basis);
          consecutive_raises_ = 0;
          lowest_raise_target_.reset();
        }
      } else {
        consecutive_raises_ = 0;
        lowest_raise_target_.reset();
      }
    }
    if (h.local_growth_interval > 0 && run_scaler_.kind != ScalerKind::kStatic &&
        run_scaler_.growth_interval < h.local_growth_interval) {
      scaler->growth_interval = h.local_growth_interval;
      why->push_back("headroom: stop the local scaler's upward probing (growth_interval " +
                     std::to_string(run_scaler_.growth_interval) + " -> " +
                     std::to_string(h.local_growth_interval) +
                     "); its backoff stays as the safety net");
    }
    if (push_bounds && scaler->loss_scale) {
      scaler->min_scale = h.min_scale;
      scaler->max_scale = h.max_scale;
      why->push_back("headroom: the run's [min_scale, max_scale] [" +
                     scale_text(run_scaler_.min_scale) + ", " + scale_text(run_scaler_.max_scale) +
                     "] does not overlap the engine's; pushing the engine's bounds");
    }
  }
  evaluation_.consecutive_raises = consecutive_raises_;
}

bool PolicyEngine::update_fp32_set(std::vector<std::string>* why) {
  const Fp32FallbackParams& p = config_.fp32_fallback;
  if (static_cast<int>(fp32_set_.size()) >= p.max_tensors) return false;
  struct Candidate {
    const TensorTrack* track;
    int any, overflowed, misfit;
  };
  std::vector<Candidate> candidates;
  for (const TensorTrack& k : tracks_) {
    if (std::binary_search(fp32_set_.begin(), fp32_set_.end(), k.name)) continue;
    const Candidate c{&k, k.reports.count(kOverflowed | kRangeMisfit),
                      k.reports.count(kOverflowed), k.reports.count(kRangeMisfit)};
    if (c.any >= p.min_reports) candidates.push_back(c);
  }
  if (candidates.empty()) return false;
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    return a.any != b.any ? a.any > b.any : a.track->name < b.track->name;
  });
  const std::size_t room = static_cast<std::size_t>(p.max_tensors) - fp32_set_.size();
  if (candidates.size() > room) candidates.resize(room);
  for (const Candidate& c : candidates) {
    const TensorTrack& k = *c.track;
    const FormatInfo& f = format_info(k.format);
    const std::string of_last =
        " of its last " + std::to_string(k.reports.steps.size()) + " reported steps";
    std::vector<std::string> causes;
    if (c.overflowed > 0)
      causes.push_back("overflowed in " + std::to_string(c.overflowed) + of_last);
    if (c.misfit > 0) {
      std::ostringstream trim;
      trim << p.range_trim_fraction;
      causes.push_back("dynamic range did not fit in " + std::to_string(c.misfit) + of_last + " (" +
                       std::to_string(k.range) + " binades after trimming " + trim.str() +
                       " of the values at each end; " + f.name + " spans " +
                       std::to_string(f.max_exponent - f.min_subnormal_exponent) + ")");
    }
    why->push_back("fp32 fallback: " + k.name + " (" + f.name + ") " + join(causes, " and ") +
                   "; threshold " + std::to_string(p.min_reports) + " of " +
                   std::to_string(p.window_reports));
    fp32_set_.insert(std::lower_bound(fp32_set_.begin(), fp32_set_.end(), k.name), k.name);
  }
  return true;
}

PolicyDecision PolicyEngine::make_decision(const ScalerSettings& scaler,
                                           const PolicyDecision& recipe, std::string reason) {
  PolicyDecision d;
  d.policy_id = next_policy_id_++;
  d.effective_from_step = latest_step_ + config_.lead_steps;
  d.scaler = scaler;
  d.fp32_tensors = fp32_set_;
  d.bf16_gemms = bf16_set_;
  d.amax_history_length = recipe.amax_history_length;
  d.amax_margin = recipe.amax_margin;
  d.reason = std::move(reason);
  if (recipe.amax_history_length) amax_history_length_ = recipe.amax_history_length;
  if (recipe.amax_margin) amax_margin_ = recipe.amax_margin;
  if (recipe.amax_history_length || recipe.amax_margin) {
    delayed_from_step_ = d.effective_from_step;
  }
  for (GemmTrack& k : gemm_tracks_) {
    const bool in_bf16 = std::binary_search(bf16_set_.begin(), bf16_set_.end(), k.layer);
    if (in_bf16 && k.bf16_from_step < 0) k.bf16_from_step = d.effective_from_step;
    if (!in_bf16) k.bf16_from_step = -1;
  }
  if (scaler.loss_scale) {
    commanded_scale_ = scaler.loss_scale;
    commanded_from_step_ = d.effective_from_step;
    consecutive_raises_ = 0;
    lowest_raise_target_.reset();
  }
  apply_to(run_scaler_, scaler);
  merge_settings(cumulative_, scaler);
  last_decision_ = d;
  return d;
}

std::optional<PolicyDecision> PolicyEngine::current_policy() const {
  if (!last_decision_) return std::nullopt;
  PolicyDecision d = *last_decision_;
  d.scaler = cumulative_;
  d.fp32_tensors = fp32_set_;
  d.bf16_gemms = bf16_set_;
  d.amax_history_length = amax_history_length_;
  d.amax_margin = amax_margin_;
  d.effective_from_step = latest_step_ + config_.lead_steps;
  return d;
}

}  // namespace ampscope::policy
