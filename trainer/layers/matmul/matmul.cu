// The linear layer on the device (matmul.h has the contract; launchers in matmul_cuda.h), on
// cuBLASLt through gemm.cuh's three steps. Backward: dinp = dout W, dW += dout^T x, and
// dbias += column sums of dout in two deterministic stages (nn_columns.cuh).
// The FP8/FP4 versions give each GEMM FP32 operands: the input rounded to compute, then
// quantised -> dequantised in place by the device fake_quantize (ampscope/cuda/recipe.h); or,
// with real FP8 allowed and per-tensor FP8 recipes on both operands, the same quantisation
// written as FP8 codes and decode scales (quantize_codes) and cuBLASLt's FP8 GEMM, whose TN
// layout takes the backward's operands as transposed codes.
#include <cstdint>
#include <memory>
#include <string>

#include "ampscope/cuda/recipe.h"
#include "gemm.cuh"
#include "layers/matmul/matmul_cuda.h"
#include "nn_columns.cuh"
#include "nn_common.cuh"
#include "nn_element.cuh"

namespace ampscope::cuda::nn {

using ::ampscope::trainer::layers::OperandRecipe;

namespace detail {
namespace {

// Partial column sums of dout (N,OC), rounded to compute: partial (chunks, OC).
__global__ void bias_columns_kernel(float* partial, ConstArray dout, std::int64_t N,
                                    std::int64_t OC, Format compute) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= OC) return;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.y) * kRowsPerChunk;
  const std::int64_t last = first + kRowsPerChunk < N ? first + kRowsPerChunk : N;
  float acc = 0.0f;
  for (std::int64_t row = first; row < last; ++row) {
    acc += input(dout.data, dout.dtype, row * OC + c, compute);
  }
  partial[blockIdx.y * OC + c] = acc;
}

// The launchers' preconditions; `what` names the launcher in the messages.
void check_forward(ConstArray out, ConstArray inp, ConstArray weight, ConstArray bias,
                   std::int64_t N, std::int64_t C, std::int64_t OC, Format compute,
                   const std::string& what) {
  AMPSCOPE_CHECK(N >= 0 && C >= 1 && OC >= 1, what, ": bad shape N=", N, " C=", C, " OC=", OC);
  check_compute(compute, what.c_str());
  check_array(out, N * OC, (what + ": out").c_str());
  check_array(inp, N * C, (what + ": inp").c_str());
  check_array(weight, OC * C, (what + ": weight").c_str());
  if (bias.data != nullptr) check_array(bias, OC, (what + ": bias").c_str());
}

void check_backward(ConstArray dinp, ConstArray dweight, ConstArray dbias, ConstArray dout,
                    ConstArray inp, ConstArray weight, std::int64_t N, std::int64_t C,
                    std::int64_t OC, Format compute, const std::string& what) {
  AMPSCOPE_CHECK(N >= 0 && C >= 1 && OC >= 1, what, ": bad shape N=", N, " C=", C, " OC=", OC);
  check_compute(compute, what.c_str());
  if (dinp.data != nullptr) check_array(dinp, N * C, (what + ": dinp").c_str());
  check_array(dweight, OC * C, (what + ": dweight").c_str());
  if (dbias.data != nullptr) check_array(dbias, OC, (what + ": dbias").c_str());
  check_array(dout, N * OC, (what + ": dout").c_str());
  check_array(inp, N * C, (what + ": inp").c_str());
  check_array(weight, OC * C, (what + ": weight").c_str());
  AMPSCOPE_CHECK(row_chunks(N) <= 65535, what, ": ", N, " rows exceed the grid");
}

// dbias (OC) += column sums of dout (N,OC) as read, rounded to compute.
void bias_gradient(Array dbias, ConstArray dout, std::int64_t N, std::int64_t OC, Format compute,
                   cudaStream_t stream) {
  StreamScratch partial(bytes_of(static_cast<std::int64_t>(row_chunks(N)) * OC, Format::kFP32),
                        stream);
  if (N > 0) {
    bias_columns_kernel<<<column_partial_grid(N, OC), kColumnThreads, 0, stream>>>(
        partial.as<float>(), dout, N, OC, compute);
    check_launch();
  }
  finish_columns(dbias, partial.as<float>(), N, OC, compute, stream);
}

// dst (n) = src read and rounded to compute, as FP32 (the CPU back end's In).
__global__ void rounded_fp32_kernel(float* dst, ConstArray src, std::int64_t n, Format compute) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) {
    dst[i] = input(src.data, src.dtype, i, compute);
  }
}

