// The device side of tensor statistics, shared by the statistics kernel (stats.cu) and the
// kernels that measure what they read anyway (the fused multi-tensor unscale, nn_optimizer.cu):
// one classification of an element, one block accumulator, one result layout, one host finish.
//
// Counts, extrema and target counts: 32-bit per thread, reduced across the warp with
// __reduce_*_sync, across the block with shared atomics, into the result with one global atomic
// per quantity and block. The binade histogram is block-private in shared memory; lanes of a
// warp that land in the same bin elect one of them to add the group's count (__match_any_sync).
//
// Exact sums. Every finite nonzero FP32 value is v * 2^q with v an integer below 2^24, where q
// depends only on its binade e: q = e - 23 for normal values, -149 for subnormal ones. So the
// values of one binade sum exactly as integers: per binade, the sum of the signed v and, for
// the squares, of v^2 split into its high and low 24 bits. The same peer group that adds the
// histogram count adds the group's integer sums (each under 2^29) into 64-bit shared
// accumulators, and blocks add theirs into the result's (exact below 2^39 values per binade).
// The host turns the per-binade integers into the exactly rounded FP64 sum and sum of squares
// (ExactSum, ../cpu/stats_internal.h), as the CPU kernels produce them: the order of the
// additions on the device does not matter, and results are the same from run to run.
//
// All warp-collective functions must be called by every lane of the warp (loops warp-uniform).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>
#include <span>

#include "../cpu/stats_internal.h"
#include "ampscope/cuda/tensor_stats.h"
#include "ampscope/formats.h"
#include "ampscope/tensor_stats.h"

