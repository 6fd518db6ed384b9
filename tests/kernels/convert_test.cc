// The scalar reference encode()/decode() against definitions written here from scratch and
// against the hardware: every FP16/BF16/FP8/FP6/FP4 bit pattern decodes to the value its fields say
// and round-trips; FP32 -> FP16 matches F16C, FP32 -> BF16 matches AVX512_BF16 where that
// instruction is exact, and FP32 -> BF16/FP8/FP6/FP4 matches a bit-level encoder written in this
// file on every FP32 pattern class (see every_pattern_class) plus boundary neighbourhoods and
// random samples. The bulk paths at every SIMD level are checked on the same inputs where cheap;
// convert_levels_test.cc compares them with the reference exhaustively.
#include "ampscope/convert.h"

#include <cpuid.h>
#include <gtest/gtest.h>
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "../../kernels/cpu/convert_internal.h"  // detail::round_through_at_level
#include "ampscope/cpu_features.h"

namespace ampscope {
namespace {

// ---- encodings written out here, independently of formats.h --------------------------------

// What the all-ones exponent holds: Inf/NaN (IEEE), numbers except S.1111.111 = NaN (E4M3
// fn), numbers only (the FP6/FP4 elements of OCP Microscaling v1.0: no Inf, no NaN).
enum class Specials { kIeee, kNanOnly, kNone };

struct Layout {
  Format format;
  int exponent_bits;
  int mantissa_bits;
  int bias;
  Specials specials;

