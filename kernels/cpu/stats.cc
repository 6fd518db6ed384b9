// compute_stats and scale_and_compute_stats: validation, run-time kernel dispatch and the split
// of large tensors over the project's pool; predict_from_histogram: the binade-resolution
// what-if analysis.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "ampscope/check.h"
#include "ampscope/convert.h"
#include "ampscope/thread_pool.h"
#include "convert_internal.h"
#include "stats_internal.h"

namespace ampscope {
namespace detail {

void stats_kernel_scalar(const void* data, std::size_t n, Format dtype,
                         std::span<const TargetThresholds> th, StatsAccumulator& acc) {
  acc.numel += n;
  for (std::size_t i = 0; i < n; ++i) accumulate_one(acc, widen_to_fp32_bits(data, i, dtype), th);
}

void scale_stats_kernel_scalar(void* data, std::size_t n, Format dtype, float factor,
                               std::span<const TargetThresholds> th, StatsAccumulator& acc) {
  const ScopedDefaultMxcsr ieee;
  auto* bytes = static_cast<unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) {
    if (dtype == Format::kFP32) {
      float x;
      std::memcpy(&x, bytes + 4 * i, 4);
      x *= factor;
      std::memcpy(bytes + 4 * i, &x, 4);
    } else {
      std::uint16_t h;
      std::memcpy(&h, bytes + 2 * i, 2);
      h = static_cast<std::uint16_t>(encode(decode(h, dtype) * factor, dtype));
      std::memcpy(bytes + 2 * i, &h, 2);
    }
  }
  stats_kernel_scalar(data, n, dtype, th, acc);
}

void finish_scalar(const void* data, std::size_t n, std::size_t full, Format dtype,
                   std::span<const TargetThresholds> th, std::size_t vector_targets,
                   StatsAccumulator& acc) {
  if (th.size() > vector_targets) {
    const std::span<const TargetThresholds> rest = th.subspan(vector_targets);
    StatsAccumulator extra(rest.size());
    for (std::size_t i = 0; i < full; ++i) {
      accumulate_one(extra, widen_to_fp32_bits(data, i, dtype), rest);
    }
    for (std::size_t t = 0; t < rest.size(); ++t) {
      for (int k = 0; k < 3; ++k) acc.target_counts[vector_targets + t][k] += extra.target_counts[t][k];
    }
  }
  for (std::size_t i = full; i < n; ++i) accumulate_one(acc, widen_to_fp32_bits(data, i, dtype), th);
}

StatsKernel select_kernel(SimdLevel level, Format dtype, std::size_t part_elements,
                          const StatsOptions& options) {
  const SimdLevel l = clamp_simd_level(level);
  if (l == SimdLevel::kScalar) return stats_kernel_scalar;
  if (dtype == Format::kE4M3 || dtype == Format::kE5M2) return stats_kernel_pattern8;
  if (dtype != Format::kFP32 && part_elements >= options.pattern_histogram_threshold) {
    return stats_kernel_pattern16;
  }
  return l == SimdLevel::kAvx512 ? stats_kernel_avx512 : stats_kernel_avx2;
}

namespace {

// The smallest part handed to a thread (parallel_threshold decides whether to split at all).
constexpr std::size_t kMinPart = 1024;

}  // namespace
}  // namespace detail

namespace {

void check_input(const void* data, std::size_t n, Format dtype) {
  AMPSCOPE_CHECK(is_stats_storage_format(dtype),
                 "statistics read fp32, fp16, bf16, e4m3 or e5m2 storage, not ", format_name(dtype));
  AMPSCOPE_CHECK(n == 0 || data != nullptr, "null data pointer for ", n, " elements");
}

// Runs part_kernel(begin, count, acc) over [0, n): on the calling thread, or in one contiguous
// part per worker (the pattern kernel keeps a table per thread and folds it once per part, so
// fewer, larger parts are cheaper than many small ones). The parts' exact accumulators merge
// without rounding, so the result does not depend on the split.
template <typename PartKernel>
TensorStats run_parts(std::size_t n, std::span<const TargetSpec> targets,
                      const StatsOptions& options, const PartKernel& part_kernel) {
  using namespace detail;
  const int max_threads = options.max_threads > 0 ? options.max_threads : pool_size();
  const bool parallel = n >= options.parallel_threshold && max_threads > 1 && n >= 2 * kMinPart;
  if (!parallel) {
    StatsAccumulator acc(targets.size());
    part_kernel(std::size_t{0}, n, n, acc);
    return acc.finish(targets);
  }
  const std::size_t parts =
      std::min<std::size_t>(static_cast<std::size_t>(max_threads), n / kMinPart);
  const std::size_t part_len = (n + parts - 1) / parts;
  std::vector<StatsAccumulator> accs(parts, StatsAccumulator(targets.size()));
  parallel_for(parts, static_cast<int>(parts), [&](std::size_t p) {
    const std::size_t begin = p * part_len;
    const std::size_t count = begin < n ? std::min(part_len, n - begin) : 0;
    part_kernel(begin, count, part_len, accs[p]);
  });
  for (std::size_t p = 1; p < parts; ++p) accs[0].merge(accs[p]);
  return accs[0].finish(targets);
}

}  // namespace

