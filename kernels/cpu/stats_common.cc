// Value-type helpers of tensor_stats.h, the exact target predicates and their translation into
// FP32 bit-pattern thresholds, and the accumulator's merge/finish.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <numeric>
#include <string>

#include "ampscope/check.h"
#include "stats_internal.h"

namespace ampscope {

std::uint64_t BinadeHistogram::count_at(int exponent) const {
  if (counts.empty() || exponent < min_exponent || exponent > max_exponent()) return 0;
  return counts[static_cast<std::size_t>(exponent - min_exponent)];
}

std::uint64_t BinadeHistogram::total() const {
  return std::accumulate(counts.begin(), counts.end(), std::uint64_t{0});
}

BinadeHistogram BinadeHistogram::from_dense(std::span<const std::uint64_t> dense) {
  AMPSCOPE_CHECK(dense.size() == kHistogramBins, "expected ", kHistogramBins, " bins, found ",
                 dense.size());
  BinadeHistogram h;
  std::size_t lo = 0;
  while (lo < dense.size() && dense[lo] == 0) ++lo;
  if (lo == dense.size()) return h;
  std::size_t hi = dense.size() - 1;
  while (dense[hi] == 0) --hi;
  h.min_exponent = static_cast<int>(lo) + kHistogramMinExponent;
  h.counts.assign(dense.begin() + static_cast<std::ptrdiff_t>(lo),
                  dense.begin() + static_cast<std::ptrdiff_t>(hi) + 1);
  return h;
}

void BinadeHistogram::add_to_dense(std::span<std::uint64_t> dense) const {
  AMPSCOPE_CHECK(dense.size() == kHistogramBins, "expected ", kHistogramBins, " bins, found ",
                 dense.size());
  AMPSCOPE_CHECK(counts.empty() || (min_exponent >= kHistogramMinExponent &&
                                    max_exponent() <= kHistogramMaxExponent),
                 "histogram exponents [", min_exponent, ", ", max_exponent(),
                 "] outside [-149, 127]");
  for (std::size_t i = 0; i < counts.size(); ++i) {
    dense[static_cast<std::size_t>(min_exponent - kHistogramMinExponent) + i] += counts[i];
  }
}

std::optional<TargetSpec> parse_target(std::string_view text, std::string* error) {
  auto fail = [&](std::string msg) -> std::optional<TargetSpec> {
    if (error) *error = std::move(msg);
    return std::nullopt;
  };
  const auto at = text.find('@');
  const std::string_view name = text.substr(0, at);
  const auto format = parse_format(name);
  if (!format) {
    std::string known;
    for (const FormatInfo& f : kFormatInfos) {
      known += (known.empty() ? "" : ", ") + std::string(f.name);
    }
    return fail("unknown format '" + std::string(name) + "' (expected one of " + known + ")");
  }
  TargetSpec t{*format, 0};
  if (at != std::string_view::npos) {
    const std::string_view num = text.substr(at + 1);
    const char* first = num.data();
    const char* last = num.data() + num.size();
    if (!num.empty() && *first == '+') ++first;
    const auto [ptr, ec] = std::from_chars(first, last, t.scale_log2);
    if (num.empty() || ec != std::errc() || ptr != last) {
      return fail("scale '" + std::string(num) + "' is not an integer power-of-two exponent");
    }
    if (t.scale_log2 < -kMaxScaleLog2 || t.scale_log2 > kMaxScaleLog2) {
      return fail("scale exponent " + std::to_string(t.scale_log2) + " outside [-" +
                  std::to_string(kMaxScaleLog2) + ", " + std::to_string(kMaxScaleLog2) + "]");
    }
  }
  return t;
}

std::string to_string(const TargetSpec& t) {
  return std::string(format_name(t.format)) + "@" + std::to_string(t.scale_log2);
}

void merge_into(TensorStats& into, const TensorStats& from) {
  AMPSCOPE_CHECK(into.targets.size() == from.targets.size(), "merging stats with ",
                 into.targets.size(), " and ", from.targets.size(), " targets");
  for (std::size_t i = 0; i < into.targets.size(); ++i) {
    AMPSCOPE_CHECK(into.targets[i].target == from.targets[i].target, "target ", i, " differs: ",
                   to_string(into.targets[i].target), " vs ", to_string(from.targets[i].target));
    into.targets[i].overflow += from.targets[i].overflow;
    into.targets[i].underflow += from.targets[i].underflow;
    into.targets[i].subnormal += from.targets[i].subnormal;
  }
  const bool into_has_nonzero = into.finite_nonzero() > 0;
  const bool from_has_nonzero = from.finite_nonzero() > 0;
  into.numel += from.numel;
  into.zeros += from.zeros;
  into.nan += from.nan;
  into.pos_inf += from.pos_inf;
  into.neg_inf += from.neg_inf;
  into.max_abs = std::max(into.max_abs, from.max_abs);
  if (from_has_nonzero) {
    into.min_abs_nonzero =
        into_has_nonzero ? std::min(into.min_abs_nonzero, from.min_abs_nonzero)
                         : from.min_abs_nonzero;
  }
  into.sum += from.sum;
  into.sum_sq += from.sum_sq;
  if (!from.histogram.empty()) {
    std::array<std::uint64_t, kHistogramBins> dense{};
    into.histogram.add_to_dense(dense);
    from.histogram.add_to_dense(dense);
    into.histogram = BinadeHistogram::from_dense(dense);
  }
}

namespace detail {

namespace {
double scaled(double v, const TargetSpec& t) { return std::ldexp(v, t.scale_log2); }
}  // namespace

bool overflows(double v, const TargetSpec& t) {
  const FormatInfo& f = format_info(t.format);
  const double y = scaled(v, t);
  return f.overflow_inclusive ? y >= f.overflow_threshold : y > f.overflow_threshold;
}

bool underflows(double v, const TargetSpec& t) {
  // Exactly half the smallest subnormal is a tie between 0 (even) and the smallest subnormal
  // (odd fraction): it rounds to zero.
  return v != 0.0 && scaled(v, t) <= 0.5 * format_info(t.format).min_subnormal();
}

bool is_subnormal_in(double v, const TargetSpec& t) {
  // Values in [min_normal - min_subnormal/2, min_normal) round up to min normal (the tie goes
  // to min normal's even fraction).
  const FormatInfo& f = format_info(t.format);
  return !underflows(v, t) && scaled(v, t) < f.min_normal() - 0.5 * f.min_subnormal();
}

namespace {
double value_of(std::uint32_t abs_bits) { return fp32_abs_bits_to_double(abs_bits); }

// Smallest a in [lo, hi) with pred(a) for a monotone (false...true) predicate; hi if none.
template <typename Pred>
std::uint32_t first_true(std::uint32_t lo, std::uint32_t hi, Pred pred) {
  while (lo < hi) {
    const std::uint32_t mid = lo + (hi - lo) / 2;
    if (pred(mid)) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}
}  // namespace

TargetThresholds compute_thresholds(const TargetSpec& t) {
  AMPSCOPE_CHECK(t.scale_log2 >= -kMaxScaleLog2 && t.scale_log2 <= kMaxScaleLog2,
                 "target scale exponent ", t.scale_log2, " outside [-", kMaxScaleLog2, ", ",
                 kMaxScaleLog2, "]");
  TargetThresholds th;
  th.ovf_lo = first_true(1, kInfBits, [&](std::uint32_t a) { return overflows(value_of(a), t); });
  // Last abs pattern that underflows = first that does not, minus one.
  th.ufl_hi =
      first_true(1, kInfBits, [&](std::uint32_t a) { return !underflows(value_of(a), t); }) - 1;
  const std::uint32_t first_normal = first_true(1, kInfBits, [&](std::uint32_t a) {
    return !underflows(value_of(a), t) && !is_subnormal_in(value_of(a), t);
  });
  th.sub_hi = std::max(th.ufl_hi, first_normal - 1);
  return th;
}

std::vector<TargetThresholds> compute_thresholds(std::span<const TargetSpec> targets) {
  std::vector<TargetThresholds> out;
  out.reserve(targets.size());
  for (const TargetSpec& t : targets) out.push_back(compute_thresholds(t));
  return out;
}

void ExactSum::normalise() {
  // Carries move up; every limb but the top one ends in [0, 2^32), the top one holds the sign.
  for (int i = 0; i + 1 < kLimbs; ++i) {
    const std::int64_t carry = limbs_[i] >> 32;  // arithmetic shift: floor division
    limbs_[i] -= carry * (std::int64_t{1} << 32);
    limbs_[i + 1] += carry;
  }
  pending_ = 0;
}

void ExactSum::merge(const ExactSum& o) {
  ExactSum other = o;
  other.normalise();
  normalise();
  for (int i = 0; i < kLimbs; ++i) limbs_[i] += other.limbs_[i];
  pending_ = 1;
}

double ExactSum::round() const {
  ExactSum n = *this;
  n.normalise();
  // Magnitude digits in [0, 2^32), least significant first, and the sign.
  std::array<std::uint64_t, kLimbs> digit{};
  const bool negative = n.limbs_[kLimbs - 1] < 0;
  if (negative) {  // two's complement over the digits: invert and add one
    std::uint64_t carry = 1;
    for (int i = 0; i < kLimbs; ++i) {
      const std::uint64_t inv = ~static_cast<std::uint64_t>(n.limbs_[i]) & 0xFFFFFFFFu;
      const std::uint64_t v = inv + carry;
      digit[static_cast<std::size_t>(i)] = v & 0xFFFFFFFFu;
      carry = v >> 32;
    }
  } else {
    for (int i = 0; i < kLimbs; ++i) {
      digit[static_cast<std::size_t>(i)] = static_cast<std::uint64_t>(n.limbs_[i]);
    }
  }
  int top = kLimbs - 1;
  while (top >= 0 && digit[static_cast<std::size_t>(top)] == 0) --top;
  if (top < 0) return 0.0;
  // The top three digits (96 bits, the leading one nonzero) and a sticky bit for the rest.
  auto at = [&](int i) { return i < 0 ? std::uint64_t{0} : digit[static_cast<std::size_t>(i)]; };
  const unsigned __int128 head = (static_cast<unsigned __int128>(at(top)) << 64) |
                                 (static_cast<unsigned __int128>(at(top - 1)) << 32) | at(top - 2);
  bool sticky = false;
  for (int i = top - 3; i >= 0; --i) sticky |= digit[static_cast<std::size_t>(i)] != 0;
  const int bits = 128 - (static_cast<std::uint64_t>(head >> 64) != 0
                              ? __builtin_clzll(static_cast<std::uint64_t>(head >> 64))
                              : 64 + __builtin_clzll(static_cast<std::uint64_t>(head)));
  const int drop = bits - 53;  // >= 12: the leading digit is nonzero, so bits >= 65
  auto mantissa = static_cast<std::uint64_t>(head >> drop);
  const unsigned __int128 rest = head & ((static_cast<unsigned __int128>(1) << drop) - 1);
  const unsigned __int128 half = static_cast<unsigned __int128>(1) << (drop - 1);
  if (rest > half || (rest == half && (sticky || (mantissa & 1)))) ++mantissa;
  // A carry out of 53 bits (2^53) is still exact as a double; ldexp scales it exactly (the
  // result is a normal double: |sum| >= 2^-350 when nonzero).
  const double magnitude =
      std::ldexp(static_cast<double>(mantissa), drop + 32 * (top - 2) + kLsbExponent);
  return negative ? -magnitude : magnitude;
}

void StatsAccumulator::merge(const StatsAccumulator& o) {
  numel += o.numel;
  zeros += o.zeros;
  nan += o.nan;
  pos_inf += o.pos_inf;
  neg_inf += o.neg_inf;
  max_abs_bits = std::max(max_abs_bits, o.max_abs_bits);
  min_abs_bits = std::min(min_abs_bits, o.min_abs_bits);
  sum.merge(o.sum);
  sum_sq.merge(o.sum_sq);
  for (std::size_t i = 0; i < hist.size(); ++i) hist[i] += o.hist[i];
  for (std::size_t i = 0; i < target_counts.size(); ++i) {
    for (int k = 0; k < 3; ++k) target_counts[i][k] += o.target_counts[i][k];
  }
}

TensorStats StatsAccumulator::finish(std::span<const TargetSpec> targets) const {
  TensorStats s;
  s.numel = numel;
  s.zeros = zeros;
  s.nan = nan;
  s.pos_inf = pos_inf;
  s.neg_inf = neg_inf;
  s.max_abs = fp32_abs_bits_to_double(max_abs_bits);
  s.min_abs_nonzero = min_abs_bits == 0xFFFFFFFFu ? 0.0 : fp32_abs_bits_to_double(min_abs_bits);
  s.sum = sum.round();
  s.sum_sq = sum_sq.round();
  s.histogram = BinadeHistogram::from_dense(hist);
  s.targets.reserve(targets.size());
  for (std::size_t i = 0; i < targets.size(); ++i) {
    s.targets.push_back(TargetCounts{targets[i], target_counts[i][0], target_counts[i][1],
                                     target_counts[i][2]});
  }
  return s;
}

}  // namespace detail
}  // namespace ampscope
