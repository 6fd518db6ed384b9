// Tensor statistics: the core measurement of ampscope.
//
// One pass over a tensor stored as FP32, FP16, BF16, FP8 E4M3 or FP8 E5M2 yields TensorStats:
//   - numel, zeros, nan, pos_inf, neg_inf
//   - max_abs and min_abs_nonzero over finite values; sum and sum_sq over finite values: sum is
//     the exactly rounded (nearest even) sum however much it cancels, sum_sq is within a few
//     units in the last place (each chunk of 512 values is summed in FP64, the chunks exactly),
//     at every SIMD level and thread count
//   - the binade histogram: for each finite nonzero x, bin e = floor(log2|x|), e in [-149, 127]
//   - exact overflow/underflow/subnormal counts for each (target format, scale 2^k) pair: what
//     happens to x * 2^k when it is rounded (to nearest even) into the target format.
// Values are measured as stored. Non-finite inputs are counted in nan/pos_inf/neg_inf only;
// they are not in the histogram, the sums, the extrema or the target counts.
//
// Target counts, with y = x * 2^k and thresholds from formats.h (decided on the rounded value):
//   overflow:  y finite and |y| rounds above max finite (|y| >= max + ulp/2, or > for E4M3)
//   underflow: y != 0 and |y| rounds to zero            (|y| <= min_subnormal / 2)
//   subnormal: y rounds to a nonzero value below min normal
//              (min_subnormal / 2 < |y| < min_normal - min_subnormal / 2)
//
// Thread safety: compute_* functions are re-entrant; they use a shared bounded worker pool for
// large tensors. TensorStats is a plain value type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ampscope/cpu_features.h"
#include "ampscope/formats.h"

namespace ampscope {

inline constexpr int kHistogramMinExponent = -149;  // smallest FP32 subnormal is 2^-149
inline constexpr int kHistogramMaxExponent = 127;   // FP32 max finite < 2^128
inline constexpr int kHistogramBins = kHistogramMaxExponent - kHistogramMinExponent + 1;
// Power-of-two scales are bounded so x * 2^k stays exact in FP64 for every FP32 x.
inline constexpr int kMaxScaleLog2 = 256;

// A what-if question: x * 2^scale_log2 rounded into `format`.
struct TargetSpec {
  Format format = Format::kFP16;
  int scale_log2 = 0;
  friend bool operator==(const TargetSpec&, const TargetSpec&) = default;
};

// Parses "fp16@16", "e4m3@-3", "bf16" (scale 0). nullopt with a reason in *error on failure.
std::optional<TargetSpec> parse_target(std::string_view text, std::string* error = nullptr);
std::string to_string(const TargetSpec& t);

struct TargetCounts {
  TargetSpec target;
  std::uint64_t overflow = 0;
  std::uint64_t underflow = 0;
  std::uint64_t subnormal = 0;
  friend bool operator==(const TargetCounts&, const TargetCounts&) = default;
};

// Sparse binade histogram: counts[i] is the number of finite nonzero values with
// floor(log2|x|) == min_exponent + i. Empty when there are none (min_exponent is then 0).
struct BinadeHistogram {
  int min_exponent = 0;
  std::vector<std::uint64_t> counts;

  bool empty() const { return counts.empty(); }
  int max_exponent() const { return min_exponent + static_cast<int>(counts.size()) - 1; }
  std::uint64_t count_at(int exponent) const;
  std::uint64_t total() const;
  // Builds the sparse form from a dense array of kHistogramBins counts indexed by
  // exponent - kHistogramMinExponent (trims empty bins at both ends).
  static BinadeHistogram from_dense(std::span<const std::uint64_t> dense);
  void add_to_dense(std::span<std::uint64_t> dense) const;
  friend bool operator==(const BinadeHistogram&, const BinadeHistogram&) = default;
};

struct TensorStats {
  std::uint64_t numel = 0;
  std::uint64_t zeros = 0;
  std::uint64_t nan = 0;
  std::uint64_t pos_inf = 0;
  std::uint64_t neg_inf = 0;
  double max_abs = 0.0;          // largest finite |x|; 0 when there is none
  double min_abs_nonzero = 0.0;  // smallest finite nonzero |x|; 0 when there is none
  double sum = 0.0;              // sum of finite values, exactly rounded
  double sum_sq = 0.0;           // sum of squares of finite values, within a few ulps
  BinadeHistogram histogram;
  std::vector<TargetCounts> targets;

