// The plumbing the cuBLASLt layers share (matmul.cu, ../attention/attention.cu): every product
// follows the same three steps, which are the precision contract of a product:
//   1. operands in the compute format: an input already stored in it (and 16-byte aligned, so
//      tensor-core algorithms can read it) is used in place; any other input is rounded into a
//      scratch copy (the CPU back end's In);
//   2. cuBLASLt with FP32 accumulation into an FP32 scratch result;
//   3. an epilogue kernel adds the (rounded) bias, rounds to the compute format and stores or
//      accumulates into the output (the CPU back end's Out::commit).
#pragma once

#include <cstdint>
#include <memory>

#include "ampscope/cuda/cublaslt.h"
#include "layers/elementwise/elementwise_cuda.h"
#include "nn_common.cuh"
#include "nn_element.cuh"

namespace ampscope::cuda::nn::detail {
namespace {

constexpr std::size_t kOperandAlignment = 16;

std::size_t bytes_of(std::int64_t n, Format f) {
  return static_cast<std::size_t>(n) * static_cast<std::size_t>(storage_bytes(f));
}

// An input (n elements) as an operand in `compute` storage.
class Operand {
 public:
  Operand(ConstArray x, std::int64_t n, Format compute, cudaStream_t stream) {
    if (x.dtype == compute && ::ampscope::cuda::detail::is_aligned(x.data, kOperandAlignment)) {
      data_ = x.data;
      return;
    }
    scratch_ = std::make_unique<StreamScratch>(bytes_of(n, compute), stream);
    convert(Array{scratch_->get(), compute}, x, n, stream);  // rounds to compute
    data_ = scratch_->get();
  }
  const void* get() const { return data_; }

 private:
  const void* data_ = nullptr;
  std::unique_ptr<StreamScratch> scratch_;
};

// out (M,N) = acc (M,N) [+ bias (N)], rounded to compute, stored or accumulated.
__global__ void epilogue_kernel(Array out, const float* acc, ConstArray bias, std::int64_t M,
                                std::int64_t N, Format compute, bool accumulate) {
  const std::int64_t n = M * N;
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) {
    float v = acc[i];
    if (bias.data != nullptr) v += input(bias.data, bias.dtype, i % N, compute);
    commit(out.data, out.dtype, i, v, compute, accumulate);
  }
}

void epilogue(Array out, const float* acc, ConstArray bias, std::int64_t M, std::int64_t N,
              Format compute, bool accumulate, cudaStream_t stream) {
  if (M * N == 0) return;
  epilogue_kernel<<<elementwise_blocks(M * N), kThreadsPerBlock, 0, stream>>>(out, acc, bias, M, N,
                                                                              compute, accumulate);
  check_launch();
}

// The arguments of c (m,n) = op(a) (m,k) op(b) (k,n) on `batch` strided operand sets, operands
// in `compute`; the caller sets the operands with set_a, set_b and set_c.
GemmArgs gemm_args(Format compute, std::int64_t m, std::int64_t n, std::int64_t k, int batch = 1) {
  GemmArgs g;
  g.m = m;
  g.n = n;
  g.k = k;
  g.batch = batch;
  g.operand = compute;
  return g;
}

void set_a(GemmArgs& g, const void* a, bool transposed, std::int64_t ld, std::int64_t stride) {
  g.a = a;
  g.a_transposed = transposed;
  g.lda = ld;
  g.stride_a = stride;
}
void set_b(GemmArgs& g, const void* b, bool transposed, std::int64_t ld, std::int64_t stride) {
  g.b = b;
  g.b_transposed = transposed;
  g.ldb = ld;
  g.stride_b = stride;
}
void set_c(GemmArgs& g, float* c, std::int64_t ld, std::int64_t stride) {
  g.c = c;
  g.ldc = ld;
  g.stride_c = stride;
}

}  // namespace
}  // namespace ampscope::cuda::nn::detail
