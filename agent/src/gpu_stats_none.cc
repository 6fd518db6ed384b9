// GpuStats in a build without CUDA: device tensors cannot be measured, and create() says so.
#include "gpu_stats.h"

namespace ampscope::agent {

bool cuda_device_present() { return false; }

std::unique_ptr<GpuStats> GpuStats::create(std::string* why_not) {
  *why_not = "this build has no CUDA support (AMPSCOPE_ENABLE_CUDA=OFF)";
  return nullptr;
}

}  // namespace ampscope::agent
