// Every SIMD level of the bulk conversions against the scalar reference encode()/decode(),
// bit for bit: every direction on awkward sizes and misaligned pointers with the special
// values in every lane position, nothing written outside [0, n), the results independent of
// the host's MXCSR, and FP32 -> narrow on all 2^32 FP32 patterns. convert_test.cc checks the
// reference itself.
#include <gtest/gtest.h>
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <random>
#include <vector>

#include "../../kernels/cpu/convert_internal.h"  // detail::round_through_at_level
#include "ampscope/check.h"
#include "ampscope/convert.h"
#include "ampscope/cpu_features.h"

namespace ampscope {

// gtest prints parameters with this (it must live in the type's namespace).
void PrintTo(SimdLevel level, std::ostream* os) { *os << simd_level_name(level); }

namespace {

constexpr Format kNarrowFormats[] = {Format::kFP16, Format::kBF16, Format::kE4M3, Format::kE5M2,
                                     Format::kE2M1, Format::kE3M2, Format::kE2M3};
constexpr Format kAllFormats[] = {Format::kFP32, Format::kFP16, Format::kBF16, Format::kE4M3,
                                  Format::kE5M2, Format::kE2M1, Format::kE3M2, Format::kE2M3};
static_assert(std::size(kAllFormats) == kNumFormats, "a format the level tests do not cover");
constexpr OverflowMode kModes[] = {OverflowMode::kNonSaturating, OverflowMode::kSaturating};
constexpr std::size_t kSizes[] = {0, 1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 64, 65, 1023};
constexpr std::size_t kSrcOffsets[] = {0, 1, 3};  // elements past a 64-byte boundary
constexpr std::size_t kDstOffsets[] = {0, 1, 5};
constexpr std::uint8_t kGuard = 0xA5;
constexpr int kMaxReported = 8;

std::uint32_t bits_of(float x) { return std::bit_cast<std::uint32_t>(x); }
float from_bits(std::uint32_t u) { return std::bit_cast<float>(u); }

const char* mode_name(OverflowMode m) {
  return m == OverflowMode::kSaturating ? "saturating" : "non-saturating";
}

// Special FP32 patterns: zeros, subnormals, Inf, NaNs with payloads, and for every format its
// overflow threshold, max finite, min normal and the smallest subnormal with its half and
// one-and-a-half, each +-1 ulp, both signs.
std::vector<std::uint32_t> special_fp32() {
  std::vector<std::uint32_t> out;
  auto add = [&](std::uint32_t u) {
    out.push_back(u);
    out.push_back(u ^ 0x80000000u);
  };
  for (std::uint32_t u :
       {0x00000000u, 0x00000001u, 0x00008000u, 0x00018000u, 0x007FFFFFu, 0x00800000u, 0x7F7F7FFFu,
        0x7F7F8000u, 0x7F7FFFFFu, 0x7F800000u, 0x7F800001u, 0x7FA00000u, 0x7FBFFFFFu, 0x7FC00000u,
        0x7FE12345u, 0x7FFFFFFFu, 0x3F800000u}) {
    add(u);
  }
  for (Format f : kNarrowFormats) {
    const FormatInfo& info = format_info(f);
    for (double v : {info.max_finite, info.overflow_threshold, info.min_normal(),
                     info.min_subnormal(), info.min_subnormal() / 2, info.min_subnormal() * 1.5}) {
      const std::uint32_t centre = bits_of(static_cast<float>(v));
      for (std::uint32_t u : {centre - 1, centre, centre + 1}) {
        if (u <= 0x7F800000u) add(u);
      }
    }
  }
  return out;
}

// `count` FP32 patterns: the specials, then random patterns (half of them in [2^-30, 2^20)).
std::vector<std::uint32_t> fp32_pool(std::size_t count, std::uint32_t seed) {
  std::vector<std::uint32_t> out = special_fp32();
  std::mt19937 rng(seed);
  while (out.size() < count) {
    std::uint32_t u = rng();
    if (out.size() % 2 == 0)
      u = (u & 0x81FFFFFFu) | (static_cast<std::uint32_t>(97 + rng() % 50) << 23);
    out.push_back(u);
  }
  return out;
}

// Codes to decode, shuffled: for FP8 every code; for FP6/FP4 every byte (the bits above the
// code must be ignored); for FP16/BF16 every zero, subnormal, Inf and
// NaN code and as many random normal ones; for FP32 the FP32 pool.
const std::vector<std::uint32_t>& code_pool(Format f) {
  static const auto pools = [] {
    std::vector<std::vector<std::uint32_t>> all(kNumFormats);
    std::mt19937 rng(31);
    for (Format g : kAllFormats) {
      std::vector<std::uint32_t>& pool = all[static_cast<int>(g)];
      const FormatInfo& info = format_info(g);
      if (g == Format::kFP32) {
        pool = fp32_pool(2048, 17);
        continue;
      }
      const std::uint32_t count = 1u << std::max(info.total_bits, 8);
      const std::uint32_t exp_mask = ((1u << info.exponent_bits) - 1) << info.mantissa_bits;
      for (std::uint32_t c = 0; c < count; ++c) {
        const std::uint32_t e = c & exp_mask;
        if (info.total_bits <= 8 || e == 0 || e == exp_mask) pool.push_back(c);
      }
      const std::size_t specials = pool.size();
      for (std::size_t i = 0; i < specials && info.total_bits == 16; ++i) {
        pool.push_back(rng() & (count - 1));
      }
      std::shuffle(pool.begin(), pool.end(), rng);
    }
    return all;
  }();
  return pools[static_cast<int>(f)];
}

// A 64-byte aligned buffer with guard bytes around the element range [offset, offset + n).
class GuardedBuffer {
 public:
  GuardedBuffer(std::size_t n, std::size_t elem_bytes, std::size_t offset)
      : storage_(n * elem_bytes + offset * elem_bytes + 192, kGuard),
        begin_((64 - reinterpret_cast<std::uintptr_t>(storage_.data()) % 64) % 64 +
               offset * elem_bytes),
        end_(begin_ + n * elem_bytes) {}

