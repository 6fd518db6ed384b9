// The elementwise group on the device: the launchers of elementwise.cu. The contract (shapes,
// precision, what accumulates) is elementwise.h's; ampscope/cuda/nn.h has what every trainer kernel
// shares (arrays, device errors, streams and scratch).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ampscope/cuda/nn.h"
#include "ampscope/formats.h"

namespace ampscope::cuda::nn {

// t (n) = value.
void fill(Array t, std::int64_t n, float value, cudaStream_t stream);
// dst (n) = src (n) in dst.dtype.
void convert(Array dst, ConstArray src, std::int64_t n, cudaStream_t stream);
// out (n) = a (n) + b (n).
void add(Array out, ConstArray a, ConstArray b, std::int64_t n, Format compute,
         cudaStream_t stream);
// t[index] = value.
void set_element(Array t, std::int64_t index, float value, cudaStream_t stream);

}  // namespace ampscope::cuda::nn