  int total_bits() const { return 1 + exponent_bits + mantissa_bits; }
  std::uint32_t exp_ones() const { return (1u << exponent_bits) - 1; }
  std::uint32_t frac_ones() const { return (1u << mantissa_bits) - 1; }
  std::uint32_t max_finite_code() const {
    switch (specials) {
      case Specials::kIeee:
        return ((exp_ones() - 1) << mantissa_bits) | frac_ones();
      case Specials::kNanOnly:
        return (exp_ones() << mantissa_bits) | (frac_ones() - 1);
      case Specials::kNone:
        break;
    }
    return (exp_ones() << mantissa_bits) | frac_ones();
  }
  // Non-saturating overflow: Inf, the NaN for E4M3 fn, max finite where there is neither.
  std::uint32_t overflow_code() const {
    switch (specials) {
      case Specials::kIeee:
        return exp_ones() << mantissa_bits;
      case Specials::kNanOnly:
        return (exp_ones() << mantissa_bits) | frac_ones();
      case Specials::kNone:
        break;
    }
    return max_finite_code();
  }
};

constexpr Layout kFp16{Format::kFP16, 5, 10, 15, Specials::kIeee};
constexpr Layout kBf16{Format::kBF16, 8, 7, 127, Specials::kIeee};
constexpr Layout kE4m3{Format::kE4M3, 4, 3, 7, Specials::kNanOnly};
constexpr Layout kE5m2{Format::kE5M2, 5, 2, 15, Specials::kIeee};
constexpr Layout kE2m1{Format::kE2M1, 2, 1, 1, Specials::kNone};
constexpr Layout kE3m2{Format::kE3M2, 3, 2, 3, Specials::kNone};
constexpr Layout kE2m3{Format::kE2M3, 2, 3, 1, Specials::kNone};
constexpr Layout kNarrowLayouts[] = {kFp16, kBf16, kE4m3, kE5m2, kE2m1, kE3m2, kE2m3};
constexpr Layout kMxElementLayouts[] = {kE2m1, kE3m2, kE2m3};

constexpr SimdLevel kLevels[] = {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512};
constexpr OverflowMode kModes[] = {OverflowMode::kNonSaturating, OverflowMode::kSaturating};

std::uint32_t bits_of(float x) { return std::bit_cast<std::uint32_t>(x); }
float from_bits(std::uint32_t u) { return std::bit_cast<float>(u); }

const char* mode_name(OverflowMode m) {
  return m == OverflowMode::kSaturating ? "saturating" : "non-saturating";
}

// The FP32 bits a pattern must decode to: the value of its fields for numbers; for NaN the
// documented quiet NaN (sign kept, fraction moved to the top of the FP32 fraction).
std::uint32_t expected_decode(std::uint32_t bits, const Layout& l) {
  const int m = l.mantissa_bits;
  const bool negative = (bits >> (l.total_bits() - 1)) & 1u;
  const std::uint32_t exp = (bits >> m) & l.exp_ones();
  const std::uint32_t frac = bits & l.frac_ones();
  const std::uint32_t sign = negative ? 0x80000000u : 0u;
  const bool all_ones = exp == l.exp_ones();
  const bool is_nan = l.specials == Specials::kIeee      ? all_ones && frac != 0
                      : l.specials == Specials::kNanOnly ? all_ones && frac == l.frac_ones()
                                                         : false;
  if (is_nan) return sign | 0x7FC00000u | (frac << (23 - m));
  if (l.specials == Specials::kIeee && all_ones) return sign | 0x7F800000u;
  const double fraction = static_cast<double>(frac) / static_cast<double>(1u << m);
  const double magnitude = exp == 0 ? std::ldexp(fraction, 1 - l.bias)
                                    : std::ldexp(1.0 + fraction, static_cast<int>(exp) - l.bias);
  // The FP32 pattern of an exact value, built without a double -> float conversion so that
  // the expectation holds whatever MXCSR says.
  if (magnitude == 0.0) return sign;
  int e2 = 0;
  const double significand = std::frexp(magnitude, &e2);  // magnitude = significand * 2^e2
  if (e2 - 1 < -126) {
    return sign | static_cast<std::uint32_t>(std::ldexp(magnitude, 149));
  }
  const auto field = static_cast<std::uint32_t>(std::ldexp(significand, 24)) - 0x800000u;
  return sign | (static_cast<std::uint32_t>(e2 - 1 + 127) << 23) | field;
}

// Bit-level FP32 -> narrow encoder: round the 24-bit significand to the target's quantum with
// an explicit remainder comparison (ties to even), then assemble the fields.
std::uint32_t expected_encode(std::uint32_t u, const Layout& l, OverflowMode mode) {
  const int m = l.mantissa_bits;
  const bool saturate = mode == OverflowMode::kSaturating;
  const std::uint32_t sign_bit = (u >> 31) << (l.total_bits() - 1);
  const std::uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) {
    if (l.specials == Specials::kNanOnly) return sign_bit | l.overflow_code();
    if (l.specials == Specials::kNone) return sign_bit | l.max_finite_code();  // no NaN code
    return sign_bit | (l.exp_ones() << m) | (1u << (m - 1)) | ((a & 0x7FFFFFu) >> (23 - m));
  }
  const std::uint32_t overflowed = sign_bit | (saturate ? l.max_finite_code() : l.overflow_code());
  if (a == 0x7F800000u) return overflowed;
  const int exp_field = static_cast<int>(a >> 23);
  std::uint64_t significand = a & 0x7FFFFFu;  // value = significand * 2^(exponent - 23)
  int exponent = -126;
  if (exp_field != 0) {
    significand |= 0x800000u;
    exponent = exp_field - 127;
  }
  const int min_normal_exponent = 1 - l.bias;
  const int quantum_exponent = std::max(exponent, min_normal_exponent) - m;
  const int drop = quantum_exponent - (exponent - 23);  // >= 23 - m
  if (drop > 25) return sign_bit;                       // below half the smallest subnormal
  std::uint64_t kept = significand >> drop;
  const std::uint64_t rest = significand & ((std::uint64_t{1} << drop) - 1);
  const std::uint64_t half = std::uint64_t{1} << (drop - 1);
  if (rest > half || (rest == half && (kept & 1u) != 0)) ++kept;
  std::uint64_t magnitude;
  if (exponent < min_normal_exponent) {
    magnitude = kept;  // subnormal; kept == 2^m is the min normal and has that very code
  } else {
    magnitude = (static_cast<std::uint64_t>(exponent + l.bias) << m) + kept - (1u << m);
  }
  if (magnitude > l.max_finite_code()) return overflowed;
  return sign_bit | static_cast<std::uint32_t>(magnitude);
}

// ---- hardware ------------------------------------------------------------------------------

bool has_avx512_bf16() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!cpu_features().avx512f || !__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx)) return false;
  return (eax >> 5) & 1u;
}

__attribute__((target("f16c"))) std::uint16_t f16c_encode(float x) {
  return _cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT);
}

__attribute__((target("avx512bf16,avx512f,avx512vl"))) std::uint16_t hw_bf16_encode(float x) {
  const __m128bh r = _mm_cvtneps_pbh(_mm_set1_ps(x));
  std::uint16_t out;
  std::memcpy(&out, &r, sizeof(out));
  return out;
}

// ---- inputs --------------------------------------------------------------------------------

