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
//   - unscale_check_and_measure: the same kernel with the statistics of stats_device.cuh taken
//     of each stored product: a chunk of a measured tensor is counted into the block's shared
//     accumulators and flushed into the tensor's slot at the end of the chunk (block-uniform:
//     every chunk belongs to one tensor), so each gradient is read and written once.
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
#include "stats_device.cuh"

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
  short stats_slot[kMultiTensorMaxPerLaunch];  // -1: not measured
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

// Stores value rounded into `f` storage (store()'s rounding) and returns the FP32 bits of what
// was stored.
__device__ std::uint32_t store_and_widen(void* base, Format f, std::int64_t i, float value) {
  namespace st = ::ampscope::cuda::detail::stats;
  switch (f) {
    case Format::kFP16: {
      const std::uint16_t h = narrow_from_fp32<Format::kFP16>(value, OverflowMode::kNonSaturating);
      static_cast<std::uint16_t*>(base)[i] = h;
      return st::widen<Format::kFP16>(h);
    }
    case Format::kBF16: {
      const std::uint16_t h = narrow_from_fp32<Format::kBF16>(value, OverflowMode::kNonSaturating);
      static_cast<std::uint16_t*>(base)[i] = h;
      return st::widen<Format::kBF16>(h);
    }
    default:
      static_cast<float*>(base)[i] = value;
      return __float_as_uint(value);
  }
}

// unscale_and_check_kernel, measuring the chunks of tensors with a stats slot.
__global__ void __launch_bounds__(kThreadsPerBlock)
    unscale_measure_kernel(const TensorTable table, float inv_scale, float* found_inf,
                           ::ampscope::cuda::detail::stats::DeviceThresholds th,
                           ::ampscope::cuda::detail::stats::StatsResult* __restrict__ slots) {
  namespace st = ::ampscope::cuda::detail::stats;
  __shared__ st::BlockStats block;
  const std::int64_t chunks = table.first_chunk[table.count];
  int bad = 0;
  for (std::int64_t chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {
    const int t = tensor_of_chunk(table, chunk);
    const std::int64_t begin = (chunk - table.first_chunk[t]) * kChunk;
    const std::int64_t end = begin + kChunk < table.numel[t] ? begin + kChunk : table.numel[t];
    void* data = table.data[t];
    const Format dtype = table.dtype[t];
    const int slot = table.stats_slot[t];
    if (slot < 0) {  // the same for the whole block
      for (std::int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
        const float g = load(data, dtype, i);
        bad |= is_finite(g) ? 0 : 1;
        store(data, dtype, i, g * inv_scale);
      }
      continue;
    }
    st::init_block(block);
    st::ThreadStats s;
    // Block-uniform trip count: every lane takes part in the warp-collective steps.
    for (std::int64_t base = begin; base < end; base += blockDim.x) {
      const std::int64_t i = base + threadIdx.x;
      const bool valid = i < end;
      std::uint32_t bits = 0;
      if (valid) {
        const float g = load(data, dtype, i);
        bad |= is_finite(g) ? 0 : 1;
        bits = store_and_widen(data, dtype, i, g * inv_scale);
      }
      st::process(s, block, bits, valid, th);
    }
    st::reduce_into_block(s, th.count, block);
    __syncthreads();
    st::flush_block(block, th.count, &slots[slot]);
    __syncthreads();  // the next chunk's init_block reuses the block's accumulators
  }
  if (__syncthreads_or(bad) != 0 && threadIdx.x == 0) *found_inf = 1.0f;
}

__global__ void reset_slots_kernel(::ampscope::cuda::detail::stats::StatsResult* slots,
                                   int count) {
  const int slot = blockIdx.x;
  if (slot >= count) return;
  auto* words = reinterpret_cast<unsigned long long*>(&slots[slot]);
  constexpr int kWords = sizeof(slots[0]) / sizeof(unsigned long long);
  for (int w = threadIdx.x; w < kWords; w += blockDim.x) words[w] = 0;
  __syncthreads();
  if (threadIdx.x == 0) slots[slot].min_abs_bits = 0xFFFFFFFFu;
}

// The tables of the launches over `grads`: at most kMultiTensorMaxPerLaunch tensors each.
std::vector<TensorTable> tables_of(std::span<const GradientTensor> grads) {
  std::vector<TensorTable> tables;
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
      table.stats_slot[i] = static_cast<short>(g.stats_slot);
      table.first_chunk[i] = chunks;
      chunks += (g.numel + kChunk - 1) / kChunk;
    }
    table.first_chunk[count] = chunks;
    tables.push_back(table);
  }
  return tables;
}

