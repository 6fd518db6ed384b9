// The trainer's CUDA back end: the Backend interface (ampscope/trainer/backend.h) on one CUDA
// device, with the kernels of ampscope::kernels_cuda_nn (cuBLASLt matmuls, FP32 accumulation;
// elementwise results bit-exact against the CPU back end, reductions within FP32 tolerance).
//
// Buffers are device memory (cudaMalloc, zero-filled on the back end's stream); every operation
// is enqueued on one non-blocking stream and returns at once; copy_to_host() and
// stream().synchronize() are the only points that wait. Bad data found on the device (a token
// or target outside the vocabulary) is reported at that next wait, as an ampscope::Error.
//
// Both functions exist in every build: a build without CUDA (AMPSCOPE_ENABLE_CUDA=OFF) links a
// stub whose reason says so, so callers need no #ifdef. AMPSCOPE_TRAINER_CUDA (1 or 0, set on
// ampscope::trainer) says which one was built.
// Thread safety: as for every Backend, one training thread at a time.
#pragma once

#include <memory>
#include <string>

#include "ampscope/trainer/backend.h"

namespace ampscope::trainer {

struct CudaBackendOptions {
  int device = 0;  // CUDA device ordinal
  // Per-tensor FP8 recipes (fp8-delayed, fp8-current): GEMMs through cuBLASLt's FP8 GEMM where
  // the device (compute capability 8.9+) and the shapes (multiples of 16) allow it; false:
  // always the emulation (dequantised operands, FP32 GEMMs). Block recipes always emulate.
  bool fp8_gemms = true;
};

inline constexpr bool kCudaBackendBuilt = AMPSCOPE_TRAINER_CUDA != 0;

// Empty when make_cuda_backend() can run here; otherwise one line saying why not (no CUDA
// support in this build, no driver or device, no such device ordinal). Never throws.
std::string cuda_backend_unavailable_reason(const CudaBackendOptions& options = {});

// Throws ampscope::Error with that reason when the back end cannot run, or when CUDA fails.
std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& options = {});

}  // namespace ampscope::trainer
