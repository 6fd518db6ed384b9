// Causal attention on the device: the launchers of attention.cu. The contract (shapes, precision,
// what accumulates) is attention.h's; ampscope/cuda/nn.h has what every trainer kernel shares
// (arrays, device errors, streams and scratch).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ampscope/cuda/cublaslt.h"
#include "ampscope/cuda/nn.h"
#include "ampscope/formats.h"

namespace ampscope::cuda::nn {

// Causal attention on qkv (B,T,3C) packed [q|k|v]: scores (B,NH,T,T) = q k^T / sqrt(C/NH)
// (masked entries 0), probs (B,NH,T,T) = softmax(scores) in `softmax` stored in probs.dtype,
// out (B,T,C) = probs v. The products run in `compute`.
void attention_forward(CublasLt& blas, Array out, Array scores, Array probs, ConstArray qkv,
                       std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH,
                       Format compute, Format softmax, cudaStream_t stream);
// dqkv (B,T,3C) overwritten; dout (B,T,C); probs as written by attention_forward.
void attention_backward(CublasLt& blas, Array dqkv, ConstArray dout, ConstArray qkv,
                        ConstArray probs, std::int64_t B, std::int64_t T, std::int64_t C,
                        std::int64_t NH, Format compute, Format softmax, cudaStream_t stream);

}  // namespace ampscope::cuda::nn
