// AVX2/F16C bulk conversions, 8 lanes at a time, bit-identical to encode()/decode().
//
// - FP16: F16C with an explicit round-to-nearest-even immediate, so MXCSR's rounding mode is
//   ignored (and F16C neither flushes FP16 subnormals nor reads DAZ). Saturation turns the Inf
//   that overflow produces into max finite: 0x7C00 - 1 = 0x7BFF, sign kept.
// - BF16: integer code. (u + 0x7FFF + lsb) >> 16 rounds to nearest even in the bit pattern,
//   FP32 subnormals included; NaN lanes take the top 16 bits with the quiet bit set.
// - FP8: branch-free per lane, constants from NarrowCodes. In the normal range the exponent
//   is rebiased and the fraction rounded half to even in the bit pattern (a carry moves into
//   the exponent); in the subnormal range the FPU rounds |x| + magic, whose ulp is the
//   smallest subnormal. Then codes above max finite become Inf/NaN/max and NaN lanes a quiet
//   NaN with the payload's top bits. Decoding rebiases normal codes, scales subnormal ones by
//   an exact int -> float multiply and selects Inf/NaN per lane. round_through does the same
//   two roundings without leaving FP32 (clear the dropped fraction bits; add and subtract the
//   magic number), about twice as fast as encoding and decoding.
// The FP8 add depends on MXCSR (DAZ, rounding mode), which belongs to the host process, so the
// encoding entry points run under the default MXCSR (ScopedDefaultMxcsr).
// Tails (n % 8) go through the same vector code via an 8-element stack buffer.
#include <immintrin.h>

#include <cstring>

#include "convert_internal.h"

namespace ampscope::detail {
namespace {

AMPSCOPE_INLINE_AVX2 __m256i splat(std::uint32_t v) {
  return _mm256_set1_epi32(static_cast<int>(v));
}

AMPSCOPE_INLINE_AVX2 __m256 splat_float_bits(std::uint32_t v) {
  return _mm256_castsi256_ps(splat(v));
}

// ---- FP16 (F16C) --------------------------------------------------------------------------

template <bool kSaturate>
AMPSCOPE_INLINE_AVX2 __m128i encode_fp16(__m256 x) {
  __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT);
  if constexpr (kSaturate) {
    const __m128i is_inf =
        _mm_cmpeq_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7FFF)), _mm_set1_epi16(0x7C00));
    h = _mm_add_epi16(h, is_inf);
  }
  return h;
}

// ---- BF16 (integer) -----------------------------------------------------------------------

// BF16 bits in the low half of each 32-bit lane.
template <bool kSaturate>
AMPSCOPE_INLINE_AVX2 __m256i encode_bf16(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), splat(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, splat(0x7FFF)), lsb), 16);
  const __m256i is_nan =
      _mm256_cmpgt_epi32(_mm256_and_si256(u, splat(0x7FFFFFFF)), splat(0x7F800000));
  r = _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_srli_epi32(u, 16), splat(0x40)), is_nan);
  if constexpr (kSaturate) {
    const __m256i is_inf = _mm256_cmpeq_epi32(_mm256_and_si256(r, splat(0x7FFF)), splat(0x7F80));
    r = _mm256_add_epi32(r, is_inf);  // 0x7F80 - 1 = 0x7F7F, sign kept
  }
  return r;
}

// FP32 bits from BF16 bits in the low half of each lane; signalling NaNs come back quiet.
AMPSCOPE_INLINE_AVX2 __m256 decode_bf16(__m256i h) {
  const __m256i v = _mm256_slli_epi32(h, 16);
  const __m256i is_nan =
      _mm256_cmpgt_epi32(_mm256_and_si256(v, splat(0x7FFFFFFF)), splat(0x7F800000));
  return _mm256_castsi256_ps(_mm256_or_si256(v, _mm256_and_si256(is_nan, splat(0x00400000))));
}

// ---- FP8 (integer, format-generic) --------------------------------------------------------

