// One-element conversions between FP32 and the narrow formats, written with the toolkit's
// conversion intrinsics. __host__ __device__ so that the host-side test can run them through
// the toolkit's host definitions of the same intrinsics on a machine without a GPU; on the
// device they compile to cvt instructions (FP8 non-saturating: the toolkit's integer code).
//
// What the intrinsics do, and where that differs from encode()/decode() (convert.h):
//   __float2half_rn, __float2bfloat16_rn: round to nearest even; overflow -> +-Inf; NaN ->
//     the canonical NaN 0x7FFF (sign and payload dropped; the reference keeps both). They have
//     no saturating form here, so kSaturating clamps an Inf result to +-max finite: a result is
//     Inf exactly when the input was Inf or rounded above max finite, which is the reference's
//     saturation rule.
//   __nv_cvt_float_to_fp8(x, __NV_SATFINITE, ...): |x| rounding above max finite and +-Inf
//     become +-max finite (448, 57344), as the reference's kSaturating does. NaN -> 0x7F for
//     both formats (sign dropped; E5M2 payload set to all ones).
//   __nv_cvt_float_to_fp8(x, __NV_NOSAT, ...): overflow and +-Inf -> +-Inf for E5M2 and
//     S.1111.111 (NaN) for E4M3, as the reference does. NaN as above.
//   __half2float, __bfloat162float, __nv_cvt_fp8_to_halfraw: exact for every non-NaN pattern.
//     BF16 widening is a shift (a signalling NaN stays signalling; the reference quiets it);
//     the FP8 path returns the canonical half NaN (sign dropped; the reference keeps it).
//   __nv_cvt_float_to_fp6 / __nv_cvt_float_to_fp4 (cudaRoundNearest): round to nearest even and
//     always saturate (+-max for overflow and +-Inf), which is the reference's rule for these
//     formats in both modes. A NaN input becomes +max (sign dropped); the reference keeps the
//     sign (S.max), so NaN is mapped here explicitly and the element code matches bit for bit.
//   __nv_cvt_fp6_to_halfraw / __nv_cvt_fp4_to_halfraw: exact (every FP6/FP4 value is an FP16
//     value); the code is masked to its low 6 / 4 bits first, as decode() reads it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp4.h>
#include <cuda_fp6.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "ampscope/convert.h"
#include "ampscope/formats.h"

namespace ampscope::cuda::detail {

// Storage of one element of a narrow format.
template <Format F>
using NarrowStorage =
    std::conditional_t<F == Format::kFP16 || F == Format::kBF16, std::uint16_t, std::uint8_t>;

__host__ __device__ inline std::uint16_t saturate_inf(std::uint16_t bits, std::uint16_t inf,
                                                      std::uint16_t max_finite) {
  const std::uint16_t sign = bits & 0x8000u;
  return (bits & 0x7FFFu) == inf ? static_cast<std::uint16_t>(sign | max_finite) : bits;
}

template <Format F>
inline constexpr bool kIsMxElement = F == Format::kE2M1 || F == Format::kE3M2 || F == Format::kE2M3;
// Their widths (format_info is host-only constexpr); checked against formats.h below.
template <Format F>
inline constexpr int kMxElementBits = F == Format::kE2M1 ? 4 : 6;
static_assert(kMxElementBits<Format::kE2M1> == format_info(Format::kE2M1).total_bits &&
              kMxElementBits<Format::kE3M2> == format_info(Format::kE3M2).total_bits &&
              kMxElementBits<Format::kE2M3> == format_info(Format::kE2M3).total_bits);

// The toolkit's FP6/FP4 kinds, and the sign bit and max code of each (formats.h: no Inf, no
// NaN, so max finite is the all-ones magnitude).
template <Format F>
__host__ __device__ inline std::uint8_t mx_element_from_fp32(float x) {
  constexpr int kBits = kMxElementBits<F>;
  constexpr std::uint8_t kSign = 1u << (kBits - 1);
  constexpr std::uint8_t kMax = kSign - 1;
  if (x != x) return (signbit(x) ? kSign : 0) | kMax;  // NaN: S.max, as the reference
  if constexpr (F == Format::kE2M1) {
    return __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest);
  } else {
    constexpr __nv_fp6_interpretation_t kKind = F == Format::kE3M2 ? __NV_E3M2 : __NV_E2M3;
    return __nv_cvt_float_to_fp6(x, kKind, cudaRoundNearest);
  }
}

template <Format F>
__host__ __device__ inline float mx_element_to_fp32(std::uint8_t bits) {
  constexpr std::uint8_t kSignBit = 1u << (kMxElementBits<F> - 1);
  constexpr std::uint8_t kMask = kSignBit | (kSignBit - 1);
  if constexpr (F == Format::kE2M1) {
    return __half2float(__half(__nv_cvt_fp4_to_halfraw(bits & kMask, __NV_E2M1)));
  } else {
    constexpr __nv_fp6_interpretation_t kKind = F == Format::kE3M2 ? __NV_E3M2 : __NV_E2M3;
    return __half2float(__half(__nv_cvt_fp6_to_halfraw(bits & kMask, kKind)));
  }
}

template <Format F>
__host__ __device__ inline NarrowStorage<F> narrow_from_fp32(float x, OverflowMode mode) {
  const bool saturate = mode == OverflowMode::kSaturating;
  if constexpr (F == Format::kFP16) {
    const std::uint16_t bits = __half_as_ushort(__float2half_rn(x));
    return saturate ? saturate_inf(bits, 0x7C00u, 0x7BFFu) : bits;
  } else if constexpr (F == Format::kBF16) {
    const std::uint16_t bits = __bfloat16_as_ushort(__float2bfloat16_rn(x));
    return saturate ? saturate_inf(bits, 0x7F80u, 0x7F7Fu) : bits;
  } else if constexpr (kIsMxElement<F>) {
    return mx_element_from_fp32<F>(x);  // saturating in both modes: no Inf or NaN code
  } else {
    static_assert(F == Format::kE4M3 || F == Format::kE5M2, "not a narrow format");
    constexpr __nv_fp8_interpretation_t kKind = F == Format::kE4M3 ? __NV_E4M3 : __NV_E5M2;
    return __nv_cvt_float_to_fp8(x, saturate ? __NV_SATFINITE : __NV_NOSAT, kKind);
  }
}

template <Format F>
__host__ __device__ inline float narrow_to_fp32(NarrowStorage<F> bits) {
  if constexpr (F == Format::kFP16) {
    return __half2float(__ushort_as_half(bits));
  } else if constexpr (F == Format::kBF16) {
    return __bfloat162float(__ushort_as_bfloat16(bits));
  } else if constexpr (kIsMxElement<F>) {
    return mx_element_to_fp32<F>(bits);
  } else {
    static_assert(F == Format::kE4M3 || F == Format::kE5M2, "not a narrow format");
    constexpr __nv_fp8_interpretation_t kKind = F == Format::kE4M3 ? __NV_E4M3 : __NV_E5M2;
    // Every FP8 value is an FP16 value, so both steps are exact.
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(bits, kKind)));
  }
}

}  // namespace ampscope::cuda::detail
