// The policy in force for a run: every decision only says what it changes (unset fields keep
// their value), so the state an agent must apply after a reconnect is the fold of all of them.
#pragma once

#include "ampscope/v1/telemetry.pb.h"

namespace ampscope::server {

// Folds `next` into `into`: fields `next` sets replace those of `into`; the FP32 list is
// replaced when `next` sets it; policy_id, run_id, mode, effective_from_step, reason, the
// decision times and seq become those of `next`.
void merge_policy_update(v1::PolicyUpdate* into, const v1::PolicyUpdate& next);

}  // namespace ampscope::server
