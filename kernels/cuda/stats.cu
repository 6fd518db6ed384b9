// Tensor statistics on the device (ampscope/cuda/tensor_stats.h).
//
// Design: one pass, one kernel per storage type (the dtype is a template parameter, chosen once
// by the launcher). Each thread widens its elements to FP32 bits and classifies them as the CPU
// kernels do (../cpu/stats_internal.h): magnitude-bit compares against the same
// TargetThresholds for the target counts, magnitude bits for the extrema, FP64 for the sums.
// Per-thread partials live in registers (target counters unrolled to kCudaStatsMaxTargets),
// are reduced across the warp with __reduce_*_sync / shuffles and across the block with shared
// atomics, and reach the job's device accumulators with one global atomic per quantity and
// block. The binade histogram is block-private in shared memory; lanes of a warp that land in
// the same bin elect one of them to add the group's count (__match_any_sync), so a tensor whose
// values sit in a few binades (the usual case) does not serialise on one shared address.
// Loads: 16-byte vectors over the aligned body; byte-assembled scalar loads for the unaligned
// head and tail, and for the whole tensor when it is not even element-aligned. All loops are
// warp-uniform, so the warp-collective histogram step always has the full warp.
// Counter widths: 32 bits inside a block; the launcher sizes the grid so that no block sees
// more than kMaxElementsPerBlock elements.
#include <cuda_fp16.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "../cpu/stats_internal.h"
#include "ampscope/check.h"
#include "ampscope/cuda/check.h"
#include "ampscope/cuda/tensor_stats.h"
#include "runtime.cuh"

