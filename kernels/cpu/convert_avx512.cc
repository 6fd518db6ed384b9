// AVX-512 bulk conversions, 16 lanes at a time, bit-identical to encode()/decode().
//
// The algorithms are those of convert_avx2.cc (read its opening comment), with mask registers
// for the per-lane selections:
// - FP16: vcvtps2ph with an explicit round-to-nearest-even immediate, and vcvtph2ps {sae};
//   like F16C they ignore MXCSR, keep FP16 subnormals and quiet signalling NaNs exactly as
//   encode()/decode() do.
// - BF16: integer round half to even on the bit pattern. vcvtneps2bf16 (AVX512_BF16) is not
//   used: it reads every FP32 subnormal input as zero, where encode() rounds it to the nearest
//   BF16 subnormal (0x007FFFFF must become 0x0080, the min normal). On every other input,
//   NaN quieting included, it agrees; tests/kernels/convert_test.cc checks both facts.
// - FP8: rebias-and-round for normals, the magic-number add for subnormals, under the default
//   MXCSR (ScopedDefaultMxcsr); decoding by rebias and an exact int -> float multiply;
//   round_through rounds in FP32 directly.
// Tails (n % 16) use masked loads and stores: nothing outside [0, n) is read or written.

// GCC 12 warns about the deliberately undefined pass-through operands inside its own AVX-512
// intrinsics (GCC bug 105593, fixed in GCC 13); the warnings point into the header.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include "convert_internal.h"

namespace ampscope::detail {
namespace {

AMPSCOPE_INLINE_AVX512 __m512i splat(std::uint32_t v) {
  return _mm512_set1_epi32(static_cast<int>(v));
}

// ---- FP16 ---------------------------------------------------------------------------------

template <bool kSaturate>
AMPSCOPE_INLINE_AVX512 __m256i encode_fp16(__m512 x) {
  __m256i h = _mm512_cvt_roundps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  if constexpr (kSaturate) {
    const __mmask16 is_inf = _mm256_cmpeq_epi16_mask(_mm256_and_si256(h, _mm256_set1_epi16(0x7FFF)),
                                                     _mm256_set1_epi16(0x7C00));
    h = _mm256_mask_sub_epi16(h, is_inf, h, _mm256_set1_epi16(1));  // 0x7BFF, sign kept
  }
  return h;
}

AMPSCOPE_INLINE_AVX512 __m512 decode_fp16(__m256i h) {
  return _mm512_cvt_roundph_ps(h, _MM_FROUND_NO_EXC);
}

// ---- BF16 ---------------------------------------------------------------------------------

// BF16 bits in the low half of each 32-bit lane.
template <bool kSaturate>
AMPSCOPE_INLINE_AVX512 __m512i encode_bf16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i top = _mm512_srli_epi32(u, 16);
  const __m512i lsb = _mm512_and_si512(top, splat(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, splat(0x7FFF)), lsb), 16);
  const __mmask16 is_nan =
      _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, splat(0x7FFFFFFF)), splat(0x7F800000));
  r = _mm512_mask_or_epi32(r, is_nan, top, splat(0x40));
  if constexpr (kSaturate) {
    const __mmask16 is_inf =
        _mm512_cmpeq_epi32_mask(_mm512_and_si512(r, splat(0x7FFF)), splat(0x7F80));
    r = _mm512_mask_sub_epi32(r, is_inf, r, splat(1));  // 0x7F7F, sign kept
  }
  return r;
}

// FP32 from BF16 bits in the low half of each lane; signalling NaNs come back quiet.
AMPSCOPE_INLINE_AVX512 __m512 decode_bf16(__m512i h) {
  const __m512i v = _mm512_slli_epi32(h, 16);
  const __mmask16 is_nan =
      _mm512_cmpgt_epi32_mask(_mm512_and_si512(v, splat(0x7FFFFFFF)), splat(0x7F800000));
  return _mm512_castsi512_ps(_mm512_mask_or_epi32(v, is_nan, v, splat(0x00400000)));
}

// ---- FP8 (format-generic) -----------------------------------------------------------------

