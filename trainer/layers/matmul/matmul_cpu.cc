// The linear layer's tuned CPU version (matmul.h): OpenBLAS sgemm (FP32 accumulation, its own
// threads), the bias added row by row on the workers and the bias gradient as column sums, with
// the elementwise group's vector kernels.
#include <cblas.h>

#include <algorithm>

#include "layers/elementwise/elementwise.h"
#include "layers/matmul/matmul.h"

namespace ampscope::trainer::layers {

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
  if (dinp != nullptr) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(N), int(C), int(OC), 1.0f, dout,
                int(OC), weight, int(C), 0.0f, dinp, int(C));
  }
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(OC), int(C), int(N), 1.0f, dout, int(OC),
              inp, int(C), 0.0f, dweight, int(C));
  if (dbias != nullptr) {
    std::fill_n(dbias, OC, 0.0f);
    elementwise_kernels(ex.level).add_column_sums(dout, N, OC, dbias);
  }
}

}  // namespace ampscope::trainer::layers
