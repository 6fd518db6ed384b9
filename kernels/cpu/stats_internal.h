// Shared pieces of the CPU statistics kernels: the per-thread accumulator, target thresholds
// expressed as ranges of FP32 magnitude bit patterns, and the per-element update used by the
// scalar fast path and by the vector kernels' tails and rare-value fix-ups.
//
// Why bit ranges: FP16 and BF16 widen to FP32 exactly and |x| is monotone in its FP32 bit
// pattern, so "x * 2^k overflows the target" is "abs_bits >= some pattern": one integer compare
// per element and target, found once per call by binary search over the exact FP64 predicate.
#pragma once

#include <array>
#include <cstring>
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

// The exact value of finite FP32 magnitude bits as FP64, without an FP32 -> FP64 conversion
// instruction: under DAZ (which a host framework may set) that conversion reads FP32
// subnormals as zero.
inline double fp32_abs_bits_to_double(std::uint32_t abs_bits) {
  if (abs_bits < kMinNormalBits) return static_cast<double>(abs_bits) * 0x1p-149;
  double d;
  const std::uint64_t b = (static_cast<std::uint64_t>((abs_bits >> 23) + (1023 - 127)) << 52) |
                          (static_cast<std::uint64_t>(abs_bits & 0x7FFFFFu) << 29);
  std::memcpy(&d, &b, 8);
  return d;
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
  const double m = fp32_abs_bits_to_double(a);
  acc.sum += (bits >> 31) ? -m : m;
  acc.sum_sq += m * m;
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

// Shared by the vector kernels ------------------------------------------------------------

inline constexpr std::size_t kChunk = 2048;  // elements per exponent-byte buffer
inline constexpr std::size_t kFoldEvery = std::size_t{1} << 24;  // uint32 tables cannot overflow
inline constexpr std::size_t kMaxVecTargets = 4;  // counted in registers; more go the scalar way

// Histogram of FP32 biased-exponent bytes in four interleaved tables: consecutive values
// usually share a binade, and one table would serialise their increments on store-to-load
// forwarding.
struct ByteHistogram {
  alignas(64) std::uint32_t t[4][256];
  void clear() { std::memset(t, 0, sizeof(t)); }
  void add(const std::uint8_t* bytes, std::size_t n) {
    std::size_t j = 0;
    for (; j + 4 <= n; j += 4) {
      ++t[0][bytes[j]];
      ++t[1][bytes[j + 1]];
      ++t[2][bytes[j + 2]];
      ++t[3][bytes[j + 3]];
    }
    for (; j < n; ++j) ++t[0][bytes[j]];
  }
  // Biased exponents 1..254 are the normal binades -126..127.
  void fold_into(StatsAccumulator& acc) {
    for (int b = 1; b < 255; ++b) {
      acc.hist[static_cast<std::size_t>(b - 127 - kHistogramMinExponent)] +=
          std::uint64_t{t[0][b]} + t[1][b] + t[2][b] + t[3][b];
    }
    clear();
  }
};

// Scalar fix-up for the rare lanes of one vector (stored to `lanes`): non-finite lanes are
// classified; FP32-subnormal lanes get their histogram bin and their exact contribution to the
// sums (a DAZ-proof conversion). Everything else about those lanes was done by the vector code.
inline void fix_up_rare_lanes(const std::uint32_t* lanes, unsigned nonfinite, unsigned subnormal,
                              StatsAccumulator& acc) {
  for (unsigned m = nonfinite; m != 0; m &= m - 1) {
    const std::uint32_t u = lanes[__builtin_ctz(m)];
    if ((u & kAbsMask) > kInfBits) {
      ++acc.nan;
    } else if (u >> 31) {
      ++acc.neg_inf;
    } else {
      ++acc.pos_inf;
    }
  }
  for (unsigned m = subnormal; m != 0; m &= m - 1) {
    const std::uint32_t u = lanes[__builtin_ctz(m)];
    const std::uint32_t a = u & kAbsMask;
    ++acc.hist[static_cast<std::size_t>(binade_of_bits(a) - kHistogramMinExponent)];
    const double v = fp32_abs_bits_to_double(a);
    acc.sum += (u >> 31) ? -v : v;
    acc.sum_sq += v * v;
  }
}

// After the vector loop over [0, full): counts targets past kMaxVecTargets (if any) for those
// elements with the scalar path, then does the tail [full, n) with all targets.
void finish_scalar(const void* data, std::size_t n, std::size_t full, Format dtype,
                   std::span<const TargetThresholds> th, std::size_t vector_targets,
                   StatsAccumulator& acc);

// The kernels. Each processes elements [0, n) of `data` into acc.
void stats_kernel_scalar(const void* data, std::size_t n, Format dtype,
                         std::span<const TargetThresholds> th, StatsAccumulator& acc);
void stats_kernel_avx2(const void* data, std::size_t n, Format dtype,
                       std::span<const TargetThresholds> th, StatsAccumulator& acc);
void stats_kernel_avx512(const void* data, std::size_t n, Format dtype,
                         std::span<const TargetThresholds> th, StatsAccumulator& acc);
// FP16/BF16 only: histogram of the raw 16-bit patterns, folded once per call.
void stats_kernel_pattern16(const void* data, std::size_t n, Format dtype,
                            std::span<const TargetThresholds> th, StatsAccumulator& acc);

}  // namespace ampscope::detail
