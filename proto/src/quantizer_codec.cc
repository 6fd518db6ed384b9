#include "ampscope/proto/quantizer_codec.h"

#include <algorithm>
#include <cmath>

#include "ampscope/proto/vocabulary_codec.h"

namespace ampscope::proto {

void encode_quantizer(const RecipeCounts& c, std::span<const float> amax_history,
                      v1::QuantizerStats* out) {
  out->set_recipe(to_string(c.recipe));
  out->set_element(to_proto(c.recipe.element));
  out->set_values(c.values);
  out->set_nonfinite(c.nonfinite);
  out->set_underflow(c.underflow);
  out->set_subnormal(c.subnormal);
  out->set_saturated(c.saturated);
  out->set_overflow(c.overflow);
  out->set_amax(c.amax);
  out->set_signal_sq(c.signal_sq);
  out->set_error_sq(c.error_sq);
  out->set_tensor_scale(c.tensor_scale);
  out->set_blocks(c.blocks);
  out->set_zero_blocks(c.zero_blocks);
  out->set_saturated_blocks(c.saturated_blocks);
  out->set_nan_blocks(c.nan_blocks);
  if (!c.scale_histogram.empty()) {
    v1::BinadeHistogram* h = out->mutable_scale_histogram();
    h->set_min_exponent(c.scale_histogram.min_exponent);
    for (std::uint64_t n : c.scale_histogram.counts) h->add_counts(n);
  }
  const std::size_t keep = std::min(amax_history.size(), kMaxAmaxHistory);
  for (float a : amax_history.last(keep)) out->add_amax_history(a);
}

std::optional<RecipeCounts> decode_quantizer(const v1::QuantizerStats& q) {
  const std::optional<Recipe> recipe = parse_recipe(q.recipe());
  if (!recipe) return std::nullopt;
  RecipeCounts c;
  c.recipe = *recipe;
  c.values = q.values();
  c.nonfinite = q.nonfinite();
  c.underflow = q.underflow();
  c.subnormal = q.subnormal();
  c.saturated = q.saturated();
  c.overflow = q.overflow();
  c.amax = q.amax();
  c.signal_sq = q.signal_sq();
  c.error_sq = q.error_sq();
  c.tensor_scale = q.tensor_scale();
  c.blocks = q.blocks();
  c.zero_blocks = q.zero_blocks();
  c.saturated_blocks = q.saturated_blocks();
  c.nan_blocks = q.nan_blocks();
  if (q.has_scale_histogram()) {
    c.scale_histogram.min_exponent = q.scale_histogram().min_exponent();
    c.scale_histogram.counts.assign(q.scale_histogram().counts().begin(),
                                    q.scale_histogram().counts().end());
  }
  return c;
}

double sqnr_db(double signal_sq, double error_sq) {
  RecipeCounts c;
  c.signal_sq = signal_sq;
  c.error_sq = error_sq;
  return c.sqnr_db();
}

MeanAndStddev mean_and_stddev(std::uint64_t n, double sum, double sum_sq) {
  if (n == 0) return {};
  const double count = static_cast<double>(n);
  const double mean = sum / count;
  if (n == 1) return {mean, 0.0};
  const double variance = (sum_sq - sum * mean) / (count - 1.0);
  return {mean, variance > 0.0 ? std::sqrt(variance) : 0.0};
}

}  // namespace ampscope::proto