// An operand (rows, cols) as the quantised GEMMs read it: an FP32 copy of the input rounded to
// compute, replaced by its fake_quantize'd values when it has a recipe (the CPU's Quantized).
class QuantizedOperand {
 public:
  QuantizedOperand(ConstArray x, std::int64_t rows, std::int64_t cols, Format compute,
                   OperandRecipe q, cudaStream_t stream)
      : copy_(bytes_of(rows * cols, Format::kFP32), stream) {
    const std::int64_t n = rows * cols;
    if (n > 0) {
      rounded_fp32_kernel<<<elementwise_blocks(n), kThreadsPerBlock, 0, stream>>>(get(), x, n,
                                                                                  compute);
      check_launch();
    }
    if (q.recipe != nullptr) {
      ::ampscope::cuda::fake_quantize(get(), get(), static_cast<std::size_t>(rows),
                                      static_cast<std::size_t>(cols), *q.recipe, q.counts, stream);
    }
  }
  float* get() const { return copy_.as<float>(); }

 private:
  StreamScratch copy_;
};

// An operand (rows, cols) as a real FP8 GEMM reads it: QuantizedOperand's FP32 copy rounded to
// compute, then quantize_codes' codes (rows x cols, or the transpose) and decode scale, with the
// counts fake_quantize would give.
class Fp8Operand {
 public:
  Fp8Operand(ConstArray x, std::int64_t rows, std::int64_t cols, Format compute, OperandRecipe q,
             bool transposed, cudaStream_t stream)
      : codes_(static_cast<std::size_t>(rows * cols), stream),
        decode_(sizeof(float), stream),
        element_(q.recipe->element) {
    const std::int64_t n = rows * cols;
    const StreamScratch copy(bytes_of(n, Format::kFP32), stream);
    if (n > 0) {
      rounded_fp32_kernel<<<elementwise_blocks(n), kThreadsPerBlock, 0, stream>>>(
          copy.as<float>(), x, n, compute);
      check_launch();
    }
    ::ampscope::cuda::quantize_codes(copy.as<float>(), codes_.as<std::uint8_t>(),
                                     decode_.as<float>(), static_cast<std::size_t>(rows),
                                     static_cast<std::size_t>(cols), transposed, *q.recipe,
                                     q.counts, stream);
  }
  const std::uint8_t* codes() const { return codes_.as<std::uint8_t>(); }
  const float* decode() const { return decode_.as<float>(); }
  Format element() const { return element_; }

 private:
  StreamScratch codes_, decode_;
  Format element_;
};

// Whether a product c (m,n) = a (m,k) b (k,n) of these operands runs as a real FP8 GEMM: allowed,
// both recipes per-tensor FP8 (not both E5M2), a device that has FP8 GEMMs and a shape cuBLASLt
// takes.
bool real_fp8(bool allowed, OperandRecipe a, OperandRecipe b, std::int64_t m, std::int64_t n,
              std::int64_t k) {
  return allowed && a.recipe != nullptr && b.recipe != nullptr &&
         ::ampscope::cuda::has_fp8_codes(*a.recipe) &&
         ::ampscope::cuda::has_fp8_codes(*b.recipe) &&
         (a.recipe->element == Format::kE4M3 || b.recipe->element == Format::kE4M3) &&
         CublasLt::fp8_shape_allowed(m, n, k) && CublasLt::fp8_supported();
}

// c (m,n) = a (m,k) x b^T, b stored (n,k): the FP8 GEMM of two Fp8Operands (TN), FP32 result.
void fp8_gemm(CublasLt& blas, float* c, const Fp8Operand& a, const Fp8Operand& b, std::int64_t m,
              std::int64_t n, std::int64_t k, cudaStream_t stream) {
  GemmArgs g = gemm_args(a.element(), m, n, k);
  g.operand_b = b.element();
  g.a_scale = a.decode();
  g.b_scale = b.decode();
  set_a(g, a.codes(), false, k, 0);
  set_b(g, b.codes(), true, k, 0);
  set_c(g, c, n, 0);
  blas.gemm(g, stream);
}

}  // namespace
}  // namespace detail

void linear_forward(CublasLt& blas, Array out, ConstArray inp, ConstArray weight, ConstArray bias,
                    std::int64_t N, std::int64_t C, std::int64_t OC, Format compute,
                    cudaStream_t stream) {
  using namespace detail;
  const NvtxRange range{"ampscope::cuda::nn::linear_forward"};
  check_forward(out, inp, weight, bias, N, C, OC, compute, "linear_forward");
  if (N == 0) return;
  Operand x(inp, N * C, compute, stream), w(weight, OC * C, compute, stream);
  StreamScratch acc(bytes_of(N * OC, Format::kFP32), stream);
  GemmArgs g = gemm_args(compute, N, OC, C);
  set_a(g, x.get(), false, C, 0);
  set_b(g, w.get(), true, C, 0);
  set_c(g, acc.as<float>(), OC, 0);
  blas.gemm(g, stream);
  epilogue(out, acc.as<float>(), bias, N, OC, compute, false, stream);
}

