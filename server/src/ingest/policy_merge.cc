#include "policy_merge.h"

namespace ampscope::server {

void merge_policy_update(v1::PolicyUpdate* into, const v1::PolicyUpdate& next) {
  if (next.has_loss_scale()) into->set_loss_scale(next.loss_scale());
  if (next.has_growth_interval()) into->set_growth_interval(next.growth_interval());
  if (next.has_growth_factor()) into->set_growth_factor(next.growth_factor());
  if (next.has_backoff_factor()) into->set_backoff_factor(next.backoff_factor());
  if (next.has_hysteresis()) into->set_hysteresis(next.hysteresis());
  if (next.has_min_scale()) into->set_min_scale(next.min_scale());
  if (next.has_max_scale()) into->set_max_scale(next.max_scale());
  if (next.fp32_tensors_set()) {
    into->set_fp32_tensors_set(true);
    *into->mutable_fp32_tensors() = next.fp32_tensors();
  }
  if (next.bf16_gemms_set()) {
    into->set_bf16_gemms_set(true);
    *into->mutable_bf16_gemms() = next.bf16_gemms();
  }
  if (next.has_amax_history_length()) into->set_amax_history_length(next.amax_history_length());
  if (next.has_amax_margin()) into->set_amax_margin(next.amax_margin());
  into->set_policy_id(next.policy_id());
  into->set_run_id(next.run_id());
  into->set_mode(next.mode());
  into->set_effective_from_step(next.effective_from_step());
  into->set_reason(next.reason());
  into->set_decided_at_step(next.decided_at_step());
  into->set_decided_unix_ns(next.decided_unix_ns());
  into->set_seq(next.seq());
}

}  // namespace ampscope::server
