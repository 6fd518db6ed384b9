// The device conversion code of kernels/cuda/convert_element.cuh, compiled for the host, where
// the toolkit defines the same intrinsics in portable C++ (NVIDIA's model of the instructions).
// Lets the conversion semantics, the saturation fix-ups and the documented NaN differences be
// tested on a machine without a GPU; the device tests then check the instructions themselves.
#pragma once

#include <cstdint>

#include "ampscope/convert.h"
#include "ampscope/formats.h"

namespace ampscope::cuda::testing {

// Narrow formats only (FP16, BF16, E4M3, E5M2, E2M1, E3M2, E2M3).
std::uint32_t host_model_from_fp32(float x, Format f, OverflowMode mode);
float host_model_to_fp32(std::uint32_t bits, Format f);

}  // namespace ampscope::cuda::testing
