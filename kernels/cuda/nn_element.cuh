// Element functions of the trainer kernels: loading and storing FP32/FP16/BF16 elements,
// rounding to a compute format, the precision contract's commit step and AdamW (a layer's own
// element functions live with the layer, e.g. trainer/layers/gelu/gelu_element.cuh).
// __host__ __device__ so that the host-model test (tests/trainer/cuda/nn_host_model*) runs them
// against the CPU back end on a machine without a GPU; on the device they compile to the same expressions (the library is built with
// --fmad=false, so no product is fused into an add behind the reference's back).
//
// Each function is the CPU back end's expression (trainer/src/cpu_backend.cc), term for term and
// in the same order. Where the CPU code uses std::min or std::max, the same comparison is
// written out, so a NaN takes the same branch.
#pragma once

#include <cmath>
#include <cstdint>

#include "ampscope/cuda/nn_optimizer.h"
#include "ampscope/formats.h"
#include "convert_element.cuh"

namespace ampscope::cuda::nn::detail {

using ::ampscope::cuda::detail::narrow_from_fp32;
using ::ampscope::cuda::detail::narrow_to_fp32;

__host__ __device__ inline bool is_finite(float x) {
#if defined(__CUDA_ARCH__)
  return isfinite(x);
#else
  return std::isfinite(x);
#endif
}

// Element i of an array of `f` storage (FP32, FP16 or BF16; anything else reads as FP32).
__host__ __device__ inline float load(const void* base, Format f, std::int64_t i) {
  switch (f) {
    case Format::kFP16:
      return narrow_to_fp32<Format::kFP16>(static_cast<const std::uint16_t*>(base)[i]);
    case Format::kBF16:
      return narrow_to_fp32<Format::kBF16>(static_cast<const std::uint16_t*>(base)[i]);
    default:
      return static_cast<const float*>(base)[i];
  }
}

// Round to nearest even into `f` storage, overflow to Inf (convert_from_fp32's semantics).
__host__ __device__ inline void store(void* base, Format f, std::int64_t i, float value) {
  switch (f) {
    case Format::kFP16:
      static_cast<std::uint16_t*>(base)[i] =
          narrow_from_fp32<Format::kFP16>(value, OverflowMode::kNonSaturating);
      return;
    case Format::kBF16:
      static_cast<std::uint16_t*>(base)[i] =
          narrow_from_fp32<Format::kBF16>(value, OverflowMode::kNonSaturating);
      return;
    default:
      static_cast<float*>(base)[i] = value;
      return;
  }
}

// The value `x` takes in format `f` (round_through in the CPU code).
__host__ __device__ inline float round_to_format(float x, Format f) {
  switch (f) {
    case Format::kFP16:
      return narrow_to_fp32<Format::kFP16>(
          narrow_from_fp32<Format::kFP16>(x, OverflowMode::kNonSaturating));
    case Format::kBF16:
      return narrow_to_fp32<Format::kBF16>(
          narrow_from_fp32<Format::kBF16>(x, OverflowMode::kNonSaturating));
    default:
      return x;
  }
}

// An input: element i read from storage and rounded to the compute format (the CPU's In).
__host__ __device__ inline float input(const void* base, Format f, std::int64_t i, Format compute) {
  return round_to_format(load(base, f, i), compute);
}

// A result (the CPU's Out::commit): rounded to `compute`, then stored in the array's format;
// with `accumulate`, added in FP32 to the stored value first.
__host__ __device__ inline void commit(void* base, Format f, std::int64_t i, float value,
                                       Format compute, bool accumulate) {
  const float rounded = round_to_format(value, compute);
  store(base, f, i, accumulate ? load(base, f, i) + rounded : rounded);
}

// The per-step constants of AdamW, computed once on the host as the CPU back end does.
struct AdamWStep {
  float lr;
  float beta1;
  float beta2;
  float eps;
  float decay;  // 1 - lr * weight_decay
  float bc1;    // 1 - beta1^step
  float bc2;    // 1 - beta2^step
};

__host__ inline AdamWStep adamw_step(const AdamWArgs& a) {
  AdamWStep s;
  s.lr = a.lr;
  s.beta1 = a.beta1;
  s.beta2 = a.beta2;
  s.eps = a.eps;
  s.decay = 1.0f - a.lr * a.weight_decay;
  s.bc1 = 1.0f - std::pow(a.beta1, static_cast<float>(a.step));
  s.bc2 = 1.0f - std::pow(a.beta2, static_cast<float>(a.step));
  return s;
}

// One parameter: p, m, v updated in place from gradient g.
__host__ __device__ inline void adamw_element(float& p, float& m, float& v, float g,
                                              const AdamWStep& s) {
  const float mi = s.beta1 * m + (1.0f - s.beta1) * g;
  const float vi = s.beta2 * v + (1.0f - s.beta2) * g * g;
  const float mhat = mi / s.bc1;
  const float vhat = vi / s.bc2;
  p = p * s.decay - s.lr * mhat / (sqrtf(vhat) + s.eps);
  m = mi;
  v = vi;
}

// The loss-scale update and inverse scale are ampscope/loss_scale.h's host/device functions.
using ::ampscope::inverse_scale;
using ::ampscope::update_loss_scale_state;

}  // namespace ampscope::cuda::nn::detail
