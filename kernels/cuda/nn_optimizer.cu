// The optimizer side on the device (ampscope/cuda/nn_optimizer.h): fused multi-tensor unscale +
// non-finite check, FP64 sum of squares, scale (clipping), AdamW and the loss-scale update.
//
// Design:
//   - unscale_and_check: apex's multi_tensor_apply layout. The tensors' pointers, sizes, formats
//     and first chunk numbers travel in the kernel's parameters (under 2.5 KiB for 96 tensors);
//     each block takes chunks of kChunk elements in turn, finds the chunk's tensor by binary
//     search over the chunk prefix, and unscales it in place. A block that saw a non-finite
//     value stores 1 into found_inf (every writer stores the same value, so the race is benign;
//     PyTorch's _amp_foreach_non_finite_check_and_unscale_ does the same).
//   - sum_squares, accumulate_mean: FP64 per-thread sums over a fixed grid, a fixed block tree,
//     per-block partials, then one block sums the partials: deterministic for a given device.
//   - scale, adamw: elementwise grid-stride loops over nn_element.cuh's expressions.
//   - update_loss_scale: one thread; the same update_loss_scale_state() the host model checks
//     against the trainer's scalers.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "ampscope/cuda/nn_optimizer.h"
#include "nn_common.cuh"
#include "nn_element.cuh"