  void* data() { return storage_.data() + begin_; }
  // Index of the first guard byte that changed, or -1.
  long first_damaged_guard() const {
    for (std::size_t i = 0; i < storage_.size(); ++i) {
      if ((i < begin_ || i >= end_) && storage_[i] != kGuard) return static_cast<long>(i);
    }
    return -1;
  }

 private:
  std::vector<std::uint8_t> storage_;
  std::size_t begin_;
  std::size_t end_;
};

std::uint32_t load_code(const void* p, std::size_t i, Format f) {
  if (storage_bytes(f) == 4) return static_cast<const std::uint32_t*>(p)[i];
  if (storage_bytes(f) == 2) return static_cast<const std::uint16_t*>(p)[i];
  return static_cast<const std::uint8_t*>(p)[i];
}

void store_code(void* p, std::size_t i, Format f, std::uint32_t code) {
  if (storage_bytes(f) == 4) {
    static_cast<std::uint32_t*>(p)[i] = code;
  } else if (storage_bytes(f) == 2) {
    static_cast<std::uint16_t*>(p)[i] = static_cast<std::uint16_t>(code);
  } else {
    static_cast<std::uint8_t*>(p)[i] = static_cast<std::uint8_t>(code);
  }
}

class ConvertLevelTest : public ::testing::TestWithParam<SimdLevel> {
 protected:
  void SetUp() override {
    if (clamp_simd_level(level()) != level()) {
      GTEST_SKIP() << "this CPU has no " << simd_level_name(level());
    }
  }
  SimdLevel level() const { return GetParam(); }

  // The inputs for one (size, offset) case: the pool rotated so that the specials land in
  // different lanes, the vector body and the tail alike.
  static std::vector<std::uint32_t> inputs(std::size_t n, std::size_t rotation) {
    static const std::vector<std::uint32_t> pool = fp32_pool(2048, 2024);
    std::vector<std::uint32_t> out(n);
    for (std::size_t i = 0; i < n; ++i) out[i] = pool[(i + rotation * 37) % pool.size()];
    return out;
  }

