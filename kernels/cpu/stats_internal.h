// Shared pieces of the CPU statistics kernels: the per-thread accumulator, target thresholds
// expressed as ranges of FP32 magnitude bit patterns, and the per-element update used by the
// scalar fast path and by the vector kernels' tails and rare-value fix-ups.
//
// Why bit ranges: FP16 and BF16 widen to FP32 exactly and |x| is monotone in its FP32 bit
// pattern, so "x * 2^k overflows the target" is "abs_bits >= some pattern": one integer compare
// per element and target, found once per call by binary search over the exact FP64 predicate.
#pragma once

#include <array>
#include <bit>
#include <cstdint>
#include <span>
#include <vector>

#include "ampscope/tensor_stats.h"

namespace ampscope::detail {

inline constexpr std::uint32_t kAbsMask = 0x7FFFFFFFu;
inline constexpr std::uint32_t kInfBits = 0x7F800000u;
inline constexpr std::uint32_t kMinNormalBits = 0x00800000u;

// For one target, with a = |x| as FP32 bits (finite):
//   overflow  iff ovf_lo <= a   (ovf_lo == kInfBits means never)
//   underflow iff 1 <= a <= ufl_hi   (ufl_hi == 0 means never)
//   subnormal iff ufl_hi < a <= sub_hi  (sub_hi == ufl_hi means never)
struct TargetThresholds {
  std::uint32_t ovf_lo = kInfBits;
  std::uint32_t ufl_hi = 0;
  std::uint32_t sub_hi = 0;
};

// The exact predicates on a positive finite value v measured as stored (FP64 arithmetic).
bool overflows(double v, const TargetSpec& t);
bool underflows(double v, const TargetSpec& t);
bool is_subnormal_in(double v, const TargetSpec& t);

TargetThresholds compute_thresholds(const TargetSpec& t);
std::vector<TargetThresholds> compute_thresholds(std::span<const TargetSpec> targets);

// floor(log2(|x|)) for finite nonzero FP32 bits, in [-149, 127].
inline int binade_of_bits(std::uint32_t abs_bits) {
  const int biased = static_cast<int>(abs_bits >> 23);
  if (biased != 0) return biased - 127;
  // Subnormal: value = frac * 2^-149.
  return -149 + (31 - std::countl_zero(abs_bits));
}

struct StatsAccumulator {
  std::uint64_t numel = 0;
  std::uint64_t zeros = 0;
  std::uint64_t nan = 0;
  std::uint64_t pos_inf = 0;
  std::uint64_t neg_inf = 0;
  std::uint32_t max_abs_bits = 0;
  std::uint32_t min_abs_bits = 0xFFFFFFFFu;  // over finite nonzero; sentinel when none
  double sum = 0.0;
  double sum_sq = 0.0;
  std::array<std::uint64_t, kHistogramBins> hist{};
  std::vector<std::array<std::uint64_t, 3>> target_counts;  // overflow, underflow, subnormal

  explicit StatsAccumulator(std::size_t num_targets = 0) : target_counts(num_targets) {}
  void merge(const StatsAccumulator& o);
  TensorStats finish(std::span<const TargetSpec> targets) const;
};

// Counts one element given as FP32 bits (already widened from the storage type).
inline void accumulate_one(StatsAccumulator& acc, std::uint32_t bits,
                           std::span<const TargetThresholds> th) {
  const std::uint32_t a = bits & kAbsMask;
  if (a >= kInfBits) {
    if (a > kInfBits) {
      ++acc.nan;
    } else if (bits >> 31) {
      ++acc.neg_inf;
    } else {
      ++acc.pos_inf;
    }
    return;
  }
  if (a == 0) {
    ++acc.zeros;
    return;
  }
  acc.max_abs_bits = a > acc.max_abs_bits ? a : acc.max_abs_bits;
  acc.min_abs_bits = a < acc.min_abs_bits ? a : acc.min_abs_bits;
  const double v = static_cast<double>(std::bit_cast<float>(bits));
  acc.sum += v;
  acc.sum_sq += v * v;
  ++acc.hist[binade_of_bits(a) - kHistogramMinExponent];
  for (std::size_t i = 0; i < th.size(); ++i) {
    acc.target_counts[i][0] += a >= th[i].ovf_lo;
    acc.target_counts[i][1] += a <= th[i].ufl_hi;
    acc.target_counts[i][2] += (a > th[i].ufl_hi) & (a <= th[i].sub_hi);
  }
}

// Portable FP16 -> FP32 bit conversion (exact; NaN payload kept and quieted as F16C does).
inline std::uint32_t fp16_bits_to_fp32_bits(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1Fu;
  const std::uint32_t m = h & 0x3FFu;
  if (e == 0x1F) return sign | (m == 0 ? kInfBits : 0x7FC00000u | (m << 13));
  if (e == 0) {
    if (m == 0) return sign;
    const int p = 31 - std::countl_zero(m);  // value = m * 2^-24, binade p - 24
    return sign | (static_cast<std::uint32_t>(p + 103) << 23) | ((m << (23 - p)) & 0x7FFFFFu);
  }
  return sign | ((e + 112) << 23) | (m << 13);
}

inline std::uint32_t widen_to_fp32_bits(const void* data, std::size_t i, Format dtype) {
  switch (dtype) {
    case Format::kFP32: {
      std::uint32_t u;
      __builtin_memcpy(&u, static_cast<const char*>(data) + 4 * i, 4);
      return u;
    }
    case Format::kBF16: {
      std::uint16_t h;
      __builtin_memcpy(&h, static_cast<const char*>(data) + 2 * i, 2);
      return static_cast<std::uint32_t>(h) << 16;
    }
    default: {  // FP16
      std::uint16_t h;
      __builtin_memcpy(&h, static_cast<const char*>(data) + 2 * i, 2);
      return fp16_bits_to_fp32_bits(h);
    }
  }
}

// The kernels. Each processes elements [0, n) of `data` into acc.
void stats_kernel_scalar(const void* data, std::size_t n, Format dtype,
                         std::span<const TargetThresholds> th, StatsAccumulator& acc);
void stats_kernel_avx2(const void* data, std::size_t n, Format dtype,
                       std::span<const TargetThresholds> th, StatsAccumulator& acc);
void stats_kernel_avx512(const void* data, std::size_t n, Format dtype,
                         std::span<const TargetThresholds> th, StatsAccumulator& acc);

}  // namespace ampscope::detail
