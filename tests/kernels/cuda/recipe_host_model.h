// The device fake_quantize's element and scale code (kernels/cuda/recipe_element.cuh), compiled
// for the host and driven in the CPU's order (strip by strip, block by block, row by row), so
// that the rules the kernels apply are checked against the CPU's fake_quantize on a machine
// without a GPU; recipe_test.cc then checks the kernels' scheduling on a device.
#pragma once

#include <cstddef>

#include "ampscope/recipe.h"

namespace ampscope::cuda::testing {

RecipeCounts host_model_fake_quantize(const float* x, float* out, std::size_t rows,
                                      std::size_t cols, const Recipe& recipe);

}  // namespace ampscope::cuda::testing
