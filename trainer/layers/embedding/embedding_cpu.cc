// The embedding's tuned CPU version (embedding.h): vector row adds (the elementwise group's add
// at the exec's SIMD level); forward rows in parallel, backward rows in token order on the
// calling thread (rows of one token must add up in that order).
#include "layers/elementwise/elementwise.h"
#include "layers/embedding/embedding.h"

namespace ampscope::trainer::layers {

void embedding_forward_cpu(const CpuExec& ex, float* out, const std::int32_t* tokens,
                           const float* wte, const float* wpe, std::size_t B, std::size_t T,
                           std::size_t C) {
  const auto add = elementwise_kernels(ex.level).add;
  for_rows(ex.workers, B * T, static_cast<std::int64_t>(C), [&](std::size_t r0, std::size_t r1) {
    for (std::size_t bt = r0; bt < r1; ++bt) {
      add(wte + static_cast<std::size_t>(tokens[bt]) * C, wpe + bt % T * C, out + bt * C, C);
    }
  });
}

void embedding_backward_cpu(const CpuExec& ex, float* dwte, float* dwpe, const float* dout,
                            const std::int32_t* tokens, std::size_t B, std::size_t T,
                            std::size_t C) {
  const auto add = elementwise_kernels(ex.level).add;
  for (std::size_t bt = 0; bt < B * T; ++bt) {
    const float* dr = dout + bt * C;
    float* wr = dwte + static_cast<std::size_t>(tokens[bt]) * C;
    float* pr = dwpe + bt % T * C;
    add(wr, dr, wr, C);
    add(pr, dr, pr, C);
  }
}

}  // namespace ampscope::trainer::layers
