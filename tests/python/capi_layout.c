/* Every field of every struct of ampscope/agent/c_api.h as the C compiler lays it out, as JSON
 * ({"structs": {"struct": {"sizeof": N, "fields": {"field": [offset, size], ...}}, ...},
 * "constants": {"FORMAT_FP16": 1, ...}}), for capi_layout_test.py to compare with the Python
 * package's ctypes declarations. */
#include <stddef.h>
#include <stdio.h>

#include "ampscope/agent/c_api.h"

#define F(s, f) printf("%s\"%s\": [%zu, %zu]", first ? "" : ", ", #f, offsetof(s, f), sizeof(((s*)0)->f)), first = 0
#define BEGIN(s) printf("%s\"%s\": {\"sizeof\": %zu, \"fields\": {", comma, #s, sizeof(s)), first = 1, comma = ", "
#define END() printf("}}")
#define C(value, name) printf("%s\"%s\": %d", first ? "" : ", ", name, (int)(value)), first = 0

int main(void) {
  int first = 1;
  const char* comma = "";
  printf("{\"structs\": {");
  BEGIN(ampscope_run_info);
  F(ampscope_run_info, struct_size);
  F(ampscope_run_info, host);
  F(ampscope_run_info, trainer);
  F(ampscope_run_info, precision);
  F(ampscope_run_info, compute_format);
  F(ampscope_run_info, loss_scale);
  F(ampscope_run_info, growth_factor);
  F(ampscope_run_info, backoff_factor);
  F(ampscope_run_info, growth_interval);
  F(ampscope_run_info, scaler_kind);
  F(ampscope_run_info, min_scale);
  F(ampscope_run_info, max_scale);
  F(ampscope_run_info, hysteresis);
  END();
  BEGIN(ampscope_tensor_view);
  F(ampscope_tensor_view, struct_size);
  F(ampscope_tensor_view, name);
  F(ampscope_tensor_view, role);
  F(ampscope_tensor_view, phase);
  F(ampscope_tensor_view, dtype);
  F(ampscope_tensor_view, data);
  F(ampscope_tensor_view, shape);
  F(ampscope_tensor_view, rank);
  F(ampscope_tensor_view, numel);
  F(ampscope_tensor_view, device);
  F(ampscope_tensor_view, stream);
  F(ampscope_tensor_view, scale);
  F(ampscope_tensor_view, micro_step);
  F(ampscope_tensor_view, order);
  F(ampscope_tensor_view, has_held);
  F(ampscope_tensor_view, held);
  END();
  BEGIN(ampscope_step_info);
  F(ampscope_step_info, struct_size);
  F(ampscope_step_info, step);
  F(ampscope_step_info, loss);
  F(ampscope_step_info, loss_scale);
  F(ampscope_step_info, scale_after);
  F(ampscope_step_info, found_inf);
  F(ampscope_step_info, skipped);
  F(ampscope_step_info, grad_norm);
  F(ampscope_step_info, lr);
  F(ampscope_step_info, tokens);
  F(ampscope_step_info, step_time_s);
  F(ampscope_step_info, optimizer_steps);
  F(ampscope_step_info, has_val_loss);
  F(ampscope_step_info, val_loss);
  F(ampscope_step_info, fp32_layers);
  F(ampscope_step_info, num_fp32_layers);
  END();
  BEGIN(ampscope_scaler_change);
  F(ampscope_scaler_change, struct_size);
  F(ampscope_scaler_change, effective_from_step);
  F(ampscope_scaler_change, has_scale);
  F(ampscope_scaler_change, scale);
  F(ampscope_scaler_change, has_growth_factor);
  F(ampscope_scaler_change, growth_factor);
  F(ampscope_scaler_change, has_backoff_factor);
  F(ampscope_scaler_change, backoff_factor);
  F(ampscope_scaler_change, has_growth_interval);
  F(ampscope_scaler_change, growth_interval);
  F(ampscope_scaler_change, has_hysteresis);
  F(ampscope_scaler_change, hysteresis);
  F(ampscope_scaler_change, has_min_scale);
  F(ampscope_scaler_change, min_scale);
  F(ampscope_scaler_change, has_max_scale);
  F(ampscope_scaler_change, max_scale);
  END();
  BEGIN(ampscope_scaler_ops);
  F(ampscope_scaler_ops, struct_size);
  F(ampscope_scaler_ops, schedule);
  F(ampscope_scaler_ops, scale);
  F(ampscope_scaler_ops, min_scale);
  F(ampscope_scaler_ops, max_scale);
  END();
  BEGIN(ampscope_overrides_ops);
  F(ampscope_overrides_ops, struct_size);
  F(ampscope_overrides_ops, capable_layers);
  F(ampscope_overrides_ops, replace);
  END();
  BEGIN(ampscope_agent_counters);
  F(ampscope_agent_counters, struct_size);
  F(ampscope_agent_counters, steps);
  F(ampscope_agent_counters, reports_spooled);
  F(ampscope_agent_counters, reports_acked);
  F(ampscope_agent_counters, dropped_reports);
  F(ampscope_agent_counters, dropped_tensors);
  F(ampscope_agent_counters, rejected_reports);
  F(ampscope_agent_counters, spool_bytes);
  F(ampscope_agent_counters, reconnects);
  F(ampscope_agent_counters, policies_applied);
  F(ampscope_agent_counters, policies_refused);
  F(ampscope_agent_counters, training_thread_s);
  F(ampscope_agent_counters, connected);
  F(ampscope_agent_counters, refused_calls);
  F(ampscope_agent_counters, lockstep_timeouts);
  END();
  BEGIN(ampscope_loss_scale_rule);
  F(ampscope_loss_scale_rule, struct_size);
  F(ampscope_loss_scale_rule, kind);
  F(ampscope_loss_scale_rule, growth_factor);
  F(ampscope_loss_scale_rule, backoff_factor);
  F(ampscope_loss_scale_rule, growth_interval);
  F(ampscope_loss_scale_rule, hysteresis);
  F(ampscope_loss_scale_rule, min_scale);
  F(ampscope_loss_scale_rule, max_scale);
  END();
  BEGIN(ampscope_loss_scale_state);
  F(ampscope_loss_scale_state, scale);
  F(ampscope_loss_scale_state, hysteresis_tracker);
  F(ampscope_loss_scale_state, growth_tracker);
  END();
  printf("}, \"constants\": {");
  first = 1;
  C(AMPSCOPE_DEADLINE_EXCEEDED, "DEADLINE_EXCEEDED");
  C(AMPSCOPE_DEVICE_CPU, "DEVICE_CPU");
  C(AMPSCOPE_DEVICE_CUDA, "DEVICE_CUDA");
  C(AMPSCOPE_FAILED_PRECONDITION, "FAILED_PRECONDITION");
  C(AMPSCOPE_FORMAT_BF16, "FORMAT_BF16");
  C(AMPSCOPE_FORMAT_E4M3, "FORMAT_E4M3");
  C(AMPSCOPE_FORMAT_E5M2, "FORMAT_E5M2");
  C(AMPSCOPE_FORMAT_FP16, "FORMAT_FP16");
  C(AMPSCOPE_FORMAT_FP32, "FORMAT_FP32");
  C(AMPSCOPE_INTERNAL, "INTERNAL");
  C(AMPSCOPE_INVALID_ARGUMENT, "INVALID_ARGUMENT");
  C(AMPSCOPE_OK, "OK");
  C(AMPSCOPE_PHASE_AFTER_UNSCALE, "PHASE_AFTER_UNSCALE");
  C(AMPSCOPE_PHASE_BACKWARD, "PHASE_BACKWARD");
  C(AMPSCOPE_PHASE_FORWARD, "PHASE_FORWARD");
  C(AMPSCOPE_PHASE_STEP_START, "PHASE_STEP_START");
  C(AMPSCOPE_PHASE_UNKNOWN, "PHASE_UNKNOWN");
  C(AMPSCOPE_ROLE_ACTIVATION, "ROLE_ACTIVATION");
  C(AMPSCOPE_ROLE_ACTIVATION_GRAD, "ROLE_ACTIVATION_GRAD");
  C(AMPSCOPE_ROLE_LOSS, "ROLE_LOSS");
  C(AMPSCOPE_ROLE_MASTER_WEIGHT, "ROLE_MASTER_WEIGHT");
  C(AMPSCOPE_ROLE_OPTIMIZER_STATE, "ROLE_OPTIMIZER_STATE");
  C(AMPSCOPE_ROLE_WEIGHT, "ROLE_WEIGHT");
  C(AMPSCOPE_ROLE_WEIGHT_GRAD, "ROLE_WEIGHT_GRAD");
  C(AMPSCOPE_SCALER_DYNAMIC, "SCALER_DYNAMIC");
  C(AMPSCOPE_SCALER_HYSTERESIS, "SCALER_HYSTERESIS");
  C(AMPSCOPE_SCALER_STATIC, "SCALER_STATIC");
  C(AMPSCOPE_STEP_PHASE_BACKWARD, "STEP_PHASE_BACKWARD");
  C(AMPSCOPE_STEP_PHASE_FORWARD, "STEP_PHASE_FORWARD");
  C(AMPSCOPE_STEP_PHASE_OPTIMIZER, "STEP_PHASE_OPTIMIZER");
  C(AMPSCOPE_STEP_PHASE_UNSCALE_CHECK, "STEP_PHASE_UNSCALE_CHECK");
  C(AMPSCOPE_UNAVAILABLE, "UNAVAILABLE");
  printf("}}\n");
  return 0;
}
