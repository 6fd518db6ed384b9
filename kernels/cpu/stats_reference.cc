// The scalar reference for tensor statistics: one element at a time, every quantity computed
// from its definition in FP64 (frexp for the binade, the exact predicates for the targets), so
// the fast kernels' bit tricks are checked against something that does not share them. The sums
// are exact (every value and its FP64 square go into an exact accumulator) and rounded once.
#include <cmath>
#include <cstring>
#include <limits>

#include "ampscope/check.h"
#include "ampscope/convert.h"
#include "stats_internal.h"

namespace ampscope {
namespace {

float load_value(const void* data, std::size_t i, Format dtype) {
  if (dtype == Format::kFP32) {
    float f;
    std::memcpy(&f, static_cast<const char*>(data) + 4 * i, 4);
    return f;
  }
  if (storage_bytes(dtype) == 1) return decode(static_cast<const unsigned char*>(data)[i], dtype);
  std::uint16_t h;
  std::memcpy(&h, static_cast<const char*>(data) + 2 * i, 2);
  return decode(h, dtype);
}

}  // namespace

TensorStats compute_stats_reference(const void* data, std::size_t n, Format dtype,
                                    std::span<const TargetSpec> targets) {
  AMPSCOPE_CHECK(is_stats_storage_format(dtype),
                 "statistics read fp32, fp16, bf16, e4m3 or e5m2 storage, not ", format_name(dtype));
  AMPSCOPE_CHECK(n == 0 || data != nullptr, "null data pointer for ", n, " elements");
  for (const TargetSpec& t : targets) {
    AMPSCOPE_CHECK(t.scale_log2 >= -kMaxScaleLog2 && t.scale_log2 <= kMaxScaleLog2,
                   "target scale exponent ", t.scale_log2, " out of range");
  }
  TensorStats s;
  s.numel = n;
  for (const TargetSpec& t : targets) s.targets.push_back(TargetCounts{t, 0, 0, 0});
  std::array<std::uint64_t, kHistogramBins> dense{};
  double min_abs = std::numeric_limits<double>::infinity();
  detail::ExactSum sum, sum_sq;
  for (std::size_t i = 0; i < n; ++i) {
    const float x = load_value(data, i, dtype);
    if (std::isnan(x)) {
      ++s.nan;
      continue;
    }
    if (std::isinf(x)) {
      ++(x > 0 ? s.pos_inf : s.neg_inf);
      continue;
    }
    if (x == 0.0f) {
      ++s.zeros;
      continue;
    }
    const double v = std::fabs(static_cast<double>(x));
    s.max_abs = std::max(s.max_abs, v);
    min_abs = std::min(min_abs, v);
    sum.add(static_cast<double>(x));
    sum_sq.add(v * v);  // exact: a float has 24 significant bits
    int e = 0;
    std::frexp(v, &e);
    ++dense[static_cast<std::size_t>(e - 1 - kHistogramMinExponent)];
    for (TargetCounts& tc : s.targets) {
      tc.overflow += detail::overflows(v, tc.target);
      tc.underflow += detail::underflows(v, tc.target);
      tc.subnormal += detail::is_subnormal_in(v, tc.target);
    }
  }
  s.min_abs_nonzero = std::isinf(min_abs) ? 0.0 : min_abs;
  s.sum = sum.round();
  s.sum_sq = sum_sq.round();
  s.histogram = BinadeHistogram::from_dense(dense);
  return s;
}

}  // namespace ampscope
