// Conversions between FP32 and the narrow formats on the device: the CUDA versions of the bulk
// conversions in ampscope/convert.h, with the same rounding (to nearest, ties to even) and the
// same OverflowMode semantics, computed by the hardware conversion instructions.
//
// Differences from the CPU reference (encode()/decode()), all about NaN bit patterns, never
// about NaN-ness or any other value:
//   - FP32 -> FP16/BF16/E4M3/E5M2: a NaN input becomes the conversion's canonical NaN, which
//     drops the sign and the payload (0x7FFF, 0x7FFF, 0x7F, 0x7F in the toolkit's definition of
//     the intrinsics); the reference keeps the sign and the top payload bits (0x7E00 | payload
//     for a quiet FP16 NaN, S.1111.111 for E4M3).
//   - BF16 -> FP32 widens by a shift: sign and payload are kept, but a signalling NaN stays
//     signalling; the reference quiets it (sets FP32 fraction bit 22).
//   - FP16/E4M3/E5M2 -> FP32 go through the hardware half conversion: a NaN stays a NaN, with
//     a sign and payload that the instruction defines and the reference may not match.
// Tests therefore compare NaN results by isnan only and every other result bit for bit.
// FP6/FP4 (E2M1, E3M2, E2M3) have no NaN or Inf code and match the reference bit for bit: a NaN
// input, an Inf and an overflow become +-max finite, the sign kept, in both modes.
// Inf and overflow follow the reference exactly: non-saturating gives +-Inf (NaN for E4M3),
// saturating (__NV_SATFINITE for FP8, an explicit clamp for FP16/BF16) gives +-max finite for
// overflowing values and for +-Inf inputs alike.
//
// Pointers are device-accessible (device, managed or mapped pinned memory) and may have any
// alignment; aligned buffers take the vectorised path. src and dst must not overlap.
// The launchers enqueue work on `stream` and return without synchronising anything; the
// buffers must stay valid until that work has run (stream order, as for any kernel launch).
// Errors: ampscope::Error on a violated precondition or a failed launch.
// Thread safety: the launchers are re-entrant.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "ampscope/convert.h"
#include "ampscope/formats.h"

namespace ampscope::cuda {

// dst holds n elements of dst_format's storage (uint16_t for FP16/BF16, uint8_t for FP8, FP6 and
// FP4, one unpacked code per byte; float for FP32: then this is a device-to-device copy).
void convert_from_fp32(const float* src, void* dst, std::size_t n, Format dst_format,
                       OverflowMode mode, cudaStream_t stream);

// src holds n elements of src_format's storage.
void convert_to_fp32(const void* src, float* dst, std::size_t n, Format src_format,
                     cudaStream_t stream);

}  // namespace ampscope::cuda