// Codes (sign included) in the low bits of each 32-bit lane. Needs the default MXCSR.
template <Format F, bool kSaturate>
AMPSCOPE_INLINE_AVX2 __m256i encode_narrow(__m256 x) {
  constexpr NarrowCodes c = narrow_codes(F);
  constexpr int m = c.mantissa_bits;
  const __m256i u = _mm256_castps_si256(x);
  const __m256i a = _mm256_and_si256(u, splat(0x7FFFFFFF));
  // Normal range: rebias and round away 23 - m fraction bits, half to even, in the pattern.
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(a, 23 - m), splat(1));
  const __m256i normal = _mm256_srli_epi32(
      _mm256_add_epi32(_mm256_add_epi32(a, splat(c.rebias_and_half)), lsb), 23 - m);
  // Subnormal range: the FPU rounds |x| + magic to the target's subnormal quantum; the low
  // bits of the sum are the code.
  const __m256 magic = splat_float_bits(c.subnormal_magic);
  const __m256i subnormal = _mm256_sub_epi32(
      _mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(a), magic)), splat(c.subnormal_magic));
  const __m256i is_subnormal = _mm256_cmpgt_epi32(splat(c.min_normal_fp32), a);
  __m256i code = _mm256_blendv_epi8(normal, subnormal, is_subnormal);
  const __m256i overflow = _mm256_cmpgt_epi32(code, splat(c.max_finite_code));
  code = _mm256_blendv_epi8(code, splat(kSaturate ? c.max_finite_code : c.overflow_code), overflow);
  const __m256i is_nan = _mm256_cmpgt_epi32(a, splat(0x7F800000));
  const __m256i nan = _mm256_or_si256(
      splat(c.nan_code), _mm256_and_si256(_mm256_srli_epi32(a, 23 - m), splat(c.payload_mask)));
  code = _mm256_blendv_epi8(code, nan, is_nan);
  const __m256i sign = _mm256_srli_epi32(_mm256_and_si256(u, splat(0x80000000)), 32 - c.total_bits);
  return _mm256_or_si256(code, sign);
}

// decode(encode(x)) without leaving FP32: the encoder's two roundings, done in place (the
// normal range clears the dropped fraction bits, the subnormal range subtracts the magic
// number again, exactly), then the overflow and NaN results decode() would give.
// Needs the default MXCSR.
template <Format F, bool kSaturate>
AMPSCOPE_INLINE_AVX2 __m256 round_narrow(__m256 x) {
  constexpr NarrowCodes c = narrow_codes(F);
  constexpr int m = c.mantissa_bits;
  const __m256i u = _mm256_castps_si256(x);
  const __m256i a = _mm256_and_si256(u, splat(0x7FFFFFFF));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(a, 23 - m), splat(1));
  const __m256i normal =
      _mm256_and_si256(_mm256_add_epi32(_mm256_add_epi32(a, splat((1u << (22 - m)) - 1)), lsb),
                       splat(~((1u << (23 - m)) - 1)));
  const __m256 magic = splat_float_bits(c.subnormal_magic);
  const __m256i subnormal =
      _mm256_castps_si256(_mm256_sub_ps(_mm256_add_ps(_mm256_castsi256_ps(a), magic), magic));
  const __m256i is_subnormal = _mm256_cmpgt_epi32(splat(c.min_normal_fp32), a);
  __m256i r = _mm256_blendv_epi8(normal, subnormal, is_subnormal);
  const __m256i overflow = _mm256_cmpgt_epi32(r, splat(c.max_finite_fp32));
  r = _mm256_blendv_epi8(r, splat(kSaturate ? c.max_finite_fp32 : c.overflow_fp32), overflow);
  const __m256i is_nan = _mm256_cmpgt_epi32(a, splat(0x7F800000));
  const __m256i nan =
      _mm256_or_si256(splat(c.nan_fp32), _mm256_and_si256(a, splat(c.payload_mask_fp32)));
  r = _mm256_blendv_epi8(r, nan, is_nan);
  return _mm256_castsi256_ps(_mm256_or_si256(r, _mm256_and_si256(u, splat(0x80000000))));
}

