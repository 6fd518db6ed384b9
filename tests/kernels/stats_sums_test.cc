// The sums of TensorStats against an exact oracle: `sum` must be the exactly rounded sum of the
// finite values however much it cancels, `sum_sq` within a few ulps of the exactly rounded sum
// of squares, on every path (the reference, each SIMD level the CPU has, one thread and several,
// the 16-bit pattern kernel). The oracle is CPython's math.fsum (Shewchuk's partials with its
// half-way correction), written out below: it shares nothing with the kernels' accumulator.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ampscope/convert.h"
#include "ampscope/tensor_stats.h"

namespace ampscope {
namespace {

// math.fsum from CPython's Modules/mathmodule.c: exact partials, then one correct rounding.
double fsum(const std::vector<double>& values) {
  std::vector<double> partials;
  for (double x : values) {
    std::size_t i = 0;
    for (std::size_t j = 0; j < partials.size(); ++j) {
      double y = partials[j];
      if (std::fabs(x) < std::fabs(y)) std::swap(x, y);
      const double hi = x + y;
      const double lo = y - (hi - x);
      if (lo != 0.0) partials[i++] = lo;
      x = hi;
    }
    partials.resize(i);
    partials.push_back(x);
  }
  if (partials.empty()) return 0.0;
  std::size_t n = partials.size();
  double hi = partials[--n];
  double lo = 0.0;
  while (n > 0) {
    const double x = hi;
    const double y = partials[--n];
    hi = x + y;
    lo = y - (hi - x);
    if (lo != 0.0) break;
  }
  // Round half-even correctly when the rest pushes a tie one way.
  if (n > 0 && ((lo < 0.0 && partials[n - 1] < 0.0) || (lo > 0.0 && partials[n - 1] > 0.0))) {
    const double y = lo * 2.0;
    const double x = hi + y;
    if (y == x - hi) hi = x;
  }
  return hi;
}

// Storage of `dtype` holding `values` (rounded into it), and the values as stored.
struct Tensor {
  Format dtype;
  std::vector<unsigned char> bytes;
  std::vector<double> stored;  // finite values only, as stored
  std::size_t n = 0;
};

Tensor make(const std::vector<float>& values, Format dtype) {
  Tensor t{dtype, {}, {}, values.size()};
  const std::size_t elem = static_cast<std::size_t>(storage_bytes(dtype));
  t.bytes.resize(values.size() * elem);
  for (std::size_t i = 0; i < values.size(); ++i) {
    const std::uint32_t bits = encode(values[i], dtype);
    std::memcpy(t.bytes.data() + i * elem, &bits, elem);
    const float v = dtype == Format::kFP32 ? values[i] : decode(bits, dtype);
    if (std::isfinite(v)) t.stored.push_back(static_cast<double>(v));
  }
  return t;
}

double ulp(double x) {
  const double a = std::fabs(x);
  return std::nextafter(a, std::numeric_limits<double>::infinity()) - a;
}

std::vector<SimdLevel> supported_levels() {
  std::vector<SimdLevel> out;
  for (int l = 0; l <= static_cast<int>(max_supported_simd_level()); ++l) {
    out.push_back(static_cast<SimdLevel>(l));
  }
  return out;
}

// Every path gives the exactly rounded sum, and the sum of squares within kSumSqUlps.
constexpr double kSumSqUlps = 4.0;

void expect_exact_sums(const Tensor& t) {
  std::vector<double> squares;
  squares.reserve(t.stored.size());
  for (double v : t.stored) squares.push_back(v * v);  // exact: at most 24 significant bits
  const double want_sum = fsum(t.stored);
  const double want_sum_sq = fsum(squares);
  auto check = [&](const TensorStats& s, const std::string& path) {
    SCOPED_TRACE(path + " " + std::string(format_name(t.dtype)) + " n=" + std::to_string(t.n));
    EXPECT_EQ(s.sum, want_sum) << "off by " << (s.sum - want_sum) / ulp(want_sum) << " ulp";
    EXPECT_LE(std::fabs(s.sum_sq - want_sum_sq), kSumSqUlps * ulp(want_sum_sq))
        << s.sum_sq << " vs " << want_sum_sq;
  };
  check(compute_stats_reference(t.bytes.data(), t.n, t.dtype), "reference");
  for (SimdLevel level : supported_levels()) {
    for (int threads : {1, 2, 3}) {
      StatsOptions o;
      o.simd = level;
      o.max_threads = threads;
      o.parallel_threshold = 1;
      const std::string path =
          std::string(simd_level_name(level)) + " threads=" + std::to_string(threads);
      check(compute_stats(t.bytes.data(), t.n, t.dtype, {}, o), path);
      if (t.dtype != Format::kFP32) {
        o.pattern_histogram_threshold = 1;
        check(compute_stats(t.bytes.data(), t.n, t.dtype, {}, o), path + " pattern");
      }
    }
  }
}

TEST(TensorStatsSumsTest, HugeValuesThatCancelLeaveTheOrdinaryOnes) {
  // FP64 accumulation in lanes loses the ordinary values to the huge ones: one lane ends at
  // 3.4e38 + (ordinary) - 3.4e38 = 0 plus whatever followed.
  std::vector<float> values;
  for (int i = 1; i <= 623; ++i) values.push_back(static_cast<float>(i) * 0.5f);
  values[5] = 3.4e38f;
  values[400] = -3.4e38f;
  const Tensor t = make(values, Format::kFP32);
  expect_exact_sums(t);
  const TensorStats s = compute_stats(t.bytes.data(), t.n, t.dtype);
  double ordinary = 0.0;  // small integers and halves: exact in any order
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i != 5 && i != 400) ordinary += values[i];
  }
  EXPECT_EQ(s.sum, ordinary);
  EXPECT_GT(s.sum, 96000.0);
}

