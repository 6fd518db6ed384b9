// Host-side runtime glue: CUDA error reporting, device discovery and the launch preconditions
// shared by the kernels in this folder. No kernels here.
#include <algorithm>

#include "ampscope/check.h"
#include "ampscope/cuda/check.h"
#include "ampscope/cuda/device.h"
#include "runtime.cuh"

namespace ampscope::cuda {
namespace detail {

void throw_cuda_failure(const char* file, int line, const char* expr, cudaError_t error) {
  // Clear a non-sticky error so the next, unrelated check does not report it again.
  (void)cudaGetLastError();
  ::ampscope::detail::throw_check_failure(
      file, line, expr,
      ::ampscope::detail::format_message(cudaGetErrorName(error), ": ", cudaGetErrorString(error)));
}

int current_device() {
  int device = 0;
  AMPSCOPE_CHECK_CUDA(cudaGetDevice(&device));
  return device;
}

int grid_blocks(std::size_t units, int blocks_per_sm) {
  int sms = 0;
  AMPSCOPE_CHECK_CUDA(
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, current_device()));
  const std::size_t resident =
      static_cast<std::size_t>(sms) * static_cast<std::size_t>(std::max(blocks_per_sm, 1));
  const std::size_t needed = (units + kThreadsPerBlock - 1) / kThreadsPerBlock;
  return static_cast<int>(std::max<std::size_t>(1, std::min(needed, resident)));
}

void check_device_accessible(const void* p, const char* what) {
  AMPSCOPE_CHECK(p != nullptr, what, " is null");
  cudaPointerAttributes attributes{};
  AMPSCOPE_CHECK_CUDA(cudaPointerGetAttributes(&attributes, p));
  // Pageable host memory is the usual mistake (a host vector passed where a device buffer is
  // expected); a kernel would fault on it and poison the context for the whole process.
  AMPSCOPE_CHECK(attributes.type != cudaMemoryTypeUnregistered, what, " (", p,
                 ") is pageable host memory, not device-accessible memory");
}

}  // namespace detail

bool cuda_device_available() {
  static const bool available = [] {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    // No driver (cudaErrorInsufficientDriver) or no device (cudaErrorNoDevice) is an answer,
    // not a failure. Clearing helps where the error is not sticky; a missing driver stays
    // reported by every call, which the header tells callers.
    if (status != cudaSuccess) (void)cudaGetLastError();
    return status == cudaSuccess && count > 0;
  }();
  return available;
}

}  // namespace ampscope::cuda
