// `ampscope cupti-check --chip NAME`: which CUPTI metrics the agent would collect on a chip,
// whether each resolves, and the pass count of the combined configuration. Uses the CUPTI
// Profiler Host API offline: no GPU needed.
#pragma once

#include <CLI/CLI.hpp>

#include <ostream>
#include <vector>

#include "ampscope/agent/cupti.h"

namespace ampscope::cli {

void add_cupti_check_command(CLI::App& app);

void print_cupti_check_text(std::ostream& out, const agent::CuptiChipCheck& check);
void print_cupti_check_json(std::ostream& out, const std::vector<agent::CuptiChipCheck>& checks);

}  // namespace ampscope::cli
