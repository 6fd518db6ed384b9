// User-facing input checks: like AMPSCOPE_CHECK, but the ampscope::Error carries only the
// message (no file, line or condition), because it is printed to the user as it is.
#pragma once

#include "ampscope/check.h"

#define AMPSCOPE_REQUIRE(cond, ...)                                                  \
  do {                                                                               \
    if (!(cond)) [[unlikely]] {                                                      \
      throw ::ampscope::Error(::ampscope::detail::format_message(__VA_ARGS__));      \
    }                                                                                \
  } while (0)
