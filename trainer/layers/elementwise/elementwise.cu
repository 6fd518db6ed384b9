// The elementwise group on the device (elementwise.h has the contract; launchers in
// elementwise_cuda.h): fill, convert, residual add and set_element. Memory-bound grid-stride
// loops, one element per thread per step, coalesced. The storage formats are runtime arguments
// switched on per element (the switch is uniform across the grid, so it costs a predictable
// branch, not divergence); this keeps one kernel per operation instead of one per (input,
// output, compute) combination. The arithmetic is nn_element.cuh's, which is the CPU's.
#include <cmath>
#include <cstdint>

#include "layers/elementwise/elementwise_cuda.h"
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

}  // namespace
}  // namespace detail

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

}  // namespace ampscope::cuda::nn
