#include "measure.h"

#include <algorithm>
#include <cmath>
#include <exception>

#include "ampscope/loss_scale.h"
#include "counts.h"

namespace ampscope::agent {
TargetSpec target_for(Format compute_format, TensorRole role, double sample_scale,
                      double step_scale) {
  TargetSpec t;
  t.format = compute_format;
  const auto valid = [](double x) { return std::isfinite(x) && x > 0.0; };
  if (is_loss_scaled(role) && valid(step_scale) && valid(sample_scale)) {
    const int k = scale_exponent(step_scale) - scale_exponent(sample_scale);
    t.scale_log2 = std::clamp(k, -kMaxScaleLog2, kMaxScaleLog2);
  }
  return t;
}

namespace {

// The recipe_targets counts of a full-level sample: one row per last-dimension slice (a 1-D
// or shapeless tensor is one row), as recipe_counts reads a tensor.
void count_recipes(const void* data, TensorSample& s, std::span<const Recipe> recipes) {
  const std::size_t row_length =
      s.shape.size() >= 2 ? static_cast<std::size_t>(std::max<std::int64_t>(0, s.shape.back()))
                          : 0;
  for (const Recipe& recipe : recipes) {
    try {
      s.recipe_counts.push_back(recipe_counts(data, s.numel, s.dtype, row_length, recipe));
    } catch (const std::exception&) {
      // A storage format the recipe cannot read: not counted (the statistics still are).
    }
  }
}

}  // namespace

MeasureResult measure_host(const void* data, TensorSample& s, bool upgrade_on_nonfinite,
                           int max_threads, std::span<const Recipe> recipes) {
  MeasureResult r;
  try {
    if (s.level == Level::kCounts && !s.record_full) {
      if (!count_nonfinite(data, s.numel, s.dtype, &s.stats)) {
        r.error = "unsupported dtype " + std::string(format_name(s.dtype));
        return r;
      }
      r.nonfinite = s.stats.nonfinite() > 0;
      if (r.nonfinite && upgrade_on_nonfinite) s.level = Level::kFull;
    }
    if (s.level == Level::kFull || s.record_full) {
      StatsOptions options;
      options.max_threads = max_threads;
      std::span<const TargetSpec> targets;
      if (s.target) targets = std::span<const TargetSpec>(&*s.target, 1);
      s.stats = compute_stats(data, s.numel, s.dtype, targets, options);
      s.full = true;
      r.nonfinite = s.stats.nonfinite() > 0;
      if (r.nonfinite && upgrade_on_nonfinite) s.level = Level::kFull;
      if (s.level == Level::kFull && !recipes.empty()) count_recipes(data, s, recipes);
    }
    s.measured = true;
    r.ok = true;
  } catch (const std::exception& e) {
    r.error = e.what();
  } catch (...) {
    r.error = "unknown error";
  }
  return r;
}

}  // namespace ampscope::agent
