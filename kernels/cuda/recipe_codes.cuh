// One element of quantize_codes (ampscope/cuda/recipe.h): the FP8 code a per-tensor recipe gives
// a value, __host__ __device__ so that the host-model test (tests/kernels/cuda/
// recipe_host_model*) runs nvcc's compilation of it against the CPU's fake_quantize without a
// GPU.
#pragma once

#include <cstdint>

#include "ampscope/detail/recipe_rules.h"
#include "convert_element.cuh"

namespace ampscope::cuda::detail {

// v under the tensor scale s (inverse = fl32(1 / s)) as an F (E4M3 or E5M2) code: a finite v is
// rounded and counted as fake_quantize rounds and counts it (its dequantised value is the code's
// value times inverse, bit for bit); a non-finite one is F's conversion without saturation.
template <Format F>
__host__ __device__ inline std::uint8_t fp8_code(float v, float s, float inverse,
                                                 const recipe_rules::RounderParams& r,
                                                 recipe_rules::ElementTally& t) {
  static_assert(F == Format::kE4M3 || F == Format::kE5M2, "FP8 codes only");
  if (!recipe_rules::finite_bits(v)) return narrow_from_fp32<F>(v, OverflowMode::kNonSaturating);
  const float q = recipe_rules::quantize_element(v, s, false, r, t);
  (void)recipe_rules::dequantize_element(v, q, inverse, t);  // its counts
  return narrow_from_fp32<F>(q, OverflowMode::kSaturating);  // q is an F value: exact
}

}  // namespace ampscope::cuda::detail
