// The elementwise group: fill, convert, residual add, set_element on the Backend interface, and
// the vector kernels every layer and the optimizer share (add, scale, the shifted exponential of
// the softmaxes, column sums, the unscale check, the sum of squares, AdamW).
//
// Contract (Backend, trainer/include/ampscope/trainer/backend.h):
//   fill(t, value)                t (n) = value stored in t.dtype
//   convert(dst, src)             dst (n) = src (n) rounded into dst.dtype
//   add(out, a, b, compute)       out (n) = a + b, inputs rounded to compute, FP32 sum
//   set_element(t, i, value)      t[i] = value stored in t.dtype (fault injection)
// Precision: one FP32 operation per element, so every back end and level gives the same bits
// for add and scale; exp_shifted is Cephes expf (~1 ulp), AdamW follows PyTorch's formula term
// for term, sum_squares accumulates in FP64.
//
// Where the code lives:
//   elementwise.h            this contract, the CPU kernel table and the references
//   elementwise_reference.cc plain scalar loops, written from the definitions (the tests' oracle)
//   elementwise_cpu.cc       the vector kernels, compiled per SIMD level (../vector.h)
//   elementwise.cu           the CUDA kernels (declared in elementwise_cuda.h)
#pragma once

#include <cstddef>

#include "ampscope/cpu_features.h"

namespace ampscope::trainer::layers {

struct AdamWScalars {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, bc1, bc2, decay, lr, eps;
};

// One SIMD level's vector kernels on FP32 arrays (any alignment; out may alias an input).
struct ElementwiseKernels {
  // out = a + b
  void (*add)(const float* a, const float* b, float* out, std::size_t n);
  // out = x * factor
  void (*scale)(const float* x, float factor, float* out, std::size_t n);
  // out = x * factor; returns whether any x is NaN or Inf
  bool (*scale_and_check)(const float* x, float factor, float* out, std::size_t n);
  // sum of x^2 in FP64
  double (*sum_squares)(const float* x, std::size_t n);
  // acc[j] += sum over rows of x[r * cols + j], rows in order
  void (*add_column_sums)(const float* x, std::size_t rows, std::size_t cols, float* acc);
  // out = e^((x - shift1) - shift2), Cephes expf; 0 below -87.34, NaN stays NaN
  void (*exp_shifted)(const float* x, float shift1, float shift2, float* out, std::size_t n);
  // PyTorch's AdamW update of p, m, v (outputs po, mo, vo) from gradient g
  void (*adamw)(const float* g, const float* p, const float* m, const float* v, float* po,
                float* mo, float* vo, std::size_t n, const AdamWScalars& s);
};

const ElementwiseKernels& elementwise_kernels(SimdLevel level);

// The references, same signatures.
void add_reference(const float* a, const float* b, float* out, std::size_t n);
void scale_reference(const float* x, float factor, float* out, std::size_t n);
bool scale_and_check_reference(const float* x, float factor, float* out, std::size_t n);
double sum_squares_reference(const float* x, std::size_t n);
void add_column_sums_reference(const float* x, std::size_t rows, std::size_t cols, float* acc);
void exp_shifted_reference(const float* x, float shift1, float shift2, float* out, std::size_t n);
void adamw_reference(const float* g, const float* p, const float* m, const float* v, float* po,
                     float* mo, float* vo, std::size_t n, const AdamWScalars& s);

}  // namespace ampscope::trainer::layers