TensorStats compute_stats(const void* data, std::size_t n, Format dtype,
                          std::span<const TargetSpec> targets, const StatsOptions& options) {
  using namespace detail;
  check_input(data, n, dtype);
  const std::vector<TargetThresholds> th = compute_thresholds(targets);
  const SimdLevel level = options.simd.value_or(active_simd_level());
  const std::size_t elem = static_cast<std::size_t>(storage_bytes(dtype));
  return run_parts(n, targets, options,
                   [&](std::size_t begin, std::size_t count, std::size_t part_len,
                       StatsAccumulator& acc) {
                     select_kernel(level, dtype, part_len, options)(
                         static_cast<const char*>(data) + begin * elem, count, dtype, th, acc);
                   });
}

TensorStats scale_and_compute_stats(void* data, std::size_t n, Format dtype, float factor,
                                    std::span<const TargetSpec> targets,
                                    const StatsOptions& options) {
  using namespace detail;
  check_input(data, n, dtype);
  AMPSCOPE_CHECK(dtype == Format::kFP32 || dtype == Format::kFP16 || dtype == Format::kBF16,
                 "scale_and_compute_stats scales fp32, fp16 or bf16 storage, not ",
                 format_name(dtype));
  const std::vector<TargetThresholds> th = compute_thresholds(targets);
  const SimdLevel level = clamp_simd_level(options.simd.value_or(active_simd_level()));
  const auto kernel =
      level == SimdLevel::kScalar ? scale_stats_kernel_scalar : scale_stats_kernel_avx2;
  const std::size_t elem = static_cast<std::size_t>(storage_bytes(dtype));
  return run_parts(n, targets, options,
                   [&](std::size_t begin, std::size_t count, std::size_t, StatsAccumulator& acc) {
                     kernel(static_cast<char*>(data) + begin * elem, count, dtype, factor, th,
                            acc);
                   });
}

WhatIf predict_from_histogram(const BinadeHistogram& histogram, Format format, int scale_log2,
                              int histogram_scale_log2) {
  const int shift = scale_log2 - histogram_scale_log2;
  AMPSCOPE_CHECK(std::abs(shift) <= 2 * kMaxScaleLog2, "scale shift ", shift, " out of range");
  const FormatInfo& f = format_info(format);
  const double ufl = 0.5 * f.min_subnormal();
  const double sub_hi = f.min_normal() - 0.5 * f.min_subnormal();
  auto ovf = [&](double y) {
    return f.overflow_inclusive ? y >= f.overflow_threshold : y > f.overflow_threshold;
  };
  WhatIf w;
  for (std::size_t i = 0; i < histogram.counts.size(); ++i) {
    const std::uint64_t c = histogram.counts[i];
    if (c == 0) continue;
    // The bin holds values in [lo, 2 lo) after the shift.
    const double lo = std::ldexp(1.0, histogram.min_exponent + static_cast<int>(i) + shift);
    const double hi = 2.0 * lo;
    if (ovf(lo)) w.overflow.lower += c;
    if (hi > f.overflow_threshold) w.overflow.upper += c;  // some y < hi may exceed it
    if (hi <= ufl) w.underflow.lower += c;
    if (lo <= ufl) w.underflow.upper += c;
    if (lo > ufl && hi <= sub_hi) w.subnormal.lower += c;
    if (hi > ufl && lo < sub_hi) w.subnormal.upper += c;
  }
  return w;
}

}  // namespace ampscope
