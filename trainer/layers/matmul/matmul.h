// The linear layer: out (N,OC) = inp (N,C) x weight (OC,C)^T + bias (OC).
//
// Contract (Backend, trainer/include/ampscope/trainer/backend.h):
//   matmul_forward(out (N,OC), inp (N,C), weight (OC,C), bias (OC, optional), compute)
//   matmul_backward(dinp (N,C), dweight (OC,C), dbias (OC), dout (N,OC), inp, weight, compute)
//     dinp = dout x weight, overwritten (optional); dweight += dout^T x inp and dbias += the
//     column sums of dout (optional), each call's contribution rounded to compute before the
//     add.
// Precision: operands rounded to compute, products accumulated in FP32 (what tensor cores do:
// OpenBLAS sgemm on the CPU, cuBLASLt with FP32 accumulation on the device), the bias added in
// FP32, results rounded to compute. Summation order is the BLAS library's: results agree across
// back ends within the FP32 tolerance of a dot product, not bit for bit.
//
// FP8/FP4 emulation (backend.h: quantized_matmul_forward/backward): an operand with a recipe is
// replaced by its quantised -> dequantised copy (ampscope/recipe.h's fake_quantize over the
// operand's row-major view, blocks as the recipe says), then the same FP32-accumulating GEMM
// runs. The bias and the bias gradient are not quantised. The reference of these is
// fake_quantize followed by the plain reference (the tests build it).
//
// Where the code lives:
//   matmul.h             this contract and the CPU entry points
//   matmul_reference.cc  plain triple loops from the definition (FP64 sums): the tests' oracle
//   matmul_cpu.cc        the tuned version (OpenBLAS sgemm, vector bias adds and column sums)
//   matmul.cu            the cuBLASLt version and its epilogues (declared in matmul_cuda.h);
//   gemm.cuh             the operand/epilogue/cuBLASLt plumbing it shares with attention
#pragma once

#include <cstddef>

#include "ampscope/recipe.h"
#include "layers/cpu_exec.h"

namespace ampscope::trainer::layers {

// FP32 arrays. bias may be null.
void matmul_forward_cpu(const CpuExec& ex, float* out, const float* inp, const float* weight,
                        const float* bias, std::size_t N, std::size_t C, std::size_t OC);
// dinp (null: skipped) = dout x weight; dweight = dout^T x inp; dbias (null: skipped) = column
// sums of dout. The back end adds dweight and dbias into the accumulating outputs.
void matmul_backward_cpu(const CpuExec& ex, float* dinp, float* dweight, float* dbias,
                         const float* dout, const float* inp, const float* weight, std::size_t N,
                         std::size_t C, std::size_t OC);

// One operand's recipe; recipe null: used as read. counts (optional) receives fake_quantize's.
struct OperandRecipe {
  const Recipe* recipe = nullptr;
  RecipeCounts* counts = nullptr;
};
// Forward with inp (N,C) and weight (OC,C) quantised along C.
void matmul_forward_quantized_cpu(const CpuExec& ex, float* out, const float* inp,
                                  const float* weight, const float* bias, std::size_t N,
                                  std::size_t C, std::size_t OC, OperandRecipe q_inp,
                                  OperandRecipe q_weight);
// dinp (null: skipped) = Q(dout) x Q(weight); dweight = Q'(dout)^T x Q(inp); dbias (null:
// skipped) = column sums of dout as read. dout under two equal recipes is quantised once.
struct BackwardRecipes {
  OperandRecipe dgrad_dout, dgrad_weight, wgrad_dout, wgrad_inp;
};
void matmul_backward_quantized_cpu(const CpuExec& ex, float* dinp, float* dweight, float* dbias,
                                   const float* dout, const float* inp, const float* weight,
                                   std::size_t N, std::size_t C, std::size_t OC,
                                   const BackwardRecipes& q);

void matmul_forward_reference(float* out, const float* inp, const float* weight, const float* bias,
                              std::size_t N, std::size_t C, std::size_t OC);
void matmul_backward_reference(float* dinp, float* dweight, float* dbias, const float* dout,
                               const float* inp, const float* weight, std::size_t N, std::size_t C,
                               std::size_t OC);

}  // namespace ampscope::trainer::layers
