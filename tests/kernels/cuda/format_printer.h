// Prints a Format by name in GoogleTest messages and parameterised test names (found by ADL, so
// it lives in Format's namespace); without it GoogleTest prints the enum's raw byte.
#pragma once

#include <ostream>

#include "ampscope/formats.h"

namespace ampscope {
inline void PrintTo(Format f, std::ostream* os) { *os << format_name(f); }
}  // namespace ampscope
