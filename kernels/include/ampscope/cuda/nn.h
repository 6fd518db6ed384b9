// What the built-in trainer's layers on the device share. Each layer's launchers are declared
// next to its kernels and its contract, in trainer/layers/<layer>/<layer>_cuda.h; they are the
// CUDA versions of the operations of the trainer's Backend interface
// (trainer/include/ampscope/trainer/backend.h). Their CPU reference is the trainer's CPU back
// end, which implements the same operations with the same arguments; tests/trainer/cuda compares
// the two operation by operation.
//
// Precision contract (the one backend.h states, applied element by element):
//   - inputs are read from their storage format and rounded to `compute`;
//   - arithmetic and accumulation are FP32 (matmuls: cuBLASLt, FP32 accumulate);
//   - results are rounded to `compute`, then stored in the output's format (round to nearest
//     even, overflow to Inf); outputs documented as "accumulate" get
//     out = store(out + round(contribution)), the sum formed in FP32.
// Element functions are compiled without FMA contraction, so elementwise results equal the CPU
// back end's bit for bit; reductions (row sums, matmuls) differ only by summation order.
//
// Arrays are device memory in FP32 or FP16/BF16 bit patterns, any element-aligned address.
// Shapes are written next to the arrays, row-major; B batch, T time, C channels, V vocabulary,
// NH heads. Every launcher enqueues on `stream` and returns without synchronising; scratch it
// needs comes from the stream-ordered allocator (cudaMallocAsync) on the same stream.
// Errors: ampscope::Error on a violated precondition or a failed launch. Bad data found on the
// device (a token outside the vocabulary) cannot throw: it is recorded in a DeviceError, which
// the caller reads at its next synchronisation.
// Thread safety: launchers are re-entrant; a CublasLt is used by one stream at a time.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "ampscope/cuda/cublaslt.h"
#include "ampscope/formats.h"

namespace ampscope::cuda::nn {

// A device array and its storage format (kFP32, kFP16 or kBF16).
struct ConstArray {
  const void* data = nullptr;
  Format dtype = Format::kFP32;
};
struct Array {
  void* data = nullptr;
  Format dtype = Format::kFP32;
  operator ConstArray() const { return {data, dtype}; }  // NOLINT: a view may always be read
};

// Written by kernels that meet bad data; the first report wins. Lives in device memory, zeroed
// by its owner; code 0 means nothing was reported.
struct DeviceError {
  int code;
  int index;  // the element (token position, row)
  int value;  // what was found
  int limit;  // the bound it broke
};
inline constexpr int kTokenOutOfRange = 1;
inline constexpr int kTargetOutOfRange = 2;
// One line for an error that was reported ("token 70 at position 3 outside the vocabulary of
// 65"); empty when code is 0.
std::string describe(const DeviceError& error);

}  // namespace ampscope::cuda::nn
