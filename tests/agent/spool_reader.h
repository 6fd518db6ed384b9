// Reads what an agent left in its spool (after it shut down) as StepReports, with their seq.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "ampscope/v1/telemetry.pb.h"

namespace ampscope::agent::testing {

std::vector<v1::StepReport> read_spool(const std::filesystem::path& spool_root,
                                       const std::string& run_id, int rank = 0);

}  // namespace ampscope::agent::testing
