// Token and position embedding: out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:].
//
// Contract (Backend, trainer/include/ampscope/trainer/backend.h):
//   embedding_forward(out (B,T,C), tokens (B,T), wte (V,C), wpe (maxT,C))
//     computed in out.dtype (the sum of two table entries rounded once); a token outside
//     [0, V) is an error (the CPU throws; the CUDA kernel reports it and writes a NaN row).
//   embedding_backward(dwte (V,C), dwpe (maxT,C), dout (B,T,C), tokens)
//     both accumulate; the rows of one token (or one position) add up in token order, on the
//     CPU and on the device alike, so the result is bit-exact across back ends.
// Precision: FP32 arithmetic; each table's contribution is rounded once to the table's dtype.
//
// Where the code lives:
//   embedding.h             this contract and the CPU entry points
//   embedding_reference.cc  plain scalar version from the definition: the tests' oracle
//   embedding_cpu.cc        the tuned version (vector row adds, rows in parallel)
//   embedding.cu            the CUDA kernels and launchers (declared in embedding_cuda.h)
#pragma once

#include <cstddef>
#include <cstdint>

#include "layers/cpu_exec.h"

namespace ampscope::trainer::layers {

// FP32 arrays; tokens already checked to lie in [0, V).
void embedding_forward_cpu(const CpuExec& ex, float* out, const std::int32_t* tokens,
                           const float* wte, const float* wpe, std::size_t B, std::size_t T,
                           std::size_t C);
// dwte, dwpe accumulate this call's sums (they start from what they hold).
void embedding_backward_cpu(const CpuExec& ex, float* dwte, float* dwpe, const float* dout,
                            const std::int32_t* tokens, std::size_t B, std::size_t T,
                            std::size_t C);

void embedding_forward_reference(float* out, const std::int32_t* tokens, const float* wte,
                                 const float* wpe, std::size_t B, std::size_t T, std::size_t C);
void embedding_backward_reference(float* dwte, float* dwpe, const float* dout,
                                  const std::int32_t* tokens, std::size_t B, std::size_t T,
                                  std::size_t C);

}  // namespace ampscope::trainer::layers
