// Internal precondition checks. AMPSCOPE_CHECK throws ampscope::Error with the file, line and
// a message that says what was expected and what was found. Library entry points that are
// called from a guest context (the agent) catch it at their boundary; kernels and tools let it
// propagate to a caller that reports it.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace ampscope {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
[[noreturn]] void throw_check_failure(const char* file, int line, const char* cond,
                                      const std::string& message);

inline std::string format_message() { return {}; }
template <typename... Args>
std::string format_message(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail
}  // namespace ampscope

// AMPSCOPE_CHECK(n == m, "expected ", n, " elements, found ", m)
#define AMPSCOPE_CHECK(cond, ...)                                                       \
  do {                                                                                  \
    if (!(cond)) [[unlikely]] {                                                         \
      ::ampscope::detail::throw_check_failure(__FILE__, __LINE__, #cond,                \
                                              ::ampscope::detail::format_message(__VA_ARGS__)); \
    }                                                                                   \
  } while (0)