int unscale_blocks(std::int64_t chunks) {
  return std::min(
      static_cast<int>(std::min<std::int64_t>(chunks, 1 << 30)),
      grid_blocks(static_cast<std::size_t>(chunks) * kThreadsPerBlock, kMultiTensorBlocksPerSm));
}

void launch_unscale(std::span<const GradientTensor> grads, float inv_scale,
                    const LossScaleState* state, float* found_inf, cudaStream_t stream) {
  AMPSCOPE_CHECK(found_inf != nullptr, "unscale_and_check: found_inf is null");
  ::ampscope::cuda::detail::check_device_accessible(found_inf, "unscale_and_check: found_inf");
  for (const auto& g : grads)
    check_array(ConstArray{g.data, g.dtype}, g.numel, "unscale_and_check: gradient");
  for (const TensorTable& table : tables_of(grads)) {
    const std::int64_t chunks = table.first_chunk[table.count];
    if (chunks == 0) continue;
    unscale_and_check_kernel<<<unscale_blocks(chunks), kThreadsPerBlock, 0, stream>>>(
        table, inv_scale, state, found_inf);
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

// Per-block FP64 sums of a x b over the same fixed grid.
__global__ void products_partial_kernel(ConstArray a, ConstArray b, std::int64_t n,
                                        double* partials) {
  __shared__ double shared[kThreadsPerBlock / kWarpSize];
  double acc = 0.0;
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) {
    acc += static_cast<double>(load(a.data, a.dtype, i)) * load(b.data, b.dtype, i);
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

__global__ void sum_final_kernel(const double* partials, int count, double* out) {
  const double sum = sum_of_partials(partials, count);
  if (threadIdx.x == 0) *out = sum;
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

struct GradientStats::Impl {
  int capacity = 0;
  ::ampscope::cuda::detail::stats::StatsResult* device = nullptr;
  ::ampscope::cuda::detail::stats::StatsResult* host = nullptr;  // pinned
  cudaEvent_t done = nullptr;
  bool in_flight = false;
  std::vector<std::uint64_t> numel;  // per slot of the launch in flight
  std::vector<TargetSpec> targets;

  ~Impl() {
    // Destructors never throw; a failure here can only leak.
    if (in_flight && done != nullptr) (void)cudaEventSynchronize(done);
    if (done != nullptr) (void)cudaEventDestroy(done);
    if (device != nullptr) (void)cudaFree(device);
    if (host != nullptr) (void)cudaFreeHost(host);
  }
};

GradientStats::GradientStats(int capacity) : impl_(std::make_unique<Impl>()) {
  AMPSCOPE_CHECK(capacity >= 1 && capacity <= (1 << 15) - 1,
                 "GradientStats: capacity must be in [1, 32767], found ", capacity);
  impl_->capacity = capacity;
  const std::size_t bytes =
      static_cast<std::size_t>(capacity) * sizeof(::ampscope::cuda::detail::stats::StatsResult);
  AMPSCOPE_CHECK_CUDA(cudaMalloc(&impl_->device, bytes));
  AMPSCOPE_CHECK_CUDA(cudaMallocHost(&impl_->host, bytes));
  AMPSCOPE_CHECK_CUDA(cudaEventCreateWithFlags(&impl_->done, cudaEventDisableTiming));
}

GradientStats::~GradientStats() = default;

int GradientStats::capacity() const { return impl_->capacity; }

std::vector<TensorStats> GradientStats::wait() {
  AMPSCOPE_CHECK(impl_->in_flight, "GradientStats::wait() without a launch in flight");
  const detail::NvtxRange range{"ampscope::cuda::nn::GradientStats::wait"};
  impl_->in_flight = false;  // collected even on an error: the buffers stay reusable
  AMPSCOPE_CHECK_CUDA(cudaEventSynchronize(impl_->done));
  std::vector<TensorStats> out;
  out.reserve(impl_->numel.size());
  for (std::size_t slot = 0; slot < impl_->numel.size(); ++slot) {
    out.push_back(::ampscope::cuda::detail::stats::finish(impl_->host[slot], impl_->numel[slot],
                                                          impl_->targets));
  }
  return out;
}

void unscale_check_and_measure(std::span<const GradientTensor> grads, float inv_scale,
                               float* found_inf, std::span<const TargetSpec> targets,
                               GradientStats& stats, cudaStream_t stream) {
  using namespace detail;
  namespace st = ::ampscope::cuda::detail::stats;
  const NvtxRange range{"ampscope::cuda::nn::unscale_check_and_measure"};
  GradientStats::Impl& m = *stats.impl_;
  AMPSCOPE_CHECK(!m.in_flight, "unscale_check_and_measure: the previous results were not "
                               "collected with GradientStats::wait()");
  AMPSCOPE_CHECK(found_inf != nullptr, "unscale_check_and_measure: found_inf is null");
  ::ampscope::cuda::detail::check_device_accessible(found_inf,
                                                    "unscale_check_and_measure: found_inf");
  const st::DeviceThresholds th = st::device_thresholds(targets);
  std::vector<std::uint64_t> numel;
  for (const auto& g : grads) {
    check_array(ConstArray{g.data, g.dtype}, g.numel, "unscale_check_and_measure: gradient");
    if (g.stats_slot < 0) continue;
    AMPSCOPE_CHECK(g.stats_slot < m.capacity, "unscale_check_and_measure: slot ", g.stats_slot,
                   " outside the ", m.capacity, " of the GradientStats");
    const auto slot = static_cast<std::size_t>(g.stats_slot);
    if (numel.size() <= slot) numel.resize(slot + 1, ~std::uint64_t{0});
    AMPSCOPE_CHECK(numel[slot] == ~std::uint64_t{0}, "unscale_check_and_measure: slot ", slot,
                   " is used twice");
    numel[slot] = static_cast<std::uint64_t>(g.numel);
  }
  for (auto& n : numel) {
    if (n == ~std::uint64_t{0}) n = 0;  // a slot no tensor uses reads as an empty tensor
  }
  const auto slots = static_cast<int>(numel.size());
  if (slots > 0) {
    reset_slots_kernel<<<slots, kThreadsPerBlock, 0, stream>>>(m.device, slots);
    check_launch();
  }
  for (const TensorTable& table : tables_of(grads)) {
    const std::int64_t chunks = table.first_chunk[table.count];
    if (chunks == 0) continue;
    unscale_measure_kernel<<<unscale_blocks(chunks), kThreadsPerBlock, 0, stream>>>(
        table, inv_scale, found_inf, th, m.device);
    check_launch();
  }
  if (slots > 0) {
    AMPSCOPE_CHECK_CUDA(cudaMemcpyAsync(m.host, m.device,
                                        static_cast<std::size_t>(slots) * sizeof(st::StatsResult),
                                        cudaMemcpyDeviceToHost, stream));
  }
  AMPSCOPE_CHECK_CUDA(cudaEventRecord(m.done, stream));
  m.in_flight = true;
  m.numel = std::move(numel);
  m.targets.assign(targets.begin(), targets.end());
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

void sum_products(double* out, ConstArray a, ConstArray b, std::int64_t n, cudaStream_t stream) {
  using namespace detail;
  const NvtxRange range{"ampscope::cuda::nn::sum_products"};
  AMPSCOPE_CHECK(out != nullptr, "sum_products: out is null");
  ::ampscope::cuda::detail::check_device_accessible(out, "sum_products: out");
  check_array(a, n, "sum_products: a");
  check_array(b, n, "sum_products: b");
  const int blocks = std::max(1, grid_blocks(static_cast<std::size_t>(n), kSumSquaresBlocksPerSm));
  StreamScratch partials(static_cast<std::size_t>(blocks) * sizeof(double), stream);
  if (n > 0) {
    products_partial_kernel<<<blocks, kThreadsPerBlock, 0, stream>>>(a, b, n,
                                                                     partials.as<double>());
    check_launch();
  }
  sum_final_kernel<<<1, kThreadsPerBlock, 0, stream>>>(partials.as<double>(), n > 0 ? blocks : 0,
                                                       out);
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