  void check_encode(Format f, OverflowMode mode, std::size_t n, std::size_t src_off,
                    std::size_t dst_off) {
    const std::vector<std::uint32_t> bits = inputs(n, src_off * 7 + dst_off + n);
    GuardedBuffer src(n, 4, src_off);
    GuardedBuffer dst(n, storage_bytes(f), dst_off);
    if (n > 0) std::memcpy(src.data(), bits.data(), n * 4);  // bits.data() is null when n == 0
    convert_from_fp32(static_cast<const float*>(src.data()), dst.data(), n, f, mode, level());
    SCOPED_TRACE(::testing::Message() << format_name(f) << " " << mode_name(mode) << " n=" << n
                                      << " src+" << src_off << " dst+" << dst_off);
    EXPECT_EQ(dst.first_damaged_guard(), -1);
    EXPECT_EQ(src.first_damaged_guard(), -1);
    int failures = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t want = encode(from_bits(bits[i]), f, mode);
      const std::uint32_t got = load_code(dst.data(), i, f);
      if (got != want && failures++ < kMaxReported) {
        ADD_FAILURE() << "[" << i << "] 0x" << std::hex << bits[i] << " -> 0x" << got
                      << ", reference 0x" << want;
      }
    }
  }

  void check_decode(Format f, std::size_t n, std::size_t src_off, std::size_t dst_off) {
    const std::vector<std::uint32_t>& pool = code_pool(f);
    GuardedBuffer src(n, storage_bytes(f), src_off);
    GuardedBuffer dst(n, 4, dst_off);
    const std::size_t rotation = (src_off * 5 + dst_off + 3 * n) * 37;
    for (std::size_t i = 0; i < n; ++i) {
      store_code(src.data(), i, f, pool[(i + rotation) % pool.size()]);
    }
    convert_to_fp32(src.data(), static_cast<float*>(dst.data()), n, f, level());
    SCOPED_TRACE(::testing::Message()
                 << format_name(f) << " n=" << n << " src+" << src_off << " dst+" << dst_off);
    EXPECT_EQ(dst.first_damaged_guard(), -1);
    int failures = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t code = load_code(src.data(), i, f);
      const std::uint32_t want = bits_of(decode(code, f));
      const std::uint32_t got = static_cast<const std::uint32_t*>(dst.data())[i];
      if (got != want && failures++ < kMaxReported) {
        ADD_FAILURE() << "[" << i << "] 0x" << std::hex << code << " -> 0x" << got
                      << ", reference 0x" << want;
      }
    }
  }

  void check_round_through(Format f, OverflowMode mode, std::size_t n, std::size_t off) {
    const std::vector<std::uint32_t> bits = inputs(n, off * 11 + 2 * n);
    GuardedBuffer data(n, 4, off);
    if (n > 0) std::memcpy(data.data(), bits.data(), n * 4);
    detail::round_through_at_level(static_cast<float*>(data.data()), n, f, mode, level());
    SCOPED_TRACE(::testing::Message()
                 << format_name(f) << " " << mode_name(mode) << " n=" << n << " +" << off);
    EXPECT_EQ(data.first_damaged_guard(), -1);
    int failures = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t want = bits_of(round_to(from_bits(bits[i]), f, mode));
      const std::uint32_t got = static_cast<const std::uint32_t*>(data.data())[i];
      if (got != want && failures++ < kMaxReported) {
        ADD_FAILURE() << "[" << i << "] 0x" << std::hex << bits[i] << " -> 0x" << got
                      << ", reference 0x" << want;
      }
    }
  }
};

TEST_P(ConvertLevelTest, EncodeMatchesReferenceOnEverySizeAndOffset) {
  for (Format f : kAllFormats) {
    for (OverflowMode mode : kModes) {
      for (std::size_t n : kSizes) {
        for (std::size_t src_off : kSrcOffsets) {
          for (std::size_t dst_off : kDstOffsets) check_encode(f, mode, n, src_off, dst_off);
        }
      }
    }
  }
}

TEST_P(ConvertLevelTest, DecodeMatchesReferenceOnEverySizeAndOffset) {
  for (Format f : kAllFormats) {
    for (std::size_t n : kSizes) {
      for (std::size_t src_off : kSrcOffsets) {
        for (std::size_t dst_off : kDstOffsets) check_decode(f, n, src_off, dst_off);
      }
    }
  }
}

TEST_P(ConvertLevelTest, RoundThroughMatchesReferenceOnEverySizeAndOffset) {
  for (Format f : kAllFormats) {
    for (OverflowMode mode : kModes) {
      for (std::size_t n : kSizes) {
        for (std::size_t off : kSrcOffsets) check_round_through(f, mode, n, off);
      }
    }
  }
}

