// The embedding on the device: the launchers of embedding.cu. The contract (shapes, precision, what
// accumulates) is embedding.h's; ampscope/cuda/nn.h has what every trainer kernel shares (arrays,
// device errors, streams and scratch).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ampscope/cuda/nn.h"
#include "ampscope/formats.h"

namespace ampscope::cuda::nn {

// out (B,T,C) = wte[tokens] + wpe[t] in out.dtype; wte (V,C), wpe (>= T rows, C); tokens (B,T).
// A token outside [0, V) is reported in *error and its row is NaN.
void embedding_forward(Array out, const std::int32_t* tokens, ConstArray wte, ConstArray wpe,
                       std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t V,
                       DeviceError* error, cudaStream_t stream);
// dwte (V,C), dwpe (max_t,C): accumulate, each row's contribution summed in token order (the
// CPU order, so the result is bit-exact). dout (B,T,C).
void embedding_backward(Array dwte, Array dwpe, ConstArray dout, const std::int32_t* tokens,
                        std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t V,
                        std::int64_t max_t, cudaStream_t stream);

}  // namespace ampscope::cuda::nn
