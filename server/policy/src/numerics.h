// Binade arithmetic shared by the engine's sources: exact log2 of doubles.
#pragma once

#include <string>

#include "ampscope/loss_scale.h"

namespace ampscope::policy::detail {

// floor_log2, ceil_log2, is_power_of_two and scale_exponent are ampscope/loss_scale.h's.
// 2^k as a double (k in [-1074, 1023]).
double pow2(int k);
// "2^k" for powers of two, the plain number otherwise.
std::string scale_text(double scale);

}  // namespace ampscope::policy::detail
