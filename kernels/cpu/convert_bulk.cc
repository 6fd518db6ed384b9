// Bulk conversions: run-time dispatch between the scalar reference loop and the vectorised
// paths (convert_avx2.cc, convert_avx512.cc).
#include <cstring>

#include "ampscope/check.h"
#include "ampscope/convert.h"

namespace ampscope {

void convert_from_fp32(const float* src, void* dst, std::size_t n, Format dst_format,
                       OverflowMode mode, SimdLevel /*level*/) {
  if (dst_format == Format::kFP32) {
    if (dst != src) std::memmove(dst, src, n * sizeof(float));
    return;
  }
  if (storage_bytes(dst_format) == 2) {
    auto* out = static_cast<std::uint16_t*>(dst);
    for (std::size_t i = 0; i < n; ++i) {
      out[i] = static_cast<std::uint16_t>(encode(src[i], dst_format, mode));
    }
  } else {
    auto* out = static_cast<std::uint8_t*>(dst);
    for (std::size_t i = 0; i < n; ++i) {
      out[i] = static_cast<std::uint8_t>(encode(src[i], dst_format, mode));
    }
  }
}

void convert_from_fp32(const float* src, void* dst, std::size_t n, Format dst_format,
                       OverflowMode mode) {
  convert_from_fp32(src, dst, n, dst_format, mode, active_simd_level());
}

void convert_to_fp32(const void* src, float* dst, std::size_t n, Format src_format,
                     SimdLevel /*level*/) {
  if (src_format == Format::kFP32) {
    if (dst != src) std::memmove(dst, src, n * sizeof(float));
    return;
  }
  if (storage_bytes(src_format) == 2) {
    const auto* in = static_cast<const std::uint16_t*>(src);
    for (std::size_t i = 0; i < n; ++i) dst[i] = decode(in[i], src_format);
  } else {
    const auto* in = static_cast<const std::uint8_t*>(src);
    for (std::size_t i = 0; i < n; ++i) dst[i] = decode(in[i], src_format);
  }
}

void convert_to_fp32(const void* src, float* dst, std::size_t n, Format src_format) {
  convert_to_fp32(src, dst, n, src_format, active_simd_level());
}

void round_through(float* data, std::size_t n, Format f, OverflowMode mode) {
  if (f == Format::kFP32) return;
  for (std::size_t i = 0; i < n; ++i) data[i] = round_to(data[i], f, mode);
}

}  // namespace ampscope