namespace ampscope::cuda {
namespace detail {
namespace {

using ::ampscope::detail::kAbsMask;
using ::ampscope::detail::kInfBits;

constexpr int kMaxTargets = kCudaStatsMaxTargets;
constexpr int kWarpSize = 32;
constexpr unsigned kFullWarp = 0xFFFFFFFFu;
constexpr int kNoBin = kHistogramBins;  // an element that is not finite and nonzero
constexpr std::size_t kVectorBytes = 16;
constexpr std::size_t kMaxElementsPerBlock = std::size_t{1} << 30;  // 32-bit block counters

// TargetThresholds of up to kMaxTargets targets, passed by value (kernel parameter space).
struct DeviceThresholds {
  int count = 0;
  std::uint32_t ovf_lo[kMaxTargets] = {};
  std::uint32_t ufl_hi[kMaxTargets] = {};
  std::uint32_t sub_hi[kMaxTargets] = {};
};

// The job's device accumulators; copied as they are into the pinned host buffer.
struct StatsResult {
  unsigned long long zeros;
  unsigned long long nan;
  unsigned long long pos_inf;
  unsigned long long neg_inf;
  unsigned long long targets[kMaxTargets][3];  // overflow, underflow, subnormal
  unsigned long long hist[kHistogramBins];     // index = floor(log2|x|) - kHistogramMinExponent
  double sum;
  double sum_sq;
  unsigned int max_abs_bits;
  unsigned int min_abs_bits;  // 0xFFFFFFFF until a finite nonzero value is seen (as on the CPU)
};

// How the launcher split the tensor: [0, head) scalar, then `vectors` 16-byte vectors, then the
// scalar tail up to n. head == n (no vectors) when data is not element-aligned.
struct StatsSpan {
  const unsigned char* data;  // (n,) elements of the storage type, any alignment
  std::size_t n;
  std::size_t head;
  std::size_t vectors;
};

struct ThreadStats {
  std::uint32_t zeros = 0;
  std::uint32_t nan = 0;
  std::uint32_t pos_inf = 0;
  std::uint32_t neg_inf = 0;
  std::uint32_t max_abs = 0;
  std::uint32_t min_abs = 0xFFFFFFFFu;
  double sum = 0.0;
  double sum_sq = 0.0;
  std::uint32_t targets[kMaxTargets][3] = {};
};

// The block's totals in shared memory, fed by one lane per warp.
struct BlockTotals {
  unsigned int zeros;
  unsigned int nan;
  unsigned int pos_inf;
  unsigned int neg_inf;
  unsigned int max_abs;
  unsigned int min_abs;
  unsigned int targets[kMaxTargets][3];
  double sum;
  double sum_sq;
};

template <Format D>
constexpr int kStorageBytes = D == Format::kFP32 ? 4 : 2;
template <Format D>
constexpr int kPerVector = static_cast<int>(kVectorBytes) / kStorageBytes<D>;

__device__ std::size_t global_thread() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ std::size_t grid_threads() { return static_cast<std::size_t>(gridDim.x) * blockDim.x; }

// Storage bits -> FP32 bits. Exact for every value; a NaN stays a NaN (payload irrelevant here).
template <Format D>
__device__ std::uint32_t widen(std::uint32_t raw) {
  if constexpr (D == Format::kFP32) {
    return raw;
  } else if constexpr (D == Format::kBF16) {
    return raw << 16;
  } else {
    return __float_as_uint(__half2float(__ushort_as_half(static_cast<unsigned short>(raw))));
  }
}

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

// floor(log2|x|) - kHistogramMinExponent for finite nonzero magnitude bits.
__device__ int binade_bin(std::uint32_t a) {
  const int biased = static_cast<int>(a >> 23);
  if (biased != 0) return biased - 127 - kHistogramMinExponent;
  return 31 - __clz(a);  // subnormal: a * 2^-149, binade -149 + floor(log2 a)
}

__device__ void count_nonfinite(ThreadStats& s, std::uint32_t bits, std::uint32_t a) {
  if (a > kInfBits) {
    ++s.nan;
  } else if (bits >> 31) {
    ++s.neg_inf;
  } else {
    ++s.pos_inf;
  }
}

__device__ void count_finite_nonzero(ThreadStats& s, std::uint32_t bits, std::uint32_t a,
                                     const DeviceThresholds& th) {
  s.max_abs = max(s.max_abs, a);
  s.min_abs = min(s.min_abs, a);
  const double v = static_cast<double>(__uint_as_float(bits));
  s.sum += v;
  s.sum_sq += v * v;
#pragma unroll
  for (int t = 0; t < kMaxTargets; ++t) {
    if (t < th.count) {  // uniform across the grid: th is a kernel parameter
      s.targets[t][0] += a >= th.ovf_lo[t];
      s.targets[t][1] += a <= th.ufl_hi[t];
      s.targets[t][2] += (a > th.ufl_hi[t]) & (a <= th.sub_hi[t]);
    }
  }
}

// Counts one element into s and returns its histogram bin, kNoBin when it has none.
__device__ int classify(ThreadStats& s, std::uint32_t bits, const DeviceThresholds& th) {
  const std::uint32_t a = bits & kAbsMask;
  if (a >= kInfBits) {
    count_nonfinite(s, bits, a);
    return kNoBin;
  }
  if (a == 0) {
    ++s.zeros;
    return kNoBin;
  }
  count_finite_nonzero(s, bits, a, th);
  return binade_bin(a);
}

// Warp-collective: every lane of the warp calls it, with kNoBin when it has nothing to add.
__device__ void add_to_histogram(unsigned int* hist, int bin) {
  const unsigned peers = __match_any_sync(kFullWarp, bin);
  const int leader = __ffs(peers) - 1;
  if (bin != kNoBin && static_cast<int>(threadIdx.x % kWarpSize) == leader) {
    atomicAdd(&hist[bin], static_cast<unsigned int>(__popc(peers)));
  }
}

// Warp-collective; `valid` is false for the lanes past the end of the data.
__device__ void process(ThreadStats& s, unsigned int* hist, std::uint32_t bits, bool valid,
                        const DeviceThresholds& th) {
  add_to_histogram(hist, valid ? classify(s, bits, th) : kNoBin);
}

__device__ double warp_sum(double x) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    x += __shfl_xor_sync(kFullWarp, x, offset);
  }
  return x;
}

__device__ void init_block(unsigned int* hist, BlockTotals& totals) {
  for (int b = threadIdx.x; b < kHistogramBins; b += blockDim.x) hist[b] = 0;
  if (threadIdx.x == 0) {
    totals = BlockTotals{};
    totals.min_abs = 0xFFFFFFFFu;
  }
  __syncthreads();
}

// Warp reductions, then one shared atomic per quantity and warp.
__device__ void reduce_into_block(const ThreadStats& s, int num_targets, BlockTotals& totals) {
  const unsigned zeros = __reduce_add_sync(kFullWarp, s.zeros);
  const unsigned nan = __reduce_add_sync(kFullWarp, s.nan);
  const unsigned pos_inf = __reduce_add_sync(kFullWarp, s.pos_inf);
  const unsigned neg_inf = __reduce_add_sync(kFullWarp, s.neg_inf);
  const unsigned max_abs = __reduce_max_sync(kFullWarp, s.max_abs);
  const unsigned min_abs = __reduce_min_sync(kFullWarp, s.min_abs);
  const double sum = warp_sum(s.sum);
  const double sum_sq = warp_sum(s.sum_sq);
  unsigned targets[kMaxTargets][3];
#pragma unroll
  for (int t = 0; t < kMaxTargets; ++t) {
#pragma unroll
    for (int k = 0; k < 3; ++k) {
      targets[t][k] = t < num_targets ? __reduce_add_sync(kFullWarp, s.targets[t][k]) : 0;
    }
  }
  if (threadIdx.x % kWarpSize != 0) return;
  atomicAdd(&totals.zeros, zeros);
  atomicAdd(&totals.nan, nan);
  atomicAdd(&totals.pos_inf, pos_inf);
  atomicAdd(&totals.neg_inf, neg_inf);
  atomicMax(&totals.max_abs, max_abs);
  atomicMin(&totals.min_abs, min_abs);
  atomicAdd(&totals.sum, sum);
  atomicAdd(&totals.sum_sq, sum_sq);
#pragma unroll
  for (int t = 0; t < kMaxTargets; ++t) {
#pragma unroll
    for (int k = 0; k < 3; ++k) {
      if (targets[t][k] != 0) atomicAdd(&totals.targets[t][k], targets[t][k]);
    }
  }
}

// One global atomic per nonzero quantity of the block.
__device__ void flush_block(const unsigned int* hist, const BlockTotals& totals, int num_targets,
                            StatsResult* out) {
  using ull = unsigned long long;
  for (int b = threadIdx.x; b < kHistogramBins; b += blockDim.x) {
    if (hist[b] != 0) atomicAdd(&out->hist[b], static_cast<ull>(hist[b]));
  }
  for (int i = threadIdx.x; i < num_targets * 3; i += blockDim.x) {
    const unsigned count = totals.targets[i / 3][i % 3];
    if (count != 0) atomicAdd(&out->targets[i / 3][i % 3], static_cast<ull>(count));
  }
  if (threadIdx.x != 0) return;
  if (totals.zeros != 0) atomicAdd(&out->zeros, static_cast<ull>(totals.zeros));
  if (totals.nan != 0) atomicAdd(&out->nan, static_cast<ull>(totals.nan));
  if (totals.pos_inf != 0) atomicAdd(&out->pos_inf, static_cast<ull>(totals.pos_inf));
  if (totals.neg_inf != 0) atomicAdd(&out->neg_inf, static_cast<ull>(totals.neg_inf));
  atomicMax(&out->max_abs_bits, totals.max_abs);
  atomicMin(&out->min_abs_bits, totals.min_abs);
  atomicAdd(&out->sum, totals.sum);
  atomicAdd(&out->sum_sq, totals.sum_sq);
}

template <Format D>
__global__ void __launch_bounds__(kThreadsPerBlock)
    stats_kernel(StatsSpan span, DeviceThresholds th, StatsResult* __restrict__ out) {
  __shared__ unsigned int hist[kHistogramBins];
  __shared__ BlockTotals totals;
  init_block(hist, totals);

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
      process(s, hist, widen<D>(element_of<D>(v, k)), valid, th);
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
    process(s, hist, widen<D>(raw), valid, th);
  }

