#include "ampscope/check.h"

namespace ampscope::detail {

void throw_check_failure(const char* file, int line, const char* cond,
                         const std::string& message) {
  std::ostringstream os;
  os << file << ":" << line << ": check failed: " << cond;
  if (!message.empty()) os << ": " << message;
  throw Error(os.str());
}

}  // namespace ampscope::detail
