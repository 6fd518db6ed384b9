// What the trainer kernels share at run time: the description of a DeviceError.
#include <sstream>
#include <string>

#include "ampscope/cuda/nn.h"

namespace ampscope::cuda::nn {

std::string describe(const DeviceError& e) {
  std::ostringstream os;
  switch (e.code) {
    case 0:
      return {};
    case kTokenOutOfRange:
      os << "token " << e.value << " at position " << e.index << " outside the vocabulary of "
         << e.limit;
      break;
    case kTargetOutOfRange:
      os << "target " << e.value << " at position " << e.index << " outside the vocabulary of "
         << e.limit;
      break;
    default:
      os << "device error code " << e.code << " (index " << e.index << ", value " << e.value
         << ", limit " << e.limit << ")";
      break;
  }
  return os.str();
}

}  // namespace ampscope::cuda::nn
