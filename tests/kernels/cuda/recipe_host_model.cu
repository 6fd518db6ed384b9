// Host instantiation of the device recipe rules (see recipe_host_model.h). Host code only.
#include <array>
#include <cstdint>

#include "ampscope/detail/recipe_rules.h"
#include "recipe_codes.cuh"
#include "recipe_host_model.h"

namespace ampscope::cuda::testing {

using namespace ::ampscope::recipe_rules;

namespace {

// The largest finite |x| of n values (0 without any).
float finite_amax(const float* x, std::size_t n) {
  float amax = 0.0f;
  for (std::size_t i = 0; i < n; ++i) {
    const float a = abs_of(x[i]);
    if (finite_bits(a) && a > amax) amax = a;
  }
  return amax;
}

// The element tally and amax into the counts.
void take_tally(const ElementTally& e, float amax, RecipeCounts* counts) {
  counts->underflow = e.underflow;
  counts->subnormal = e.subnormal;
  counts->saturated = e.saturated;
  counts->overflow = e.overflow;
  counts->signal_sq = e.signal_sq;
  counts->error_sq = e.error_sq;
  counts->amax = amax;
}

}  // namespace

RecipeCounts host_model_fake_quantize(const float* x, float* out, std::size_t rows,
                                      std::size_t cols, const Recipe& recipe) {
  RecipeCounts counts = ::ampscope::fake_quantize(nullptr, nullptr, 0, 0, recipe);  // checks
  const RecipeParams p = recipe_params(recipe);
  const std::size_t n = rows * cols;
  const float amax = finite_amax(x, n);
  ElementTally e;
  std::array<std::uint64_t, kHistogramBins> histogram{};
  if (!is_block_recipe(recipe.scaling)) {
    const float s = tensor_scale(p, amax), inverse = div_rn(1.0f, s);
    for (std::size_t i = 0; i < n; ++i) {
      if (finite_bits(x[i])) {
        ++counts.values;
        out[i] = quantize_finite(x[i], s, inverse, false, p.element, e);
      } else {
        ++counts.nonfinite;
        out[i] = x[i];
      }
    }
  } else {
    const float g = recipe.scaling == Scaling::kNVFP4 ? tensor_scale(p, amax) : 0.0f;
    const auto br = static_cast<std::size_t>(recipe.block_rows);
    const auto bc = static_cast<std::size_t>(recipe.block_cols);
    for (std::size_t r0 = 0; r0 < rows; r0 += br) {
      const std::size_t r1 = r0 + br < rows ? r0 + br : rows;
      for (std::size_t c0 = 0; c0 < cols; c0 += bc) {
        const std::size_t c1 = c0 + bc < cols ? c0 + bc : cols;
        float m = 0.0f;
        bool bad = false;
        for (std::size_t r = r0; r < r1; ++r) {
          for (std::size_t c = c0; c < c1; ++c) {
            const float a = abs_of(x[r * cols + c]);
            if (!finite_bits(a)) {
              bad = true;
              ++counts.nonfinite;
            } else {
              ++counts.values;
              if (a > m) m = a;
            }
          }
        }
        const BlockScale s = block_scale(p, m, bad, g);
        ++counts.blocks;
        if (s.kind == BlockKind::kZero) ++counts.zero_blocks;
        if (s.kind == BlockKind::kNaN) ++counts.nan_blocks;
        if (s.kind == BlockKind::kScaled) {
          ++histogram[static_cast<std::size_t>(floor_log2_positive(s.dec) - kHistogramMinExponent)];
        }
        const std::uint64_t saturated_before = e.saturated;
        for (std::size_t r = r0; r < r1; ++r) {
          for (std::size_t c = c0; c < c1; ++c) {
            const std::size_t i = r * cols + c;
            out[i] = quantize_in_block(x[i], s, recipe.scaling == Scaling::kMX, p.element, e);
          }
        }
        if (e.saturated != saturated_before) ++counts.saturated_blocks;
      }
    }
  }
  take_tally(e, amax, &counts);
  counts.tensor_scale = tensor_scale(p, amax);
  counts.scale_histogram = BinadeHistogram::from_dense(histogram);
  return counts;
}

RecipeCounts host_model_quantize_codes(const float* x, std::uint8_t* codes, float* decode,
                                       std::size_t rows, std::size_t cols, bool transposed,
                                       const Recipe& recipe) {
  RecipeCounts counts = ::ampscope::fake_quantize(nullptr, nullptr, 0, 0, recipe);  // checks
  const RecipeParams p = recipe_params(recipe);
  const std::size_t n = rows * cols;
  const float amax = finite_amax(x, n);
  const float s = tensor_scale(p, amax), inverse = div_rn(1.0f, s);
  *decode = inverse;
  ElementTally e;
  for (std::size_t i = 0; i < n; ++i) {
    ++(finite_bits(x[i]) ? counts.values : counts.nonfinite);
    codes[transposed ? i % cols * rows + i / cols : i] =
        recipe.element == Format::kE4M3
            ? detail::fp8_code<Format::kE4M3>(x[i], s, inverse, p.element, e)
            : detail::fp8_code<Format::kE5M2>(x[i], s, inverse, p.element, e);
  }
  take_tally(e, amax, &counts);
  counts.tensor_scale = s;
  return counts;
}

}  // namespace ampscope::cuda::testing
