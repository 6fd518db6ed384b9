// RecipeCounts (kernels, ampscope/recipe.h) <-> ampscope.v1.QuantizerStats (wire): the one place
// that writes a quantiser's measurement fields, shared by the agent's encoder and the server's
// tests, and reads them back (the server's policy engine). The identity (name, role, phase,
// micro-step) is the caller's.
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "ampscope/recipe.h"
#include "ampscope/v1/telemetry.pb.h"

namespace ampscope::proto {

// Bounds the server enforces (telemetry.proto): quantisers per report, the amax history's
// length and the recipe text's size.
inline constexpr std::size_t kMaxQuantizersPerReport = 4096;
inline constexpr std::size_t kMaxAmaxHistory = 1024;
inline constexpr std::size_t kRecipeMaxBytes = 64;

// Writes the recipe (its canonical text and element format), the counts, amax, the SQNR sums,
// the tensor scale, the block counts and, for block recipes, the scale histogram; then the
// newest kMaxAmaxHistory entries of `amax_history` (oldest first).
void encode_quantizer(const RecipeCounts& c, std::span<const float> amax_history,
                      v1::QuantizerStats* out);

// The counts encode_quantizer wrote (the amax history is the caller's). nullopt when the recipe
// text is not one parse_recipe reads (the server's validation refuses such an entry).
std::optional<RecipeCounts> decode_quantizer(const v1::QuantizerStats& q);

// The SQNR of a quantiser's sums, in dB: RecipeCounts::sqnr_db's definition (+Inf when the
// error is 0, NaN without signal).
double sqnr_db(double signal_sq, double error_sq);

// The mean and sample standard deviation of n values from their sum and sum of squares
// (QuantizerRecord.loss_cost_mean and _stddev): {0, 0} without values, a standard deviation of
// 0 with one (and where rounding makes the variance negative).
struct MeanAndStddev {
  double mean = 0.0;
  double stddev = 0.0;
};
MeanAndStddev mean_and_stddev(std::uint64_t n, double sum, double sum_sq);

}  // namespace ampscope::proto
