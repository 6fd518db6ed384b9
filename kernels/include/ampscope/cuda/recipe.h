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

#include "ampscope/recipe.h"

namespace ampscope::cuda {

// x and out device memory (out may alias x; out null: counts only). Throws ampscope::Error on a
// recipe fake_quantize refuses (same message), on a pointer the device cannot read, or on a
// failed launch or copy.
void fake_quantize(const float* x, float* out, std::size_t rows, std::size_t cols,
                   const Recipe& recipe, RecipeCounts* counts, cudaStream_t stream);

}  // namespace ampscope::cuda