namespace ampscope::cuda::detail::stats {

using ::ampscope::detail::kAbsMask;
using ::ampscope::detail::kInfBits;

inline constexpr int kMaxTargets = kCudaStatsMaxTargets;
inline constexpr int kWarpSize = 32;
inline constexpr unsigned kFullWarp = 0xFFFFFFFFu;
inline constexpr int kNoBin = kHistogramBins;  // an element that is not finite and nonzero

// TargetThresholds of up to kMaxTargets targets, passed by value (kernel parameter space).
struct DeviceThresholds {
  int count = 0;
  std::uint32_t ovf_lo[kMaxTargets] = {};
  std::uint32_t ufl_hi[kMaxTargets] = {};
  std::uint32_t sub_hi[kMaxTargets] = {};
};

// The device accumulators of one tensor; copied as they are to the host. Zeroed before use,
// except min_abs_bits (0xFFFFFFFF until a finite nonzero value is seen, as on the CPU).
struct StatsResult {
  unsigned long long zeros;
  unsigned long long nan;
  unsigned long long pos_inf;
  unsigned long long neg_inf;
  unsigned long long targets[kMaxTargets][3];  // overflow, underflow, subnormal
  unsigned long long hist[kHistogramBins];     // index = floor(log2|x|) - kHistogramMinExponent
  unsigned long long sum[kHistogramBins];      // per binade: sum of signed v (two's complement)
  unsigned long long sq_hi[kHistogramBins];    // per binade: sum of v^2 >> 24
  unsigned long long sq_lo[kHistogramBins];    // per binade: sum of v^2 & (2^24 - 1)
  unsigned int max_abs_bits;
  unsigned int min_abs_bits;
};

// A thread's partials in registers.
struct ThreadStats {
  std::uint32_t zeros = 0;
  std::uint32_t nan = 0;
  std::uint32_t pos_inf = 0;
  std::uint32_t neg_inf = 0;
  std::uint32_t max_abs = 0;
  std::uint32_t min_abs = 0xFFFFFFFFu;
  std::uint32_t targets[kMaxTargets][3] = {};
};

// A block's accumulators in shared memory.
struct BlockStats {
  unsigned int hist[kHistogramBins];
  unsigned long long sum[kHistogramBins];
  unsigned long long sq_hi[kHistogramBins];
  unsigned long long sq_lo[kHistogramBins];
  unsigned int zeros;
  unsigned int nan;
  unsigned int pos_inf;
  unsigned int neg_inf;
  unsigned int max_abs;
  unsigned int min_abs;
  unsigned int targets[kMaxTargets][3];
};

// One element as the integer sums see it: its bin and v (signed), kNoBin when it has none.
struct Binned {
  int bin = kNoBin;
  int v = 0;
};

// FP32 bits of a storage element (exact; a NaN stays a NaN).
template <Format D>
__device__ inline std::uint32_t widen(std::uint32_t raw) {
  if constexpr (D == Format::kFP32) {
    return raw;
  } else if constexpr (D == Format::kBF16) {
    return raw << 16;
  } else {
    return __float_as_uint(__half2float(__ushort_as_half(static_cast<unsigned short>(raw))));
  }
}

// floor(log2|x|) - kHistogramMinExponent for finite nonzero magnitude bits.
__device__ inline int binade_bin(std::uint32_t a) {
  const int biased = static_cast<int>(a >> 23);
  if (biased != 0) return biased - 127 - kHistogramMinExponent;
  return 31 - __clz(a);  // subnormal: a * 2^-149, binade -149 + floor(log2 a)
}

// The exponent q of a bin's integers: x = v * 2^q.
__host__ __device__ inline int bin_quantum(int bin) {
  return bin <= 23 ? -149 : bin + kHistogramMinExponent - 23;
}

__device__ inline void count_nonfinite(ThreadStats& s, std::uint32_t bits, std::uint32_t a) {
  if (a > kInfBits) {
    ++s.nan;
  } else if (bits >> 31) {
    ++s.neg_inf;
  } else {
    ++s.pos_inf;
  }
}

__device__ inline void count_finite_nonzero(ThreadStats& s, std::uint32_t a,
                                            const DeviceThresholds& th) {
  s.max_abs = max(s.max_abs, a);
  s.min_abs = min(s.min_abs, a);
#pragma unroll
  for (int t = 0; t < kMaxTargets; ++t) {
    if (t < th.count) {  // uniform across the grid: th is a kernel parameter
      s.targets[t][0] += a >= th.ovf_lo[t];
      s.targets[t][1] += a <= th.ufl_hi[t];
      s.targets[t][2] += (a > th.ufl_hi[t]) & (a <= th.sub_hi[t]);
    }
  }
}

// Counts one element (FP32 bits) into s and returns its bin and integer.
__device__ inline Binned classify(ThreadStats& s, std::uint32_t bits,
                                  const DeviceThresholds& th) {
  const std::uint32_t a = bits & kAbsMask;
  if (a >= kInfBits) {
    count_nonfinite(s, bits, a);
    return {};
  }
  if (a == 0) {
    ++s.zeros;
    return {};
  }
  count_finite_nonzero(s, a, th);
  const std::uint32_t frac = a & 0x7FFFFFu;
  const auto v = static_cast<int>((a >> 23) != 0 ? (frac | 0x800000u) : frac);
  return {binade_bin(a), (bits >> 31) != 0 ? -v : v};
}

// Warp-collective: adds each lane's element to the block's histogram and integer sums (lanes
// with kNoBin add nothing). One lane per distinct bin does the shared atomics.
__device__ inline void add_to_block(BlockStats& b, Binned e) {
  const unsigned peers = __match_any_sync(kFullWarp, e.bin);
  const auto mag = static_cast<std::uint64_t>(e.v < 0 ? -e.v : e.v);
  const std::uint64_t sq = mag * mag;
  // Group sums: at most 32 terms below 2^24 each.
  const int sum = __reduce_add_sync(peers, e.v);
  const unsigned hi = __reduce_add_sync(peers, static_cast<unsigned>(sq >> 24));
  const unsigned lo = __reduce_add_sync(peers, static_cast<unsigned>(sq & 0xFFFFFFu));
  const int leader = __ffs(peers) - 1;
  if (e.bin == kNoBin || static_cast<int>(threadIdx.x % kWarpSize) != leader) return;
  atomicAdd(&b.hist[e.bin], static_cast<unsigned int>(__popc(peers)));
  atomicAdd(&b.sum[e.bin], static_cast<unsigned long long>(static_cast<long long>(sum)));
  atomicAdd(&b.sq_hi[e.bin], static_cast<unsigned long long>(hi));
  atomicAdd(&b.sq_lo[e.bin], static_cast<unsigned long long>(lo));
}

// Warp-collective; `valid` is false for the lanes past the end of the data.
__device__ inline void process(ThreadStats& s, BlockStats& b, std::uint32_t bits, bool valid,
                               const DeviceThresholds& th) {
  add_to_block(b, valid ? classify(s, bits, th) : Binned{});
}

// Block-collective: zeroes the block's accumulators.
__device__ inline void init_block(BlockStats& b) {
  for (int i = threadIdx.x; i < kHistogramBins; i += blockDim.x) {
    b.hist[i] = 0;
    b.sum[i] = 0;
    b.sq_hi[i] = 0;
    b.sq_lo[i] = 0;
  }
  if (threadIdx.x == 0) {
    b.zeros = b.nan = b.pos_inf = b.neg_inf = 0;
    b.max_abs = 0;
    b.min_abs = 0xFFFFFFFFu;
    for (int t = 0; t < kMaxTargets; ++t) b.targets[t][0] = b.targets[t][1] = b.targets[t][2] = 0;
  }
  __syncthreads();
}

// Warp reductions of the thread partials, then one shared atomic per quantity and warp.
__device__ inline void reduce_into_block(const ThreadStats& s, int num_targets, BlockStats& b) {
  const unsigned zeros = __reduce_add_sync(kFullWarp, s.zeros);
  const unsigned nan = __reduce_add_sync(kFullWarp, s.nan);
  const unsigned pos_inf = __reduce_add_sync(kFullWarp, s.pos_inf);
  const unsigned neg_inf = __reduce_add_sync(kFullWarp, s.neg_inf);
  const unsigned max_abs = __reduce_max_sync(kFullWarp, s.max_abs);
  const unsigned min_abs = __reduce_min_sync(kFullWarp, s.min_abs);
  unsigned targets[kMaxTargets][3];
#pragma unroll
  for (int t = 0; t < kMaxTargets; ++t) {
#pragma unroll
    for (int k = 0; k < 3; ++k) {
      targets[t][k] = t < num_targets ? __reduce_add_sync(kFullWarp, s.targets[t][k]) : 0;
    }
  }
  if (threadIdx.x % kWarpSize != 0) return;
  atomicAdd(&b.zeros, zeros);
  atomicAdd(&b.nan, nan);
  atomicAdd(&b.pos_inf, pos_inf);
  atomicAdd(&b.neg_inf, neg_inf);
  atomicMax(&b.max_abs, max_abs);
  atomicMin(&b.min_abs, min_abs);
#pragma unroll
  for (int t = 0; t < kMaxTargets; ++t) {
#pragma unroll
    for (int k = 0; k < 3; ++k) {
      if (targets[t][k] != 0) atomicAdd(&b.targets[t][k], targets[t][k]);
    }
  }
}

// Block-collective (after a __syncthreads that follows reduce_into_block): one global atomic
// per nonzero quantity of the block.
__device__ inline void flush_block(const BlockStats& b, int num_targets, StatsResult* out) {
  using ull = unsigned long long;
  for (int i = threadIdx.x; i < kHistogramBins; i += blockDim.x) {
    if (b.hist[i] == 0) continue;
    atomicAdd(&out->hist[i], static_cast<ull>(b.hist[i]));
    if (b.sum[i] != 0) atomicAdd(&out->sum[i], b.sum[i]);
    if (b.sq_hi[i] != 0) atomicAdd(&out->sq_hi[i], b.sq_hi[i]);
    if (b.sq_lo[i] != 0) atomicAdd(&out->sq_lo[i], b.sq_lo[i]);
  }
  for (int i = threadIdx.x; i < num_targets * 3; i += blockDim.x) {
    const unsigned count = b.targets[i / 3][i % 3];
    if (count != 0) atomicAdd(&out->targets[i / 3][i % 3], static_cast<ull>(count));
  }
  if (threadIdx.x != 0) return;
  if (b.zeros != 0) atomicAdd(&out->zeros, static_cast<ull>(b.zeros));
  if (b.nan != 0) atomicAdd(&out->nan, static_cast<ull>(b.nan));
  if (b.pos_inf != 0) atomicAdd(&out->pos_inf, static_cast<ull>(b.pos_inf));
  if (b.neg_inf != 0) atomicAdd(&out->neg_inf, static_cast<ull>(b.neg_inf));
  atomicMax(&out->max_abs_bits, b.max_abs);
  atomicMin(&out->min_abs_bits, b.min_abs);
}

// Host side (stats.cu). The thresholds of `targets` (at most kMaxTargets; checks each scale's
// range), and the TensorStats of a result: the CPU accumulator's finish(), with the sums
// rounded exactly from the per-binade integers.
DeviceThresholds device_thresholds(std::span<const TargetSpec> targets);
TensorStats finish(const StatsResult& r, std::uint64_t numel, std::span<const TargetSpec> targets);

}  // namespace ampscope::cuda::detail::stats
