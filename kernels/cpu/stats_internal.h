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

// An exact sum of doubles: a fixed-point number with its least significant bit at 2^-352 in
// 23 limbs of 32 bits, each held in an int64 so that additions need no carry propagation (the
// limbs are normalised every 2^30 additions and before a merge). Every double the statistics
// add lies in [2^-350, 2^330): a finite FP32 value, its exact FP64 square, or a chunk's FP64
// sum of such values (see the kernels), so add() never loses a bit, and round() gives the
// exactly rounded (nearest even) double of the whole sum. add() costs a dozen integer
// operations, so the vector kernels call it once per chunk, not per element.
class ExactSum {
 public:
  static constexpr int kLimbs = 23;
  static constexpr int kLsbExponent = -352;

  void add(double d) {
    std::uint64_t u;
    std::memcpy(&u, &d, 8);
    const int biased = static_cast<int>((u >> 52) & 0x7FF);
    if (biased == 0) return;  // zero (no double below 2^-1022 is ever added)
    const std::uint64_t mantissa = (u & ((std::uint64_t{1} << 52) - 1)) | (std::uint64_t{1} << 52);
    const int shift = biased - 1075 - kLsbExponent;  // d = mantissa * 2^(shift + kLsbExponent)
    const unsigned __int128 v = static_cast<unsigned __int128>(mantissa) << (shift % 32);
    const int k = shift / 32;
    const auto lo = static_cast<std::int64_t>(static_cast<std::uint64_t>(v) & 0xFFFFFFFFu);
    const auto mid = static_cast<std::int64_t>(static_cast<std::uint64_t>(v >> 32) & 0xFFFFFFFFu);
    const auto hi = static_cast<std::int64_t>(static_cast<std::uint64_t>(v >> 64));
    if (u >> 63) {
      limbs_[k] -= lo;
      limbs_[k + 1] -= mid;
      limbs_[k + 2] -= hi;
    } else {
      limbs_[k] += lo;
      limbs_[k + 1] += mid;
      limbs_[k + 2] += hi;
    }
    if (++pending_ == kNormaliseEvery) normalise();
  }
  // a * b exactly (the FMA residual is the product's rounding error).
  void add_product(double a, double b) {
    const double p = a * b;
    add(p);
    add(__builtin_fma(a, b, -p));
  }
  void merge(const ExactSum& o);
  // The exactly rounded sum (ties to even).
  double round() const;

 private:
  static constexpr int kNormaliseEvery = 1 << 30;
  void normalise();
  std::array<std::int64_t, kLimbs> limbs_{};
  int pending_ = 0;
};

struct StatsAccumulator {
  std::uint64_t numel = 0;
  std::uint64_t zeros = 0;
  std::uint64_t nan = 0;
  std::uint64_t pos_inf = 0;
  std::uint64_t neg_inf = 0;
  std::uint32_t max_abs_bits = 0;
  std::uint32_t min_abs_bits = 0xFFFFFFFFu;  // over finite nonzero; sentinel when none
  ExactSum sum;
  ExactSum sum_sq;
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
  acc.sum.add((bits >> 31) ? -m : m);
  acc.sum_sq.add(m * m);
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

// FP32 bits of every E4M3 (fp8_bits_to_fp32_bits(kE4M3)[b]) or E5M2 pattern: decode()'s values,
// built once. FP8 storage is read through these tables (the formats have 256 values each).
const std::uint32_t* fp8_bits_to_fp32_bits(Format dtype);

inline std::uint32_t widen_to_fp32_bits(const void* data, std::size_t i, Format dtype) {
  switch (dtype) {
    case Format::kE4M3:
    case Format::kE5M2:
      return fp8_bits_to_fp32_bits(dtype)[static_cast<const unsigned char*>(data)[i]];
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

// Elements per chunk: the vector kernels keep a chunk's |x| bits and exponent bytes in L1 and
// add its FP64 sums into the exact accumulators once (see chunk_sum_is_exact).
inline constexpr std::size_t kChunk = 512;
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
    acc.sum.add((u >> 31) ? -v : v);
    acc.sum_sq.add(v * v);
  }
}

// Whether FP64 lane sums of up to `count` finite normal values of `dtype`, all with biased FP32
// exponents (after widening) in [lo, hi], are exact, in every lane and in any order of adding
// the lanes. Such values are multiples of 2^(lo - 127 - m) (m: the dtype's fraction bits) and
// below 2^(hi - 126), so every partial sum of up to count of them is a multiple of that quantum
// below count * 2^(hi - 126): exact when count * 2^(hi - lo + m + 1) <= 2^53. FP16 values are
// all multiples of 2^-24 below 2^16, so up to 2^13 of them always sum exactly.
inline bool chunk_sum_is_exact(Format dtype, int lo, int hi, std::size_t count) {
  const int log2_count = count <= 1 ? 0 : 64 - std::countl_zero(count - 1);
  if (dtype == Format::kFP16) return log2_count <= 13;
  const int fraction_bits = dtype == Format::kBF16 ? 7 : 23;
  return (hi - lo) + fraction_bits + 1 + log2_count <= 53;
}

// The slow, exact way for a chunk whose range is too wide for chunk_sum_is_exact: every finite
// normal element of [0, count) (as FP32 after widening) goes into the exact sums one by one.
// Zeros, subnormals and non-finite values are left out (the fix-ups handle the subnormals).
inline void add_normal_values_exactly(const void* data, std::size_t count, Format dtype,
                                      StatsAccumulator& acc) {
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint32_t bits = widen_to_fp32_bits(data, i, dtype);
    const std::uint32_t a = bits & kAbsMask;
    if (a < kMinNormalBits || a >= kInfBits) continue;
    const double m = fp32_abs_bits_to_double(a);
    acc.sum.add((bits >> 31) ? -m : m);
    acc.sum_sq.add(m * m);
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
// The fused kernels of scale_and_compute_stats(): data[i] = round(data[i] * factor) in dtype,
// then the statistics of the stored values. AVX-512 CPUs use the AVX2 one.
void scale_stats_kernel_scalar(void* data, std::size_t n, Format dtype, float factor,
                               std::span<const TargetThresholds> th, StatsAccumulator& acc);
void scale_stats_kernel_avx2(void* data, std::size_t n, Format dtype, float factor,
                             std::span<const TargetThresholds> th, StatsAccumulator& acc);
// FP8 (E4M3, E5M2) storage: the count of each of the 256 bit patterns, folded once per call.
void stats_kernel_pattern8(const void* data, std::size_t n, Format dtype,
                           std::span<const TargetThresholds> th, StatsAccumulator& acc);
// FP16/BF16 only: histogram of the raw 16-bit patterns, folded once per call.
void stats_kernel_pattern16(const void* data, std::size_t n, Format dtype,
                            std::span<const TargetThresholds> th, StatsAccumulator& acc);

// The kernel compute_stats runs on a part of `part_elements` elements of `dtype` at `level`
// (also what fake_quantize_with_stats runs on the pieces it quantises). Every kernel's
// accumulator gives the same statistics for any split of the data.
using StatsKernel = void (*)(const void*, std::size_t, Format, std::span<const TargetThresholds>,
                             StatsAccumulator&);
StatsKernel select_kernel(SimdLevel level, Format dtype, std::size_t part_elements,
                          const StatsOptions& options);

}  // namespace ampscope::detail