// Appends the FP32 patterns within +-radius ulps of |v| and -|v| (clipped to [0, 0x7F800000]).
void add_neighbourhood(std::vector<std::uint32_t>& out, double v, int radius) {
  const std::int64_t centre = bits_of(static_cast<float>(v));  // v is an FP32 value here
  for (std::int64_t d = -radius; d <= radius; ++d) {
    const std::int64_t p = centre + d;
    if (p < 0 || p > 0x7F800000) continue;
    out.push_back(static_cast<std::uint32_t>(p));
    out.push_back(static_cast<std::uint32_t>(p) | 0x80000000u);
  }
}

// Every value of the format and every midpoint between neighbours (the rounding boundaries;
// the midpoint above max finite is the overflow threshold), +-radius FP32 ulps each.
std::vector<std::uint32_t> boundary_inputs(const Layout& l, int radius) {
  std::vector<std::uint32_t> out;
  const std::uint32_t top = l.max_finite_code();
  for (std::uint32_t code = 0; code <= top; ++code) {
    const double lo = from_bits(expected_decode(code, l));
    // The next value up; above max finite, where the next code would be if the range went on.
    const double hi = code < top ? from_bits(expected_decode(code + 1, l))
                                 : lo + (lo - from_bits(expected_decode(code - 1, l)));
    add_neighbourhood(out, lo, radius);
    add_neighbourhood(out, (lo + hi) / 2, radius);
    if (code == top) add_neighbourhood(out, hi, radius);
  }
  for (std::uint32_t u : {0x7F800000u, 0x7F800001u, 0x7FC00000u, 0x7FA5A5A5u, 0x7FFFFFFFu,
                          0x00000001u, 0x007FFFFFu, 0x00800000u, 0x7F7FFFFFu}) {
    out.push_back(u);
    out.push_back(u | 0x80000000u);
  }
  return out;
}

std::vector<std::uint32_t> random_inputs(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::uint32_t> out(n);
  for (auto& u : out) u = rng();
  return out;
}

// Random patterns whose exponent lies in [lo, hi] (biased FP32 exponents).
std::vector<std::uint32_t> random_inputs_in_range(std::size_t n, int lo, int hi,
                                                  std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> exponent(lo, hi);
  std::vector<std::uint32_t> out(n);
  for (auto& u : out) {
    u = (rng() & 0x807FFFFFu) | (static_cast<std::uint32_t>(exponent(rng)) << 23);
  }
  return out;
}

// For BF16 and FP8 every kept fraction bit is bit 16 or higher, so the low 16 bits only decide
// whether the rest is zero, below, at or above half: {0}, [1, 0x7FFF], {0x8000},
// [0x8001, 0xFFFF] (NaN payloads come from the top bits too). Members of each class, next to
// every value of the top 16 bits, cover every FP32 pattern.
std::vector<std::uint32_t> every_pattern_class() {
  std::vector<std::uint32_t> out;
  out.reserve(65536 * 6);
  for (std::uint32_t top = 0; top < 65536; ++top) {
    for (std::uint32_t low : {0x0000u, 0x0001u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu}) {
      out.push_back((top << 16) | low);
    }
  }
  return out;
}

std::vector<float> as_floats(const std::vector<std::uint32_t>& bits) {
  std::vector<float> out(bits.size());
  std::memcpy(out.data(), bits.data(), bits.size() * sizeof(float));
  return out;
}

// ---- checks --------------------------------------------------------------------------------

constexpr int kMaxReported = 8;

// encode() and every level's convert_from_fp32 and round_through against `expected` on
// `inputs`.
template <typename Expected>
void check_encoding(const Layout& l, OverflowMode mode, const std::vector<std::uint32_t>& inputs,
                    Expected expected) {
  SCOPED_TRACE(::testing::Message() << format_name(l.format) << ", " << mode_name(mode));
  int failures = 0;
  std::vector<std::uint32_t> want(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    want[i] = expected(inputs[i]);
    const std::uint32_t got = encode(from_bits(inputs[i]), l.format, mode);
    if (got != want[i] && failures++ < kMaxReported) {
      ADD_FAILURE() << "encode(0x" << std::hex << inputs[i] << ") = 0x" << got << ", expected 0x"
                    << want[i];
    }
  }
  const std::vector<float> src = as_floats(inputs);
  for (SimdLevel level : kLevels) {
    if (clamp_simd_level(level) != level) continue;
    std::vector<std::uint16_t> out16(inputs.size());
    std::vector<std::uint8_t> out8(inputs.size());
    const bool wide = l.total_bits() == 16;
    convert_from_fp32(src.data(), wide ? static_cast<void*>(out16.data()) : out8.data(), src.size(),
                      l.format, mode, level);
    std::vector<float> rounded = src;
    detail::round_through_at_level(rounded.data(), rounded.size(), l.format, mode, level);
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      const std::uint32_t got = wide ? out16[i] : out8[i];
      if (got != want[i] && failures++ < kMaxReported) {
        ADD_FAILURE() << simd_level_name(level) << ": 0x" << std::hex << inputs[i] << " -> 0x"
                      << got << ", expected 0x" << want[i];
      }
      const std::uint32_t want_rounded = expected_decode(want[i], l);
      if (bits_of(rounded[i]) != want_rounded && failures++ < kMaxReported) {
        ADD_FAILURE() << simd_level_name(level) << " round_through: 0x" << std::hex << inputs[i]
                      << " -> 0x" << bits_of(rounded[i]) << ", expected 0x" << want_rounded;
      }
    }
  }
}