// Codes (sign included) in the low bits of each 32-bit lane. Needs the default MXCSR.
template <Format F, bool kSaturate>
AMPSCOPE_INLINE_AVX512 __m512i encode_narrow(__m512 x) {
  constexpr NarrowCodes c = narrow_codes(F);
  constexpr int m = c.mantissa_bits;
  const __m512i u = _mm512_castps_si512(x);
  const __m512i a = _mm512_and_si512(u, splat(0x7FFFFFFF));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(a, 23 - m), splat(1));
  __m512i code = _mm512_srli_epi32(
      _mm512_add_epi32(_mm512_add_epi32(a, splat(c.rebias_and_half)), lsb), 23 - m);
  const __m512 magic = _mm512_castsi512_ps(splat(c.subnormal_magic));
  const __m512i subnormal = _mm512_sub_epi32(
      _mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(a), magic)), splat(c.subnormal_magic));
  const __mmask16 is_subnormal = _mm512_cmplt_epi32_mask(a, splat(c.min_normal_fp32));
  code = _mm512_mask_mov_epi32(code, is_subnormal, subnormal);
  const __mmask16 overflow = _mm512_cmpgt_epi32_mask(code, splat(c.max_finite_code));
  code =
      _mm512_mask_mov_epi32(code, overflow, splat(kSaturate ? c.max_finite_code : c.overflow_code));
  const __mmask16 is_nan = _mm512_cmpgt_epi32_mask(a, splat(0x7F800000));
  const __m512i nan = _mm512_or_si512(
      splat(c.nan_code), _mm512_and_si512(_mm512_srli_epi32(a, 23 - m), splat(c.payload_mask)));
  code = _mm512_mask_mov_epi32(code, is_nan, nan);
  const __m512i sign = _mm512_srli_epi32(_mm512_and_si512(u, splat(0x80000000)), 32 - c.total_bits);
  return _mm512_or_si512(code, sign);
}

// decode(encode(x)) without leaving FP32; see round_narrow in convert_avx2.cc.
template <Format F, bool kSaturate>
AMPSCOPE_INLINE_AVX512 __m512 round_narrow(__m512 x) {
  constexpr NarrowCodes c = narrow_codes(F);
  constexpr int m = c.mantissa_bits;
  const __m512i u = _mm512_castps_si512(x);
  const __m512i a = _mm512_and_si512(u, splat(0x7FFFFFFF));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(a, 23 - m), splat(1));
  __m512i r =
      _mm512_and_si512(_mm512_add_epi32(_mm512_add_epi32(a, splat((1u << (22 - m)) - 1)), lsb),
                       splat(~((1u << (23 - m)) - 1)));
  const __m512 magic = _mm512_castsi512_ps(splat(c.subnormal_magic));
  const __m512i subnormal =
      _mm512_castps_si512(_mm512_sub_ps(_mm512_add_ps(_mm512_castsi512_ps(a), magic), magic));
  r = _mm512_mask_mov_epi32(r, _mm512_cmplt_epi32_mask(a, splat(c.min_normal_fp32)), subnormal);
  r = _mm512_mask_mov_epi32(r, _mm512_cmpgt_epi32_mask(r, splat(c.max_finite_fp32)),
                            splat(kSaturate ? c.max_finite_fp32 : c.overflow_fp32));
  const __m512i nan =
      _mm512_or_si512(splat(c.nan_fp32), _mm512_and_si512(a, splat(c.payload_mask_fp32)));
  r = _mm512_mask_mov_epi32(r, _mm512_cmpgt_epi32_mask(a, splat(0x7F800000)), nan);
  return _mm512_castsi512_ps(_mm512_or_si512(r, _mm512_and_si512(u, splat(0x80000000))));
}