TEST(TensorStatsSumsTest, RandomCancellation) {
  // Pairs x, -x over 60 binades, shuffled, plus a few values that survive: the exact sum is
  // tiny next to the terms.
  for (Format dtype : {Format::kFP32, Format::kFP16, Format::kBF16}) {
    std::mt19937 rng(static_cast<unsigned>(dtype) + 1);
    std::uniform_real_distribution<float> mant(1.0f, 2.0f);
    std::uniform_int_distribution<int> exp(dtype == Format::kFP16 ? -24 : -40,
                                           dtype == Format::kFP16 ? 15 : 20);
    std::vector<float> values;
    for (int i = 0; i < 6000; ++i) {
      const float x = std::ldexp(mant(rng), exp(rng));
      values.push_back(x);
      values.push_back(-x);
    }
    for (int i = 0; i < 7; ++i) values.push_back(std::ldexp(mant(rng), exp(rng) / 2));
    std::shuffle(values.begin(), values.end(), rng);
    expect_exact_sums(make(values, dtype));
  }
}

TEST(TensorStatsSumsTest, EveryBinadeAndSpecialValues) {
  // Any finite bit pattern (subnormals to max), NaN, Inf and zeros mixed in: the ranges are too
  // wide for a chunk's FP64 sum, so the exact slow paths run too.
  for (Format dtype : {Format::kFP32, Format::kFP16, Format::kBF16}) {
    std::mt19937 rng(77);
    std::uniform_int_distribution<std::uint32_t> any;
    std::vector<float> values;
    for (int i = 0; i < 20011; ++i) {
      float x = std::bit_cast<float>(any(rng));
      if (i % 97 == 0) x = 0.0f;
      values.push_back(x);
    }
    expect_exact_sums(make(values, dtype));
  }
}

TEST(TensorStatsSumsTest, GradientLikeData) {
  // The common case: every chunk takes the fast path.
  for (Format dtype : {Format::kFP32, Format::kFP16, Format::kBF16}) {
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 1e-3f);
    std::vector<float> values(100003);
    for (float& x : values) x = normal(rng);
    expect_exact_sums(make(values, dtype));
  }
}

TEST(TensorStatsSumsTest, ScaleAndComputeStatsSumsAreExact) {
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::vector<float> values(50021);
  for (float& x : values) x = normal(rng);
  values[77] = 3.0e38f;
  values[30000] = -3.0e38f;
  for (Format dtype : {Format::kFP32, Format::kFP16, Format::kBF16}) {
    for (SimdLevel level : supported_levels()) {
      Tensor t = make(values, dtype);
      StatsOptions o;
      o.simd = level;
      const TensorStats s = scale_and_compute_stats(t.bytes.data(), t.n, dtype, 0x1p-3f, {}, o);
      std::vector<double> stored;
      for (std::size_t i = 0; i < t.n; ++i) {
        float v;
        if (dtype == Format::kFP32) {
          std::memcpy(&v, t.bytes.data() + 4 * i, 4);
        } else {
          std::uint16_t h;
          std::memcpy(&h, t.bytes.data() + 2 * i, 2);
          v = decode(h, dtype);
        }
        if (std::isfinite(v)) stored.push_back(v);
      }
      SCOPED_TRACE(std::string(simd_level_name(level)) + " " + std::string(format_name(dtype)));
      EXPECT_EQ(s.sum, fsum(stored));
    }
  }
}

}  // namespace
}  // namespace ampscope