void check_against_bit_reference(const Layout& l, const std::vector<std::uint32_t>& inputs) {
  for (OverflowMode mode : kModes) {
    check_encoding(l, mode, inputs, [&](std::uint32_t u) { return expected_encode(u, l, mode); });
  }
}

// ---- decoding --------------------------------------------------------------------------------

void check_decode_every_pattern(const Layout& l) {
  const std::uint32_t count = 1u << l.total_bits();
  int failures = 0;
  for (std::uint32_t b = 0; b < count; ++b) {
    const std::uint32_t want = expected_decode(b, l);
    const std::uint32_t got = bits_of(decode(b, l.format));
    if (got != want && failures++ < kMaxReported) {
      ADD_FAILURE() << "decode(0x" << std::hex << b << ") = 0x" << got << ", expected 0x" << want;
    }
  }
  std::vector<std::uint16_t> codes16(count);
  std::vector<std::uint8_t> codes8(count);
  for (std::uint32_t b = 0; b < count; ++b) {
    codes16[b] = static_cast<std::uint16_t>(b);
    codes8[b] = static_cast<std::uint8_t>(b);
  }
  for (SimdLevel level : kLevels) {
    if (clamp_simd_level(level) != level) continue;
    std::vector<float> out(count);
    const void* src =
        l.total_bits() == 16 ? static_cast<const void*>(codes16.data()) : codes8.data();
    convert_to_fp32(src, out.data(), count, l.format, level);
    for (std::uint32_t b = 0; b < count; ++b) {
      const std::uint32_t want = expected_decode(b, l);
      if (bits_of(out[b]) != want && failures++ < kMaxReported) {
        ADD_FAILURE() << simd_level_name(level) << ": 0x" << std::hex << b << " -> 0x"
                      << bits_of(out[b]) << ", expected 0x" << want;
      }
    }
  }
}

// encode(decode(b)) == b for every number; NaN stays NaN with its sign (and becomes quiet).
void check_round_trip_every_pattern(const Layout& l) {
  const std::uint32_t count = 1u << l.total_bits();
  const std::uint32_t sign_bit = 1u << (l.total_bits() - 1);
  int failures = 0;
  for (std::uint32_t b = 0; b < count; ++b) {
    const float x = decode(b, l.format);
    const std::uint32_t back = encode(x, l.format);
    const std::uint32_t back_sat = encode(x, l.format, OverflowMode::kSaturating);
    std::uint32_t want = b;
    std::uint32_t want_sat = b;
    if (std::isnan(x)) {
      // Quiet bit set (E4M3's one NaN per sign already is its own quiet form).
      want = l.specials == Specials::kIeee ? b | (1u << (l.mantissa_bits - 1)) : b;
      want_sat = want;
    } else if (std::isinf(x)) {
      want_sat = (b & sign_bit) | l.max_finite_code();
    }
    if ((back != want || back_sat != want_sat) && failures++ < kMaxReported) {
      ADD_FAILURE() << "0x" << std::hex << b << " -> " << x << " -> 0x" << back
                    << " / saturating 0x" << back_sat << ", expected 0x" << want << " / 0x"
                    << want_sat;
    }
  }
}

TEST(ConvertTest, Fp16DecodeEveryPattern) { check_decode_every_pattern(kFp16); }
TEST(ConvertTest, Bf16DecodeEveryPattern) { check_decode_every_pattern(kBf16); }
TEST(ConvertTest, E4m3DecodeEveryPattern) { check_decode_every_pattern(kE4m3); }
TEST(ConvertTest, E5m2DecodeEveryPattern) { check_decode_every_pattern(kE5m2); }