template <Format F>
AMPSCOPE_INLINE_AVX512 __m512 decode_narrow(__m512i b) {
  constexpr NarrowCodes c = narrow_codes(F);
  constexpr int m = c.mantissa_bits;
  const __m512i a = _mm512_and_si512(b, splat((1u << (c.total_bits - 1)) - 1));
  const __m512i frac = _mm512_and_si512(a, splat((1u << m) - 1));
  __m512i v = _mm512_add_epi32(_mm512_slli_epi32(a, 23 - m), splat((127u - c.bias) << 23));
  const __m512 scale =
      _mm512_castsi512_ps(splat(static_cast<std::uint32_t>(127 + c.min_normal_exponent - m) << 23));
  const __m512 subnormal = _mm512_mul_ps(_mm512_cvtepi32_ps(frac), scale);  // exact
  const __mmask16 is_subnormal = _mm512_cmplt_epi32_mask(a, splat(1u << m));
  v = _mm512_mask_mov_epi32(v, is_subnormal, _mm512_castps_si512(subnormal));
  const __mmask16 has_frac = _mm512_test_epi32_mask(frac, frac);
  __m512i special_value = _mm512_or_si512(splat(0x7F800000), _mm512_slli_epi32(frac, 23 - m));
  special_value = _mm512_mask_or_epi32(special_value, has_frac, special_value, splat(0x00400000));
  const __mmask16 is_special = _mm512_cmpge_epi32_mask(a, splat(c.special_min));
  v = _mm512_mask_mov_epi32(v, is_special, special_value);
  // The sign bit to bit 31; bits above the code (an FP6/FP4 byte's top) shift out.
  const __m512i sign = _mm512_and_si512(_mm512_slli_epi32(b, 32 - c.total_bits), splat(0x80000000));
  return _mm512_castsi512_ps(_mm512_or_si512(v, sign));
}

// ---- loads and stores of 16 lanes, full or masked -----------------------------------------

AMPSCOPE_INLINE_AVX512 __m512 load_fp32(const float* src, __mmask16 k, bool full) {
  return full ? _mm512_loadu_ps(src) : _mm512_maskz_loadu_ps(k, src);
}
AMPSCOPE_INLINE_AVX512 void store_fp32(float* dst, __m512 v, __mmask16 k, bool full) {
  if (full) {
    _mm512_storeu_ps(dst, v);
  } else {
    _mm512_mask_storeu_ps(dst, k, v);
  }
}
AMPSCOPE_INLINE_AVX512 __m512i load_codes(const std::uint8_t* src, __mmask16 k, bool full) {
  return _mm512_cvtepu8_epi32(full ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(src))
                                   : _mm_maskz_loadu_epi8(k, src));
}
AMPSCOPE_INLINE_AVX512 __m512i load_codes(const std::uint16_t* src, __mmask16 k, bool full) {
  return _mm512_cvtepu16_epi32(full ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src))
                                    : _mm256_maskz_loadu_epi16(k, src));
}
AMPSCOPE_INLINE_AVX512 __m256i load_halves(const std::uint16_t* src, __mmask16 k, bool full) {
  return full ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src))
              : _mm256_maskz_loadu_epi16(k, src);
}
AMPSCOPE_INLINE_AVX512 void store_codes(std::uint8_t* dst, __m512i codes, __mmask16 k, bool full) {
  if (full) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm512_cvtepi32_epi8(codes));
  } else {
    _mm512_mask_cvtepi32_storeu_epi8(dst, k, codes);
  }
}
AMPSCOPE_INLINE_AVX512 void store_codes(std::uint16_t* dst, __m512i codes, __mmask16 k, bool full) {
  if (full) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm512_cvtepi32_epi16(codes));
  } else {
    _mm512_mask_cvtepi32_storeu_epi16(dst, k, codes);
  }
}
AMPSCOPE_INLINE_AVX512 void store_halves(std::uint16_t* dst, __m256i h, __mmask16 k, bool full) {
  if (full) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), h);
  } else {
    _mm256_mask_storeu_epi16(dst, k, h);
  }
}

// ---- codecs: one per (format, overflow mode), 16 lanes per call ---------------------------

template <bool kSaturate>
struct Fp16Codec {
  using Storage = std::uint16_t;
  static AMPSCOPE_INLINE_AVX512 void encode(const float* src, Storage* dst, __mmask16 k,
                                            bool full) {
    store_halves(dst, encode_fp16<kSaturate>(load_fp32(src, k, full)), k, full);
  }
  static AMPSCOPE_INLINE_AVX512 void decode(const Storage* src, float* dst, __mmask16 k,
                                            bool full) {
    store_fp32(dst, decode_fp16(load_halves(src, k, full)), k, full);
  }
  static AMPSCOPE_INLINE_AVX512 __m512 round(__m512 x) {
    return decode_fp16(encode_fp16<kSaturate>(x));
  }
};

