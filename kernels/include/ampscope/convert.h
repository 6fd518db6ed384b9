// Conversions between FP32 and the narrow formats of formats.h.
//
// Rounding is to nearest, ties to even, exactly as the hardware does it (F16C, the AVX-512 and
// CUDA conversion instructions). Overflow follows formats.h: by default a value whose rounded
// magnitude exceeds max finite becomes Inf (NaN for E4M3 fn, which has no Inf); with
// OverflowMode::kSaturating it becomes +-max finite instead, and an Inf input does too (NVIDIA's
// __NV_SATFINITE semantics). NaN stays NaN in both modes: the result is a quiet NaN that keeps
// the sign and the top payload bits that fit (what F16C does); E4M3 has one NaN per sign.
//
// The FP6/FP4 elements (E3M2, E2M3, E2M1) have neither Inf nor NaN: every code is a value, so
// there is no code for a non-finite result. A value whose rounded magnitude exceeds max finite,
// an Inf and a NaN all encode as +-max finite, the sign kept, in both OverflowModes. (OCP
// Microscaling v1.0 leaves converting NaN/Inf to these elements to the implementation; the MX
// recipes never encode one: a block holding one gets a NaN scale, recipe.h.) Their codes sit in
// the low bits of a byte; decode() ignores the bits above total_bits.
//
// encode()/decode() are the scalar reference: plain, format-generic code written from the
// definition. The bulk functions dispatch at run time to AVX2/F16C or AVX-512 code and are
// tested bit-for-bit against the reference.
// Thread safety: all functions are pure.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ampscope/cpu_features.h"
#include "ampscope/formats.h"

namespace ampscope {

enum class OverflowMode { kNonSaturating = 0, kSaturating = 1 };

// Bits of x rounded to format f, in the low f.total_bits bits. For Format::kFP32 returns the
// bits of x unchanged.
std::uint32_t encode(float x, Format f, OverflowMode mode = OverflowMode::kNonSaturating);

// The exact value of the bit pattern (only the low total_bits bits are read). NaN patterns
// decode to a quiet FP32 NaN with the same sign and payload bits shifted to the top.
float decode(std::uint32_t bits, Format f);

// decode(encode(x, f, mode), f): x rounded through f.
float round_to(float x, Format f, OverflowMode mode = OverflowMode::kNonSaturating);

inline std::uint16_t fp32_to_fp16(float x) {
  return static_cast<std::uint16_t>(encode(x, Format::kFP16));
}
inline float fp16_to_fp32(std::uint16_t h) { return decode(h, Format::kFP16); }
inline std::uint16_t fp32_to_bf16(float x) {
  return static_cast<std::uint16_t>(encode(x, Format::kBF16));
}
inline float bf16_to_fp32(std::uint16_t h) { return decode(h, Format::kBF16); }
inline std::uint8_t fp32_to_e4m3(float x, OverflowMode m = OverflowMode::kNonSaturating) {
  return static_cast<std::uint8_t>(encode(x, Format::kE4M3, m));
}
inline float e4m3_to_fp32(std::uint8_t b) { return decode(b, Format::kE4M3); }
inline std::uint8_t fp32_to_e5m2(float x, OverflowMode m = OverflowMode::kNonSaturating) {
  return static_cast<std::uint8_t>(encode(x, Format::kE5M2, m));
}
inline float e5m2_to_fp32(std::uint8_t b) { return decode(b, Format::kE5M2); }

// E8M0, the shared scale of an OCP MX block: an unsigned power of two 2^(code - 127), codes 0
// to 254 (2^-127 to 2^127), 0xFF is NaN. No sign, no zero, no Inf.
inline constexpr std::uint8_t kE8M0Nan = 0xFF;
inline constexpr int kE8M0Bias = 127;
inline constexpr int kE8M0MinExponent = -127;
inline constexpr int kE8M0MaxExponent = 127;
// The exact value of the code: 2^(code - 127) (code 0 is 2^-127, an FP32 subnormal, built from
// bits so that FTZ/DAZ cannot flush it), a quiet NaN for 0xFF.
float decode_e8m0(std::uint8_t code);
// The code of 2^exponent, the exponent clamped to [-127, 127] first. Never returns the NaN code.
std::uint8_t encode_e8m0(int exponent);
// floor(log2 |x|) for finite nonzero x, exact, FP32 subnormals included (read from the bits:
// -149 for the smallest). Throws ampscope::Error on zero, Inf or NaN.
int floor_log2(float x);

// Bulk conversions. dst holds n elements of dst_format's storage (uint16_t for FP16/BF16,
// uint8_t for FP8, FP6 and FP4, float for FP32). src and dst may be unaligned; they must not
// overlap unless equal (in-place is only possible for FP32 -> FP32). `level` defaults to the active
// level.
void convert_from_fp32(const float* src, void* dst, std::size_t n, Format dst_format,
                       OverflowMode mode = OverflowMode::kNonSaturating);
void convert_from_fp32(const float* src, void* dst, std::size_t n, Format dst_format,
                       OverflowMode mode, SimdLevel level);
void convert_to_fp32(const void* src, float* dst, std::size_t n, Format src_format);
void convert_to_fp32(const void* src, float* dst, std::size_t n, Format src_format,
                     SimdLevel level);

// data[i] = round_to(data[i], f, mode) for every i: what storing a tensor in f and reading it
// back does. The trainer uses it to keep FP16/BF16 activations exactly as a GPU would.
void round_through(float* data, std::size_t n, Format f,
                   OverflowMode mode = OverflowMode::kNonSaturating);

}  // namespace ampscope
