// GELU, tanh approximation (GPT-2): gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
//
// Contract (Backend, trainer/include/ampscope/trainer/backend.h):
//   gelu_forward(out, inp, compute)          out (n) = gelu(inp (n))
//   gelu_backward(dinp, dout, inp, compute)  dinp (n) = gelu'(inp) * dout, overwritten
// Precision: inputs rounded to compute, FP32 arithmetic, tanh through one exponential
// (tanh(u) = 1 - 2 / (e^2u + 1), u clamped at 40), results rounded to compute. The CPU vector
// version and the CUDA element functions (gelu_element.cuh) are the same expression.
//
// Where the code lives:
//   gelu.h             this contract and the CPU entry points
//   gelu_reference.cc  plain scalar version from the definition (std::tanh): the tests' oracle
//   gelu_cpu.cc        the vector kernels per SIMD level and the parallel loop
//   gelu_element.cuh   the element functions the CUDA kernels run (also compiled for the host)
//   gelu.cu            the CUDA kernels and launchers (declared in gelu_cuda.h)
#pragma once

#include <cstddef>

#include "layers/cpu_exec.h"

namespace ampscope::trainer::layers {

// FP32 arrays of n elements.
void gelu_forward_cpu(const CpuExec& ex, const float* inp, float* out, std::size_t n);
void gelu_backward_cpu(const CpuExec& ex, const float* inp, const float* dout, float* dinp,
                       std::size_t n);

void gelu_forward_reference(const float* inp, float* out, std::size_t n);
void gelu_backward_reference(const float* inp, const float* dout, float* dinp, std::size_t n);

}  // namespace ampscope::trainer::layers