template <bool kSaturate>
struct Bf16Codec {
  using Storage = std::uint16_t;
  static AMPSCOPE_INLINE_AVX512 void encode(const float* src, Storage* dst, __mmask16 k,
                                            bool full) {
    store_codes(dst, encode_bf16<kSaturate>(load_fp32(src, k, full)), k, full);
  }
  static AMPSCOPE_INLINE_AVX512 void decode(const Storage* src, float* dst, __mmask16 k,
                                            bool full) {
    store_fp32(dst, decode_bf16(load_codes(src, k, full)), k, full);
  }
  // The encoded NaN is already quiet, so decoding is only the shift.
  static AMPSCOPE_INLINE_AVX512 __m512 round(__m512 x) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(encode_bf16<kSaturate>(x), 16));
  }
};

template <Format F, bool kSaturate>
struct NarrowCodec {
  using Storage = std::uint8_t;
  static AMPSCOPE_INLINE_AVX512 void encode(const float* src, Storage* dst, __mmask16 k,
                                            bool full) {
    store_codes(dst, encode_narrow<F, kSaturate>(load_fp32(src, k, full)), k, full);
  }
  static AMPSCOPE_INLINE_AVX512 void decode(const Storage* src, float* dst, __mmask16 k,
                                            bool full) {
    store_fp32(dst, decode_narrow<F>(load_codes(src, k, full)), k, full);
  }
  static AMPSCOPE_INLINE_AVX512 __m512 round(__m512 x) { return round_narrow<F, kSaturate>(x); }
};

// ---- loops --------------------------------------------------------------------------------

constexpr std::size_t kLanes = 16;

AMPSCOPE_INLINE_AVX512 __mmask16 tail_mask(std::size_t rest) {
  return static_cast<__mmask16>((1u << rest) - 1);
}

template <class Codec>
AMPSCOPE_TARGET_AVX512 void encode_loop(const float* src, void* dst_bytes, std::size_t n) {
  auto* dst = static_cast<typename Codec::Storage*>(dst_bytes);
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) Codec::encode(src + i, dst + i, 0xFFFF, true);
  if (i < n) Codec::encode(src + i, dst + i, tail_mask(n - i), false);
}

template <class Codec>
AMPSCOPE_TARGET_AVX512 void decode_loop(const void* src_bytes, float* dst, std::size_t n) {
  const auto* src = static_cast<const typename Codec::Storage*>(src_bytes);
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) Codec::decode(src + i, dst + i, 0xFFFF, true);
  if (i < n) Codec::decode(src + i, dst + i, tail_mask(n - i), false);
}

template <class Codec>
AMPSCOPE_TARGET_AVX512 void round_loop(float* data, std::size_t n) {
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    _mm512_storeu_ps(data + i, Codec::round(_mm512_loadu_ps(data + i)));
  }
  if (i < n) {
    const __mmask16 k = tail_mask(n - i);
    _mm512_mask_storeu_ps(data + i, k, Codec::round(_mm512_maskz_loadu_ps(k, data + i)));
  }
}

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

void convert_from_fp32_avx512(const float* src, void* dst, std::size_t n, Format dst_format,
                              OverflowMode mode) {
  const ScopedDefaultMxcsr mxcsr;
  with_codec<EncodeOp>(dst_format, mode, src, dst, n);
}

void convert_to_fp32_avx512(const void* src, float* dst, std::size_t n, Format src_format) {
  with_codec<DecodeOp>(src_format, OverflowMode::kNonSaturating, src, dst, n);
}

void round_through_avx512(float* data, std::size_t n, Format f, OverflowMode mode) {
  const ScopedDefaultMxcsr mxcsr;
  with_codec<RoundOp>(f, mode, data, n);
}

}  // namespace ampscope::detail
