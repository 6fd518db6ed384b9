// Tensor statistics: the reference against hand-computed values and against the conversions,
// and every fast path (scalar, AVX2, AVX-512, threaded) against the reference on random and
// adversarial data.
#include <gtest/gtest.h>
#include <xmmintrin.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "ampscope/check.h"
#include "ampscope/convert.h"
#include "ampscope/tensor_stats.h"
#include "../../kernels/cpu/stats_internal.h"
#include "expect_same_stats.h"

namespace ampscope {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

const std::vector<TargetSpec> kTargets = {
    {Format::kFP16, 0}, {Format::kFP16, 16}, {Format::kBF16, 0}, {Format::kE4M3, 0},
    {Format::kE5M2, -3}, {Format::kFP32, -20}, {Format::kE4M3, 12}, {Format::kFP16, -40},
};

// Storage for a test tensor: raw bytes, so pointers can be misaligned on purpose.
struct Tensor {
  Format dtype;
  std::size_t n;
  std::vector<unsigned char> bytes;
  std::size_t offset = 0;
  const void* data() const { return bytes.data() + offset; }
};

Tensor make_tensor(const std::vector<float>& values, Format dtype, std::size_t misalign = 0) {
  Tensor t{dtype, values.size(), {}, misalign};
  const std::size_t elem = static_cast<std::size_t>(storage_bytes(dtype));
  t.bytes.resize(values.size() * elem + misalign + 1);
  for (std::size_t i = 0; i < values.size(); ++i) {
    const std::uint32_t bits = encode(values[i], dtype);
    std::memcpy(t.bytes.data() + misalign + i * elem, &bits, elem);  // little-endian low bytes
  }
  return t;
}

Tensor make_tensor_bits(const std::vector<std::uint16_t>& bits, Format dtype) {
  Tensor t{dtype, bits.size(), std::vector<unsigned char>(bits.size() * 2), 0};
  std::memcpy(t.bytes.data(), bits.data(), bits.size() * 2);
  return t;
}

std::vector<SimdLevel> supported_levels() {
  std::vector<SimdLevel> out = {SimdLevel::kScalar};
  if (max_supported_simd_level() >= SimdLevel::kAvx2) out.push_back(SimdLevel::kAvx2);
  if (max_supported_simd_level() >= SimdLevel::kAvx512) out.push_back(SimdLevel::kAvx512);
  return out;
}

void check_all_paths(const Tensor& t, std::span<const TargetSpec> targets = kTargets) {
  const TensorStats want = compute_stats_reference(t.data(), t.n, t.dtype, targets);
  for (SimdLevel level : supported_levels()) {
    SCOPED_TRACE(std::string(simd_level_name(level)) + " " + std::string(format_name(t.dtype)) +
                 " n=" + std::to_string(t.n));
    StatsOptions single;
    single.simd = level;
    single.max_threads = 1;
    expect_same_stats(compute_stats(t.data(), t.n, t.dtype, targets, single), want);
    StatsOptions threaded;
    threaded.simd = level;
    threaded.max_threads = 4;
    threaded.parallel_threshold = 1;
    expect_same_stats(compute_stats(t.data(), t.n, t.dtype, targets, threaded), want);
    if (t.dtype != Format::kFP32) {
      SCOPED_TRACE("pattern histogram");
      StatsOptions pattern = single;
      pattern.pattern_histogram_threshold = 1;
      expect_same_stats(compute_stats(t.data(), t.n, t.dtype, targets, pattern), want);
      pattern.max_threads = 3;
      pattern.parallel_threshold = 1;
      expect_same_stats(compute_stats(t.data(), t.n, t.dtype, targets, pattern), want);
    }
  }
}

// Every special value of every format, its neighbours, subnormals, and values around every
// target threshold, shuffled so specials land in every lane position.
std::vector<float> adversarial_values(std::mt19937& rng) {
  std::vector<float> v = {0.0f, -0.0f, kInf, -kInf, kNaN, -kNaN,
                          std::bit_cast<float>(0x7F800001u), std::bit_cast<float>(0xFFC12345u),
                          std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::min(), std::numeric_limits<float>::denorm_min(),
                          -std::numeric_limits<float>::denorm_min(), 65504.0f, 65520.0f, 65519.996f,
                          448.0f, 464.0f, 464.00003f, 57344.0f, 61440.0f, 0x1p-24f, 0x1p-25f,
                          0x1.000002p-25f, 0x1p-14f, 0x1.ffcp-15f, 0x1.ff8p-15f, 0x1p-9f, 0x1p-10f,
                          0x1p-16f, 0x1p-17f, 0x1p-133f, 0x1p-134f, 0x1p-126f};
  for (const FormatInfo& f : kFormatInfos) {
    for (int e = f.min_subnormal_exponent - 2; e <= f.max_exponent + 1; ++e) {
      const float p = std::ldexp(1.0f, e);
      for (float x : {p, std::nextafter(p, 0.0f), std::nextafter(p, kInf), 1.5f * p}) {
        v.push_back(x);
        v.push_back(-x);
      }
    }
  }
  std::uniform_int_distribution<std::uint32_t> any;
  for (int i = 0; i < 4000; ++i) v.push_back(std::bit_cast<float>(any(rng)));  // any pattern
  std::shuffle(v.begin(), v.end(), rng);
  return v;
}

std::vector<float> gradient_like(std::size_t n, double stddev, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, static_cast<float>(stddev));
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

TEST(TensorStatsReferenceTest, HandComputedValues) {
  const std::vector<float> x = {0.0f, -0.0f, 1.0f, -2.0f, 0.5f, kNaN, kInf, -kInf, 3.0f, 0x1p-149f};
  const TensorStats s = compute_stats_reference(x.data(), x.size(), Format::kFP32,
                                                std::vector<TargetSpec>{{Format::kFP16, 0}});
  EXPECT_EQ(s.numel, 10u);
  EXPECT_EQ(s.zeros, 2u);
  EXPECT_EQ(s.nan, 1u);
  EXPECT_EQ(s.pos_inf, 1u);
  EXPECT_EQ(s.neg_inf, 1u);
  EXPECT_EQ(s.finite_nonzero(), 5u);
  EXPECT_EQ(s.max_abs, 3.0);
  EXPECT_EQ(s.min_abs_nonzero, 0x1p-149);
  EXPECT_EQ(s.sum, 1.0 - 2.0 + 0.5 + 3.0 + 0x1p-149);
  EXPECT_EQ(s.sum_sq, 1.0 + 4.0 + 0.25 + 9.0 + 0x1p-298);
  EXPECT_EQ(s.histogram.min_exponent, -149);
  EXPECT_EQ(s.histogram.max_exponent(), 1);
  EXPECT_EQ(s.histogram.count_at(-149), 1u);
  EXPECT_EQ(s.histogram.count_at(-1), 1u);  // 0.5
  EXPECT_EQ(s.histogram.count_at(0), 1u);   // 1
  EXPECT_EQ(s.histogram.count_at(1), 2u);   // 2, 3
  EXPECT_EQ(s.histogram.total(), 5u);
  ASSERT_EQ(s.targets.size(), 1u);
  EXPECT_EQ(s.targets[0].overflow, 0u);
  EXPECT_EQ(s.targets[0].underflow, 1u);  // 2^-149 rounds to zero in FP16
  EXPECT_EQ(s.targets[0].subnormal, 0u);
}

TEST(TensorStatsReferenceTest, ThresholdsFollowDesign) {
  // By definition: FP16 overflows from 65520 up; E4M3 only above 464; half the smallest subnormal
  // underflows.
  const std::vector<float> x = {65504.0f, 65519.996f, 65520.0f, 464.0f, 464.00003f,
                                0x1p-25f, 0x1.000002p-25f, 0x1p-10f, 0x1.000002p-10f};
  const std::vector<TargetSpec> t = {{Format::kFP16, 0}, {Format::kE4M3, 0}};
  auto count = [&](float v, const TargetSpec& spec) {
    return compute_stats_reference(&v, 1, Format::kFP32, std::span(&spec, 1)).targets[0];
  };
  EXPECT_EQ(count(65504.0f, t[0]).overflow, 0u);
  EXPECT_EQ(count(65519.996f, t[0]).overflow, 0u);
  EXPECT_EQ(count(65520.0f, t[0]).overflow, 1u);
  EXPECT_EQ(count(464.0f, t[1]).overflow, 0u);
  EXPECT_EQ(count(464.00003f, t[1]).overflow, 1u);
  EXPECT_EQ(count(0x1p-25f, t[0]).underflow, 1u);
  EXPECT_EQ(count(0x1.000002p-25f, t[0]).underflow, 0u);
  EXPECT_EQ(count(0x1.000002p-25f, t[0]).subnormal, 1u);
  EXPECT_EQ(count(0x1p-10f, t[1]).underflow, 1u);  // E4M3: half of 2^-9
  EXPECT_EQ(count(0x1.000002p-10f, t[1]).subnormal, 1u);
  // Largest FP16 subnormal region edge: values from 2^-14 - 2^-25 round up to min normal.
  EXPECT_EQ(count(0x1.ff8p-15f, t[0]).subnormal, 1u);  // largest subnormal itself
  EXPECT_EQ(count(0x1.ffbffep-15f, t[0]).subnormal, 1u);  // just below the tie
  EXPECT_EQ(count(0x1.ffcp-15f, t[0]).subnormal, 0u);  // the tie rounds to 2^-14
}

// FP6/FP4 saturate, so their conversion never shows an overflow; it is read off the rounding
// instead. Above max, |y| < 2^(max_exponent + 1) lies in the top binade, and y/2 in the normal
// binade below it, which has the same quantum relative to it: 2 * round(y/2) is y rounded as
// if the range went on, and it is beyond max exactly when y overflows.
bool rounds_past_max(float y, const FormatInfo& f) {
  const double a = std::fabs(static_cast<double>(y));
  if (a <= f.max_finite) return false;
  if (a >= std::ldexp(1.0, f.max_exponent + 1)) return true;
  return 2.0 * static_cast<double>(round_to(static_cast<float>(a / 2), f.format)) > f.max_finite;
}

// The statistics' overflow/underflow/subnormal must say exactly what the conversion does.
TEST(TensorStatsReferenceTest, PredicatesAgreeWithConversions) {
  std::mt19937 rng(7);
  std::vector<float> values = adversarial_values(rng);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  for (int e = -40; e <= 20; ++e) {
    for (int i = 0; i < 50; ++i) values.push_back(std::ldexp(mant(rng), e));
  }
  for (const FormatInfo& f : kFormatInfos) {
    for (int k : {-8, 0, 3, 16}) {
      const TargetSpec t{f.format, k};
      for (float x : values) {
        if (!std::isfinite(x) || x == 0.0f) continue;
        const double y = std::ldexp(static_cast<double>(x), k);
        const auto yf = static_cast<float>(y);
        if (static_cast<double>(yf) != y) continue;  // only where the scaled value is an FP32
        const float r = round_to(yf, f.format);
        const double v = std::fabs(static_cast<double>(x));
        SCOPED_TRACE(std::string(f.name) + " x=" + std::to_string(x) + " k=" + std::to_string(k));
        EXPECT_EQ(detail::overflows(v, t), f.has_nan ? !std::isfinite(r) : rounds_past_max(yf, f));
        EXPECT_EQ(detail::underflows(v, t), r == 0.0f);
        EXPECT_EQ(detail::is_subnormal_in(v, t),
                  r != 0.0f && std::isfinite(r) && std::fabs(r) < f.min_normal());
      }
    }
  }
}

TEST(TensorStatsTest, EmptyTensor) {
  for (SimdLevel level : supported_levels()) {
    StatsOptions o;
    o.simd = level;
    const TensorStats s = compute_stats(nullptr, 0, Format::kFP16, kTargets, o);
    EXPECT_EQ(s.numel, 0u);
    EXPECT_TRUE(s.histogram.empty());
    EXPECT_EQ(s.max_abs, 0.0);
    EXPECT_EQ(s.min_abs_nonzero, 0.0);
    ASSERT_EQ(s.targets.size(), kTargets.size());
    EXPECT_EQ(s.targets[3].overflow, 0u);
  }
}

class TensorStatsPathsTest : public ::testing::TestWithParam<std::tuple<Format, std::size_t>> {};

TEST_P(TensorStatsPathsTest, GradientLikeDataMatchesReference) {
  const auto [dtype, n] = GetParam();
  std::mt19937 rng(static_cast<unsigned>(n) * 31 + static_cast<unsigned>(dtype));
  check_all_paths(make_tensor(gradient_like(n, 1e-3, rng), dtype));
}

TEST_P(TensorStatsPathsTest, AdversarialDataMatchesReference) {
  const auto [dtype, n] = GetParam();
  std::mt19937 rng(static_cast<unsigned>(n) + 99);
  std::vector<float> pool = adversarial_values(rng);
  std::vector<float> values(n);
  for (std::size_t i = 0; i < n; ++i) values[i] = pool[i % pool.size()];
  check_all_paths(make_tensor(values, dtype));
}

TEST_P(TensorStatsPathsTest, MisalignedPointers) {
  const auto [dtype, n] = GetParam();
  std::mt19937 rng(5);
  const std::vector<float> values = gradient_like(n, 1.0, rng);
  for (std::size_t misalign : {1u, 2u, 3u}) check_all_paths(make_tensor(values, dtype, misalign));
}

INSTANTIATE_TEST_SUITE_P(
    DtypeBySize, TensorStatsPathsTest,
    ::testing::Combine(::testing::Values(Format::kFP32, Format::kFP16, Format::kBF16),
                       ::testing::Values(1, 2, 7, 8, 15, 16, 17, 31, 33, 97, 1021, 4099, 65537)),
    [](const auto& info) {
      return std::string(format_name(std::get<0>(info.param))) + "_" +
             std::to_string(std::get<1>(info.param));
    });

TEST(TensorStatsTest, LargeTensorThreadedMatchesReference) {
  std::mt19937 rng(11);
  std::vector<float> values = gradient_like((std::size_t{1} << 20) + 3, 1e-4, rng);
  values[12345] = kNaN;
  values[777777] = -kInf;
  values[1 << 19] = 0x1p-140f;
  for (Format dtype : {Format::kFP32, Format::kFP16, Format::kBF16}) {
    check_all_paths(make_tensor(values, dtype));
  }
}

TEST(TensorStatsTest, EveryFp16AndBf16Pattern) {
  std::vector<std::uint16_t> all(65536);
  for (std::uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<std::uint16_t>(i);
  check_all_paths(make_tensor_bits(all, Format::kFP16));
  check_all_paths(make_tensor_bits(all, Format::kBF16));
  const TensorStats h = compute_stats(all.data(), all.size(), Format::kFP16);
  EXPECT_EQ(h.zeros, 2u);
  EXPECT_EQ(h.pos_inf, 1u);
  EXPECT_EQ(h.neg_inf, 1u);
  EXPECT_EQ(h.nan, 2u * 1023u);
  EXPECT_EQ(h.histogram.min_exponent, -24);
  EXPECT_EQ(h.histogram.max_exponent(), 15);
  EXPECT_EQ(h.histogram.count_at(-24), 2u);        // +-2^-24
  EXPECT_EQ(h.histogram.count_at(-15), 2u * 512u);  // subnormals 512..1023 * 2^-24
  EXPECT_EQ(h.histogram.count_at(0), 2u * 1024u);
  EXPECT_EQ(h.max_abs, 65504.0);
  EXPECT_EQ(h.min_abs_nonzero, 0x1p-24);
}

TEST(TensorStatsTest, ExactUnderFlushToZeroAndDenormalsAreZero) {
  // A host framework may set FTZ/DAZ; the counts must not change.
  std::mt19937 rng(3);
  std::vector<float> values = adversarial_values(rng);
  for (float& x : values) {
    if (std::fabs(x) < 0x1p-100f) x = std::ldexp(x, -30);  // more FP32 subnormals
  }
  const unsigned saved = _mm_getcsr();
  for (Format dtype : {Format::kFP32, Format::kFP16, Format::kBF16}) {
    const Tensor t = make_tensor(values, dtype);
    const TensorStats want = compute_stats_reference(t.data(), t.n, t.dtype, kTargets);
    _mm_setcsr(saved | 0x8040);  // FTZ | DAZ
    for (SimdLevel level : supported_levels()) {
      SCOPED_TRACE(std::string(simd_level_name(level)) + " " + std::string(format_name(dtype)));
      StatsOptions o;
      o.simd = level;
      const TensorStats got = compute_stats(t.data(), t.n, t.dtype, kTargets, o);
      _mm_setcsr(saved);
      expect_same_stats(got, want);
      _mm_setcsr(saved | 0x8040);
    }
    _mm_setcsr(saved);
  }
}

TEST(TensorStatsTest, ManyTargetsBeyondVectorLimit) {
  std::vector<TargetSpec> many;
  for (int k = -20; k <= 20; k += 2) many.push_back({Format::kE5M2, k});
  std::mt19937 rng(17);
  for (Format dtype : {Format::kFP32, Format::kFP16}) {
    check_all_paths(make_tensor(gradient_like(5003, 1e-2, rng), dtype), many);
  }
}

TEST(TensorStatsTest, MergeOfPartsEqualsWhole) {
  std::mt19937 rng(23);
  std::vector<float> values = adversarial_values(rng);
  const std::size_t half = values.size() / 2;
  TensorStats a = compute_stats(values.data(), half, Format::kFP32, kTargets);
  const TensorStats b =
      compute_stats(values.data() + half, values.size() - half, Format::kFP32, kTargets);
  const double part_sums_error = 0.5 * (ulp(a.sum) + ulp(b.sum));
  merge_into(a, b);
  // merge_into adds the parts' exactly rounded sums in FP64: each part is off by half an ulp
  // of its own sum, the addition by half an ulp of the result.
  TensorStats whole =
      compute_stats_reference(values.data(), values.size(), Format::kFP32, kTargets);
  EXPECT_LE(std::fabs(a.sum - whole.sum), part_sums_error + 0.5 * ulp(a.sum));
  whole.sum = a.sum;
  expect_same_stats(a, whole);
}

// FP8 storage (torch.float8_e4m3fn / float8_e5m2 memory): every byte pattern, each a different
// number of times, gives the statistics of its decoded FP32 values, at every level and split.
TEST(TensorStatsTest, EveryFp8PatternReadsAsItsValue) {
  for (const Format dtype : {Format::kE4M3, Format::kE5M2}) {
    SCOPED_TRACE(std::string(format_name(dtype)));
    std::vector<unsigned char> bytes;
    std::vector<float> decoded;
    for (std::uint32_t b = 0; b < 256; ++b) {
      for (std::uint32_t k = 0; k <= b % 5; ++k) {
        bytes.push_back(static_cast<unsigned char>(b));
        decoded.push_back(decode(b, dtype));
      }
    }
    std::mt19937 rng(7);
    std::vector<std::size_t> order(bytes.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    Tensor t{dtype, bytes.size(), std::vector<unsigned char>(bytes.size() + 1), 1};
    std::vector<float> as_fp32(bytes.size());
    for (std::size_t i = 0; i < order.size(); ++i) {
      t.bytes[1 + i] = bytes[order[i]];  // misaligned by one byte on purpose
      as_fp32[i] = decoded[order[i]];
    }
    check_all_paths(t);
    expect_same_stats(compute_stats(t.data(), t.n, dtype, kTargets),
                      compute_stats_reference(as_fp32.data(), as_fp32.size(), Format::kFP32,
                                              kTargets));
    const TensorStats s = compute_stats(t.data(), t.n, dtype);
    if (dtype == Format::kE4M3) {
      EXPECT_EQ(s.nan, (0x7Fu % 5 + 1) + (0xFFu % 5 + 1));  // S.1111.111 only, both signs
      EXPECT_EQ(s.pos_inf + s.neg_inf, 0u);
      EXPECT_EQ(s.max_abs, 448.0);
      EXPECT_EQ(s.min_abs_nonzero, 0x1p-9);
    } else {
      EXPECT_EQ(s.pos_inf, 0x7Cu % 5 + 1);
      EXPECT_EQ(s.max_abs, 57344.0);
      EXPECT_EQ(s.min_abs_nonzero, 0x1p-16);
    }
  }
  unsigned char b = 0;
  float f = 1.0f;
  EXPECT_THROW(scale_and_compute_stats(&b, 1, Format::kE4M3, 0.5f), Error);
  EXPECT_NO_THROW(scale_and_compute_stats(&f, 1, Format::kFP32, 0.5f));
}

TEST(TensorStatsTest, RejectsBadInput) {
  const float x = 1.0f;
  const std::vector<TargetSpec> bad = {{Format::kFP16, kMaxScaleLog2 + 1}};
  EXPECT_THROW(compute_stats(&x, 1, Format::kFP32, bad), Error);
  EXPECT_THROW(compute_stats(nullptr, 4, Format::kFP32), Error);
}

// The fused unscale: the same stored results as the elementwise conversions and the same
// statistics as compute_stats_reference() on them, at every level, on one thread and several.
TEST(ScaleAndComputeStatsTest, EqualsScaleThenComputeStats) {
  std::mt19937 rng(41);
  std::vector<float> values = adversarial_values(rng);
  const std::vector<float> more = gradient_like(20011, 1e-2, rng);
  values.insert(values.end(), more.begin(), more.end());
  const float factors[] = {1.0f, 0x1p-16f, 0x1p+20f, 0x1p-140f, 3.0f, 1e-3f, 1e30f, -0.75f, 0.0f};
  for (Format dtype : {Format::kFP32, Format::kFP16, Format::kBF16}) {
    const Tensor input = make_tensor(values, dtype, 1);
    const std::size_t elem = static_cast<std::size_t>(storage_bytes(dtype));
    for (const float factor : factors) {
      std::vector<float> scaled(input.n);
      convert_to_fp32(input.data(), scaled.data(), input.n, dtype, SimdLevel::kScalar);
      for (float& x : scaled) x *= factor;
      Tensor want_tensor = input;
      convert_from_fp32(scaled.data(), want_tensor.bytes.data() + 1, input.n, dtype,
                        OverflowMode::kNonSaturating, SimdLevel::kScalar);
      const TensorStats want =
          compute_stats_reference(want_tensor.data(), input.n, dtype, kTargets);
      for (SimdLevel level : supported_levels()) {
        for (const int threads : {1, 3}) {
          SCOPED_TRACE(std::string(simd_level_name(level)) + " " +
                       std::string(format_name(dtype)) + " factor=" + std::to_string(factor) +
                       " threads=" + std::to_string(threads));
          Tensor t = input;
          StatsOptions o;
          o.simd = level;
          o.max_threads = threads;
          o.parallel_threshold = 1;
          const TensorStats got = scale_and_compute_stats(t.bytes.data() + 1, t.n, dtype, factor,
                                                          kTargets, o);
          EXPECT_EQ(0, std::memcmp(t.bytes.data() + 1, want_tensor.bytes.data() + 1,
                                   input.n * elem));
          expect_same_stats(got, want);
        }
      }
    }
  }
}

TEST(ScaleAndComputeStatsTest, IeeeResultsUnderFlushToZero) {
  // The host may have set FTZ/DAZ; products that are FP32 subnormals must still be stored and
  // counted as IEEE arithmetic gives them.
  std::vector<float> values;
  for (int e = -149; e <= -100; ++e) values.push_back(std::ldexp(1.5f, e + 20));
  values.push_back(1.0f);
  values.push_back(-3.0f);
  const float factor = 0x1p-20f;
  std::vector<float> want = values;
  for (float& x : want) x *= factor;  // default MXCSR here
  const TensorStats want_stats = compute_stats_reference(want.data(), want.size(), Format::kFP32,
                                                         kTargets);
  const unsigned saved = _mm_getcsr();
  for (SimdLevel level : supported_levels()) {
    SCOPED_TRACE(std::string(simd_level_name(level)));
    std::vector<float> got = values;
    StatsOptions o;
    o.simd = level;
    _mm_setcsr(saved | 0x8040);  // FTZ | DAZ
    const TensorStats s =
        scale_and_compute_stats(got.data(), got.size(), Format::kFP32, factor, kTargets, o);
    _mm_setcsr(saved);
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * sizeof(float)));
    expect_same_stats(s, want_stats);
  }
}

TEST(TargetSpecTest, Parses) {
  std::string err;
  EXPECT_EQ(parse_target("fp16@16", &err), (TargetSpec{Format::kFP16, 16}));
  EXPECT_EQ(parse_target("e4m3@-3", &err), (TargetSpec{Format::kE4M3, -3}));
  EXPECT_EQ(parse_target("bf16", &err), (TargetSpec{Format::kBF16, 0}));
  EXPECT_EQ(parse_target("e5m2@+2", &err), (TargetSpec{Format::kE5M2, 2}));
  EXPECT_FALSE(parse_target("fp64@1", &err).has_value());
  EXPECT_NE(err.find("unknown format"), std::string::npos);
  EXPECT_FALSE(parse_target("fp16@", &err).has_value());
  EXPECT_FALSE(parse_target("fp16@1.5", &err).has_value());
  EXPECT_FALSE(parse_target("fp16@9999", &err).has_value());
  EXPECT_NE(err.find("outside"), std::string::npos);
  EXPECT_EQ(to_string(TargetSpec{Format::kE4M3, -3}), "e4m3@-3");
}

// What-if from the histogram: the exact count (computed at that scale) lies within the bounds,
// for every format and a sweep of scales.
TEST(WhatIfTest, ExactCountsLieWithinBounds) {
  std::mt19937 rng(29);
  std::vector<float> values = gradient_like(20000, 1e-3, rng);
  for (float& x : values) x *= std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
  const int measured_scale = 4;  // values as stored carry a scale of 2^4
  const TensorStats stored = compute_stats(values.data(), values.size(), Format::kFP32);
  for (const FormatInfo& f : kFormatInfos) {
    for (int k = -30; k <= 40; k += 3) {
      const WhatIf w = predict_from_histogram(stored.histogram, f.format, k, measured_scale);
      const std::vector<TargetSpec> t = {{f.format, k - measured_scale}};
      const TargetCounts exact =
          compute_stats(values.data(), values.size(), Format::kFP32, t).targets[0];
      SCOPED_TRACE(std::string(f.name) + "@" + std::to_string(k));
      EXPECT_LE(w.overflow.lower, exact.overflow);
      EXPECT_GE(w.overflow.upper, exact.overflow);
      EXPECT_LE(w.underflow.lower, exact.underflow);
      EXPECT_GE(w.underflow.upper, exact.underflow);
      EXPECT_LE(w.subnormal.lower, exact.subnormal);
      EXPECT_GE(w.subnormal.upper, exact.subnormal);
    }
  }
}

TEST(WhatIfTest, PowerOfTwoValuesArePredictedExactly) {
  // Values that are exact powers of two sit at bin starts: each bin is wholly on one side of
  // every threshold except the one straddling bin, so the bounds pin the count for FP16 here.
  std::vector<float> values;
  for (int e = -30; e <= 20; ++e) values.push_back(std::ldexp(1.0f, e));
  const TensorStats s = compute_stats(values.data(), values.size(), Format::kFP32);
  const WhatIf w = predict_from_histogram(s.histogram, Format::kFP16, 0);
  EXPECT_EQ(w.overflow.lower, 5u);  // 2^16 .. 2^20
  EXPECT_EQ(w.overflow.upper, 6u);  // 2^15's bin reaches 65536 > 65520
  EXPECT_EQ(w.underflow.lower, 5u);  // 2^-30 .. 2^-26 bins end at or below 2^-25
  EXPECT_EQ(w.underflow.upper, 6u);  // 2^-25 itself underflows, its bin straddles
}

}  // namespace
}  // namespace ampscope
