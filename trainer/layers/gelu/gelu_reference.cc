// GELU from its definition (gelu.h), with the C library's tanh, in FP64 rounded once to FP32:
// the oracle for the vector and CUDA versions, which use one expf.
#include <cmath>

#include "layers/gelu/gelu.h"

namespace ampscope::trainer::layers {
namespace {

constexpr double kScale = 0.79788456080286535588;  // sqrt(2 / pi)
constexpr double kCubic = 0.044715;

}  // namespace

void gelu_forward_reference(const float* inp, float* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const double x = inp[i];
    out[i] = static_cast<float>(0.5 * x * (1.0 + std::tanh(kScale * (x + kCubic * x * x * x))));
  }
}

void gelu_backward_reference(const float* inp, const float* dout, float* dinp, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const double x = inp[i];
    const double t = std::tanh(kScale * (x + kCubic * x * x * x));
    const double grad =
        0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * kScale * (1.0 + 3.0 * kCubic * x * x);
    dinp[i] = static_cast<float>(grad * dout[i]);
  }
}

}  // namespace ampscope::trainer::layers
