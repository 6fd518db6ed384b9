// Causal multi-head self-attention on packed qkv (B,T,3C) = [q | k | v], NH heads of hs = C/NH:
//   scores (B,NH,T,T) = q k^T / sqrt(hs), entries past the diagonal 0;
//   probs  (B,NH,T,T) = row softmax of the scores over keys 0..i (0 past the diagonal);
//   out    (B,T,C)    = probs v, the heads side by side.
//
// Contract (Backend, trainer/include/ampscope/trainer/backend.h):
//   attention_forward(out, scores, probs, qkv, n_head, compute, softmax, faults)
//   attention_backward(dqkv (B,T,3C) overwritten, dout (B,T,C), qkv, probs, n_head, compute,
//                      softmax)
// Precision: the two products run in `compute` (operands rounded to it, FP32 accumulation); the
// scores are stored in compute and the softmax reads them from there; the softmax (and its
// backward) is computed in FP32 and rounded to `softmax`, the probabilities stored in their
// dtype; the second product reads them rounded to compute. Faults (fault injection) land in the
// scores before the softmax reads them and in the probabilities before the product reads them.
//
// Where the code lives:
//   attention.h             this contract and the CPU entry points
//   attention_reference.cc  plain loops from the definition (FP64 sums, FP32 only): the oracle
//   attention_cpu.cc        the tuned version (sgemm per head, vector exponentials, heads on
//                           the workers)
//   attention.cu            the CUDA version on cuBLASLt (declared in attention_cuda.h)
#pragma once

#include <cstdint>

#include "ampscope/formats.h"
#include "ampscope/trainer/backend.h"
#include "layers/cpu_exec.h"

namespace ampscope::trainer::layers {

// FP32 arrays in the shapes above; C divisible by NH and the faults' indices checked by the
// caller.
void attention_forward_cpu(const CpuExec& ex, float* out, float* scores, float* probs,
                           const float* qkv, std::int64_t B, std::int64_t T, std::int64_t C,
                           std::int64_t NH, Format compute, Format softmax,
                           const AttentionFaults& faults);
void attention_backward_cpu(const CpuExec& ex, float* dqkv, const float* dout, const float* qkv,
                            const float* probs, std::int64_t B, std::int64_t T, std::int64_t C,
                            std::int64_t NH, Format compute, Format softmax);

// FP32 throughout, no faults.
void attention_forward_reference(float* out, float* scores, float* probs, const float* qkv,
                                 std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH);
void attention_backward_reference(float* dqkv, const float* dout, const float* qkv,
                                  const float* probs, std::int64_t B, std::int64_t T,
                                  std::int64_t C, std::int64_t NH);

}  // namespace ampscope::trainer::layers
