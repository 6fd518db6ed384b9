// Statistics of FP16 and BF16 tensors from a histogram of their raw 16-bit patterns (and of FP8
// tensors from their 8-bit patterns).
//
// A 16-bit tensor has only 65,536 possible values, so the count of each bit pattern is a
// sufficient statistic for everything TensorStats holds: zeros, NaN, +-Inf, extrema, the binade
// histogram and the target counts are sums over pattern ranges, and the sums are
// sum(count * value), each product exact (a 16-bit value has at most 11 significant bits and a
// count fewer than 2^32) and added into the exact accumulators. The per-element work is one
// table increment, which is several times cheaper than classifying, widening and comparing
// every element; the per-call cost is one walk over the 65,536 counts, so compute_stats uses
// this kernel only for large tensors.
//
// Two tables take alternate elements: runs of one pattern (zeros from a ReLU) would otherwise
// serialise on store-to-load forwarding. The tables live per thread and are reused.
#include <array>
#include <bit>
#include <cstring>
#include <memory>

#include "ampscope/check.h"
#include "ampscope/convert.h"
#include "stats_internal.h"

namespace ampscope::detail {
namespace {

constexpr std::size_t kPatterns = 65536;
// A uint32 count cannot overflow within one block of this many elements per table.
constexpr std::size_t kBlock = std::size_t{1} << 31;

struct PatternTables {
  std::uint32_t t[2][kPatterns];
};

PatternTables& thread_tables() {
  thread_local std::unique_ptr<PatternTables> tables = std::make_unique<PatternTables>();
  return *tables;
}

void count_patterns(const unsigned char* p, std::size_t n, PatternTables& tables) {
  std::uint32_t* t0 = tables.t[0];
  std::uint32_t* t1 = tables.t[1];
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    std::uint64_t four;
    std::memcpy(&four, p + 2 * i, 8);  // any alignment
    ++t0[four & 0xFFFF];
    ++t1[(four >> 16) & 0xFFFF];
    ++t0[(four >> 32) & 0xFFFF];
    ++t1[four >> 48];
  }
  for (; i < n; ++i) {
    std::uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    ++t0[h];
  }
}

// Adds c elements of the value with FP32 bits `bits` to acc, as accumulate_one would one by one.
// c < 2^32 and a 16-bit (or 8-bit) value has at most 11 significant bits: c * m is exact, and
// (c * m) * m goes in exactly as a product.
void fold_pattern(std::uint32_t bits, std::uint64_t c, std::span<const TargetThresholds> th,
                  StatsAccumulator& acc) {
  const std::uint32_t a = bits & kAbsMask;
  if (a >= kInfBits) {
    if (a > kInfBits) {
      acc.nan += c;
    } else if (bits >> 31) {
      acc.neg_inf += c;
    } else {
      acc.pos_inf += c;
    }
    return;
  }
  if (a == 0) {
    acc.zeros += c;
    return;
  }
  acc.max_abs_bits = a > acc.max_abs_bits ? a : acc.max_abs_bits;
  acc.min_abs_bits = a < acc.min_abs_bits ? a : acc.min_abs_bits;
  const double m = fp32_abs_bits_to_double(a);
  const double cm = static_cast<double>(c) * m;
  acc.sum.add((bits >> 31) ? -cm : cm);
  acc.sum_sq.add_product(cm, m);
  acc.hist[static_cast<std::size_t>(binade_of_bits(a) - kHistogramMinExponent)] += c;
  for (std::size_t i = 0; i < th.size(); ++i) {
    if (a >= th[i].ovf_lo) acc.target_counts[i][0] += c;
    if (a <= th[i].ufl_hi) acc.target_counts[i][1] += c;
    if (a > th[i].ufl_hi && a <= th[i].sub_hi) acc.target_counts[i][2] += c;
  }
}

// Folds the tables into acc (pattern by pattern, weighted by the count) and clears them.
void fold_patterns(PatternTables& tables, Format dtype, std::span<const TargetThresholds> th,
                   StatsAccumulator& acc) {
  for (std::size_t pattern = 0; pattern < kPatterns; ++pattern) {
    const std::uint64_t c = std::uint64_t{tables.t[0][pattern]} + tables.t[1][pattern];
    if (c == 0) continue;
    tables.t[0][pattern] = 0;
    tables.t[1][pattern] = 0;
    const auto h = static_cast<std::uint16_t>(pattern);
    fold_pattern(dtype == Format::kBF16 ? std::uint32_t{h} << 16 : fp16_bits_to_fp32_bits(h), c,
                 th, acc);
  }
}

}  // namespace

void stats_kernel_pattern16(const void* data, std::size_t n, Format dtype,
                            std::span<const TargetThresholds> th, StatsAccumulator& acc) {
  AMPSCOPE_CHECK(dtype == Format::kFP16 || dtype == Format::kBF16,
                 "the pattern kernel reads 16-bit storage, not ", format_name(dtype));
  acc.numel += n;
  PatternTables& tables = thread_tables();
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t begin = 0; begin < n; begin += kBlock) {
    const std::size_t count = n - begin < kBlock ? n - begin : kBlock;
    count_patterns(p + 2 * begin, count, tables);
    fold_patterns(tables, dtype, th, acc);
  }
}

void stats_kernel_pattern8(const void* data, std::size_t n, Format dtype,
                           std::span<const TargetThresholds> th, StatsAccumulator& acc) {
  AMPSCOPE_CHECK(dtype == Format::kE4M3 || dtype == Format::kE5M2,
                 "the 8-bit pattern kernel reads FP8 storage, not ", format_name(dtype));
  acc.numel += n;
  const std::uint32_t* widen = fp8_bits_to_fp32_bits(dtype);
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t begin = 0; begin < n; begin += kBlock) {
    const std::size_t count = n - begin < kBlock ? n - begin : kBlock;
    // Four tables take alternate bytes (runs of one pattern would serialise on one counter).
    std::uint32_t t[4][256] = {};
    std::size_t i = 0;
    for (; i + 4 <= count; i += 4) {
      ++t[0][p[begin + i]];
      ++t[1][p[begin + i + 1]];
      ++t[2][p[begin + i + 2]];
      ++t[3][p[begin + i + 3]];
    }
    for (; i < count; ++i) ++t[0][p[begin + i]];
    for (std::size_t pattern = 0; pattern < 256; ++pattern) {
      const std::uint64_t c = std::uint64_t{t[0][pattern]} + t[1][pattern] + t[2][pattern] +
                              t[3][pattern];
      if (c != 0) fold_pattern(widen[pattern], c, th, acc);
    }
  }
}

const std::uint32_t* fp8_bits_to_fp32_bits(Format dtype) {
  using Table = std::array<std::uint32_t, 256>;
  static const auto make = [](Format f) {
    Table t{};
    for (std::uint32_t b = 0; b < 256; ++b) t[b] = std::bit_cast<std::uint32_t>(decode(b, f));
    return t;
  };
  static const Table e4m3 = make(Format::kE4M3);
  static const Table e5m2 = make(Format::kE5M2);
  AMPSCOPE_CHECK(dtype == Format::kE4M3 || dtype == Format::kE5M2, "not an FP8 format: ",
                 format_name(dtype));
  return dtype == Format::kE4M3 ? e4m3.data() : e5m2.data();
}

}  // namespace ampscope::detail