  reduce_into_block(s, th.count, totals);
  __syncthreads();
  flush_block(hist, totals, th.count, out);
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

DeviceThresholds device_thresholds(std::span<const TargetSpec> targets) {
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
  AMPSCOPE_CHECK(is_stats_storage_format(dtype), "statistics read fp32, fp16 or bf16 storage, ",
                 "not format ", static_cast<int>(dtype));
  AMPSCOPE_CHECK(targets_to_count.size() <= static_cast<std::size_t>(max_targets),
                 "expected at most ", max_targets, " targets, found ", targets_to_count.size());
  const int current = detail::current_device();
  AMPSCOPE_CHECK(current == device, "the job was created on device ", device, " but device ",
                 current, " is current");
  if (n > 0) detail::check_device_accessible(data, "device_data");
}

TensorStats CudaStatsJob::Impl::collect() const {
  // Reuse the CPU accumulator's finish() so both back ends build TensorStats the same way.
  const detail::StatsResult& r = *host_result;
  ::ampscope::detail::StatsAccumulator acc(targets.size());
  acc.numel = numel;
  acc.zeros = r.zeros;
  acc.nan = r.nan;
  acc.pos_inf = r.pos_inf;
  acc.neg_inf = r.neg_inf;
  acc.max_abs_bits = r.max_abs_bits;
  acc.min_abs_bits = r.min_abs_bits;
  acc.sum = r.sum;
  acc.sum_sq = r.sum_sq;
  std::copy(std::begin(r.hist), std::end(r.hist), acc.hist.begin());
  for (std::size_t t = 0; t < targets.size(); ++t) {
    for (int k = 0; k < 3; ++k) acc.target_counts[t][k] = r.targets[t][k];
  }
  return acc.finish(targets);
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
  const detail::DeviceThresholds th = detail::device_thresholds(targets);
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
