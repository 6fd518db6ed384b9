// The built-in trainer's layers on the device: the CUDA versions of the operations of the
// trainer's Backend interface (trainer/include/ampscope/trainer/backend.h). Their CPU reference
// is the trainer's CPU back end, which implements the same operations with the same arguments;
// tests/trainer/cuda compares the two operation by operation.
//
// Precision contract (the one backend.h states, applied element by element):
//   - inputs are read from their storage format and rounded to `compute`;
//   - arithmetic and accumulation are FP32 (matmuls: cuBLASLt, FP32 accumulate);
//   - results are rounded to `compute`, then stored in the output's format (round to nearest
//     even, overflow to Inf); outputs documented as "accumulate" get
//     out = store(out + round(contribution)), the sum formed in FP32.
// Element functions are compiled without FMA contraction, so elementwise results equal the CPU
// back end's bit for bit; reductions (row sums, matmuls) differ only by summation order.
//
// Arrays are device memory in FP32 or FP16/BF16 bit patterns, any element-aligned address.
// Shapes are written next to the arrays, row-major; B batch, T time, C channels, V vocabulary,
// NH heads. Every launcher enqueues on `stream` and returns without synchronising; scratch it
// needs comes from the stream-ordered allocator (cudaMallocAsync) on the same stream.
// Errors: ampscope::Error on a violated precondition or a failed launch. Bad data found on the
// device (a token outside the vocabulary) cannot throw: it is recorded in a DeviceError, which
// the caller reads at its next synchronisation.
// Thread safety: launchers are re-entrant; a CublasLt is used by one stream at a time.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "ampscope/cuda/cublaslt.h"
#include "ampscope/formats.h"

namespace ampscope::cuda::nn {

// A device array and its storage format (kFP32, kFP16 or kBF16).
struct ConstArray {
  const void* data = nullptr;
  Format dtype = Format::kFP32;
};
struct Array {
  void* data = nullptr;
  Format dtype = Format::kFP32;
  operator ConstArray() const { return {data, dtype}; }  // NOLINT: a view may always be read
};

// Written by kernels that meet bad data; the first report wins. Lives in device memory, zeroed
// by its owner; code 0 means nothing was reported.
struct DeviceError {
  int code;
  int index;  // the element (token position, row)
  int value;  // what was found
  int limit;  // the bound it broke
};
inline constexpr int kTokenOutOfRange = 1;
inline constexpr int kTargetOutOfRange = 2;
// One line for an error that was reported ("token 70 at position 3 outside the vocabulary of
// 65"); empty when code is 0.
std::string describe(const DeviceError& error);

// ---- Elementwise ---------------------------------------------------------------------------
// t (n) = value.
void fill(Array t, std::int64_t n, float value, cudaStream_t stream);
// dst (n) = src (n) in dst.dtype.
void convert(Array dst, ConstArray src, std::int64_t n, cudaStream_t stream);
// out (n) = a (n) + b (n).
void add(Array out, ConstArray a, ConstArray b, std::int64_t n, Format compute,
         cudaStream_t stream);
// t[index] = value.
void set_element(Array t, std::int64_t index, float value, cudaStream_t stream);
// GELU, tanh approximation: out (n) = gelu(inp (n)); dinp (n) = gelu'(inp) * dout.
void gelu_forward(Array out, ConstArray inp, std::int64_t n, Format compute, cudaStream_t stream);
void gelu_backward(Array dinp, ConstArray dout, ConstArray inp, std::int64_t n, Format compute,
                   cudaStream_t stream);

// ---- Layers --------------------------------------------------------------------------------
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
// out (N,C); mean, rstd (N) FP32; weight, bias (C). eps 1e-5.
void layernorm_forward(Array out, float* mean, float* rstd, ConstArray inp, ConstArray weight,
                       ConstArray bias, std::int64_t N, std::int64_t C, Format compute,
                       cudaStream_t stream);
// dinp (N,C), dweight, dbias (C): accumulate.
void layernorm_backward(Array dinp, Array dweight, Array dbias, ConstArray dout, ConstArray inp,
                        ConstArray weight, const float* mean, const float* rstd, std::int64_t N,
                        std::int64_t C, Format compute, cudaStream_t stream);
// out (N,OC) = inp (N,C) x weight (OC,C)^T + bias (OC; bias.data null: none).
void linear_forward(CublasLt& blas, Array out, ConstArray inp, ConstArray weight, ConstArray bias,
                    std::int64_t N, std::int64_t C, std::int64_t OC, Format compute,
                    cudaStream_t stream);
// dinp (N,C) overwritten (data null: skipped); dweight (OC,C) and dbias (OC; data null:
// skipped) accumulate. dout (N,OC).
void linear_backward(CublasLt& blas, Array dinp, Array dweight, Array dbias, ConstArray dout,
                     ConstArray inp, ConstArray weight, std::int64_t N, std::int64_t C,
                     std::int64_t OC, Format compute, cudaStream_t stream);
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