// FP32 from codes in the low bits of each lane (higher bits zero).
template <Format F>
AMPSCOPE_INLINE_AVX2 __m256 decode_narrow(__m256i b) {
  constexpr NarrowCodes c = narrow_codes(F);
  constexpr int m = c.mantissa_bits;
  const __m256i a = _mm256_and_si256(b, splat((1u << (c.total_bits - 1)) - 1));
  const __m256i frac = _mm256_and_si256(a, splat((1u << m) - 1));
  const __m256i normal =
      _mm256_add_epi32(_mm256_slli_epi32(a, 23 - m), splat((127u - c.bias) << 23));
  // frac * 2^(min normal exponent - m): exact, and a normal FP32 value for the FP8 formats.
  const __m256 subnormal = _mm256_mul_ps(
      _mm256_cvtepi32_ps(frac),
      splat_float_bits(static_cast<std::uint32_t>(127 + c.min_normal_exponent - m) << 23));
  const __m256i is_subnormal = _mm256_cmpgt_epi32(splat(1u << m), a);
  __m256i v = _mm256_blendv_epi8(normal, _mm256_castps_si256(subnormal), is_subnormal);
  const __m256i quiet =
      _mm256_andnot_si256(_mm256_cmpeq_epi32(frac, _mm256_setzero_si256()), splat(0x00400000));
  const __m256i special_value =
      _mm256_or_si256(_mm256_or_si256(splat(0x7F800000), _mm256_slli_epi32(frac, 23 - m)), quiet);
  const __m256i is_special = _mm256_cmpgt_epi32(a, splat(c.special_min - 1));
  v = _mm256_blendv_epi8(v, special_value, is_special);
  // The sign bit to bit 31; bits above the code (an FP6/FP4 byte's top) shift out.
  const __m256i sign = _mm256_and_si256(_mm256_slli_epi32(b, 32 - c.total_bits), splat(0x80000000));
  return _mm256_castsi256_ps(_mm256_or_si256(v, sign));
}

// ---- loads and stores of 8 lanes ----------------------------------------------------------

AMPSCOPE_INLINE_AVX2 void store8(std::uint8_t* dst, __m256i codes) {
  // Byte 0 of every 32-bit lane to the bottom of its 128-bit half, then both halves together.
  const __m256i pick =
      _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1,
                       -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(codes, pick),
                                                    _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(dst), _mm256_castsi256_si128(bytes));
}

AMPSCOPE_INLINE_AVX2 void store8(std::uint16_t* dst, __m256i codes) {
  const __m256i pick = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1, 0,
                                        1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i halves = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(codes, pick), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm256_castsi256_si128(halves));
}

AMPSCOPE_INLINE_AVX2 __m256i load8(const std::uint8_t* src) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src)));
}

AMPSCOPE_INLINE_AVX2 __m256i load8(const std::uint16_t* src) {
  return _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
}

// ---- codecs: one per (format, overflow mode), 8 lanes per call ----------------------------

template <bool kSaturate>
struct Fp16Codec {
  using Storage = std::uint16_t;
  static AMPSCOPE_INLINE_AVX2 void encode(const float* src, Storage* dst) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), encode_fp16<kSaturate>(_mm256_loadu_ps(src)));
  }
  static AMPSCOPE_INLINE_AVX2 void decode(const Storage* src, float* dst) {
    _mm256_storeu_ps(dst, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src))));
  }
  static AMPSCOPE_INLINE_AVX2 __m256 round(__m256 x) {
    return _mm256_cvtph_ps(encode_fp16<kSaturate>(x));
  }
};

template <bool kSaturate>
struct Bf16Codec {
  using Storage = std::uint16_t;
  static AMPSCOPE_INLINE_AVX2 void encode(const float* src, Storage* dst) {
    store8(dst, encode_bf16<kSaturate>(_mm256_loadu_ps(src)));
  }
  static AMPSCOPE_INLINE_AVX2 void decode(const Storage* src, float* dst) {
    _mm256_storeu_ps(dst, decode_bf16(load8(src)));
  }
  // The encoded NaN is already quiet, so decoding is only the shift.
  static AMPSCOPE_INLINE_AVX2 __m256 round(__m256 x) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(encode_bf16<kSaturate>(x), 16));
  }
};

template <Format F, bool kSaturate>
struct NarrowCodec {
  using Storage = std::uint8_t;
  static AMPSCOPE_INLINE_AVX2 void encode(const float* src, Storage* dst) {
    store8(dst, encode_narrow<F, kSaturate>(_mm256_loadu_ps(src)));
  }
  static AMPSCOPE_INLINE_AVX2 void decode(const Storage* src, float* dst) {
    _mm256_storeu_ps(dst, decode_narrow<F>(load8(src)));
  }
  static AMPSCOPE_INLINE_AVX2 __m256 round(__m256 x) { return round_narrow<F, kSaturate>(x); }
};

// ---- loops --------------------------------------------------------------------------------

constexpr std::size_t kLanes = 8;

