// The element and scale rules the device fake_quantize applies (ampscope/detail/recipe_rules.h,
// which the CPU's fake_quantize shares) as nvcc compiles them, run on the host in the CPU's order
// (strip by strip, block by block, row by row), so that nvcc's compilation of the rules and the
// block logic the kernels follow are checked against the CPU's fake_quantize on a machine without
// a GPU; recipe_test.cc then checks the kernels' scheduling on a device.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ampscope/recipe.h"

namespace ampscope::cuda::testing {

RecipeCounts host_model_fake_quantize(const float* x, float* out, std::size_t rows,
                                      std::size_t cols, const Recipe& recipe);

// quantize_codes' elements (recipe_codes.cuh) in the same order: codes (rows x cols, or the
// transpose), *decode = fl32(1 / s). Per-tensor E4M3/E5M2 recipes only.
RecipeCounts host_model_quantize_codes(const float* x, std::uint8_t* codes, float* decode,
                                       std::size_t rows, std::size_t cols, bool transposed,
                                       const Recipe& recipe);

}  // namespace ampscope::cuda::testing