TEST(ConvertTest, Fp16RoundTripEveryPattern) { check_round_trip_every_pattern(kFp16); }
TEST(ConvertTest, Bf16RoundTripEveryPattern) { check_round_trip_every_pattern(kBf16); }
TEST(ConvertTest, E4m3RoundTripEveryPattern) { check_round_trip_every_pattern(kE4m3); }
TEST(ConvertTest, E5m2RoundTripEveryPattern) { check_round_trip_every_pattern(kE5m2); }

// Spot values of the decode tables, written by hand.
TEST(ConvertTest, DecodeKnownValues) {
  EXPECT_EQ(decode(0x7BFF, Format::kFP16), 65504.0f);
  EXPECT_EQ(decode(0x0001, Format::kFP16), 0x1p-24f);
  EXPECT_EQ(decode(0x0400, Format::kFP16), 0x1p-14f);
  EXPECT_EQ(decode(0x7F7F, Format::kBF16), 0x1.fep127f);
  EXPECT_EQ(decode(0x0001, Format::kBF16), 0x1p-133f);
  EXPECT_EQ(decode(0x7E, Format::kE4M3), 448.0f);
  EXPECT_EQ(decode(0x78, Format::kE4M3), 256.0f);  // exponent all ones is a number in E4M3 fn
  EXPECT_EQ(decode(0x01, Format::kE4M3), 0x1p-9f);
  EXPECT_EQ(decode(0x08, Format::kE4M3), 0x1p-6f);
  EXPECT_TRUE(std::isnan(decode(0x7F, Format::kE4M3)));
  EXPECT_TRUE(std::isnan(decode(0xFF, Format::kE4M3)));
  EXPECT_EQ(decode(0x7B, Format::kE5M2), 57344.0f);
  EXPECT_EQ(decode(0x01, Format::kE5M2), 0x1p-16f);
  EXPECT_EQ(decode(0xFC, Format::kE5M2), -INFINITY);
  EXPECT_EQ(bits_of(decode(0x80, Format::kE5M2)), 0x80000000u);
}

// ---- FP16 against F16C -----------------------------------------------------------------------

class ConvertF16cTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cpu_features().f16c) GTEST_SKIP() << "no F16C on this CPU";
  }

  static void check(const std::vector<std::uint32_t>& inputs) {
    for (OverflowMode mode : kModes) {
      check_encoding(kFp16, mode, inputs, [mode](std::uint32_t u) -> std::uint32_t {
        std::uint32_t h = f16c_encode(from_bits(u));
        if (mode == OverflowMode::kSaturating && (h & 0x7FFFu) == 0x7C00u) h -= 1;  // -> max
        return h;
      });
    }
    // The test's own encoder must agree with the hardware too, or its BF16/FP8 verdicts mean
    // nothing.
    int failures = 0;
    for (std::uint32_t u : inputs) {
      const std::uint32_t want = f16c_encode(from_bits(u));
      const std::uint32_t got = expected_encode(u, kFp16, OverflowMode::kNonSaturating);
      if (got != want && failures++ < kMaxReported) {
        ADD_FAILURE() << "test encoder: 0x" << std::hex << u << " -> 0x" << got << ", F16C 0x"
                      << want;
      }
    }
  }
};

TEST_F(ConvertF16cTest, Fp16EncodeMatchesF16cNearEveryBoundary) {
  check(boundary_inputs(kFp16, 24));
}

TEST_F(ConvertF16cTest, Fp16EncodeMatchesF16cOnRandomPatterns) {
  check(random_inputs(5'000'000, 1234));
  // Exponents from well below half the smallest subnormal to above the overflow threshold.
  check(random_inputs_in_range(5'000'000, 127 - 27, 127 + 17, 5678));
}