void linear_backward(CublasLt& blas, Array dinp, Array dweight, Array dbias, ConstArray dout,
                     ConstArray inp, ConstArray weight, std::int64_t N, std::int64_t C,
                     std::int64_t OC, Format compute, cudaStream_t stream) {
  using namespace detail;
  const NvtxRange range{"ampscope::cuda::nn::linear_backward"};
  check_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC, compute, "linear_backward");
  Operand d(dout, N * OC, compute, stream);
  if (dinp.data != nullptr && N > 0) {
    // dinp (N,C) = dout (N,OC) x weight (OC,C).
    Operand w(weight, OC * C, compute, stream);
    StreamScratch acc(bytes_of(N * C, Format::kFP32), stream);
    GemmArgs g = gemm_args(compute, N, C, OC);
    set_a(g, d.get(), false, OC, 0);
    set_b(g, w.get(), false, C, 0);
    set_c(g, acc.as<float>(), C, 0);
    blas.gemm(g, stream);
    epilogue(dinp, acc.as<float>(), ConstArray{}, N, C, compute, false, stream);
  }
  {
    // dweight (OC,C) += dout^T (OC,N) x inp (N,C).
    Operand x(inp, N * C, compute, stream);
    StreamScratch acc(bytes_of(OC * C, Format::kFP32), stream);
    GemmArgs g = gemm_args(compute, OC, C, N);
    set_a(g, d.get(), true, OC, 0);
    set_b(g, x.get(), false, C, 0);
    set_c(g, acc.as<float>(), C, 0);
    blas.gemm(g, stream);
    epilogue(dweight, acc.as<float>(), ConstArray{}, OC, C, compute, true, stream);
  }
  if (dbias.data != nullptr) bias_gradient(dbias, dout, N, OC, compute, stream);
}

void linear_forward_quantized(CublasLt& blas, Array out, ConstArray inp, ConstArray weight,
                              ConstArray bias, std::int64_t N, std::int64_t C, std::int64_t OC,
                              Format compute, OperandRecipe q_inp, OperandRecipe q_weight,
                              bool real_fp8_allowed, cudaStream_t stream) {
  using namespace detail;
  const NvtxRange range{"ampscope::cuda::nn::linear_forward_quantized"};
  check_forward(out, inp, weight, bias, N, C, OC, compute, "linear_forward_quantized");
  if (real_fp8(real_fp8_allowed, q_inp, q_weight, N, OC, C)) {
    // out (N,OC) = x (N,C) x w^T, w stored (OC,C): TN as stored.
    const Fp8Operand x(inp, N, C, compute, q_inp, false, stream);
    const Fp8Operand w(weight, OC, C, compute, q_weight, false, stream);
    StreamScratch acc(bytes_of(N * OC, Format::kFP32), stream);
    fp8_gemm(blas, acc.as<float>(), x, w, N, OC, C, stream);
    epilogue(out, acc.as<float>(), bias, N, OC, compute, false, stream);
    return;
  }
  const QuantizedOperand x(inp, N, C, compute, q_inp, stream);
  const QuantizedOperand w(weight, OC, C, compute, q_weight, stream);
  if (N == 0) return;
  StreamScratch acc(bytes_of(N * OC, Format::kFP32), stream);
  GemmArgs g = gemm_args(Format::kFP32, N, OC, C);
  set_a(g, x.get(), false, C, 0);
  set_b(g, w.get(), true, C, 0);
  set_c(g, acc.as<float>(), OC, 0);
  blas.gemm(g, stream);
  epilogue(out, acc.as<float>(), bias, N, OC, compute, false, stream);
}

