// GELU's element functions (gelu.h), __host__ __device__: the CUDA kernels (gelu.cu) run them,
// and the host-model test (tests/trainer/cuda/nn_host_model*) runs them on the CPU against the
// CPU back end. They are the vector kernel's expression (gelu_cpu.cc), term for term and in the
// same order; the library is compiled without FMA contraction, so the device rounds as the
// baseline CPU level does.
#pragma once

#include <cmath>

namespace ampscope::cuda::nn::detail {

inline constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)

// tanh through one expf, as the vector kernel computes it (gelu_cpu.cc).
__host__ __device__ inline float gelu_tanh(float u) {
  const float e = expf(2.0f * ((40.0f < u) ? 40.0f : u));
  return 1.0f - 2.0f / (e + 1.0f);
}

__host__ __device__ inline float gelu_forward_element(float v) {
  const float cube = 0.044715f * v * v * v;
  return 0.5f * v * (1.0f + gelu_tanh(kGeluScale * (v + cube)));
}

__host__ __device__ inline float gelu_backward_element(float v, float dout) {
  const float cube = 0.044715f * v * v * v;
  const float t = gelu_tanh(kGeluScale * (v + cube));
  const float sech2 = 1.0f - t * t;
  const float grad =
      0.5f * (1.0f + t) + 0.5f * v * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * v * v);
  return grad * dout;
}

}  // namespace ampscope::cuda::nn::detail
