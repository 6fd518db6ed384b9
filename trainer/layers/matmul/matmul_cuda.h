// The linear layer on the device: the launchers of matmul.cu. The contract (shapes, precision, what
// accumulates) is matmul.h's; ampscope/cuda/nn.h has what every trainer kernel shares (arrays,
// device errors, streams and scratch).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ampscope/cuda/cublaslt.h"
#include "ampscope/cuda/nn.h"
#include "ampscope/formats.h"

namespace ampscope::cuda::nn {

// out (N,OC) = inp (N,C) x weight (OC,C)^T + bias (OC; bias.data null: none).
void linear_forward(CublasLt& blas, Array out, ConstArray inp, ConstArray weight, ConstArray bias,
                    std::int64_t N, std::int64_t C, std::int64_t OC, Format compute,
                    cudaStream_t stream);
// dinp (N,C) overwritten (data null: skipped); dweight (OC,C) and dbias (OC; data null:
// skipped) accumulate. dout (N,OC).
void linear_backward(CublasLt& blas, Array dinp, Array dweight, Array dbias, ConstArray dout,
                     ConstArray inp, ConstArray weight, std::int64_t N, std::int64_t C,
                     std::int64_t OC, Format compute, cudaStream_t stream);

}  // namespace ampscope::cuda::nn
