// GELU on the device: the launchers of gelu.cu. The contract (shapes, precision, what
// accumulates) is gelu.h's; ampscope/cuda/nn.h has what every trainer kernel shares (arrays,
// device errors, streams and scratch).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ampscope/cuda/nn.h"
#include "ampscope/formats.h"

namespace ampscope::cuda::nn {

// GELU, tanh approximation: out (n) = gelu(inp (n)); dinp (n) = gelu'(inp) * dout.
void gelu_forward(Array out, ConstArray inp, std::int64_t n, Format compute, cudaStream_t stream);
void gelu_backward(Array dinp, ConstArray dout, ConstArray inp, std::int64_t n, Format compute,
                   cudaStream_t stream);

}  // namespace ampscope::cuda::nn