// The thresholds of the formats' definitions, with results written by hand.
TEST_F(ConvertF16cTest, Fp16OverflowAndUnderflowThresholds) {
  struct Case {
    float x;
    std::uint16_t want;
    std::uint16_t want_saturating;
  };
  const Case cases[] = {
      {65504.0f, 0x7BFF, 0x7BFF},
      {std::nextafter(65520.0f, 0.0f), 0x7BFF, 0x7BFF},
      {65520.0f, 0x7C00, 0x7BFF},  // the tie goes to Inf: 65504's fraction is odd
      {std::nextafter(65520.0f, INFINITY), 0x7C00, 0x7BFF},
      {-65520.0f, 0xFC00, 0xFBFF},
      {INFINITY, 0x7C00, 0x7BFF},
      {0x1p-25f, 0x0000, 0x0000},  // exactly half the smallest subnormal: ties to even (zero)
      {std::nextafter(0x1p-25f, 1.0f), 0x0001, 0x0001},
      {-0x1p-25f, 0x8000, 0x8000},
      {0x1p-24f, 0x0001, 0x0001},
      {0x3p-26f, 0x0001, 0x0001},  // 0.75 * 2^-24 is no tie: it rounds up to 2^-24
      {std::nextafter(0x3p-25f, 0.0f), 0x0001, 0x0001},
      {0x3p-25f, 0x0002, 0x0002},  // 1.5 * 2^-24 ties to the even 2 * 2^-24
      {0x5p-25f, 0x0002, 0x0002},  // 2.5 * 2^-24 ties to the even 2 * 2^-24
      {0x1p-14f, 0x0400, 0x0400},
      {std::nextafter(0x1p-14f, 0.0f), 0x0400, 0x0400},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "x = " << c.x);
    EXPECT_EQ(f16c_encode(c.x), c.want);
    EXPECT_EQ(encode(c.x, Format::kFP16), c.want);
    EXPECT_EQ(encode(c.x, Format::kFP16, OverflowMode::kSaturating), c.want_saturating);
    for (SimdLevel level : kLevels) {
      std::uint16_t out[2] = {};
      convert_from_fp32(&c.x, out, 1, Format::kFP16, OverflowMode::kNonSaturating, level);
      convert_from_fp32(&c.x, out + 1, 1, Format::kFP16, OverflowMode::kSaturating, level);
      EXPECT_EQ(out[0], c.want) << simd_level_name(level);
      EXPECT_EQ(out[1], c.want_saturating) << simd_level_name(level);
    }
  }
}

// ---- BF16 ------------------------------------------------------------------------------------

TEST(ConvertTest, Bf16EncodeMatchesBitReferenceOnEveryPatternClass) {
  check_against_bit_reference(kBf16, every_pattern_class());
}

TEST(ConvertTest, Bf16EncodeMatchesBitReferenceNearEveryBoundary) {
  check_against_bit_reference(kBf16, boundary_inputs(kBf16, 8));
}

TEST(ConvertTest, Bf16EncodeMatchesBitReferenceOnRandomPatterns) {
  check_against_bit_reference(kBf16, random_inputs(2'000'000, 42));
}

// vcvtneps2bf16 rounds to nearest even, quiets NaN like encode() and ignores MXCSR, but treats
// FP32 subnormal inputs as zero (Intel SDM pseudocode convert_fp32_to_bfloat16: "denormal ->
// zero"). So it is a reference for every other input, and for subnormals the test pins down
// the difference (encode() rounds them to BF16 subnormals; 0x007FFFFF even rounds up to the
// min normal 0x0080).
TEST(ConvertTest, Bf16EncodeMatchesAvx512Bf16ExceptOnSubnormalInputs) {
  if (!has_avx512_bf16()) GTEST_SKIP() << "no AVX512_BF16 on this CPU";
  std::vector<std::uint32_t> inputs = every_pattern_class();
  const std::vector<std::uint32_t> more = boundary_inputs(kBf16, 8);
  inputs.insert(inputs.end(), more.begin(), more.end());
  const std::vector<std::uint32_t> random = random_inputs(1'000'000, 7);
  inputs.insert(inputs.end(), random.begin(), random.end());
  int failures = 0;
  int subnormals_differing = 0;
  for (std::uint32_t u : inputs) {
    const std::uint32_t hw = hw_bf16_encode(from_bits(u));
    const std::uint32_t ours = encode(from_bits(u), Format::kBF16);
    const bool subnormal_input = (u & 0x7F800000u) == 0 && (u & 0x7FFFFFu) != 0;
    const std::uint32_t want = subnormal_input ? (u >> 16) & 0x8000u : ours;
    if (hw != want && failures++ < kMaxReported) {
      ADD_FAILURE() << "vcvtneps2bf16(0x" << std::hex << u << ") = 0x" << hw << ", expected 0x"
                    << want;
    }
    if (subnormal_input && hw != ours) ++subnormals_differing;
  }
  EXPECT_GT(subnormals_differing, 0);  // the difference is real, not an artefact of the inputs
  EXPECT_EQ(encode(from_bits(0x007FFFFFu), Format::kBF16), 0x0080u);
  EXPECT_EQ(hw_bf16_encode(from_bits(0x007FFFFFu)), 0x0000u);
}

