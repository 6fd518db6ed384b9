// Tensor statistics on the device (ampscope/cuda/tensor_stats.h).
//
// Design: one pass, one kernel per storage type (the dtype is a template parameter, chosen once
// by the launcher). Each thread widens its elements to FP32 bits and classifies them as the CPU
// kernels do (../cpu/stats_internal.h): magnitude-bit compares against the same
// TargetThresholds for the target counts, magnitude bits for the extrema, per-binade integers
// for the exact sums. The accumulation (registers, warp, shared memory, one global atomic per
// quantity and block) is stats_device.cuh's, which the fused unscale (nn_optimizer.cu) shares.
// Loads: 16-byte vectors over the aligned body; byte-assembled scalar loads for the unaligned
// head and tail, and for the whole tensor when it is not even element-aligned. All loops are
// warp-uniform, so the warp-collective steps always have the full warp.
// Counter widths: 32 bits inside a block; the launcher sizes the grid so that no block sees
// more than kMaxElementsPerBlock elements.
#include <cuda_fp16.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "ampscope/check.h"
#include "ampscope/cuda/check.h"
#include "ampscope/cuda/tensor_stats.h"
#include "runtime.cuh"
#include "stats_device.cuh"

namespace ampscope::cuda {
namespace detail {

namespace stats {

DeviceThresholds device_thresholds(std::span<const TargetSpec> targets) {
  AMPSCOPE_CHECK(targets.size() <= static_cast<std::size_t>(kMaxTargets), "expected at most ",
                 kMaxTargets, " targets, found ", targets.size());
  DeviceThresholds th;
  const std::vector<::ampscope::detail::TargetThresholds> host =
      ::ampscope::detail::compute_thresholds(targets);  // checks the scale range
  th.count = static_cast<int>(host.size());
  for (std::size_t t = 0; t < host.size(); ++t) {
    th.ovf_lo[t] = host[t].ovf_lo;
    th.ufl_hi[t] = host[t].ufl_hi;
    th.sub_hi[t] = host[t].sub_hi;
  }
  return th;
}

namespace {

// Adds u * 2^q exactly: u as two 32-bit halves, each exact in FP64.
void add_scaled(::ampscope::detail::ExactSum& sum, std::uint64_t u, int q, bool negative) {
  const double sign = negative ? -1.0 : 1.0;
  sum.add(sign * std::ldexp(static_cast<double>(u >> 32), q + 32));
  sum.add(sign * std::ldexp(static_cast<double>(u & 0xFFFFFFFFu), q));
}

}  // namespace

TensorStats finish(const StatsResult& r, std::uint64_t numel,
                   std::span<const TargetSpec> targets) {
  // The CPU accumulator's finish(), so that both back ends build TensorStats the same way.
  ::ampscope::detail::StatsAccumulator acc(targets.size());
  acc.numel = numel;
  acc.zeros = r.zeros;
  acc.nan = r.nan;
  acc.pos_inf = r.pos_inf;
  acc.neg_inf = r.neg_inf;
  acc.max_abs_bits = r.max_abs_bits;
  acc.min_abs_bits = r.min_abs_bits;
  for (int bin = 0; bin < kHistogramBins; ++bin) {
    acc.hist[static_cast<std::size_t>(bin)] = r.hist[bin];
    if (r.hist[bin] == 0) continue;
    const int q = bin_quantum(bin);
    const auto sum = static_cast<std::int64_t>(r.sum[bin]);  // two's complement
    const std::uint64_t magnitude =
        sum < 0 ? ~static_cast<std::uint64_t>(sum) + 1 : static_cast<std::uint64_t>(sum);
    add_scaled(acc.sum, magnitude, q, sum < 0);
    add_scaled(acc.sum_sq, r.sq_hi[bin], 2 * q + 24, false);
    add_scaled(acc.sum_sq, r.sq_lo[bin], 2 * q, false);
  }
  for (std::size_t t = 0; t < targets.size(); ++t) {
    for (int k = 0; k < 3; ++k) acc.target_counts[t][k] = r.targets[t][k];
  }
  return acc.finish(targets);
}

}  // namespace stats

namespace {

using stats::BlockStats;
using stats::DeviceThresholds;
using stats::StatsResult;
using stats::ThreadStats;

constexpr int kWarpSize = stats::kWarpSize;
constexpr std::size_t kVectorBytes = 16;
constexpr std::size_t kMaxElementsPerBlock = std::size_t{1} << 30;  // 32-bit block counters

// How the launcher split the tensor: [0, head) scalar, then `vectors` 16-byte vectors, then the
// scalar tail up to n. head == n (no vectors) when data is not element-aligned.
struct StatsSpan {
  const unsigned char* data;  // (n,) elements of the storage type, any alignment
  std::size_t n;
  std::size_t head;
  std::size_t vectors;
};

template <Format D>
constexpr int kStorageBytes = D == Format::kFP32 ? 4 : 2;
template <Format D>
constexpr int kPerVector = static_cast<int>(kVectorBytes) / kStorageBytes<D>;

__device__ std::size_t global_thread() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ std::size_t grid_threads() { return static_cast<std::size_t>(gridDim.x) * blockDim.x; }

// Element k of a 16-byte vector (little-endian: element 0 is in the low bits of v.x).
template <Format D>
__device__ std::uint32_t element_of(const uint4& v, int k) {
  const std::uint32_t words[4] = {v.x, v.y, v.z, v.w};
  if constexpr (kStorageBytes<D> == 4) {
    return words[k];
  } else {
    return (words[k / 2] >> (16 * (k % 2))) & 0xFFFFu;
  }
}

// Element i at any byte address, assembled from bytes.
template <Format D>
__device__ std::uint32_t load_unaligned(const unsigned char* data, std::size_t i) {
  std::uint32_t raw = 0;
#pragma unroll
  for (int b = 0; b < kStorageBytes<D>; ++b) {
    raw |= static_cast<std::uint32_t>(data[i * kStorageBytes<D> + b]) << (8 * b);
  }
  return raw;
}

template <Format D>
__global__ void __launch_bounds__(kThreadsPerBlock)
    stats_kernel(StatsSpan span, DeviceThresholds th, StatsResult* __restrict__ out) {
  __shared__ BlockStats block;
  stats::init_block(block);

  ThreadStats s;
  // Loops advance warp by warp so that all 32 lanes make the same number of steps.
  const std::size_t lane = threadIdx.x % kWarpSize;
  const std::size_t warp_first = global_thread() - lane;
  const std::size_t stride = grid_threads();

  const auto* body = reinterpret_cast<const uint4*>(span.data + span.head * kStorageBytes<D>);
  for (std::size_t base = warp_first; base < span.vectors; base += stride) {
    const std::size_t j = base + lane;
    const bool valid = j < span.vectors;
    const uint4 v = valid ? body[j] : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int k = 0; k < kPerVector<D>; ++k) {
      stats::process(s, block, stats::widen<D>(element_of<D>(v, k)), valid, th);
    }
  }

