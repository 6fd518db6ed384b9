// The linear layer's tuned CPU version (matmul.h): OpenBLAS sgemm (FP32 accumulation, its own
// threads), the bias added row by row on the workers and the bias gradient as column sums, with
// the elementwise group's vector kernels. The FP8/FP4 versions run the same GEMMs on operands
// fake_quantize has replaced by their dequantised values (scratch copies).
#include <cblas.h>

#include <algorithm>
#include <optional>

#include "layers/elementwise/elementwise.h"
#include "layers/matmul/matmul.h"

namespace ampscope::trainer::layers {
namespace {

// dinp (N,C) = dout (N,OC) x weight (OC,C).
void dgrad(float* dinp, const float* dout, const float* weight, std::size_t N, std::size_t C,
           std::size_t OC) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(N), int(C), int(OC), 1.0f, dout,
              int(OC), weight, int(C), 0.0f, dinp, int(C));
}

// dweight (OC,C) = dout (N,OC)^T x inp (N,C).
void wgrad(float* dweight, const float* dout, const float* inp, std::size_t N, std::size_t C,
           std::size_t OC) {
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(OC), int(C), int(N), 1.0f, dout, int(OC),
              inp, int(C), 0.0f, dweight, int(C));
}

void bias_grad(const CpuExec& ex, float* dbias, const float* dout, std::size_t N, std::size_t OC) {
  std::fill_n(dbias, OC, 0.0f);
  elementwise_kernels(ex.level).add_column_sums(dout, N, OC, dbias);
}

// The operand as the GEMM reads it: `src` itself without a recipe, else a scratch copy holding
// fake_quantize's dequantised values.
class Quantized {
 public:
  Quantized(const CpuExec& ex, const float* src, std::size_t rows, std::size_t cols,
            OperandRecipe q) {
    if (q.recipe == nullptr) {
      ptr_ = src;
      return;
    }
    scratch_.emplace(ex.scratch.get(rows * cols));
    RecipeCounts counts = fake_quantize(src, scratch_->data(), rows, cols, *q.recipe);
    if (q.counts != nullptr) *q.counts = std::move(counts);
    ptr_ = scratch_->data();
  }
  const float* get() const { return ptr_; }

 private:
  const float* ptr_ = nullptr;
  std::optional<ScratchPool::Handle> scratch_;
};

}  // namespace

void matmul_forward_cpu(const CpuExec& ex, float* out, const float* inp, const float* weight,
                        const float* bias, std::size_t N, std::size_t C, std::size_t OC) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(N), int(OC), int(C), 1.0f, inp, int(C),
              weight, int(C), 0.0f, out, int(OC));
  if (bias == nullptr) return;
  const auto add = elementwise_kernels(ex.level).add;
  for_rows(ex.workers, N, static_cast<std::int64_t>(OC), [&](std::size_t r0, std::size_t r1) {
    for (std::size_t i = r0; i < r1; ++i) add(out + i * OC, bias, out + i * OC, OC);
  });
}

void matmul_backward_cpu(const CpuExec& ex, float* dinp, float* dweight, float* dbias,
                         const float* dout, const float* inp, const float* weight, std::size_t N,
                         std::size_t C, std::size_t OC) {
  if (dinp != nullptr) dgrad(dinp, dout, weight, N, C, OC);
  wgrad(dweight, dout, inp, N, C, OC);
  if (dbias != nullptr) bias_grad(ex, dbias, dout, N, OC);
}

void matmul_forward_quantized_cpu(const CpuExec& ex, float* out, const float* inp,
                                  const float* weight, const float* bias, std::size_t N,
                                  std::size_t C, std::size_t OC, OperandRecipe q_inp,
                                  OperandRecipe q_weight) {
  const Quantized x(ex, inp, N, C, q_inp), w(ex, weight, OC, C, q_weight);
  matmul_forward_cpu(ex, out, x.get(), w.get(), bias, N, C, OC);
}

void matmul_backward_quantized_cpu(const CpuExec& ex, float* dinp, float* dweight, float* dbias,
                                   const float* dout, const float* inp, const float* weight,
                                   std::size_t N, std::size_t C, std::size_t OC,
                                   const BackwardRecipes& q) {
  const bool same_dout = q.dgrad_dout.recipe != nullptr && q.wgrad_dout.recipe != nullptr &&
                         *q.dgrad_dout.recipe == *q.wgrad_dout.recipe;
  // One pass for both GEMMs when the recipes agree; its counts go to whoever asked.
  OperandRecipe first = q.dgrad_dout;
  if (same_dout && first.counts == nullptr) first.counts = q.wgrad_dout.counts;
  std::optional<Quantized> d_dgrad;
  if (dinp != nullptr || same_dout) d_dgrad.emplace(ex, dout, N, OC, first);
  if (same_dout && q.wgrad_dout.counts != nullptr && q.wgrad_dout.counts != first.counts) {
    *q.wgrad_dout.counts = *first.counts;
  }
  if (dinp != nullptr) {
    const Quantized w(ex, weight, OC, C, q.dgrad_weight);
    dgrad(dinp, d_dgrad->get(), w.get(), N, C, OC);
  }
  {
    std::optional<Quantized> d_own;
    if (!same_dout) d_own.emplace(ex, dout, N, OC, q.wgrad_dout);
    const Quantized x(ex, inp, N, C, q.wgrad_inp);
    wgrad(dweight, same_dout ? d_dgrad->get() : d_own->get(), x.get(), N, C, OC);
  }
  if (dbias != nullptr) bias_grad(ex, dbias, dout, N, OC);
}

}  // namespace ampscope::trainer::layers
