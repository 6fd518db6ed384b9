// The CUDA back end's entry points in a build without CUDA (AMPSCOPE_ENABLE_CUDA=OFF): they say
// so instead of failing to link, so ampscope-train's --device cuda gives one clear line.
#include "ampscope/check.h"
#include "cuda_backend.h"

namespace ampscope::trainer {

std::string cuda_backend_unavailable_reason(const CudaBackendOptions&) {
  return "this build has no CUDA support (configure with the CUDA toolkit and "
         "-DAMPSCOPE_ENABLE_CUDA=ON)";
}

std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& options) {
  throw Error(cuda_backend_unavailable_reason(options));
}

}  // namespace ampscope::trainer
