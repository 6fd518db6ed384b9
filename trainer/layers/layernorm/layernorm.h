// LayerNorm over the last dimension, eps 1e-5:
//   out[r,c] = (x[r,c] - mean[r]) * rstd[r] * weight[c] + bias[c],
//   mean[r] = sum_c x[r,c] / C,  rstd[r] = 1 / sqrt(sum_c (x[r,c] - mean[r])^2 / C + eps).
//
// Contract (Backend, trainer/include/ampscope/trainer/backend.h):
//   layernorm_forward(out (N,C), mean (N), rstd (N), inp (N,C), weight (C), bias (C), compute)
//     mean and rstd are FP32 whatever the compute format (the backward pass reads them).
//   layernorm_backward(dinp (N,C), dweight (C), dbias (C), dout (N,C), inp, weight, mean, rstd,
//                      compute)
//     all three gradients accumulate: with dnorm = weight * dout and norm = (x - mean) * rstd,
//     dinp += (dnorm - mean_c(dnorm) - norm * mean_c(dnorm * norm)) * rstd,
//     dweight += sum_r norm * dout, dbias += sum_r dout.
// Precision: inputs rounded to compute; the row statistics, sums and results in FP32 (two
// passes for the variance, no E[x^2] - E[x]^2 cancellation); results rounded to compute.
// Summation order: the CPU sums a row per vector lane and combines lanes in order, and sums
// dweight/dbias per rows_per_task rows, combined in task order; the CUDA version sums a row by
// warp butterflies and the columns in chunks of 32 rows. Both are deterministic.
//
// Where the code lives:
//   layernorm.h             this contract and the CPU entry points
//   layernorm_reference.cc  plain scalar version from the definition: the tests' oracle
//   layernorm_cpu.cc        the vector kernels per SIMD level and the parallel loops
//   layernorm.cu            the CUDA kernels and launchers (declared in layernorm_cuda.h)
#pragma once

#include <cstddef>

#include "layers/cpu_exec.h"

namespace ampscope::trainer::layers {

inline constexpr float kLayerNormEps = 1e-5f;

// FP32 arrays; x, out (N,C); weight, bias (C); mean, rstd (N).
void layernorm_forward_cpu(const CpuExec& ex, const float* x, const float* weight,
                           const float* bias, float* out, float* mean, float* rstd, std::size_t N,
                           std::size_t C);
// dinp (N,C), dweight, dbias (C) accumulate (dweight and dbias receive this call's row sums in
// one add each).
void layernorm_backward_cpu(const CpuExec& ex, const float* x, const float* weight,
                            const float* dout, const float* mean, const float* rstd, float* dinp,
                            float* dweight, float* dbias, std::size_t N, std::size_t C);

void layernorm_forward_reference(const float* x, const float* weight, const float* bias, float* out,
                                 float* mean, float* rstd, std::size_t N, std::size_t C);
void layernorm_backward_reference(const float* x, const float* weight, const float* dout,
                                  const float* mean, const float* rstd, float* dinp, float* dweight,
                                  float* dbias, std::size_t N, std::size_t C);

}  // namespace ampscope::trainer::layers
