// The linear layer from its definition (matmul.h): triple loops, sums in FP64 rounded once to
// FP32, so the result is the exactly rounded one for the sizes the tests use.
#include "layers/matmul/matmul.h"

namespace ampscope::trainer::layers {

void matmul_forward_reference(float* out, const float* inp, const float* weight, const float* bias,
                              std::size_t N, std::size_t C, std::size_t OC) {
  for (std::size_t n = 0; n < N; ++n) {
    for (std::size_t o = 0; o < OC; ++o) {
      double acc = bias != nullptr ? bias[o] : 0.0;
      for (std::size_t c = 0; c < C; ++c) {
        acc += static_cast<double>(inp[n * C + c]) * weight[o * C + c];
      }
      out[n * OC + o] = static_cast<float>(acc);
    }
  }
}

void matmul_backward_reference(float* dinp, float* dweight, float* dbias, const float* dout,
                               const float* inp, const float* weight, std::size_t N, std::size_t C,
                               std::size_t OC) {
  for (std::size_t n = 0; dinp != nullptr && n < N; ++n) {
    for (std::size_t c = 0; c < C; ++c) {
      double acc = 0.0;
      for (std::size_t o = 0; o < OC; ++o) {
        acc += static_cast<double>(dout[n * OC + o]) * weight[o * C + c];
      }
      dinp[n * C + c] = static_cast<float>(acc);
    }
  }
  for (std::size_t o = 0; o < OC; ++o) {
    for (std::size_t c = 0; c < C; ++c) {
      double acc = 0.0;
      for (std::size_t n = 0; n < N; ++n)
        acc += static_cast<double>(dout[n * OC + o]) * inp[n * C + c];
      dweight[o * C + c] = static_cast<float>(acc);
    }
    if (dbias != nullptr) {
      double acc = 0.0;
      for (std::size_t n = 0; n < N; ++n) acc += dout[n * OC + o];
      dbias[o] = static_cast<float>(acc);
    }
  }
}

}  // namespace ampscope::trainer::layers
