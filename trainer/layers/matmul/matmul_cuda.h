// The linear layer on the device: the launchers of matmul.cu. The contract (shapes, precision, what
// accumulates) is matmul.h's; ampscope/cuda/nn.h has what every trainer kernel shares (arrays,
// device errors, streams and scratch).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ampscope/cuda/cublaslt.h"
#include "ampscope/cuda/nn.h"
#include "ampscope/formats.h"
#include "layers/matmul/matmul.h"  // OperandRecipe, BackwardRecipes

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

// FP8/FP4 emulation (matmul.h): the CPU's quantised versions, operand for operand. Every operand
// is read and rounded to `compute` into an FP32 copy; an operand with a recipe is then replaced
// by ampscope/cuda/recipe.h's fake_quantize of that copy (bit for bit the CPU's), and cuBLASLt
// multiplies the FP32 copies (strict FP32, no TF32: a dequantised value q x scale needs FP32's
// precision). A recipe with `counts` waits for the stream to bring its counts back.
// real_fp8_allowed: where both operands of a GEMM have per-tensor FP8 recipes
// (cuda::has_fp8_codes), the device has FP8 GEMMs (compute capability 8.9+) and every dimension
// is a multiple of 16, the GEMM runs in FP8 instead: the operands' codes and decode scales
// (cuda::quantize_codes, the same rounding and counts) through cuBLASLt's FP8 GEMM with FP32
// accumulation. Its result equals the emulation's up to the FP32 sums' order (the emulation sums
// q_a d_a x q_b d_b, the FP8 GEMM d_a d_b x sum q_a q_b).
void linear_forward_quantized(CublasLt& blas, Array out, ConstArray inp, ConstArray weight,
                              ConstArray bias, std::int64_t N, std::int64_t C, std::int64_t OC,
                              Format compute, ::ampscope::trainer::layers::OperandRecipe q_inp,
                              ::ampscope::trainer::layers::OperandRecipe q_weight,
                              bool real_fp8_allowed, cudaStream_t stream);
// dinp = Q(dout) x Q(weight) (dinp.data null: skipped); dweight += Q'(dout)^T x Q(inp); dbias
// += column sums of dout as read. dout under two equal recipes is quantised once.
void linear_backward_quantized(CublasLt& blas, Array dinp, Array dweight, Array dbias,
                               ConstArray dout, ConstArray inp, ConstArray weight, std::int64_t N,
                               std::int64_t C, std::int64_t OC, Format compute,
                               const ::ampscope::trainer::layers::BackwardRecipes& q,
                               bool real_fp8_allowed, cudaStream_t stream);

// What `recipe` counts on a GEMM operand x (rows, cols) read and rounded to `compute`, the
// counts linear_*_quantized would give it, without a GEMM (Backend::gemm_operand_counts). Waits
// for the stream.
RecipeCounts operand_recipe_counts(ConstArray x, std::int64_t rows, std::int64_t cols,
                                   Format compute, const Recipe& recipe, cudaStream_t stream);

}  // namespace ampscope::cuda::nn
