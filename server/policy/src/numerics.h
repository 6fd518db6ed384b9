// Binade arithmetic shared by the engine's sources: exact log2 of doubles and the estimate of
// where an overflowed tensor's values really lay.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "ampscope/loss_scale.h"
#include "ampscope/tensor_stats.h"

namespace ampscope::policy::detail {

// floor_log2, ceil_log2, is_power_of_two and scale_exponent are ampscope/loss_scale.h's.
// 2^k as a double (k in [-1074, 1023]).
double pow2(int k);
// "2^k" for powers of two, the plain number otherwise.
std::string scale_text(double scale);

// Bin of the value at `fraction` of the way up the histogram (0: lowest bin holding a value,
// 0.5: median), counting `above` extra values that lie above every bin. nullopt when the
// position falls among the `above` values or the histogram is empty.
std::optional<int> quantile_bin(const BinadeHistogram& h, std::uint64_t above, double fraction);

}  // namespace ampscope::policy::detail
