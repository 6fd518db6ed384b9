// Softmax cross-entropy on the device: the launchers of cross_entropy.cu. The contract (shapes,
// precision, what accumulates) is cross_entropy.h's; ampscope/cuda/nn.h has what every trainer
// kernel shares (arrays, device errors, streams and scratch).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ampscope/cuda/nn.h"
#include "ampscope/formats.h"

namespace ampscope::cuda::nn {

// losses (N), probs (N,V) = softmax(logits (N,V)); targets (N). A target outside [0, V) is
// reported in *error and its loss is NaN.
void cross_entropy_forward(Array losses, Array probs, ConstArray logits,
                           const std::int32_t* targets, std::int64_t N, std::int64_t V,
                           Format compute, DeviceError* error, cudaStream_t stream);
// dlogits (N,V) = (probs - onehot(targets)) * dloss, overwritten; probs read in FP32.
void cross_entropy_backward(Array dlogits, ConstArray probs, const std::int32_t* targets,
                            std::int64_t N, std::int64_t V, float dloss, Format compute,
                            cudaStream_t stream);

}  // namespace ampscope::cuda::nn
