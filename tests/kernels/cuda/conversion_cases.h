// Inputs and the comparison rule shared by the device conversion tests and the host-emulation
// test of the same element code. The rule is the one documented in ampscope/cuda/convert.h:
// bit-exact, except that a NaN result is compared by NaN-ness alone.
#pragma once

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "ampscope/convert.h"
#include "ampscope/formats.h"
#include "format_printer.h"

namespace ampscope::cuda::testing {

inline float from_bits(std::uint32_t u) { return std::bit_cast<float>(u); }
inline std::uint32_t to_bits(float x) { return std::bit_cast<std::uint32_t>(x); }

inline constexpr Format kNarrowFormats[] = {Format::kFP16, Format::kBF16, Format::kE4M3,
                                            Format::kE5M2, Format::kE2M1, Format::kE3M2,
                                            Format::kE2M3};

// Every bit pattern a decoder reads: all of FP16/BF16's, every byte for the byte formats (the
// FP6/FP4 code is the byte's low bits; the rest must be ignored).
inline std::uint32_t decode_patterns(Format f) {
  const int bits = format_info(f).total_bits;
  return 1u << (bits < 8 ? 8 : bits);
}

// FP32 inputs that a rounding into f has to get right:
//   - every value v of f (both signs) and its FP32 neighbours up to 3 ulps away;
//   - the midpoint between v and the next larger value of f (the rounding tie), and its
//     neighbours; above max finite the "next value" is the overflow threshold;
//   - FP32 specials: zeros, infinities, NaNs with several signs and payloads, FP32 subnormals;
//   - a sweep over all FP32 bit patterns with a prime stride.
inline std::vector<float> conversion_probes(Format f) {
  std::vector<float> out;
  const FormatInfo& info = format_info(f);
  auto around = [&](float x, int radius) {
    const std::uint32_t u = to_bits(x);
    for (int d = -radius; d <= radius; ++d) {
      out.push_back(from_bits(u + static_cast<std::uint32_t>(d)));
      out.push_back(-from_bits(u + static_cast<std::uint32_t>(d)));
    }
  };
  const std::uint32_t patterns = 1u << info.total_bits;
  const std::uint32_t sign_bit = patterns >> 1;
  for (std::uint32_t b = 0; b < sign_bit; ++b) {
    const float v = decode(b, f);
    if (std::isnan(v) || std::isinf(v)) continue;
    around(v, 3);
    const float next = decode(b + 1, f);
    // Past max finite: the next code is Inf, NaN or (FP6/FP4, no specials) the sign bit.
    const bool past_max = b + 1 == sign_bit || std::isnan(next) || std::isinf(next);
    const double upper = past_max ? info.overflow_threshold : static_cast<double>(next);
    if (upper > v) around(static_cast<float>((static_cast<double>(v) + upper) / 2), 2);
  }
  for (std::uint32_t u :
       {0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFC00000u, 0x7F800001u,
        0xFF800001u, 0x7FA00000u, 0x7FFFFFFFu, 0xFFFFFFFFu, 0x7FC12345u, 0x00000001u, 0x007FFFFFu,
        0x00400000u, 0x7F7FFFFFu, 0xFF7FFFFFu}) {
    out.push_back(from_bits(u));
  }
  for (std::uint64_t u = 0; u <= 0xFFFFFFFFull; u += 4093) {
    out.push_back(from_bits(static_cast<std::uint32_t>(u)));
  }
  return out;
}

// "0x..." (AssertionResult streams every operand separately, so std::hex would not stick).
inline std::string hex(std::uint32_t bits) {
  std::ostringstream os;
  os << "0x" << std::hex << bits;
  return os.str();
}

// got: the conversion under test of x into f; want: encode(x, f, mode).
inline ::testing::AssertionResult same_narrow(std::uint32_t got, std::uint32_t want, float x,
                                              Format f) {
  if (got == want) return ::testing::AssertionSuccess();
  if (std::isnan(x) && std::isnan(decode(got, f))) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << format_name(f) << ": x = " << x << " (" << hex(to_bits(x))
                                       << ") gave " << hex(got) << ", reference " << hex(want);
}

// got: the conversion under test of bit pattern `bits` of f into FP32.
inline ::testing::AssertionResult same_wide(float got, std::uint32_t bits, Format f) {
  const float want = decode(bits, f);
  if (to_bits(got) == to_bits(want)) return ::testing::AssertionSuccess();
  if (std::isnan(want) && std::isnan(got)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << format_name(f) << ": pattern " << hex(bits) << " gave "
                                       << hex(to_bits(got)) << ", reference " << hex(to_bits(want));
}

}  // namespace ampscope::cuda::testing
