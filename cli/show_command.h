// `ampscope show RUN`: what the server saw of one run — steps, skipped steps and why, first
// offenders, the loss-scale timeline, the worst tensors by underflow and by overflow, and the
// policy decisions with the agents' answers. With --step S: that step and what led to it
// (step_history.h).
#pragma once

#include <CLI/CLI.hpp>
#include <ostream>

#include "ampscope/v1/query.pb.h"

namespace ampscope::cli {

void add_show_command(CLI::App& app);

void print_run_text(std::ostream& out, const v1::GetRunResponse& run);
// One JSON object: run_id, steps (distinct steps stored), reports, skipped_steps (a list, with
// skipped_step_count), first_offenders, scale_timeline, worst_underflow, worst_overflow,
// policy_updates, agents and the remaining summary fields.
void print_run_json(std::ostream& out, const v1::GetRunResponse& run);

}  // namespace ampscope::cli
