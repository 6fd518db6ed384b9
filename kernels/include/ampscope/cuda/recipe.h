// The scaled recipes on the device: the CUDA version of fake_quantize (ampscope/recipe.h), same
// contract and same RecipeCounts, for a row-major [rows, cols] FP32 tensor in device memory. The
// trainer's CUDA back end quantises its GEMM operands with it (FP8/FP4 emulation).
//
// Exactness: the dequantised values equal the CPU's fake_quantize bit for bit, and so do every
// count, the block counts, the block-scale histogram, amax and tensor_scale. signal_sq and
// error_sq are sums of the same FP64 terms in another (and run-to-run varying) order: equal
// within a relative 1e-12 or so, not bit for bit.
//
// Stream-ordered: the kernels (a finite-amax pass first for the recipes that need the tensor's
// amax: current, delayed, nvfp4; then the quantisation pass) are enqueued on `stream`. Without
// `counts` the call returns at once; with it, the call waits for `stream` and returns the
// counts (the device accumulators are copied back in that wait).
// Thread safety: re-entrant; x and out must stay valid until the work has run on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "ampscope/recipe.h"

namespace ampscope::cuda {

// x and out device memory (out may alias x; out null: counts only). Throws ampscope::Error on a
// recipe fake_quantize refuses (same message), on a pointer the device cannot read, or on a
// failed launch or copy.
void fake_quantize(const float* x, float* out, std::size_t rows, std::size_t cols,
                   const Recipe& recipe, RecipeCounts* counts, cudaStream_t stream);

// True for the recipes quantize_codes takes: per-tensor scaling (current, delayed) with an E4M3
// or E5M2 element, the operands of a real FP8 GEMM.
bool has_fp8_codes(const Recipe& recipe);

// fake_quantize of a per-tensor FP8 recipe (has_fp8_codes), written as what a real FP8 GEMM
// reads instead of dequantised values: `codes` (rows x cols bytes, row-major; cols x rows, the
// transpose, when `transposed`) the elements q as E4M3/E5M2 bits, and *decode (one device
// float) fl32(1 / s). So q x decode is fake_quantize's dequantised value bit for bit, and the
// counts are fake_quantize's. A non-finite input is stored as that format's conversion without
// saturation gives it (E5M2: +-Inf or NaN; E4M3: NaN). Stream-ordered as fake_quantize; throws
// ampscope::Error as it does, and on a recipe without codes.
void quantize_codes(const float* x, std::uint8_t* codes, float* decode, std::size_t rows,
                    std::size_t cols, bool transposed, const Recipe& recipe, RecipeCounts* counts,
                    cudaStream_t stream);

}  // namespace ampscope::cuda
