// Softmax cross-entropy on the device (cross_entropy.h has the contract; launchers in
// cross_entropy_cuda.h).
//   - forward: one block per row (V may be large): block max, block sum of exponentials, then
//     probabilities and the row's loss.
//   - backward: elementwise, bit-exact with the CPU.
#include <cmath>
#include <cstdint>

#include "layers/cross_entropy/cross_entropy_cuda.h"
#include "nn_common.cuh"
#include "nn_element.cuh"

namespace ampscope::cuda::nn {
namespace detail {
namespace {

// One block per row. losses (N); probs, logits (N,V); targets (N).
__global__ void cross_entropy_forward_kernel(Array losses, Array probs, ConstArray logits,
                                             const std::int32_t* targets, std::int64_t V,
                                             Format compute, DeviceError* error) {
  __shared__ float shared[kWarpsPerBlock];
  const std::int64_t row = blockIdx.x;
  const std::int64_t base = row * V;
  float mx = -INFINITY;
  for (std::int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    const float x = input(logits.data, logits.dtype, base + j, compute);
    mx = (mx < x) ? x : mx;
  }
  mx = block_max(mx, shared);
  float sum = 0.0f;
  for (std::int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    sum += expf(input(logits.data, logits.dtype, base + j, compute) - mx);
  }
  const float log_sum = logf(block_sum(sum, shared));
  for (std::int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    const float x = input(logits.data, logits.dtype, base + j, compute);
    commit(probs.data, probs.dtype, base + j, expf(x - mx - log_sum), compute, false);
  }
  if (threadIdx.x == 0) {
    const std::int32_t t = targets[row];
    float loss = NAN;
    if (t < 0 || t >= V) {
      report(error, kTargetOutOfRange, row, t, V);
    } else {
      loss = log_sum + mx - input(logits.data, logits.dtype, base + t, compute);
    }
    commit(losses.data, losses.dtype, row, loss, compute, false);
  }
}

__global__ void cross_entropy_backward_kernel(Array dlogits, ConstArray probs,
                                              const std::int32_t* targets, std::int64_t N,
                                              std::int64_t V, float dloss, Format compute) {
  const std::int64_t n = N * V;
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) {
    const std::int64_t row = i / V, j = i % V;
    const float p = load(probs.data, probs.dtype, i);
    const float d = j == targets[row] ? (p - 1.0f) * dloss : p * dloss;
    commit(dlogits.data, dlogits.dtype, i, d, compute, false);
  }
}

}  // namespace
}  // namespace detail

void cross_entropy_forward(Array losses, Array probs, ConstArray logits,
                           const std::int32_t* targets, std::int64_t N, std::int64_t V,
                           Format compute, DeviceError* error, cudaStream_t stream) {
  using namespace detail;
  const NvtxRange range{"ampscope::cuda::nn::cross_entropy_forward"};
  AMPSCOPE_CHECK(N >= 0 && V >= 1, "cross_entropy_forward: bad shape N=", N, " V=", V);
  check_compute(compute, "cross_entropy_forward");
  check_array(losses, N, "cross_entropy_forward: losses");
  check_array(probs, N * V, "cross_entropy_forward: probs");
  check_array(logits, N * V, "cross_entropy_forward: logits");
  if (N == 0) return;
  check_grid_rows(N, "cross_entropy_forward");
  ::ampscope::cuda::detail::check_device_accessible(targets, "cross_entropy_forward: targets");
  cross_entropy_forward_kernel<<<static_cast<unsigned>(N), kThreadsPerBlock, 0, stream>>>(
      losses, probs, logits, targets, V, compute, error);
  check_launch();
}

void cross_entropy_backward(Array dlogits, ConstArray probs, const std::int32_t* targets,
                            std::int64_t N, std::int64_t V, float dloss, Format compute,
                            cudaStream_t stream) {
  using namespace detail;
  const NvtxRange range{"ampscope::cuda::nn::cross_entropy_backward"};
  AMPSCOPE_CHECK(N >= 0 && V >= 1, "cross_entropy_backward: bad shape N=", N, " V=", V);
  check_compute(compute, "cross_entropy_backward");
  check_array(dlogits, N * V, "cross_entropy_backward: dlogits");
  check_array(probs, N * V, "cross_entropy_backward: probs");
  if (N == 0) return;
  ::ampscope::cuda::detail::check_device_accessible(targets, "cross_entropy_backward: targets");
  cross_entropy_backward_kernel<<<elementwise_blocks(N * V), kThreadsPerBlock, 0, stream>>>(
      dlogits, probs, targets, N, V, dloss, compute);
  check_launch();
}

}  // namespace ampscope::cuda::nn