TEST(ConvertTest, Bf16OverflowAndNaN) {
  EXPECT_EQ(encode(0x1.fep127f, Format::kBF16), 0x7F7Fu);
  EXPECT_EQ(encode(from_bits(0x7F7F7FFFu), Format::kBF16), 0x7F7Fu);
  EXPECT_EQ(encode(from_bits(0x7F7F8000u), Format::kBF16), 0x7F80u);  // tie: max is odd -> Inf
  EXPECT_EQ(encode(from_bits(0x7F7F8000u), Format::kBF16, OverflowMode::kSaturating), 0x7F7Fu);
  EXPECT_EQ(encode(-INFINITY, Format::kBF16, OverflowMode::kSaturating), 0xFF7Fu);
  EXPECT_EQ(encode(from_bits(0xFF800001u), Format::kBF16), 0xFFC0u);  // sNaN -> quiet, signed
  EXPECT_EQ(encode(from_bits(0x7FA10000u), Format::kBF16, OverflowMode::kSaturating), 0x7FE1u);
  EXPECT_EQ(encode(from_bits(0x00008000u), Format::kBF16), 0x0000u);  // half a subnormal
  EXPECT_EQ(encode(from_bits(0x00018000u), Format::kBF16), 0x0002u);  // tie to even
}

// ---- FP8 -------------------------------------------------------------------------------------

TEST(ConvertTest, E4m3EncodeMatchesBitReferenceOnEveryPatternClass) {
  check_against_bit_reference(kE4m3, every_pattern_class());
}

TEST(ConvertTest, E5m2EncodeMatchesBitReferenceOnEveryPatternClass) {
  check_against_bit_reference(kE5m2, every_pattern_class());
}

TEST(ConvertTest, E4m3EncodeMatchesBitReferenceNearEveryBoundary) {
  check_against_bit_reference(kE4m3, boundary_inputs(kE4m3, 64));
}

TEST(ConvertTest, E5m2EncodeMatchesBitReferenceNearEveryBoundary) {
  check_against_bit_reference(kE5m2, boundary_inputs(kE5m2, 64));
}

TEST(ConvertTest, Fp8EncodeMatchesBitReferenceOnRandomPatterns) {
  const std::vector<std::uint32_t> uniform = random_inputs(1'000'000, 99);
  const std::vector<std::uint32_t> in_range = random_inputs_in_range(1'000'000, 105, 145, 100);
  for (const Layout& l : {kE4m3, kE5m2}) {
    check_against_bit_reference(l, uniform);
    check_against_bit_reference(l, in_range);
  }
}

TEST(ConvertTest, Fp8OverflowAndUnderflowThresholds) {
  struct Case {
    Format format;
    float x;
    std::uint8_t want;
    std::uint8_t want_saturating;
  };
  const Case cases[] = {
      {Format::kE4M3, 448.0f, 0x7E, 0x7E},
      {Format::kE4M3, 464.0f, 0x7E, 0x7E},  // tie to even stays at 448: 480 would be NaN
      {Format::kE4M3, std::nextafter(464.0f, INFINITY), 0x7F, 0x7E},
      {Format::kE4M3, -1e6f, 0xFF, 0xFE},
      {Format::kE4M3, INFINITY, 0x7F, 0x7E},
      {Format::kE4M3, -INFINITY, 0xFF, 0xFE},
      {Format::kE4M3, NAN, 0x7F, 0x7F},
      {Format::kE4M3, -NAN, 0xFF, 0xFF},
      {Format::kE4M3, 0x1p-10f, 0x00, 0x00},
      {Format::kE4M3, std::nextafter(0x1p-10f, 1.0f), 0x01, 0x01},
      {Format::kE4M3, 0x3p-11f, 0x01, 0x01},  // 0.75 * 2^-9
      {Format::kE4M3, 0x3p-10f, 0x02, 0x02},  // 1.5 * 2^-9 ties to even
      {Format::kE4M3, std::nextafter(0x1p-6f, 0.0f), 0x08, 0x08},
      {Format::kE4M3, 256.0f, 0x78, 0x78},
      {Format::kE5M2, 57344.0f, 0x7B, 0x7B},
      {Format::kE5M2, std::nextafter(61440.0f, 0.0f), 0x7B, 0x7B},
      {Format::kE5M2, 61440.0f, 0x7C, 0x7B},  // tie: 57344's fraction 11 is odd -> Inf
      {Format::kE5M2, -INFINITY, 0xFC, 0xFB},
      {Format::kE5M2, from_bits(0x7FC00000u), 0x7E, 0x7E},
      {Format::kE5M2, from_bits(0xFFA00000u), 0xFF, 0xFF},  // payload bit kept, quiet set
      {Format::kE5M2, from_bits(0x7F800001u), 0x7E, 0x7E},
      {Format::kE5M2, 0x1p-17f, 0x00, 0x00},
      {Format::kE5M2, -std::nextafter(0x1p-17f, 1.0f), 0x81, 0x81},
      {Format::kE5M2, 0x3p-17f, 0x02, 0x02},  // 1.5 * 2^-16 ties to even
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << format_name(c.format) << " x = " << c.x);
    EXPECT_EQ(encode(c.x, c.format), c.want);
    EXPECT_EQ(encode(c.x, c.format, OverflowMode::kSaturating), c.want_saturating);
    for (SimdLevel level : kLevels) {
      std::uint8_t out[2] = {};
      convert_from_fp32(&c.x, out, 1, c.format, OverflowMode::kNonSaturating, level);
      convert_from_fp32(&c.x, out + 1, 1, c.format, OverflowMode::kSaturating, level);
      EXPECT_EQ(out[0], c.want) << simd_level_name(level);
      EXPECT_EQ(out[1], c.want_saturating) << simd_level_name(level);
    }
  }
}