  // Head and tail as one index space: [0, head) then [body_end, n).
  const std::size_t body_end = span.head + span.vectors * kPerVector<D>;
  const std::size_t scalars = span.head + (span.n - body_end);
  for (std::size_t base = warp_first; base < scalars; base += stride) {
    const std::size_t j = base + lane;
    const bool valid = j < scalars;
    const std::size_t i = j < span.head ? j : body_end + (j - span.head);
    const std::uint32_t raw = valid ? load_unaligned<D>(span.data, i) : 0u;
    stats::process(s, block, stats::widen<D>(raw), valid, th);
  }

  stats::reduce_into_block(s, th.count, block);
  __syncthreads();
  stats::flush_block(block, th.count, out);
}

StatsSpan split(const void* data, std::size_t n, std::size_t elem_bytes) {
  StatsSpan span{static_cast<const unsigned char*>(data), n, n, 0};
  if (n == 0 || !is_aligned(data, elem_bytes)) return span;
  const auto address = reinterpret_cast<std::uintptr_t>(data);
  const std::size_t misalignment = address % kVectorBytes;
  const std::size_t head_bytes = misalignment == 0 ? 0 : kVectorBytes - misalignment;
  span.head = std::min(n, head_bytes / elem_bytes);
  span.vectors = (n - span.head) * elem_bytes / kVectorBytes;
  return span;
}

using StatsKernel = void (*)(StatsSpan, DeviceThresholds, StatsResult*);

StatsKernel kernel_for(Format dtype) {
  switch (dtype) {
    case Format::kFP16:
      return stats_kernel<Format::kFP16>;
    case Format::kBF16:
      return stats_kernel<Format::kBF16>;
    default:
      return stats_kernel<Format::kFP32>;
  }
}

}  // namespace
}  // namespace detail

