// LayerNorm on the device: the launchers of layernorm.cu. The contract (shapes, precision, what
// accumulates) is layernorm.h's; ampscope/cuda/nn.h has what every trainer kernel shares (arrays,
// device errors, streams and scratch).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ampscope/cuda/nn.h"
#include "ampscope/formats.h"

namespace ampscope::cuda::nn {

// out (N,C); mean, rstd (N) FP32; weight, bias (C). eps 1e-5.
void layernorm_forward(Array out, float* mean, float* rstd, ConstArray inp, ConstArray weight,
                       ConstArray bias, std::int64_t N, std::int64_t C, Format compute,
                       cudaStream_t stream);
// dinp (N,C), dweight, dbias (C): accumulate.
void layernorm_backward(Array dinp, Array dweight, Array dbias, ConstArray dout, ConstArray inp,
                        ConstArray weight, const float* mean, const float* rstd, std::int64_t N,
                        std::int64_t C, Format compute, cudaStream_t stream);

}  // namespace ampscope::cuda::nn
