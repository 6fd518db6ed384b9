// Softmax cross-entropy from its definition (cross_entropy.h), in FP64 rounded once to FP32:
// the oracle for the tuned CPU version.
#include <algorithm>
#include <cmath>

#include "layers/cross_entropy/cross_entropy.h"

namespace ampscope::trainer::layers {

void cross_entropy_forward_reference(float* losses, float* probs, const float* logits,
                                     const std::int32_t* targets, std::size_t N, std::size_t V) {
  for (std::size_t n = 0; n < N; ++n) {
    const float* x = logits + n * V;
    const double mx = *std::max_element(x, x + V);
    double sum = 0.0;
    for (std::size_t j = 0; j < V; ++j) sum += std::exp(x[j] - mx);
    for (std::size_t j = 0; j < V; ++j)
      probs[n * V + j] = static_cast<float>(std::exp(x[j] - mx) / sum);
    losses[n] = static_cast<float>(std::log(sum) + mx - x[targets[n]]);
  }
}

void cross_entropy_backward_reference(float* dlogits, const float* probs,
                                      const std::int32_t* targets, float dloss, std::size_t N,
                                      std::size_t V) {
  for (std::size_t n = 0; n < N; ++n) {
    for (std::size_t j = 0; j < V; ++j) {
      const double onehot = static_cast<std::int64_t>(j) == targets[n] ? 1.0 : 0.0;
      dlogits[n * V + j] = static_cast<float>((probs[n * V + j] - onehot) * dloss);
    }
  }
}

}  // namespace ampscope::trainer::layers
