// AMPSCOPE_CHECK_CUDA(expr): the CUDA counterpart of AMPSCOPE_CHECK (ampscope/check.h). It
// evaluates a CUDA runtime call once and, when it does not return cudaSuccess, throws
// ampscope::Error naming the file, the line, the call and the CUDA error. Usable from plain C++
// translation units (tests, host code) as well as from .cu files.
// Thread safety: stateless.
#pragma once

#include <cuda_runtime_api.h>

#include "ampscope/check.h"

namespace ampscope::cuda::detail {
[[noreturn]] void throw_cuda_failure(const char* file, int line, const char* expr,
                                     cudaError_t error);
}  // namespace ampscope::cuda::detail

#define AMPSCOPE_CHECK_CUDA(expr)                                             \
  do {                                                                        \
    const cudaError_t ampscope_cuda_status_ = (expr);                         \
    if (ampscope_cuda_status_ != cudaSuccess) [[unlikely]] {                  \
      ::ampscope::cuda::detail::throw_cuda_failure(__FILE__, __LINE__, #expr, \
                                                   ampscope_cuda_status_);    \
    }                                                                         \
  } while (0)