  std::uint64_t finite_nonzero() const { return numel - zeros - nan - pos_inf - neg_inf; }
  std::uint64_t nonfinite() const { return nan + pos_inf + neg_inf; }
};

// Combines statistics of two disjoint parts of one tensor (or of two tensors). Both must carry
// the same target list (in the same order). Counts, extrema and histograms combine exactly; the
// sums are added in FP64 (one more rounding; compute_stats itself merges its threads' parts
// exactly).
void merge_into(TensorStats& into, const TensorStats& from);

struct StatsOptions {
  // Maximum worker threads for one call; 0 = the pool size (hardware concurrency, at most 16).
  int max_threads = 0;
  // Tensors below this many elements are processed on the calling thread only. The caller waits
  // for the result either way, so a tensor is split once a part per thread is worth a worker's
  // wake-up (a few microseconds; 2^15 FP32 elements take tens of them): with 2^20, the agent's
  // full statistics of a small GPT's tensors ran on one of two cores (docs/benchmarks.md).
  std::size_t parallel_threshold = std::size_t{1} << 15;
  // Kernel level; nullopt = active_simd_level().
  std::optional<SimdLevel> simd;
  // FP16/BF16 parts of at least this many elements are measured by counting their raw 16-bit
  // patterns (65,536 possible values) and folding the counts once, instead of element-wise
  // vector code; below it the fold (65,536 entries, 512 KiB of tables per thread, more than
  // L2 holds on many CPUs) costs more than it saves: with 2^16 the agent's full statistics of a
  // small GPT's FP16 tensors (2^16 to 2^19 elements) took 4x the time of the vector kernel
  // (docs/benchmarks.md). Not used at kScalar.
  std::size_t pattern_histogram_threshold = std::size_t{1} << 22;
};

// The dispatched, possibly multi-threaded, implementation. `data` points to n elements of
// `dtype` storage (float, uint16_t bit patterns for FP16/BF16, one byte per element for E4M3 and
// E5M2: torch.float8_e4m3fn / float8_e5m2 memory) with any alignment.
// Throws ampscope::Error on an unsupported dtype or a target whose scale is out of
// [-kMaxScaleLog2, kMaxScaleLog2].
TensorStats compute_stats(const void* data, std::size_t n, Format dtype,
                          std::span<const TargetSpec> targets = {},
                          const StatsOptions& options = {});

// Multiplies the n elements of `data` (dtype storage: FP32, FP16 or BF16) by `factor` in place,
// in FP32 arithmetic with the product rounded (nearest even) to dtype, and returns the
// statistics of the stored results, in one pass over memory. This is the fused form of a
// trainer's gradient unscale (factor = 1 / loss scale) followed by compute_stats(): the same
// results as doing both, bit for bit, with one read and one write of the data. The arithmetic
// runs under the IEEE default (no flush-to-zero, whatever the caller's MXCSR). NaN inputs stay
// NaN; products that overflow dtype become Inf. Same preconditions and threading as
// compute_stats().
TensorStats scale_and_compute_stats(void* data, std::size_t n, Format dtype, float factor,
                                    std::span<const TargetSpec> targets = {},
                                    const StatsOptions& options = {});

// The scalar reference: one element at a time, written from the definition.
TensorStats compute_stats_reference(const void* data, std::size_t n, Format dtype,
                                    std::span<const TargetSpec> targets = {});

// Binade-resolution prediction from a histogram alone (no access to the values): bounds on how
// many of the histogram's values overflow / underflow in `format` at scale 2^scale_log2. The
// exact count always lies in [lower, upper]; bins that straddle a threshold are counted in the
// upper bound only. `histogram_scale_log2` is the scale already applied to the measured values
// (the report's loss scale), so the prediction is for x_unscaled * 2^scale_log2.
struct CountBounds {
  std::uint64_t lower = 0;
  std::uint64_t upper = 0;
};
struct WhatIf {
  CountBounds overflow;
  CountBounds underflow;
  CountBounds subnormal;
};
WhatIf predict_from_histogram(const BinadeHistogram& histogram, Format format, int scale_log2,
                              int histogram_scale_log2 = 0);

}  // namespace ampscope
