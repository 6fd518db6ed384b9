#include "ampscope/trainer/hooks.h"

#include <algorithm>

namespace ampscope::trainer {

Fp32OverrideSet::Fp32OverrideSet(std::vector<std::string> valid_layers)
    : valid_(std::move(valid_layers)) {}

std::string Fp32OverrideSet::add(std::string_view layer, std::int64_t from_step) {
  if (from_step < 0) return "fp32 override: from_step must be >= 0";
  if (layer != "*" && !valid_.empty() &&
      std::find(valid_.begin(), valid_.end(), layer) == valid_.end()) {
    return "fp32 override: unknown layer '" + std::string(layer) + "'";
  }
  std::lock_guard lock(mu_);
  from_step_[std::string(layer)] = from_step;
  return {};
}

bool Fp32OverrideSet::remove(std::string_view layer) {
  std::lock_guard lock(mu_);
  return from_step_.erase(std::string(layer)) > 0;
}

void Fp32OverrideSet::clear() {
  std::lock_guard lock(mu_);
  from_step_.clear();
}

bool Fp32OverrideSet::active(std::string_view layer, std::int64_t step) const {
  std::lock_guard lock(mu_);
  if (auto it = from_step_.find("*"); it != from_step_.end() && step >= it->second) return true;
  auto it = from_step_.find(std::string(layer));
  return it != from_step_.end() && step >= it->second;
}

std::vector<std::string> Fp32OverrideSet::active_layers(std::int64_t step) const {
  std::vector<std::string> out;
  {
    std::lock_guard lock(mu_);
    for (const auto& [name, from] : from_step_) {
      if (step >= from) out.push_back(name);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::pair<std::string, std::int64_t>> Fp32OverrideSet::entries() const {
  std::lock_guard lock(mu_);
  std::vector<std::pair<std::string, std::int64_t>> out(from_step_.begin(), from_step_.end());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace ampscope::trainer
