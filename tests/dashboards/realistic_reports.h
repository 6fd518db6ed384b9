// Step reports of a small FP16 run that exercise every series the dashboard and the alert rules
// read: every tensor role, gradients reaching into FP16's underflow range, a NaN in an
// activation at one step (first offender, skipped step, scale backoff), tensor-core samples,
// validation loss, and the agent's counters. Shared by dashboard_test.cc (every name is
// exported) and two_servers_test.cc (two servers answer as one).
#pragma once

#include <cstdint>
#include <string>

#include "ampscope/v1/telemetry.pb.h"

namespace ampscope::testing {

// A gradient or activation tensor as the agent would measure it, optionally with NaNs.
v1::TensorStats realistic_tensor(const std::string& name, v1::TensorRole role, int lo, int hi,
                                 double scale, std::uint32_t seed, std::uint64_t nan = 0);

// Report `seq` (step seq - 1) of `run`, rank 0, measured at loss scale `scale`; the step
// `nan_step` has the NaN (and backs the scale off: its scale_after is scale / 2).
v1::StepReport realistic_report(const std::string& run, std::uint64_t seq, double scale,
                                std::int64_t nan_step);

}  // namespace ampscope::testing
