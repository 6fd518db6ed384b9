// Row-major matrix products on the device through cuBLASLt: FP32, FP16 or BF16 operands, FP32
// accumulation and an FP32 result (tensor cores for FP16/BF16; strict FP32 for FP32 operands,
// never TF32), optionally batched with constant strides. FP8 operands (E4M3 or E5M2 codes, each
// with an FP32 decode scale on the device; not both E5M2) run cuBLASLt's FP8 GEMM on devices of
// compute capability 8.9 and up, with FP32 accumulation (no fast accumulation): the result is
// alpha x a_scale x b_scale x (a x b). cuBLASLt's FP8 kernels read A transposed and B not ("TN"),
// which in this row-major interface is a stored (m, k) and b stored (n, k): a not transposed, b
// transposed; k and the leading dimensions multiples of 16. The trainer's linear layers and
// attention products (ampscope/cuda/nn.h) are built on it; it does no rounding of its own.
//
//   c[i] (m, n) = alpha * op(a[i]) (m, k) x op(b[i]) (k, n),  i < batch
//   op(a) = a stored (m, k) with leading dimension lda, or a stored (k, m) when a_transposed;
//   op(b) = b stored (k, n), or b stored (n, k) when b_transposed; c stored (m, n), ldc.
//
// Ownership: a CublasLt owns a cuBLASLt handle, a device workspace and a cache of the algorithm
// chosen for each problem (shape, strides, operand format, pointer alignment). Create it once.
// Thread safety: one thread and one stream at a time (the workspace is shared by every product).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "ampscope/formats.h"

namespace ampscope::cuda {

struct GemmArgs {
  std::int64_t m = 0, n = 0, k = 0;
  int batch = 1;
  Format operand = Format::kFP32;  // storage of a and b: kFP32, kFP16 or kBF16; a's: kE4M3/kE5M2
  // FP8 only: b's element (kE4M3 or kE5M2) and the decode scales (one FP32 each, device memory).
  Format operand_b = Format::kFP32;
  const float* a_scale = nullptr;
  const float* b_scale = nullptr;
  float alpha = 1.0f;
  const void* a = nullptr;
  bool a_transposed = false;
  std::int64_t lda = 0, stride_a = 0;  // strides in elements, between batch entries
  const void* b = nullptr;
  bool b_transposed = false;
  std::int64_t ldb = 0, stride_b = 0;
  float* c = nullptr;
  std::int64_t ldc = 0, stride_c = 0;
};

class CublasLt {
 public:
  // Creates the handle and a workspace on the current device. Throws ampscope::Error.
  CublasLt();
  ~CublasLt();
  CublasLt(const CublasLt&) = delete;
  CublasLt& operator=(const CublasLt&) = delete;

  // Enqueues the product on `stream`. Throws ampscope::Error on a bad argument (shapes,
  // leading dimensions, formats, null pointers), when cuBLASLt has no algorithm for the problem,
  // or when the launch fails. k == 0 writes zeros.
  void gemm(const GemmArgs& args, cudaStream_t stream);

  // Whether the current device runs FP8 products (compute capability 8.9 or later).
  static bool fp8_supported();
  // Whether an FP8 product of this shape meets the TN layout and multiple-of-16 rules above.
  static bool fp8_shape_allowed(std::int64_t m, std::int64_t n, std::int64_t k);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ampscope::cuda
