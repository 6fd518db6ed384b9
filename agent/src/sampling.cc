#include "sampling.h"

namespace ampscope::agent {

Sampler::Sampler(const SamplingConfig& config, const std::vector<TensorRole>& recorded_roles,
                 bool full_stats)
    : config_(config), full_stats_(full_stats) {
  for (TensorRole r : config_.count_roles) count_role_[static_cast<int>(r)] = true;
  for (TensorRole r : config_.full_roles) full_role_[static_cast<int>(r)] = true;
  for (TensorRole r : recorded_roles) record_role_[static_cast<int>(r)] = true;
  counts_any_ = (config_.counts && !config_.count_roles.empty()) || !recorded_roles.empty();
}

bool Sampler::begin_step(std::int64_t step) {
  step_ = step;
  escalated_ = false;
  full_step_ =
      full_stats_ && (follow_up_ || (config_.full_every > 0 && step % config_.full_every == 0));
  follow_up_ = false;
  return full_step_ || counts_any_;
}

bool Sampler::records(TensorRole role, TensorPhase phase) const {
  const bool repeat = role == TensorRole::kWeightGrad && phase == TensorPhase::kAfterUnscale;
  return record_role_[static_cast<int>(role)] && !repeat;
}

Level Sampler::level(TensorRole role, TensorPhase phase) const {
  const int r = static_cast<int>(role);
  if ((full_step_ || escalated_) && full_role_[r]) return Level::kFull;
  if (config_.counts && count_role_[r] && phase != TensorPhase::kAfterUnscale) {
    return Level::kCounts;
  }
  return Level::kSkip;
}

void Sampler::saw_nonfinite() {
  if (config_.full_on_nonfinite) escalated_ = true;
}

void Sampler::end_step(bool nonfinite, bool scale_changed) {
  follow_up_ =
      (nonfinite && config_.full_on_nonfinite) || (scale_changed && config_.full_on_scale_change);
}

}  // namespace ampscope::agent