// In-place FP32 -> FP32 is allowed (and a no-op); so is a null pointer with n == 0, but not
// with n > 0.
TEST_P(ConvertLevelTest, Fp32ToFp32CopiesAndAllowsInPlace) {
  std::vector<float> a = {1.0f, -2.5f, NAN, INFINITY, 0x1p-149f};
  std::vector<float> b(a.size());
  convert_from_fp32(a.data(), b.data(), a.size(), Format::kFP32, OverflowMode::kSaturating,
                    level());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
  convert_to_fp32(b.data(), b.data(), b.size(), Format::kFP32, level());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
  convert_from_fp32(nullptr, nullptr, 0, Format::kE4M3, OverflowMode::kNonSaturating, level());
  convert_to_fp32(nullptr, nullptr, 0, Format::kBF16, level());
  std::uint8_t out[1];
  EXPECT_THROW(
      convert_from_fp32(nullptr, out, 1, Format::kE4M3, OverflowMode::kNonSaturating, level()),
      Error);
}

// ---- the host's MXCSR ------------------------------------------------------------------------

class ScopedMxcsr {
 public:
  explicit ScopedMxcsr(unsigned bits) : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | bits); }
  ~ScopedMxcsr() { _mm_setcsr(saved_); }
  ScopedMxcsr(const ScopedMxcsr&) = delete;
  ScopedMxcsr& operator=(const ScopedMxcsr&) = delete;

 private:
  unsigned saved_;
};

// FTZ|DAZ (torch.set_flush_denormal(True)) and round-toward-zero must not change a result.
// Expectations are computed under the default MXCSR.
TEST_P(ConvertLevelTest, ResultsDoNotDependOnMxcsr) {
  std::vector<std::uint32_t> bits = fp32_pool(4096, 77);
  for (std::uint32_t u = 1; u < 0x800000u; u += 0x3FFFu) bits.push_back(u);  // FP32 subnormals
  const std::size_t n = bits.size();
  std::vector<float> src(n);
  std::memcpy(src.data(), bits.data(), n * 4);
  for (Format f : kNarrowFormats) {
    for (OverflowMode mode : kModes) {
      std::vector<std::uint16_t> want_codes(n);
      std::vector<std::uint32_t> want_round(n);
      std::vector<std::uint32_t> want_decoded(n);
      for (std::size_t i = 0; i < n; ++i) {
        want_codes[i] = static_cast<std::uint16_t>(encode(src[i], f, mode));
        want_round[i] = bits_of(round_to(src[i], f, mode));
        // Decode inputs: the low bits of the pool, so every code class appears.
        want_decoded[i] = bits_of(decode(bits[i] & ((1u << format_info(f).total_bits) - 1), f));
      }
      std::vector<std::uint16_t> codes16(n);
      std::vector<std::uint8_t> codes8(n);
      for (std::size_t i = 0; i < n; ++i) {
        codes16[i] = static_cast<std::uint16_t>(bits[i]);
        codes8[i] = static_cast<std::uint8_t>(bits[i]);
      }
      const bool wide = storage_bytes(f) == 2;
      for (unsigned csr : {0x8040u /* FTZ|DAZ */, 0x6000u /* toward zero */}) {
        SCOPED_TRACE(::testing::Message() << format_name(f) << " " << mode_name(mode)
                                          << " MXCSR |= 0x" << std::hex << csr);
        std::vector<std::uint16_t> out16(n);
        std::vector<std::uint8_t> out8(n);
        std::vector<float> rounded = src;
        std::vector<float> decoded(n);
        {
          const ScopedMxcsr scoped(csr);
          convert_from_fp32(src.data(), wide ? static_cast<void*>(out16.data()) : out8.data(), n, f,
                            mode, level());
          detail::round_through_at_level(rounded.data(), n, f, mode, level());
          convert_to_fp32(wide ? static_cast<const void*>(codes16.data()) : codes8.data(),
                          decoded.data(), n, f, level());
        }
        int failures = 0;
        for (std::size_t i = 0; i < n; ++i) {
          const std::uint32_t code = wide ? out16[i] : out8[i];
          if ((code != want_codes[i] || bits_of(rounded[i]) != want_round[i] ||
               bits_of(decoded[i]) != want_decoded[i]) &&
              failures++ < kMaxReported) {
            ADD_FAILURE() << "0x" << std::hex << bits[i] << ": code 0x" << code << " (want 0x"
                          << want_codes[i] << "), rounded 0x" << bits_of(rounded[i]) << " (want 0x"
                          << want_round[i] << "), decoded 0x" << bits_of(decoded[i]) << " (want 0x"
                          << want_decoded[i] << ")";
          }
        }
      }
    }
  }
}