struct CudaStatsJob::Impl {
  int max_targets = 0;
  int device = 0;
  std::array<int, kNumFormats> blocks_per_sm{};  // occupancy of each stats kernel
  detail::StatsResult* device_result = nullptr;
  detail::StatsResult* host_result = nullptr;  // pinned, written by the copy in launch()
  cudaEvent_t done = nullptr;
  bool in_flight = false;
  std::size_t numel = 0;
  std::vector<TargetSpec> targets;

  ~Impl() {
    // Destructors never throw; a failure here can only leak, and the process is told nothing.
    if (in_flight && done != nullptr) (void)cudaEventSynchronize(done);
    if (done != nullptr) (void)cudaEventDestroy(done);
    if (device_result != nullptr) (void)cudaFree(device_result);
    if (host_result != nullptr) (void)cudaFreeHost(host_result);
  }

  void check_launch_preconditions(const void* data, std::size_t n, Format dtype,
                                  std::span<const TargetSpec> targets_to_count) const;
  int grid_for(const detail::StatsSpan& span, Format dtype) const;
  void enqueue(const detail::StatsSpan& span, Format dtype, const detail::DeviceThresholds& th,
               cudaStream_t stream);
  TensorStats collect() const;
};

int CudaStatsJob::Impl::grid_for(const detail::StatsSpan& span, Format dtype) const {
  using detail::kMaxElementsPerBlock;
  const std::size_t per_vector = detail::kVectorBytes / storage_bytes(dtype);
  const std::size_t scalars = span.n - span.vectors * per_vector;
  const int covering =
      detail::grid_blocks(std::max(span.vectors, scalars), blocks_per_sm[static_cast<int>(dtype)]);
  // More blocks than the device holds at once only when a block would otherwise see more
  // elements than its 32-bit counters allow.
  const auto bounded = static_cast<int>((span.n + kMaxElementsPerBlock - 1) / kMaxElementsPerBlock);
  return std::max(covering, bounded);
}

// Reset, kernel, copy-back, event: all on `stream`, nothing waits.
void CudaStatsJob::Impl::enqueue(const detail::StatsSpan& span, Format dtype,
                                 const detail::DeviceThresholds& th, cudaStream_t stream) {
  detail::StatsResult* out = device_result;
  AMPSCOPE_CHECK_CUDA(cudaMemsetAsync(out, 0, sizeof(*out), stream));
  AMPSCOPE_CHECK_CUDA(cudaMemsetAsync(&out->min_abs_bits, 0xFF, sizeof(out->min_abs_bits), stream));
  if (span.n > 0) {
    detail::kernel_for(dtype)<<<grid_for(span, dtype), detail::kThreadsPerBlock, 0, stream>>>(
        span, th, out);
    AMPSCOPE_CHECK_CUDA(cudaGetLastError());
  }
  AMPSCOPE_CHECK_CUDA(
      cudaMemcpyAsync(host_result, out, sizeof(*out), cudaMemcpyDeviceToHost, stream));
  AMPSCOPE_CHECK_CUDA(cudaEventRecord(done, stream));
}

