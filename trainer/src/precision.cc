#include "ampscope/trainer/precision.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "ampscope/check.h"

namespace ampscope::trainer {

namespace {
constexpr PrecisionMode kModes[] = {PrecisionMode::kFP32,       PrecisionMode::kFP16,
                                    PrecisionMode::kAmpFP16,    PrecisionMode::kAmpBF16,
                                    PrecisionMode::kFP8Delayed, PrecisionMode::kFP8Current,
                                    PrecisionMode::kMXFP8,      PrecisionMode::kNVFP4};
}  // namespace

std::string_view precision_name(PrecisionMode mode) {
  switch (mode) {
    case PrecisionMode::kFP32:
      return "fp32";
    case PrecisionMode::kFP16:
      return "fp16";
    case PrecisionMode::kAmpFP16:
      return "amp-fp16";
    case PrecisionMode::kAmpBF16:
      return "amp-bf16";
    case PrecisionMode::kFP8Delayed:
      return "fp8-delayed";
    case PrecisionMode::kFP8Current:
      return "fp8-current";
    case PrecisionMode::kMXFP8:
      return "mxfp8";
    case PrecisionMode::kNVFP4:
      return "nvfp4";
  }
  return "unknown";
}

std::optional<PrecisionMode> parse_precision(std::string_view name) {
  for (auto m : kModes) {
    if (name == precision_name(m)) return m;
  }
  return std::nullopt;
}

std::vector<std::string> precision_names() {
  std::vector<std::string> out;
  for (auto m : kModes) out.emplace_back(precision_name(m));
  return out;
}

PrecisionPolicy PrecisionPolicy::for_mode(PrecisionMode mode) {
  PrecisionPolicy p;
  switch (mode) {
    case PrecisionMode::kFP32:
      break;
    case PrecisionMode::kFP16:
      p.param = p.compute = p.residual = p.fp32_ops = Format::kFP16;
      break;
    case PrecisionMode::kAmpFP16:
      p.master_weights = true;
      p.compute = Format::kFP16;
      break;
    case PrecisionMode::kAmpBF16:
      p.master_weights = true;
      p.compute = Format::kBF16;
      break;
    case PrecisionMode::kFP8Delayed:
    case PrecisionMode::kFP8Current:
    case PrecisionMode::kMXFP8:
    case PrecisionMode::kNVFP4:
      p.master_weights = true;
      p.compute = Format::kBF16;
      p.scaled_gemms = true;
      break;
  }
  return p;
}

std::string_view operand_name(GemmOperand operand) {
  switch (operand) {
    case GemmOperand::kInput:
      return "input";
    case GemmOperand::kWeight:
      return "weight";
    case GemmOperand::kOutputGrad:
      return "output_grad";
  }
  return "unknown";
}

std::string_view gemm_use_name(GemmUse use) {
  switch (use) {
    case GemmUse::kForward:
      return "forward";
    case GemmUse::kDgrad:
      return "dgrad";
    case GemmUse::kWgrad:
      return "wgrad";
  }
  return "unknown";
}

int gemm_block_length(PrecisionMode mode) {
  if (mode == PrecisionMode::kMXFP8) return 32;
  if (mode == PrecisionMode::kNVFP4) return 16;
  return 0;
}

std::optional<Recipe> gemm_recipe(PrecisionMode mode, GemmOperand operand, GemmUse use,
                                  int margin) {
  if (!PrecisionPolicy::for_mode(mode).scaled_gemms) return std::nullopt;
  const bool reads = use == GemmUse::kForward
                         ? operand != GemmOperand::kOutputGrad
                         : (use == GemmUse::kDgrad ? operand != GemmOperand::kInput
                                                   : operand != GemmOperand::kWeight);
  if (!reads) return std::nullopt;
  Recipe r;
  switch (mode) {
    case PrecisionMode::kFP8Delayed:
    case PrecisionMode::kFP8Current:
      r.scaling = mode == PrecisionMode::kFP8Delayed ? Scaling::kDelayed : Scaling::kCurrent;
      r.element = operand == GemmOperand::kOutputGrad ? Format::kE5M2 : Format::kE4M3;
      if (mode == PrecisionMode::kFP8Current) r.margin = margin;
      return r;
    case PrecisionMode::kMXFP8:
      r.scaling = Scaling::kMX;
      r.element = Format::kE4M3;
      break;
    case PrecisionMode::kNVFP4:
      r.scaling = Scaling::kNVFP4;
      r.element = Format::kE2M1;
      break;
    default:
      return std::nullopt;
  }
  // Blocks along the reduction axis: the last axis of X and W in forward and of dY in dgrad
  // (1 x k), the first axis of W in dgrad and of dY and X in wgrad (k x 1).
  const bool along_rows =
      use == GemmUse::kForward || (use == GemmUse::kDgrad && operand == GemmOperand::kOutputGrad);
  const int k = gemm_block_length(mode);
  r.block_rows = along_rows ? 1 : k;
  r.block_cols = along_rows ? k : 1;
  return r;
}

// ---- DelayedScaling --------------------------------------------------------------------------

namespace {
Format delayed_element(GemmOperand operand) {
  return operand == GemmOperand::kOutputGrad ? Format::kE5M2 : Format::kE4M3;
}
}  // namespace

DelayedScaling::DelayedScaling(const std::vector<std::string>& layers,
                               const DelayedSettings& settings) {
  for (const auto& layer : layers) {
    for (auto op : {GemmOperand::kInput, GemmOperand::kWeight, GemmOperand::kOutputGrad}) {
      inputs_.push_back({layer + "." + std::string(operand_name(op)), layer, op});
      histories_.emplace_back(delayed_element(op), settings.history_length, settings.margin);
      settings_.push_back(settings);
    }
  }
  step_amax_.assign(inputs_.size(), -std::numeric_limits<double>::infinity());
}

int DelayedScaling::index(std::string_view layer, GemmOperand operand) const {
  for (std::size_t i = 0; i < inputs_.size(); ++i) {
    if (inputs_[i].layer == layer && inputs_[i].operand == operand) return static_cast<int>(i);
  }
  return -1;
}

void DelayedScaling::apply(std::size_t i, const DelayedSettings& s) {
  AmaxHistory& h = histories_[i];
  if (settings_[i].history_length != s.history_length) h.set_length(s.history_length);
  if (settings_[i].margin != s.margin) h.set_margin(s.margin);
  settings_[i] = s;
}

void DelayedScaling::record(std::size_t i, double amax) {
  step_amax_[i] = std::max(step_amax_[i], amax);
}

void DelayedScaling::end_step(std::span<const double> amaxes) {
  AMPSCOPE_CHECK(amaxes.size() == histories_.size(), "end_step: ", amaxes.size(), " amaxes for ",
                 histories_.size(), " inputs");
  for (std::size_t i = 0; i < histories_.size(); ++i) {
    if (std::isfinite(amaxes[i])) histories_[i].push(static_cast<float>(amaxes[i]));
  }
  std::fill(step_amax_.begin(), step_amax_.end(), -std::numeric_limits<double>::infinity());
}

void DelayedScaling::restore(std::size_t i, const DelayedSettings& s,
                             std::span<const float> history, float scale) {
  AMPSCOPE_CHECK(s.history_length >= 1 && history.size() <= std::size_t(s.history_length),
                 inputs_[i].name, ": ", history.size(), " amaxes for a history of ",
                 s.history_length);
  AmaxHistory h(delayed_element(inputs_[i].operand), s.history_length, s.margin);
  h.restore(history, scale);
  histories_[i] = std::move(h);
  settings_[i] = s;
}

// ---- GemmPrecisionSet ------------------------------------------------------------------------

GemmPrecisionSet::GemmPrecisionSet(std::vector<std::string> valid_layers)
    : valid_(std::move(valid_layers)) {}

std::string GemmPrecisionSet::check(std::string_view layer, std::int64_t from_step) const {
  if (from_step < 0) return "gemm precision: from_step must be >= 0";
  if (layer != "*" && !valid_.empty() &&
      std::find(valid_.begin(), valid_.end(), layer) == valid_.end()) {
    return "gemm precision: unknown layer '" + std::string(layer) + "'";
  }
  return {};
}

std::string GemmPrecisionSet::add_bf16(std::string_view layer, std::int64_t from_step) {
  if (std::string e = check(layer, from_step); !e.empty()) return e;
  std::lock_guard lock(mu_);
  bf16_from_[std::string(layer)] = from_step;
  return {};
}

bool GemmPrecisionSet::remove_bf16(std::string_view layer) {
  std::lock_guard lock(mu_);
  return bf16_from_.erase(std::string(layer)) > 0;
}

bool GemmPrecisionSet::bf16(std::string_view layer, std::int64_t step) const {
  std::lock_guard lock(mu_);
  if (auto it = bf16_from_.find("*"); it != bf16_from_.end() && step >= it->second) return true;
  auto it = bf16_from_.find(std::string(layer));
  return it != bf16_from_.end() && step >= it->second;
}

std::vector<std::string> GemmPrecisionSet::bf16_layers(std::int64_t step) const {
  std::vector<std::string> out;
  {
    std::lock_guard lock(mu_);
    for (const auto& [name, from] : bf16_from_) {
      if (step >= from) out.push_back(name);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::pair<std::string, std::int64_t>> GemmPrecisionSet::bf16_entries() const {
  std::lock_guard lock(mu_);
  std::vector<std::pair<std::string, std::int64_t>> out(bf16_from_.begin(), bf16_from_.end());
  std::sort(out.begin(), out.end());
  return out;
}

std::string GemmPrecisionSet::set_delayed(std::string_view layer, const DelayedSettings& s,
                                          std::int64_t from_step) {
  if (std::string e = check(layer, from_step); !e.empty()) return e;
  if (s.history_length < 1) {
    return "gemm precision: history_length must be >= 1, got " + std::to_string(s.history_length);
  }
  if (s.margin < 0 || s.margin > 64) {
    return "gemm precision: margin must be in [0, 64], got " + std::to_string(s.margin);
  }
  std::lock_guard lock(mu_);
  delayed_[std::string(layer)] = {s, from_step};
  return {};
}

bool GemmPrecisionSet::remove_delayed(std::string_view layer) {
  std::lock_guard lock(mu_);
  return delayed_.erase(std::string(layer)) > 0;
}

std::optional<DelayedSettings> GemmPrecisionSet::delayed(std::string_view layer,
                                                         std::int64_t step) const {
  std::lock_guard lock(mu_);
  if (auto it = delayed_.find(std::string(layer));
      it != delayed_.end() && step >= it->second.second) {
    return it->second.first;
  }
  if (auto it = delayed_.find("*"); it != delayed_.end() && step >= it->second.second) {
    return it->second.first;
  }
  return std::nullopt;
}

std::vector<GemmPrecisionSet::DelayedEntry> GemmPrecisionSet::delayed_entries() const {
  std::vector<DelayedEntry> out;
  {
    std::lock_guard lock(mu_);
    for (const auto& [name, e] : delayed_) out.push_back({name, e.first, e.second});
  }
  std::sort(out.begin(), out.end(),
            [](const DelayedEntry& a, const DelayedEntry& b) { return a.layer < b.layer; });
  return out;
}

void GemmPrecisionSet::clear() {
  std::lock_guard lock(mu_);
  bf16_from_.clear();
  delayed_.clear();
}

}  // namespace ampscope::trainer