namespace ampscope::cuda::nn {
namespace detail {
namespace {

constexpr std::int64_t kChunk = 1 << 16;  // elements per block-step of the multi-tensor kernel
constexpr int kMultiTensorBlocksPerSm = 4;
constexpr int kSumSquaresBlocksPerSm = 2;

struct TensorTable {
  void* data[kMultiTensorMaxPerLaunch];
  std::int64_t numel[kMultiTensorMaxPerLaunch];
  std::int64_t first_chunk[kMultiTensorMaxPerLaunch + 1];  // first_chunk[count]: total chunks
  Format dtype[kMultiTensorMaxPerLaunch];
  int count;
};
static_assert(sizeof(TensorTable) < 4000, "the tensor table must fit the 4 KiB parameter space");

// The tensor holding global chunk `chunk`: the last t with first_chunk[t] <= chunk.
__device__ int tensor_of_chunk(const TensorTable& table, std::int64_t chunk) {
  int lo = 0, hi = table.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (table.first_chunk[mid] <= chunk) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// scale: the device state to read the scale from, or null to use inv_scale.
__global__ void unscale_and_check_kernel(const TensorTable table, float inv_scale,
                                         const LossScaleState* scale, float* found_inf) {
  const float inv = scale != nullptr ? inverse_scale(scale->scale) : inv_scale;
  const std::int64_t chunks = table.first_chunk[table.count];
  int bad = 0;
  for (std::int64_t chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {
    const int t = tensor_of_chunk(table, chunk);
    const std::int64_t begin = (chunk - table.first_chunk[t]) * kChunk;
    const std::int64_t end = begin + kChunk < table.numel[t] ? begin + kChunk : table.numel[t];
    void* data = table.data[t];
    const Format dtype = table.dtype[t];
    for (std::int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
      const float g = load(data, dtype, i);
      bad |= is_finite(g) ? 0 : 1;
      store(data, dtype, i, g * inv);
    }
  }
  if (__syncthreads_or(bad) != 0 && threadIdx.x == 0) *found_inf = 1.0f;
}

void launch_unscale(std::span<const GradientTensor> grads, float inv_scale,
                    const LossScaleState* state, float* found_inf, cudaStream_t stream) {
  AMPSCOPE_CHECK(found_inf != nullptr, "unscale_and_check: found_inf is null");
  ::ampscope::cuda::detail::check_device_accessible(found_inf, "unscale_and_check: found_inf");
  for (const auto& g : grads)
    check_array(ConstArray{g.data, g.dtype}, g.numel, "unscale_and_check: gradient");
  for (std::size_t first = 0; first < grads.size(); first += kMultiTensorMaxPerLaunch) {
    const std::size_t count = std::min<std::size_t>(kMultiTensorMaxPerLaunch, grads.size() - first);
    TensorTable table{};
    table.count = static_cast<int>(count);
    std::int64_t chunks = 0;
    for (std::size_t i = 0; i < count; ++i) {
      const GradientTensor& g = grads[first + i];
      table.data[i] = g.data;
      table.numel[i] = g.numel;
      table.dtype[i] = g.dtype;
      table.first_chunk[i] = chunks;
      chunks += (g.numel + kChunk - 1) / kChunk;
    }
    table.first_chunk[count] = chunks;
    if (chunks == 0) continue;
    const int blocks = std::min(
        static_cast<int>(std::min<std::int64_t>(chunks, 1 << 30)),
        grid_blocks(static_cast<std::size_t>(chunks) * kThreadsPerBlock, kMultiTensorBlocksPerSm));
    unscale_and_check_kernel<<<blocks, kThreadsPerBlock, 0, stream>>>(table, inv_scale, state,
                                                                      found_inf);
    check_launch();
  }
}

// Per-block FP64 sums of x (kSquare: of x^2) over a fixed grid.
template <bool kSquare>
__global__ void sum_partial_kernel(ConstArray x, std::int64_t n, double* partials) {
  __shared__ double shared[kThreadsPerBlock / kWarpSize];
  double acc = 0.0;
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) {
    const double g = load(x.data, x.dtype, i);
    acc += kSquare ? g * g : g;
  }
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

__device__ double sum_of_partials(const double* partials, int count) {
  __shared__ double shared[kThreadsPerBlock / kWarpSize];
  double acc = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  return block_sum(acc, shared);
}

__global__ void sum_squares_final_kernel(const double* partials, int count, float* sum_sq) {
  const double acc = sum_of_partials(partials, count);
  if (threadIdx.x == 0) *sum_sq = static_cast<float>(acc);
}

__global__ void accumulate_mean_final_kernel(const double* partials, int count, double n,
                                             double* acc) {
  const double sum = sum_of_partials(partials, count);
  if (threadIdx.x == 0) *acc += sum / n;
}

__global__ void scale_kernel(Array x, std::int64_t n, float factor) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) {
    store(x.data, x.dtype, i, load(x.data, x.dtype, i) * factor);
  }
}

__global__ void adamw_kernel(Array params, ConstArray grads, Array m, Array v, std::int64_t n,
                             AdamWStep step) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) {
    float p = load(params.data, params.dtype, i);
    float mi = load(m.data, m.dtype, i);
    float vi = load(v.data, v.dtype, i);
    adamw_element(p, mi, vi, load(grads.data, grads.dtype, i), step);
    store(params.data, params.dtype, i, p);
    store(m.data, m.dtype, i, mi);
    store(v.data, v.dtype, i, vi);
  }
}

__global__ void update_loss_scale_kernel(LossScaleState* state, const float* found_inf,
                                         LossScaleRule rule) {
  LossScaleState s = *state;
  update_loss_scale_state(s, rule, *found_inf != 0.0f);
  *state = s;
}

}  // namespace
}  // namespace detail

void unscale_and_check(std::span<const GradientTensor> grads, float inv_scale, float* found_inf,
                       cudaStream_t stream) {
  const detail::NvtxRange range{"ampscope::cuda::nn::unscale_and_check"};
  detail::launch_unscale(grads, inv_scale, nullptr, found_inf, stream);
}

void unscale_and_check(std::span<const GradientTensor> grads, const LossScaleState* state,
                       float* found_inf, cudaStream_t stream) {
  const detail::NvtxRange range{"ampscope::cuda::nn::unscale_and_check"};
  AMPSCOPE_CHECK(state != nullptr, "unscale_and_check: the loss-scale state is null");
  ::ampscope::cuda::detail::check_device_accessible(state, "unscale_and_check: state");
  detail::launch_unscale(grads, 0.0f, state, found_inf, stream);
}

