// `ampscope show RUN --step S`: one step and what led to it (Query.GetStepHistory). For each
// tensor that offended at S (a non-finite value, or underflow above the alert threshold), one
// line per earlier step with full statistics (the flight recorder's history and the full
// samples of the reports), then the step itself: the occupied binade range and a sparkline of
// the binade histogram over the range every line shares, so a drift reads top to bottom.
#pragma once

#include <ostream>
#include <string>

#include "ampscope/v1/query.pb.h"

namespace ampscope::cli {

// Prints at most `limit` tensors with history in full and `limit` without, then how many more.
void print_step_text(std::ostream& out, const std::string& run_id, std::int64_t step,
                     const v1::GetStepHistoryResponse& history, std::size_t limit);
// One JSON object: run_id, step, reports (what happened at the step, by rank) and tensors, each
// with its statistics at the step and a history list (step, rank, from_flight_recorder,
// level, scale, min_exponent, counts, max_abs, min_abs_nonzero, nan, pos_inf, neg_inf, zeros,
// numel; values as stored, scale the loss scale they carry).
void print_step_json(std::ostream& out, const std::string& run_id, std::int64_t step,
                     const v1::GetStepHistoryResponse& history);

// The histogram's counts over binades [lo, hi] as one character each: ' ' for none, then
// "▁▂▃▄▅▆▇█" by log(1 + count) against the largest count in the range.
std::string sparkline(const v1::BinadeHistogram& histogram, int lo, int hi);

}  // namespace ampscope::cli