void linear_backward_quantized(CublasLt& blas, Array dinp, Array dweight, Array dbias,
                               ConstArray dout, ConstArray inp, ConstArray weight, std::int64_t N,
                               std::int64_t C, std::int64_t OC, Format compute,
                               const ::ampscope::trainer::layers::BackwardRecipes& q,
                               bool real_fp8_allowed, cudaStream_t stream) {
  using namespace detail;
  const NvtxRange range{"ampscope::cuda::nn::linear_backward_quantized"};
  check_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC, compute,
                 "linear_backward_quantized");
  // matmul_backward_quantized_cpu's operand logic, step for step: dout under two equal recipes
  // is quantised once and its counts go to whoever asked.
  const bool same_dout = q.dgrad_dout.recipe != nullptr && q.wgrad_dout.recipe != nullptr &&
                         *q.dgrad_dout.recipe == *q.wgrad_dout.recipe;
  OperandRecipe first = q.dgrad_dout;
  if (same_dout && first.counts == nullptr) first.counts = q.wgrad_dout.counts;
  if (real_fp8(real_fp8_allowed, q.wgrad_dout, q.wgrad_inp, OC, C, N) &&
      (dinp.data == nullptr || real_fp8(true, q.dgrad_dout, q.dgrad_weight, N, C, OC))) {
    // The TN layout: dinp (N,C) = d (N,OC) x (w^T stored (C,OC))^T; dweight (OC,C) = (d^T
    // stored (OC,N)) x (x^T stored (C,N))^T. dout's two code layouts come from one recipe when
    // the two are equal, its counts reported once.
    if (dinp.data != nullptr) {
      const Fp8Operand d(dout, N, OC, compute, first, false, stream);
      const Fp8Operand w(weight, OC, C, compute, q.dgrad_weight, true, stream);
      StreamScratch acc(bytes_of(N * C, Format::kFP32), stream);
      fp8_gemm(blas, acc.as<float>(), d, w, N, C, OC, stream);
      epilogue(dinp, acc.as<float>(), ConstArray{}, N, C, compute, false, stream);
    }
    OperandRecipe wq = q.wgrad_dout;
    if (same_dout) wq = OperandRecipe{first.recipe, dinp.data == nullptr ? first.counts : nullptr};
    const Fp8Operand dt(dout, N, OC, compute, wq, true, stream);
    if (same_dout && q.wgrad_dout.counts != nullptr && q.wgrad_dout.counts != first.counts) {
      *q.wgrad_dout.counts = *first.counts;
    }
    const Fp8Operand xt(inp, N, C, compute, q.wgrad_inp, true, stream);
    StreamScratch acc(bytes_of(OC * C, Format::kFP32), stream);
    fp8_gemm(blas, acc.as<float>(), dt, xt, OC, C, N, stream);
    epilogue(dweight, acc.as<float>(), ConstArray{}, OC, C, compute, true, stream);
    if (dbias.data != nullptr) bias_gradient(dbias, dout, N, OC, compute, stream);
    return;
  }
  std::unique_ptr<QuantizedOperand> d_dgrad;
  if (dinp.data != nullptr || same_dout) {
    d_dgrad = std::make_unique<QuantizedOperand>(dout, N, OC, compute, first, stream);
  }
  if (same_dout && q.wgrad_dout.counts != nullptr && q.wgrad_dout.counts != first.counts) {
    *q.wgrad_dout.counts = *first.counts;
  }
  if (dinp.data != nullptr) {
    // dinp (N,C) = dout (N,OC) x weight (OC,C).
    const QuantizedOperand w(weight, OC, C, compute, q.dgrad_weight, stream);
    if (N > 0) {
      StreamScratch acc(bytes_of(N * C, Format::kFP32), stream);
      GemmArgs g = gemm_args(Format::kFP32, N, C, OC);
      set_a(g, d_dgrad->get(), false, OC, 0);
      set_b(g, w.get(), false, C, 0);
      set_c(g, acc.as<float>(), C, 0);
      blas.gemm(g, stream);
      epilogue(dinp, acc.as<float>(), ConstArray{}, N, C, compute, false, stream);
    }
  }
  {
    // dweight (OC,C) += dout^T (OC,N) x inp (N,C).
    std::unique_ptr<QuantizedOperand> d_own;
    if (!same_dout) {
      d_own = std::make_unique<QuantizedOperand>(dout, N, OC, compute, q.wgrad_dout, stream);
    }
    const QuantizedOperand x(inp, N, C, compute, q.wgrad_inp, stream);
    StreamScratch acc(bytes_of(OC * C, Format::kFP32), stream);
    GemmArgs g = gemm_args(Format::kFP32, OC, C, N);
    set_a(g, (same_dout ? d_dgrad : d_own)->get(), true, OC, 0);
    set_b(g, x.get(), false, C, 0);
    set_c(g, acc.as<float>(), C, 0);
    blas.gemm(g, stream);  // k == N == 0 writes zeros
    epilogue(dweight, acc.as<float>(), ConstArray{}, OC, C, compute, true, stream);
  }
  if (dbias.data != nullptr) bias_gradient(dbias, dout, N, OC, compute, stream);
}

RecipeCounts operand_recipe_counts(ConstArray x, std::int64_t rows, std::int64_t cols,
                                   Format compute, const Recipe& recipe, cudaStream_t stream) {
  using namespace detail;
  const NvtxRange range{"ampscope::cuda::nn::operand_recipe_counts"};
  AMPSCOPE_CHECK(rows >= 0 && cols >= 1, "operand_recipe_counts: bad shape ", rows, " x ", cols);
  check_compute(compute, "operand_recipe_counts");
  check_array(x, rows * cols, "operand_recipe_counts: x");
  RecipeCounts counts;
  // The quantised GEMMs' own operand pass; its dequantised copy is dropped.
  const QuantizedOperand q(x, rows, cols, compute, OperandRecipe{&recipe, &counts}, stream);
  return counts;
}

}  // namespace ampscope::cuda::nn
