// `ampscope tail RUN`: the latest step reports of a run, one line each, and with --follow the
// new ones as the server commits them (polling GetReports in arrival order).
#pragma once

#include <CLI/CLI.hpp>
#include <ostream>

#include "ampscope/v1/query.pb.h"

namespace ampscope::cli {

void add_tail_command(CLI::App& app);

void print_report_text(std::ostream& out, const v1::StoredReport& report);
// One JSON object per line (JSON Lines); with `tensors`, each tensor's identity and counts too.
void print_report_json(std::ostream& out, const v1::StoredReport& report, bool tensors = false);

}  // namespace ampscope::cli
