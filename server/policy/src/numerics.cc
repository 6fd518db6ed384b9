// Binade arithmetic and the histogram helpers of the public header. Everything here works on
// exponents (ints) so that the engine's decisions are exact and reproducible.
#include "numerics.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "ampscope/policy/policy_engine.h"

namespace ampscope::policy {
namespace detail {

double pow2(int k) { return std::ldexp(1.0, k); }

std::string scale_text(double scale) {
  if (is_power_of_two(scale)) return "2^" + std::to_string(scale_exponent(scale));
  std::ostringstream os;
  os.precision(9);
  os << scale;
  return os.str();
}

}  // namespace detail

BinadeHistogram to_unscaled(const BinadeHistogram& measured, double scale) {
  if (!(std::isfinite(scale) && scale > 0.0)) {
    std::ostringstream os;
    os << "scale must be finite and > 0, got " << scale;
    throw PolicyError(os.str());
  }
  BinadeHistogram h = measured;
  // Power of two: exact. Otherwise floor(log2(scale)): every value x / scale is below
  // 2^(e + 1) / 2^floor(log2 scale), so each bin lands where its largest possible value lies.
  if (!h.empty()) h.min_exponent -= scale_exponent(scale);
  return h;
}

std::optional<int> overflow_free_scale_log2(const BinadeHistogram& unscaled, Format format) {
  if (unscaled.empty()) return std::nullopt;
  const FormatInfo& f = format_info(format);
  // The top bin [2^t, 2^(t+1)) is safe at 2^k when 2^(t+1+k) <= the overflow threshold, which
  // lies in [2^max_exponent, 2^(max_exponent+1)) for every format: k = max_exponent - 1 - t.
  // predict_from_histogram() is the definition; the loops only confirm (and would correct) it.
  int k = f.max_exponent - 1 - unscaled.max_exponent();
  const int limit = 2 * kMaxScaleLog2 - 1;
  k = std::clamp(k, -limit, limit);
  while (k > -limit && predict_from_histogram(unscaled, format, k).overflow.upper > 0) --k;
  while (k < limit && predict_from_histogram(unscaled, format, k + 1).overflow.upper == 0) ++k;
  return k;
}

int trimmed_dynamic_range(const BinadeHistogram& histogram, double trim_fraction) {
  const std::uint64_t total = histogram.total();
  if (total == 0) return 0;
  std::uint64_t drop =
      static_cast<std::uint64_t>(std::floor(static_cast<long double>(trim_fraction) * total));
  if (2 * drop >= total) drop = (total - 1) / 2;  // keep at least one value
  int lo = histogram.min_exponent, hi = histogram.max_exponent();
  std::uint64_t cum = 0;
  for (std::size_t i = 0; i < histogram.counts.size(); ++i) {
    cum += histogram.counts[i];
    if (cum > drop) {
      lo = histogram.min_exponent + static_cast<int>(i);
      break;
    }
  }
  cum = 0;
  for (std::size_t i = histogram.counts.size(); i-- > 0;) {
    cum += histogram.counts[i];
    if (cum > drop) {
      hi = histogram.min_exponent + static_cast<int>(i);
      break;
    }
  }
  return hi - lo;
}

}  // namespace ampscope::policy