template <class Codec>
AMPSCOPE_TARGET_AVX2 void encode_loop(const float* src, void* dst_bytes, std::size_t n) {
  using Storage = typename Codec::Storage;
  auto* dst = static_cast<Storage*>(dst_bytes);
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) Codec::encode(src + i, dst + i);
  if (i < n) {
    const std::size_t rest = n - i;
    float in[kLanes] = {};
    Storage out[kLanes];
    std::memcpy(in, src + i, rest * sizeof(float));
    Codec::encode(in, out);
    std::memcpy(dst + i, out, rest * sizeof(Storage));
  }
}

template <class Codec>
AMPSCOPE_TARGET_AVX2 void decode_loop(const void* src_bytes, float* dst, std::size_t n) {
  using Storage = typename Codec::Storage;
  const auto* src = static_cast<const Storage*>(src_bytes);
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) Codec::decode(src + i, dst + i);
  if (i < n) {
    const std::size_t rest = n - i;
    Storage in[kLanes] = {};
    float out[kLanes];
    std::memcpy(in, src + i, rest * sizeof(Storage));
    Codec::decode(in, out);
    std::memcpy(dst + i, out, rest * sizeof(float));
  }
}

template <class Codec>
AMPSCOPE_TARGET_AVX2 void round_loop(float* data, std::size_t n) {
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    _mm256_storeu_ps(data + i, Codec::round(_mm256_loadu_ps(data + i)));
  }
  if (i < n) {
    const std::size_t rest = n - i;
    float buf[kLanes] = {};
    std::memcpy(buf, data + i, rest * sizeof(float));
    _mm256_storeu_ps(buf, Codec::round(_mm256_loadu_ps(buf)));
    std::memcpy(data + i, buf, rest * sizeof(float));
  }
}

// Calls Op::template run<Codec>() for the codec of (f, mode).
template <template <class> class Op, typename... Args>
void with_codec(Format f, OverflowMode mode, Args... args) {
  const bool sat = mode == OverflowMode::kSaturating;
  switch (f) {
    case Format::kFP16:
      return sat ? Op<Fp16Codec<true>>::run(args...) : Op<Fp16Codec<false>>::run(args...);
    case Format::kBF16:
      return sat ? Op<Bf16Codec<true>>::run(args...) : Op<Bf16Codec<false>>::run(args...);
    case Format::kE4M3:
      return sat ? Op<NarrowCodec<Format::kE4M3, true>>::run(args...)
                 : Op<NarrowCodec<Format::kE4M3, false>>::run(args...);
    case Format::kE5M2:
      return sat ? Op<NarrowCodec<Format::kE5M2, true>>::run(args...)
                 : Op<NarrowCodec<Format::kE5M2, false>>::run(args...);
    case Format::kE2M1:
      return sat ? Op<NarrowCodec<Format::kE2M1, true>>::run(args...)
                 : Op<NarrowCodec<Format::kE2M1, false>>::run(args...);
    case Format::kE3M2:
      return sat ? Op<NarrowCodec<Format::kE3M2, true>>::run(args...)
                 : Op<NarrowCodec<Format::kE3M2, false>>::run(args...);
    case Format::kE2M3:
      return sat ? Op<NarrowCodec<Format::kE2M3, true>>::run(args...)
                 : Op<NarrowCodec<Format::kE2M3, false>>::run(args...);
    case Format::kFP32:
      break;
  }
}

template <class Codec>
struct EncodeOp {
  static void run(const float* src, void* dst, std::size_t n) { encode_loop<Codec>(src, dst, n); }
};
template <class Codec>
struct DecodeOp {
  static void run(const void* src, float* dst, std::size_t n) { decode_loop<Codec>(src, dst, n); }
};
template <class Codec>
struct RoundOp {
  static void run(float* data, std::size_t n) { round_loop<Codec>(data, n); }
};

}  // namespace

void convert_from_fp32_avx2(const float* src, void* dst, std::size_t n, Format dst_format,
                            OverflowMode mode) {
  const ScopedDefaultMxcsr mxcsr;
  with_codec<EncodeOp>(dst_format, mode, src, dst, n);
}

void convert_to_fp32_avx2(const void* src, float* dst, std::size_t n, Format src_format) {
  // Decoding does not depend on the overflow mode.
  with_codec<DecodeOp>(src_format, OverflowMode::kNonSaturating, src, dst, n);
}

void round_through_avx2(float* data, std::size_t n, Format f, OverflowMode mode) {
  const ScopedDefaultMxcsr mxcsr;
  with_codec<RoundOp>(f, mode, data, n);
}

}  // namespace ampscope::detail