// ---- FP6 / FP4 (OCP Microscaling elements) --------------------------------------------------
// The same bit-level checks as FP8; convert_mx_test.cc checks them against the specification's
// value tables.

TEST(ConvertTest, MxElementsDecodeEveryPattern) {
  for (const Layout& l : kMxElementLayouts) {
    SCOPED_TRACE(format_name(l.format));
    check_decode_every_pattern(l);
  }
}

TEST(ConvertTest, MxElementsRoundTripEveryPattern) {
  for (const Layout& l : kMxElementLayouts) {
    SCOPED_TRACE(format_name(l.format));
    check_round_trip_every_pattern(l);
  }
}

TEST(ConvertTest, MxElementsEncodeMatchesBitReferenceOnEveryPatternClass) {
  const std::vector<std::uint32_t> inputs = every_pattern_class();
  for (const Layout& l : kMxElementLayouts) check_against_bit_reference(l, inputs);
}

TEST(ConvertTest, MxElementsEncodeMatchesBitReferenceNearEveryBoundary) {
  for (const Layout& l : kMxElementLayouts) check_against_bit_reference(l, boundary_inputs(l, 64));
}

TEST(ConvertTest, MxElementsEncodeMatchesBitReferenceOnRandomPatterns) {
  const std::vector<std::uint32_t> uniform = random_inputs(1'000'000, 199);
  const std::vector<std::uint32_t> in_range = random_inputs_in_range(1'000'000, 118, 134, 200);
  for (const Layout& l : kMxElementLayouts) {
    check_against_bit_reference(l, uniform);
    check_against_bit_reference(l, in_range);
  }
}

// ---- the host's MXCSR ------------------------------------------------------------------------

// Sets MXCSR for the lifetime of the object, restoring the caller's on exit.
class ScopedMxcsr {
 public:
  explicit ScopedMxcsr(unsigned bits) : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | bits); }
  ~ScopedMxcsr() { _mm_setcsr(saved_); }
  ScopedMxcsr(const ScopedMxcsr&) = delete;
  ScopedMxcsr& operator=(const ScopedMxcsr&) = delete;

 private:
  unsigned saved_;
};

constexpr unsigned kFlushToZero = 0x8000;
constexpr unsigned kDenormalsAreZero = 0x0040;
constexpr unsigned kRoundTowardZero = 0x6000;

// The agent runs inside someone else's process, which may have set FTZ/DAZ (e.g.
// torch.set_flush_denormal(True)) or another rounding mode. Conversions must not change.
TEST(ConvertTest, ResultsDoNotDependOnMxcsr) {
  std::vector<std::uint32_t> inputs;
  for (const Layout& l : kNarrowLayouts) {
    const std::vector<std::uint32_t> b = boundary_inputs(l, 2);
    inputs.insert(inputs.end(), b.begin(), b.end());
  }
  for (std::uint32_t u = 0; u < 0x800000u; u += 0x1FFFu) {  // FP32 subnormals
    inputs.push_back(u);
    inputs.push_back(u | 0x80000000u);
  }
  for (unsigned bits : {kFlushToZero | kDenormalsAreZero, kRoundTowardZero}) {
    SCOPED_TRACE(::testing::Message() << "MXCSR |= 0x" << std::hex << bits);
    const ScopedMxcsr mxcsr(bits);
    for (const Layout& l : kNarrowLayouts) {
      check_against_bit_reference(l, inputs);
      check_decode_every_pattern(l);
    }
  }
}

}  // namespace
}  // namespace ampscope