void CudaStatsJob::Impl::check_launch_preconditions(
    const void* data, std::size_t n, Format dtype,
    std::span<const TargetSpec> targets_to_count) const {
  AMPSCOPE_CHECK(!in_flight, "the previous launch has not been collected with wait()");
  // FP8 storage is measured on the host only so far (compute_stats' 8-bit pattern kernel).
  AMPSCOPE_CHECK(dtype == Format::kFP32 || dtype == Format::kFP16 || dtype == Format::kBF16,
                 "device statistics read fp32, fp16 or bf16 storage, not format ",
                 static_cast<int>(dtype));
  AMPSCOPE_CHECK(targets_to_count.size() <= static_cast<std::size_t>(max_targets),
                 "expected at most ", max_targets, " targets, found ", targets_to_count.size());
  const int current = detail::current_device();
  AMPSCOPE_CHECK(current == device, "the job was created on device ", device, " but device ",
                 current, " is current");
  if (n > 0) detail::check_device_accessible(data, "device_data");
}

TensorStats CudaStatsJob::Impl::collect() const {
  return detail::stats::finish(*host_result, numel, targets);
}

CudaStatsJob::CudaStatsJob(int max_targets) : impl_(std::make_unique<Impl>()) {
  AMPSCOPE_CHECK(max_targets >= 0 && max_targets <= kCudaStatsMaxTargets,
                 "max_targets must be in [0, ", kCudaStatsMaxTargets, "], found ", max_targets);
  impl_->max_targets = max_targets;
  impl_->device = detail::current_device();
  for (Format f : {Format::kFP32, Format::kFP16, Format::kBF16}) {
    AMPSCOPE_CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &impl_->blocks_per_sm[static_cast<int>(f)], detail::kernel_for(f), detail::kThreadsPerBlock,
        0));
  }
  // A throw below leaves impl_ to free what was already allocated.
  AMPSCOPE_CHECK_CUDA(cudaMalloc(&impl_->device_result, sizeof(detail::StatsResult)));
  AMPSCOPE_CHECK_CUDA(cudaMallocHost(&impl_->host_result, sizeof(detail::StatsResult)));
  AMPSCOPE_CHECK_CUDA(cudaEventCreateWithFlags(&impl_->done, cudaEventDisableTiming));
}

CudaStatsJob::~CudaStatsJob() = default;
CudaStatsJob::CudaStatsJob(CudaStatsJob&&) noexcept = default;
CudaStatsJob& CudaStatsJob::operator=(CudaStatsJob&&) noexcept = default;

int CudaStatsJob::max_targets() const { return impl_ ? impl_->max_targets : 0; }

void CudaStatsJob::launch(const void* device_data, std::size_t n, Format dtype,
                          std::span<const TargetSpec> targets, cudaStream_t stream) {
  const detail::NvtxRange range{"ampscope::cuda::CudaStatsJob::launch"};
  AMPSCOPE_CHECK(impl_ != nullptr, "launch() on a moved-from CudaStatsJob");
  impl_->check_launch_preconditions(device_data, n, dtype, targets);
  const detail::DeviceThresholds th = detail::stats::device_thresholds(targets);
  const auto elem_bytes = static_cast<std::size_t>(storage_bytes(dtype));
  impl_->enqueue(detail::split(device_data, n, elem_bytes), dtype, th, stream);
  impl_->in_flight = true;
  impl_->numel = n;
  impl_->targets.assign(targets.begin(), targets.end());
}

bool CudaStatsJob::ready() const {
  if (!impl_ || !impl_->in_flight) return false;
  const cudaError_t status = cudaEventQuery(impl_->done);
  if (status == cudaErrorNotReady) return false;
  AMPSCOPE_CHECK_CUDA(status);
  return true;
}

TensorStats CudaStatsJob::wait() {
  AMPSCOPE_CHECK(impl_ != nullptr, "wait() on a moved-from CudaStatsJob");
  AMPSCOPE_CHECK(impl_->in_flight, "wait() without a launch in flight");
  const detail::NvtxRange range{"ampscope::cuda::CudaStatsJob::wait"};
  // The launch is collected even if CUDA reports an error: the job must stay reusable.
  impl_->in_flight = false;
  AMPSCOPE_CHECK_CUDA(cudaEventSynchronize(impl_->done));
  return impl_->collect();
}

}  // namespace ampscope::cuda