void sum_squares(float* sum_sq, ConstArray x, std::int64_t n, cudaStream_t stream) {
  using namespace detail;
  const NvtxRange range{"ampscope::cuda::nn::sum_squares"};
  AMPSCOPE_CHECK(sum_sq != nullptr, "sum_squares: sum_sq is null");
  ::ampscope::cuda::detail::check_device_accessible(sum_sq, "sum_squares: sum_sq");
  check_array(x, n, "sum_squares: x");
  const int blocks = grid_blocks(static_cast<std::size_t>(n), kSumSquaresBlocksPerSm);
  StreamScratch partials(static_cast<std::size_t>(blocks) * sizeof(double), stream);
  sum_partial_kernel<true><<<blocks, kThreadsPerBlock, 0, stream>>>(x, n, partials.as<double>());
  check_launch();
  sum_squares_final_kernel<<<1, kThreadsPerBlock, 0, stream>>>(partials.as<double>(), blocks,
                                                               sum_sq);
  check_launch();
}

void accumulate_mean(double* acc, ConstArray x, std::int64_t n, cudaStream_t stream) {
  using namespace detail;
  const NvtxRange range{"ampscope::cuda::nn::accumulate_mean"};
  AMPSCOPE_CHECK(acc != nullptr, "accumulate_mean: acc is null");
  AMPSCOPE_CHECK(n >= 1, "accumulate_mean: needs at least one element, got ", n);
  ::ampscope::cuda::detail::check_device_accessible(acc, "accumulate_mean: acc");
  check_array(x, n, "accumulate_mean: x");
  const int blocks = grid_blocks(static_cast<std::size_t>(n), kSumSquaresBlocksPerSm);
  StreamScratch partials(static_cast<std::size_t>(blocks) * sizeof(double), stream);
  sum_partial_kernel<false><<<blocks, kThreadsPerBlock, 0, stream>>>(x, n, partials.as<double>());
  check_launch();
  accumulate_mean_final_kernel<<<1, kThreadsPerBlock, 0, stream>>>(
      partials.as<double>(), blocks, static_cast<double>(n), acc);
  check_launch();
}

void scale(Array x, std::int64_t n, float factor, cudaStream_t stream) {
  using namespace detail;
  const NvtxRange range{"ampscope::cuda::nn::scale"};
  check_array(x, n, "scale: x");
  if (n == 0) return;
  scale_kernel<<<elementwise_blocks(n), kThreadsPerBlock, 0, stream>>>(x, n, factor);
  check_launch();
}

void adamw(Array params, ConstArray grads, Array m, Array v, std::int64_t n, const AdamWArgs& args,
           cudaStream_t stream) {
  using namespace detail;
  const NvtxRange range{"ampscope::cuda::nn::adamw"};
  check_array(params, n, "adamw: params");
  check_array(grads, n, "adamw: grads");
  check_array(m, n, "adamw: m");
  check_array(v, n, "adamw: v");
  AMPSCOPE_CHECK(args.step >= 1, "adamw: step must be >= 1, found ", args.step);
  if (n == 0) return;
  adamw_kernel<<<elementwise_blocks(n), kThreadsPerBlock, 0, stream>>>(params, grads, m, v, n,
                                                                       adamw_step(args));
  check_launch();
}

void update_loss_scale(LossScaleState* state, const float* found_inf, const LossScaleRule& rule,
                       cudaStream_t stream) {
  using namespace detail;
  const NvtxRange range{"ampscope::cuda::nn::update_loss_scale"};
  AMPSCOPE_CHECK(state != nullptr && found_inf != nullptr,
                 "update_loss_scale: state and found_inf must be device pointers");
  ::ampscope::cuda::detail::check_device_accessible(state, "update_loss_scale: state");
  ::ampscope::cuda::detail::check_device_accessible(found_inf, "update_loss_scale: found_inf");
  AMPSCOPE_CHECK(rule.growth_interval >= 1 && rule.hysteresis >= 1,
                 "update_loss_scale: growth_interval and hysteresis must be >= 1");
  update_loss_scale_kernel<<<1, 1, 0, stream>>>(state, found_inf, rule);
  check_launch();
}

}  // namespace ampscope::cuda::nn
