// Softmax cross-entropy over the vocabulary:
//   probs[n,:] = softmax(logits[n,:]),  losses[n] = log(sum_j e^logits[n,j]) - logits[n,t_n],
//   dlogits[n,j] = (probs[n,j] - [j == t_n]) * dloss.
//
// Contract (Backend, trainer/include/ampscope/trainer/backend.h):
//   cross_entropy_forward(losses (B,T), probs (B,T,V), logits (B,T,V), targets (B,T), compute)
//   cross_entropy_backward(dlogits (B,T,V) overwritten, probs, targets, dloss, compute)
//     probs are read in FP32 (a 16-bit probs tensor is widened exactly).
// Precision: logits rounded to compute; max, exponentials (shifted by the row max, so no
// overflow) and their sum in FP32; probabilities and losses rounded to compute. A target
// outside [0, V) is an error (the CPU throws; the CUDA kernel reports it and writes a NaN
// loss).
//
// Where the code lives:
//   cross_entropy.h             this contract and the CPU entry points
//   cross_entropy_reference.cc  plain loops from the definition (FP64): the tests' oracle
//   cross_entropy_cpu.cc        the tuned version (vector exponentials, rows on the workers)
//   cross_entropy.cu            the CUDA kernels and launchers (declared in cross_entropy_cuda.h)
#pragma once

#include <cstddef>
#include <cstdint>

#include "layers/cpu_exec.h"

namespace ampscope::trainer::layers {

// FP32 arrays: losses (N), probs and logits (N,V); targets checked to lie in [0, V).
void cross_entropy_forward_cpu(const CpuExec& ex, float* losses, float* probs, const float* logits,
                               const std::int32_t* targets, std::size_t N, std::size_t V);
void cross_entropy_backward_cpu(const CpuExec& ex, float* dlogits, const float* probs,
                                const std::int32_t* targets, float dloss, std::size_t N,
                                std::size_t V);

void cross_entropy_forward_reference(float* losses, float* probs, const float* logits,
                                     const std::int32_t* targets, std::size_t N, std::size_t V);
void cross_entropy_backward_reference(float* dlogits, const float* probs,
                                      const std::int32_t* targets, float dloss, std::size_t N,
                                      std::size_t V);

}  // namespace ampscope::trainer::layers