// ---- all 2^32 FP32 patterns ------------------------------------------------------------------

// Within a block of 2^k consecutive patterns (same top 32 - k bits), where k is below the
// rounding position of the format (k = 13 for FP16, whose rounding bit is bit 12 at the
// lowest; 16 for BF16 and FP8), the result depends only on which of these classes the low
// bits fall in: 0, [1, half), half, (half, 2^k). So each block is checked against the
// reference on one member of each class, and the vector output is checked to be constant on
// each class: every pattern is compared, with one reference call per class.
// (round_through is decode(encode(x)) in registers; convert_test.cc checks it on the rounding
// boundaries, where a mistake would show.)
class BlockChecker {
 public:
  BlockChecker(Format f, OverflowMode mode) : format_(f), mode_(mode) {}

  Format format() const { return format_; }
  OverflowMode mode() const { return mode_; }
  bool failed() const { return failures_ > 0; }

  // Checks out[i] == encode(top << 16 | i) for i in [0, 65536).
  void check(std::uint32_t top, const void* out, SimdLevel level) {
    const std::size_t block = std::size_t{1} << (format_ == Format::kFP16 ? 13 : 16);
    const std::size_t half = block / 2;
    const std::size_t width = storage_bytes(format_);
    const auto* bytes = static_cast<const std::uint8_t*>(out);
    for (std::size_t start = 0; start < 65536; start += block) {
      const std::size_t firsts[4] = {start, start + 1, start + half, start + half + 1};
      const std::size_t lasts[4] = {start, start + half - 1, start + half, start + block - 1};
      for (int k = 0; k < 4; ++k) {
        const std::uint32_t rep = (top << 16) | static_cast<std::uint32_t>(firsts[k]);
        const std::uint32_t want = encode(from_bits(rep), format_, mode_);
        const std::uint8_t* p = bytes + firsts[k] * width;
        const bool ok = load_code(bytes, firsts[k], format_) == want &&
                        std::memcmp(p, p + width, (lasts[k] - firsts[k]) * width) == 0;
        if (!ok) report(top, firsts[k], lasts[k], want, out, level);
      }
    }
  }

 private:
  void report(std::uint32_t top, std::size_t first, std::size_t last, std::uint32_t want,
              const void* out, SimdLevel level) {
    for (std::size_t i = first; i <= last && failures_ < kMaxReported; ++i) {
      const std::uint32_t got = load_code(out, i, format_);
      if (got != want) {
        ++failures_;
        ADD_FAILURE() << simd_level_name(level) << " " << format_name(format_) << " "
                      << mode_name(mode_) << ": 0x" << std::hex << ((top << 16) | i) << " -> 0x"
                      << got << ", reference 0x" << want;
      }
    }
  }

  Format format_;
  OverflowMode mode_;
  int failures_ = 0;
};

TEST_P(ConvertLevelTest, EncodeMatchesReferenceOnEveryFp32Pattern) {
  if (level() == SimdLevel::kScalar) GTEST_SKIP() << "the scalar level is the reference";
  std::vector<BlockChecker> checkers;
  for (Format f : kNarrowFormats) {
    for (OverflowMode mode : kModes) checkers.emplace_back(f, mode);
  }
  std::vector<float> in(65536);
  std::vector<std::uint16_t> out(65536);
  for (std::uint32_t top = 0; top < 65536; ++top) {
    for (std::uint32_t i = 0; i < 65536; ++i) in[i] = from_bits((top << 16) | i);
    for (BlockChecker& checker : checkers) {
      if (checker.failed()) continue;
      convert_from_fp32(in.data(), out.data(), in.size(), checker.format(), checker.mode(),
                        level());
      checker.check(top, out.data(), level());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Levels, ConvertLevelTest,
                         ::testing::Values(SimdLevel::kScalar, SimdLevel::kAvx2,
                                           SimdLevel::kAvx512),
                         [](const ::testing::TestParamInfo<SimdLevel>& info) {
                           return std::string(simd_level_name(info.param));
                         });

}  // namespace
}  // namespace ampscope
