// Measuring one host tensor for a sample: the counts pass (counts.h) or the full statistics
// (compute_stats with the sample's target), on whichever thread calls it.
#pragma once

#include <span>
#include <string>

#include "ampscope/recipe.h"
#include "record.h"

namespace ampscope::agent {

struct MeasureResult {
  bool ok = false;
  bool nonfinite = false;
  std::string error;  // when !ok: one line
};

// Measures n = s.numel elements of s.dtype at `data` at s.level, in full when s.record_full
// (s.full says so). With upgrade_on_nonfinite, a sample below kFull that holds a non-finite
// value is measured in full and reported so (its level becomes kFull). `max_threads` as
// StatsOptions::max_threads. A sample that ends at kFull is also counted against each of
// `recipes` (the recipe_targets option) into s.recipe_counts, rows of its shape's last
// dimension; a recipe that cannot count it leaves it out, silently. Never throws.
MeasureResult measure_host(const void* data, TensorSample& s, bool upgrade_on_nonfinite,
                           int max_threads, std::span<const Recipe> recipes = {});

// The what-if target of a sample: the run's compute format at the scale the values would be
// cast with this step. Gradients measured unscaled (scale 1) are asked about the step's loss
// scale; values that carry a scale, and everything else, as stored.
TargetSpec target_for(Format compute_format, TensorRole role, double sample_scale,
                      double step_scale);

}  // namespace ampscope::agent
