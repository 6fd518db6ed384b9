// FORMAT@K targets on the FP6/FP4 element formats (E2M1, E3M2, E2M3) through every statistics
// path: the thresholds the kernels derive from formats.h must count exactly what the conversion
// does. These formats saturate instead of overflowing, so "overflow" is read off the rounding
// (rounds_past_max below) and the counts are checked against conversions, value by value, at
// every SIMD level, threaded and through the pattern histogram, for every storage format the
// statistics read (FP32, FP16, BF16, E4M3, E5M2).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ampscope/convert.h"
#include "ampscope/cpu_features.h"
#include "ampscope/formats.h"
#include "ampscope/tensor_stats.h"

namespace ampscope {
namespace {

constexpr Format kMxElements[] = {Format::kE2M1, Format::kE3M2, Format::kE2M3};
constexpr int kScales[] = {-12, 0, 5};

// |y| rounds beyond max (where a format with the exponent range going on would put it).
// Above max and below 2^(max_exponent + 1), y/2 lies in the normal binade under the top one,
// which has the same relative quantum: 2 * round(y/2) is y rounded without the clamp.
bool rounds_past_max(double y, const FormatInfo& f) {
  const double a = std::fabs(y);
  if (a <= f.max_finite) return false;
  if (a >= std::ldexp(1.0, f.max_exponent + 1)) return true;
  return 2.0 * static_cast<double>(round_to(static_cast<float>(a / 2), f.format)) > f.max_finite;
}

// The counts of one target, from conversions of each value (the values are FP32 numbers and
// y = x * 2^k stays one for the inputs here).
TargetCounts counts_by_conversion(const std::vector<float>& xs, const TargetSpec& t) {
  const FormatInfo& f = format_info(t.format);
  TargetCounts c{t};
  for (float x : xs) {
    if (!std::isfinite(x) || x == 0.0f) continue;
    const double y = std::ldexp(static_cast<double>(x), t.scale_log2);
    const auto yf = static_cast<float>(y);
    EXPECT_EQ(static_cast<double>(yf), y) << "input not exact at scale " << t.scale_log2;
    const float r = round_to(yf, t.format);
    if (rounds_past_max(y, f)) {
      ++c.overflow;
    } else if (r == 0.0f) {
      ++c.underflow;
    } else if (std::fabs(r) < f.min_normal()) {
      ++c.subnormal;
    }
  }
  return c;
}

// Every value and midpoint of each element format (the rounding boundaries: max, the overflow
// tie, half the smallest subnormal, the subnormal/normal tie), +-1 and +-2 FP32 ulps, both signs,
// at each target scale, plus zeros, Inf and NaN.
std::vector<float> boundary_values() {
  std::vector<float> out = {0.0f, -0.0f, INFINITY, -INFINITY, NAN};
  for (Format g : kMxElements) {
    const FormatInfo& f = format_info(g);
    const std::uint32_t codes = 1u << (f.total_bits - 1);
    std::vector<double> points;
    for (std::uint32_t c = 0; c < codes; ++c) {
      const double v = decode(c, g);
      const double next = c + 1 < codes ? static_cast<double>(decode(c + 1, g))
                                        : 2 * f.overflow_threshold - f.max_finite;
      points.push_back(v);
      points.push_back((v + next) / 2);
    }
    points.push_back(4 * f.max_finite);
    for (int k : kScales) {
      for (double p : points) {
        const auto centre = static_cast<float>(std::ldexp(p, -k));  // exact: a few bits
        if (centre == 0.0f) continue;
        float lo = centre, hi = centre;
        for (int step = 0; step < 3; ++step) {
          for (float x : {lo, hi}) {
            out.push_back(x);
            out.push_back(-x);
          }
          lo = std::nextafter(lo, 0.0f);
          hi = std::nextafter(hi, INFINITY);
        }
      }
    }
  }
  return out;
}

std::vector<TargetSpec> mx_targets() {
  std::vector<TargetSpec> out;
  for (Format g : kMxElements) {
    for (int k : kScales) out.push_back({g, k});
  }
  return out;
}

// The values as stored in dtype and read back (what the statistics see).
std::vector<unsigned char> store(const std::vector<float>& xs, Format dtype,
                                 std::vector<float>* as_read) {
  const auto elem = static_cast<std::size_t>(storage_bytes(dtype));
  std::vector<unsigned char> bytes(xs.size() * elem);
  as_read->resize(xs.size());
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const std::uint32_t bits = encode(xs[i], dtype);
    std::memcpy(bytes.data() + i * elem, &bits, elem);  // little-endian low bytes
    (*as_read)[i] = decode(bits, dtype);
  }
  return bytes;
}

std::vector<SimdLevel> supported_levels() {
  std::vector<SimdLevel> out = {SimdLevel::kScalar};
  if (max_supported_simd_level() >= SimdLevel::kAvx2) out.push_back(SimdLevel::kAvx2);
  if (max_supported_simd_level() >= SimdLevel::kAvx512) out.push_back(SimdLevel::kAvx512);
  return out;
}

void expect_counts(const TensorStats& s, const std::vector<TargetCounts>& want,
                   const std::string& path) {
  ASSERT_EQ(s.targets.size(), want.size()) << path;
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(s.targets[i], want[i])
        << path << " target " << to_string(want[i].target) << ": overflow/underflow/subnormal "
        << s.targets[i].overflow << "/" << s.targets[i].underflow << "/" << s.targets[i].subnormal
        << ", by conversion " << want[i].overflow << "/" << want[i].underflow << "/"
        << want[i].subnormal;
  }
}

