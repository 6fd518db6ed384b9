// GELU on the device (gelu.h has the contract; launchers in gelu_cuda.h): grid-stride loops over
// gelu_element.cuh's element functions, which are the CPU's expression.
#include <cmath>
#include <cstdint>

#include "layers/gelu/gelu_cuda.h"
#include "layers/gelu/gelu_element.cuh"
#include "nn_common.cuh"
#include "nn_element.cuh"

namespace ampscope::cuda::nn {
namespace detail {
namespace {

__global__ void gelu_forward_kernel(Array out, ConstArray inp, std::int64_t n, Format compute) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) {
    const float v = input(inp.data, inp.dtype, i, compute);
    commit(out.data, out.dtype, i, gelu_forward_element(v), compute, false);
  }
}

__global__ void gelu_backward_kernel(Array dinp, ConstArray dout, ConstArray inp, std::int64_t n,
                                     Format compute) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) {
    const float v = input(inp.data, inp.dtype, i, compute);
    const float d = input(dout.data, dout.dtype, i, compute);
    commit(dinp.data, dinp.dtype, i, gelu_backward_element(v, d), compute, false);
  }
}

}  // namespace
}  // namespace detail

void gelu_forward(Array out, ConstArray inp, std::int64_t n, Format compute, cudaStream_t stream) {
  using namespace detail;
  const NvtxRange range{"ampscope::cuda::nn::gelu_forward"};
  check_array(out, n, "gelu_forward: out");
  check_array(inp, n, "gelu_forward: inp");
  check_compute(compute, "gelu_forward");
  if (n == 0) return;
  gelu_forward_kernel<<<elementwise_blocks(n), kThreadsPerBlock, 0, stream>>>(out, inp, n, compute);
  check_launch();
}

void gelu_backward(Array dinp, ConstArray dout, ConstArray inp, std::int64_t n, Format compute,
                   cudaStream_t stream) {
  using namespace detail;
  const NvtxRange range{"ampscope::cuda::nn::gelu_backward"};
  check_array(dinp, n, "gelu_backward: dinp");
  check_array(dout, n, "gelu_backward: dout");
  check_array(inp, n, "gelu_backward: inp");
  check_compute(compute, "gelu_backward");
  if (n == 0) return;
  gelu_backward_kernel<<<elementwise_blocks(n), kThreadsPerBlock, 0, stream>>>(dinp, dout, inp, n,
                                                                               compute);
  check_launch();
}

}  // namespace ampscope::cuda::nn
