// Elementwise trainer kernels (ampscope/cuda/nn.h): fill, convert, residual add, set_element and
// GELU forward/backward.
//
// Design: memory-bound grid-stride loops, one element per thread per step, coalesced. The
// storage formats are runtime arguments switched on per element (the switch is uniform across
// the grid, so it costs a predictable branch, not divergence); this keeps one kernel per
// operation instead of one per (input, output, compute) combination. The arithmetic is
// nn_element.cuh's, which is the CPU back end's expression.
#include <cmath>
#include <cstdint>
#include <sstream>

#include "ampscope/cuda/nn.h"
#include "nn_common.cuh"
#include "nn_element.cuh"

namespace ampscope::cuda::nn {
namespace detail {
namespace {

__global__ void fill_kernel(Array t, std::int64_t n, float value) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) {
    store(t.data, t.dtype, i, value);
  }
}

__global__ void convert_kernel(Array dst, ConstArray src, std::int64_t n) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) {
    store(dst.data, dst.dtype, i, load(src.data, src.dtype, i));
  }
}

__global__ void add_kernel(Array out, ConstArray a, ConstArray b, std::int64_t n, Format compute) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) {
    const float x = input(a.data, a.dtype, i, compute);
    const float y = input(b.data, b.dtype, i, compute);
    commit(out.data, out.dtype, i, x + y, compute, false);
  }
}

__global__ void set_element_kernel(Array t, std::int64_t index, float value) {
  store(t.data, t.dtype, index, value);
}

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

void fill(Array t, std::int64_t n, float value, cudaStream_t stream) {
  using namespace detail;
  const NvtxRange range{"ampscope::cuda::nn::fill"};
  check_array(t, n, "fill: t");
  if (n == 0) return;
  fill_kernel<<<elementwise_blocks(n), kThreadsPerBlock, 0, stream>>>(t, n, value);
  check_launch();
}

void convert(Array dst, ConstArray src, std::int64_t n, cudaStream_t stream) {
  using namespace detail;
  const NvtxRange range{"ampscope::cuda::nn::convert"};
  check_array(dst, n, "convert: dst");
  check_array(src, n, "convert: src");
  if (n == 0) return;
  convert_kernel<<<elementwise_blocks(n), kThreadsPerBlock, 0, stream>>>(dst, src, n);
  check_launch();
}

void add(Array out, ConstArray a, ConstArray b, std::int64_t n, Format compute,
         cudaStream_t stream) {
  using namespace detail;
  const NvtxRange range{"ampscope::cuda::nn::add"};
  check_array(out, n, "add: out");
  check_array(a, n, "add: a");
  check_array(b, n, "add: b");
  check_compute(compute, "add");
  if (n == 0) return;
  add_kernel<<<elementwise_blocks(n), kThreadsPerBlock, 0, stream>>>(out, a, b, n, compute);
  check_launch();
}

void set_element(Array t, std::int64_t index, float value, cudaStream_t stream) {
  using namespace detail;
  const NvtxRange range{"ampscope::cuda::nn::set_element"};
  AMPSCOPE_CHECK(index >= 0, "set_element: negative index ", index);
  check_array(t, index + 1, "set_element: t");
  set_element_kernel<<<1, 1, 0, stream>>>(t, index, value);
  check_launch();
}

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