TEST(MxTargetStatsTest, EveryPathCountsWhatTheConversionDoes) {
  std::vector<float> xs = boundary_values();
  std::mt19937 rng(29);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-20, 12);
  for (int i = 0; i < 20000; ++i) xs.push_back(std::ldexp(mantissa(rng), exponent(rng)));
  std::shuffle(xs.begin(), xs.end(), rng);
  const std::vector<TargetSpec> targets = mx_targets();
  for (const FormatInfo& storage : kFormatInfos) {
    const Format dtype = storage.format;
    if (!is_stats_storage_format(dtype)) continue;
    std::vector<float> as_read;
    const std::vector<unsigned char> bytes = store(xs, dtype, &as_read);
    std::vector<TargetCounts> want;
    for (const TargetSpec& t : targets) want.push_back(counts_by_conversion(as_read, t));
    const std::string name(format_name(dtype));
    expect_counts(compute_stats_reference(bytes.data(), xs.size(), dtype, targets), want,
                  name + " reference");
    for (SimdLevel level : supported_levels()) {
      const std::string path = name + " " + std::string(simd_level_name(level));
      StatsOptions single;
      single.simd = level;
      single.max_threads = 1;
      single.pattern_histogram_threshold = SIZE_MAX;
      expect_counts(compute_stats(bytes.data(), xs.size(), dtype, targets, single), want, path);
      StatsOptions threaded = single;
      threaded.max_threads = 4;
      threaded.parallel_threshold = 1;
      expect_counts(compute_stats(bytes.data(), xs.size(), dtype, targets, threaded), want,
                    path + " threaded");
      if (dtype != Format::kFP32) {
        StatsOptions pattern = single;
        pattern.pattern_histogram_threshold = 1;
        expect_counts(compute_stats(bytes.data(), xs.size(), dtype, targets, pattern), want,
                      path + " pattern histogram");
      }
    }
  }
}

// Counted by hand from the E2M1 value set +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}.
TEST(MxTargetStatsTest, E2m1CountsByHand) {
  const std::vector<float> xs = {
      7.0f,                         // tie between 6 and 8: rounds to 8, beyond max: overflow
      -7.0f,                        // overflow
      std::nextafter(7.0f, 0.0f),   // rounds to 6: counted nowhere
      100.0f,                       // overflow
      0.25f,                        // half of 0.5: ties to 0: underflow
      std::nextafter(0.25f, 1.0f),  // rounds to 0.5: subnormal
      std::nextafter(0.75f, 0.0f),  // rounds to 0.5: subnormal
      0.75f,                        // tie between 0.5 and 1: rounds to the even 1: normal
      0.0f,                         // zero is not an underflow
      3.5f,                         // normal
  };
  for (SimdLevel level : supported_levels()) {
    StatsOptions o;
    o.simd = level;
    const std::vector<TargetSpec> t = {{Format::kE2M1, 0}, {Format::kE2M1, 1}};
    const TensorStats s = compute_stats(xs.data(), xs.size(), Format::kFP32, t, o);
    ASSERT_EQ(s.targets.size(), 2u);
    EXPECT_EQ(s.targets[0].overflow, 3u) << simd_level_name(level);
    EXPECT_EQ(s.targets[0].underflow, 1u) << simd_level_name(level);
    EXPECT_EQ(s.targets[0].subnormal, 2u) << simd_level_name(level);
    // At 2^1: +-7, 6.9999995 and 100 overflow, and 3.5 -> 7 is the tie: 5; 0.25 -> 0.5 and
    // 0.2500001 -> 0.5000001 round to the subnormal 0.5: 2; 0.7499999 -> 1.4999999 and 0.75 ->
    // 1.5 are normal; nothing underflows.
    EXPECT_EQ(s.targets[1].overflow, 5u) << simd_level_name(level);
    EXPECT_EQ(s.targets[1].underflow, 0u) << simd_level_name(level);
    EXPECT_EQ(s.targets[1].subnormal, 2u) << simd_level_name(level);
  }
}

}  // namespace
}  // namespace ampscope
