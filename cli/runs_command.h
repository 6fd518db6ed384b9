// `ampscope runs`: the runs the server knows, most recently active first; `ampscope runs delete
// RUN` deletes one of them on the server (its stored data, its policy state and its metrics).
#pragma once

#include <CLI/CLI.hpp>
#include <ostream>

#include "ampscope/v1/query.pb.h"

namespace ampscope::cli {

void add_runs_command(CLI::App& app);

void print_runs_text(std::ostream& out, const v1::ListRunsResponse& runs);
void print_runs_json(std::ostream& out, const v1::ListRunsResponse& runs);

}  // namespace ampscope::cli
