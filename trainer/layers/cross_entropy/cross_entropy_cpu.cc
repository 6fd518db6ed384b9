// Softmax cross-entropy's tuned CPU version (cross_entropy.h): the row max and sums in order,
// the exponentials with the elementwise group's vector kernel, rows_per_task rows per task on
// the workers.
#include <algorithm>
#include <cmath>

#include "layers/cross_entropy/cross_entropy.h"
#include "layers/elementwise/elementwise.h"

namespace ampscope::trainer::layers {

void cross_entropy_forward_cpu(const CpuExec& ex, float* losses, float* probs, const float* logits,
                               const std::int32_t* targets, std::size_t N, std::size_t V) {
  const auto exp_shifted = elementwise_kernels(ex.level).exp_shifted;
  for_rows(ex.workers, N, static_cast<std::int64_t>(V), [&](std::size_t r0, std::size_t r1) {
    for (std::size_t i = r0; i < r1; ++i) {
      const float* xr = logits + i * V;
      float* pr = probs + i * V;
      float mx = -INFINITY;
      for (std::size_t j = 0; j < V; ++j) mx = std::max(mx, xr[j]);
      exp_shifted(xr, mx, 0.0f, pr, V);
      float sum = 0.0f;
      for (std::size_t j = 0; j < V; ++j) sum += pr[j];
      const float log_sum = std::log(sum);
      exp_shifted(xr, mx, log_sum, pr, V);
      losses[i] = log_sum + mx - xr[targets[i]];
    }
  });
}

void cross_entropy_backward_cpu(const CpuExec& ex, float* dlogits, const float* probs,
                                const std::int32_t* targets, float dloss, std::size_t N,
                                std::size_t V) {
  const auto scale = elementwise_kernels(ex.level).scale;
  for_rows(ex.workers, N, static_cast<std::int64_t>(V), [&](std::size_t r0, std::size_t r1) {
    for (std::size_t i = r0; i < r1; ++i) {
      const float* pr = probs + i * V;
      float* dr = dlogits + i * V;
      scale(pr, dloss, dr, V);
      dr[targets[i]] = (pr[targets[i]] - 1.0f) * dloss;
    }
  });
}

}  // namespace ampscope::trainer::layers
