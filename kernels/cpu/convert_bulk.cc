// Bulk conversions: run-time dispatch between the scalar reference loop and the vectorised
// paths (convert_avx2.cc, convert_avx512.cc). The requested level is clamped to what the CPU
// has, so tests can ask for each level and get the best one available at or below it.
// FP32 -> FP32 is a copy at every level.
#include <cstring>

#include "ampscope/check.h"
#include "ampscope/convert.h"
#include "convert_internal.h"

namespace ampscope {
namespace {

void check_buffers(const void* src, const void* dst, std::size_t n) {
  AMPSCOPE_CHECK(n == 0 || (src != nullptr && dst != nullptr), "expected non-null buffers for ", n,
                 " elements, found src=", src, " dst=", dst);
}

// The scalar loops read and write through memcpy: convert.h lets src and dst be unaligned.
void encode_scalar(const float* src, void* dst, std::size_t n, Format f, OverflowMode mode) {
  const auto* in = reinterpret_cast<const unsigned char*>(src);
  auto* out = static_cast<unsigned char*>(dst);
  for (std::size_t i = 0; i < n; ++i) {
    float x;
    std::memcpy(&x, in + i * sizeof(float), sizeof(float));
    if (storage_bytes(f) == 2) {
      const auto code = static_cast<std::uint16_t>(encode(x, f, mode));
      std::memcpy(out + 2 * i, &code, 2);
    } else {
      out[i] = static_cast<std::uint8_t>(encode(x, f, mode));
    }
  }
}

void decode_scalar(const void* src, float* dst, std::size_t n, Format f) {
  const auto* in = static_cast<const unsigned char*>(src);
  auto* out = reinterpret_cast<unsigned char*>(dst);
  for (std::size_t i = 0; i < n; ++i) {
    float x;
    if (storage_bytes(f) == 2) {
      std::uint16_t code;
      std::memcpy(&code, in + 2 * i, 2);
      x = decode(code, f);
    } else {
      x = decode(in[i], f);
    }
    std::memcpy(out + i * sizeof(float), &x, sizeof(float));
  }
}

}  // namespace

void convert_from_fp32(const float* src, void* dst, std::size_t n, Format dst_format,
                       OverflowMode mode, SimdLevel level) {
  check_buffers(src, dst, n);
  if (n == 0) return;
  if (dst_format == Format::kFP32) {
    if (dst != src) std::memmove(dst, src, n * sizeof(float));
    return;
  }
  switch (clamp_simd_level(level)) {
    case SimdLevel::kAvx512:
      return detail::convert_from_fp32_avx512(src, dst, n, dst_format, mode);
    case SimdLevel::kAvx2:
      return detail::convert_from_fp32_avx2(src, dst, n, dst_format, mode);
    case SimdLevel::kScalar:
      break;
  }
  encode_scalar(src, dst, n, dst_format, mode);
}

void convert_from_fp32(const float* src, void* dst, std::size_t n, Format dst_format,
                       OverflowMode mode) {
  convert_from_fp32(src, dst, n, dst_format, mode, active_simd_level());
}

void convert_to_fp32(const void* src, float* dst, std::size_t n, Format src_format,
                     SimdLevel level) {
  check_buffers(src, dst, n);
  if (n == 0) return;
  if (src_format == Format::kFP32) {
    if (dst != src) std::memmove(dst, src, n * sizeof(float));
    return;
  }
  switch (clamp_simd_level(level)) {
    case SimdLevel::kAvx512:
      return detail::convert_to_fp32_avx512(src, dst, n, src_format);
    case SimdLevel::kAvx2:
      return detail::convert_to_fp32_avx2(src, dst, n, src_format);
    case SimdLevel::kScalar:
      break;
  }
  decode_scalar(src, dst, n, src_format);
}

void convert_to_fp32(const void* src, float* dst, std::size_t n, Format src_format) {
  convert_to_fp32(src, dst, n, src_format, active_simd_level());
}

void detail::round_through_at_level(float* data, std::size_t n, Format f, OverflowMode mode,
                                    SimdLevel level) {
  check_buffers(data, data, n);
  if (n == 0 || f == Format::kFP32) return;
  switch (clamp_simd_level(level)) {
    case SimdLevel::kAvx512:
      return detail::round_through_avx512(data, n, f, mode);
    case SimdLevel::kAvx2:
      return detail::round_through_avx2(data, n, f, mode);
    case SimdLevel::kScalar:
      break;
  }
  for (std::size_t i = 0; i < n; ++i) data[i] = round_to(data[i], f, mode);
}

void round_through(float* data, std::size_t n, Format f, OverflowMode mode) {
  detail::round_through_at_level(data, n, f, mode, active_simd_level());
}

}  // namespace ampscope
