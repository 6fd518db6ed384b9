// Scaled low-precision recipes: what a value becomes under FP8/FP6/FP4 training's scaling rules,
// not only under a bare format. One definition serves the statistics (`ampscope stats --target
// mxfp4`, the agent's counts) and the trainer's emulation (quantise -> dequantise around a
// GEMM), so what is counted is what the trainer applied.
//
// Recipes (docs/numerics.md states every rule with its source). amax is over finite values.
//   current   per-tensor FP32 scale from the tensor's own amax:
//             s = fl32(max_elem / amax) / 2^margin (amax 0: s = 1; an infinite s is clamped to
//             FP32 max; an s below 2^-126 is raised to 2^-126 so that 1 / s stays finite),
//             element = round(fl32(x * s)), dequantised q * fl32(1 / s). Transformer Engine's
//             current scaling.
//   delayed   the same with s given (from an amax history: AmaxHistory below).
//   tile      an FP32 decode scale per block of block_rows x block_cols (1x128 activation tiles,
//             128x128 weight blocks, DeepSeek-V3 style): d = fl32(amax_block / max_elem) (amax 0:
//             zero block; a d that rounds to 0 is 2^-149), element = round(fl32(x / d)),
//             dequantised fl32(q * d).
//   mx        OCP Microscaling v1.0: blocks of 32 consecutive elements along the last dimension
//             (block_rows x block_cols configurable) share an E8M0 scale
//             X = 2^(floor(log2 amax_block) - emax_elem), clamped to E8M0's [2^-127, 2^127];
//             element = round(x / X) (exact division by a power of two); with ScaleRounding::kCeil
//             X = 2^ceil(log2(amax_block / max_elem)) instead, so nothing saturates.
//   nvfp4     E2M1 elements in blocks of 16 with an E4M3 (sign 0) decode scale per block under a
//             per-tensor FP32 decode scale g = fl32(amax / (448 * 6)) (amax 0: g = 1; a g that
//             rounds to 0 is 2^-149): block code
//             b = e4m3_saturating(fl32(fl32(amax_block / 6) / g)), effective scale d = fl32(b * g),
//             element = round(fl32(x / d)), dequantised fl32(q * d); a block whose d is 0 (its
//             code rounds to 0) quantises to zeros.
// Block recipes: a block holding an Inf or NaN has scale NaN (OCP MX's rule, applied to every
// block recipe): each of its elements decodes to NaN. A block of zeros stays zeros. Blocks tile
// the [rows, cols] view from (0, 0); at the right and bottom edges they are cut short (ragged)
// and take their scale from the elements they hold, as if padded with zeros.
// Element rounding is to nearest, ties to even, and saturating (results beyond the element's
// max become +-max) in every recipe, as the hardware casts and the specifications do.
// Non-finite inputs outside a NaN block (per-tensor recipes) pass through unchanged.
//
// Counts are decided on the rounded value of the scaled element y (x * s, x / X, x / d):
//   underflow  x != 0 and y rounds to zero (nvfp4: every nonzero x of a block whose d is 0)
//   subnormal  y rounds to a nonzero value below the element's min normal
//   saturated  |y| rounds above the element's max finite and was clamped to it
//   overflow   x finite but decoded non-finite: its block's scale is NaN, or q x scale is
//              beyond FP32 (only for an amax within a rounding of FP32 max: mx:ceil rounds
//              FP32 max / 2^126 up to 4, decoded 2^128)
// Non-finite inputs are counted in `nonfinite` only.
//
// The arithmetic runs under the IEEE default (nearest, no FTZ/DAZ) whatever the caller's MXCSR,
// which is given back on return.
// Thread safety: pure functions; AmaxHistory is a plain value type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ampscope/formats.h"
#include "ampscope/tensor_stats.h"

namespace ampscope {

enum class Scaling : std::uint8_t { kCurrent = 0, kDelayed = 1, kTile = 2, kMX = 3, kNVFP4 = 4 };
enum class ScaleRounding : std::uint8_t { kFloor = 0, kCeil = 1 };

// The scaling's name in reports and labels: current, delayed, tile, mx, nvfp4.
std::string_view scaling_name(Scaling s);
// Tile, MX and NVFP4 scale per block (block_rows x block_cols); current and delayed per tensor.
bool is_block_recipe(Scaling s);

struct Recipe {
  Scaling scaling = Scaling::kCurrent;
  Format element = Format::kE4M3;  // E4M3, E5M2, E3M2, E2M3 or E2M1
  float scale = 1.0f;              // kDelayed: the multiplier s applied before rounding
  int margin = 0;                  // kCurrent: s = max_elem / amax / 2^margin
  // Block shape over a row-major [rows, cols] view: 1 x 32 (MX), 1 x 16 (NVFP4), 1 x 128 or
  // 128 x 128 (tile); 32 x 1 runs blocks down the columns (the other GEMM operand's reduction
  // axis). Unused (0) for per-tensor recipes.
  int block_rows = 0;
  int block_cols = 0;
  ScaleRounding rounding = ScaleRounding::kFloor;  // kMX only
  friend bool operator==(const Recipe&, const Recipe&) = default;
};

// Parses a recipe target: "mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4",
// "nvfp4", "e4m3:current", "e5m2:current", "e4m3:current:margin=1", "e4m3:scale=112.5",
// "e4m3:tile=1x128", "e4m3:tile=128x128", with options ":block=RxC" (mx, nvfp4) and ":ceil"
// (mx). nullopt with a reason in *error when the text is none of these.
std::optional<Recipe> parse_recipe(std::string_view text, std::string* error = nullptr);
// The canonical text parse_recipe reads back: parse_recipe(to_string(r)) == r.
std::string to_string(const Recipe& r);
// True for text that names a recipe rather than a FORMAT@K target (it has ':' or starts with
// "mx"/"nv"): callers route a --target to parse_recipe or parse_target with it.
bool looks_like_recipe(std::string_view text);

struct RecipeCounts {
  Recipe recipe;
  std::uint64_t values = 0;     // finite input values
  std::uint64_t nonfinite = 0;  // NaN and Inf inputs
  std::uint64_t underflow = 0;
  std::uint64_t subnormal = 0;
  std::uint64_t saturated = 0;
  std::uint64_t overflow = 0;
  double amax = 0.0;       // largest finite |x|
  double signal_sq = 0.0;  // sum of x^2 over finite values that decode finite
  double error_sq = 0.0;   // sum of (x - dequantised x)^2 over the same values
  // Per-tensor recipes: the scale s applied (current, delayed); nvfp4: the per-tensor decode
  // scale g; tile and mx: 0.
  double tensor_scale = 0.0;
  // Block recipes: blocks in all, blocks whose values are all zero (no scale histogram entry),
  // blocks with a saturated element, blocks with a NaN scale; the decode scales' binades
  // (floor(log2 scale) per block with a nonzero finite amax).
  std::uint64_t blocks = 0;
  std::uint64_t zero_blocks = 0;
  std::uint64_t saturated_blocks = 0;
  std::uint64_t nan_blocks = 0;
  BinadeHistogram scale_histogram;

  // 10 log10(signal_sq / error_sq); +Inf when error_sq is 0, NaN when there is no signal.
  double sqnr_db() const;
  friend bool operator==(const RecipeCounts&, const RecipeCounts&) = default;
};

// Quantises the row-major [rows, cols] FP32 tensor x by the recipe, writes the dequantised
// values to `out` (which may alias x; nullptr = counts only) and returns the counts. One thread,
// two passes over x (amax, then rounding; block recipes do both per group of blocks, in cache).
// Throws ampscope::Error on a recipe that cannot apply (element not FP8/FP6/FP4, nvfp4 without
// E2M1, a block side outside [1, 65536], a delayed scale not finite or below 2^-126, a margin
// outside [0, 64]) - never on data.
RecipeCounts fake_quantize(const float* x, float* out, std::size_t rows, std::size_t cols,
                           const Recipe& recipe);

// fake_quantize, and from the same walk over x its full statistics: *stats receives what
// compute_stats(x, rows * cols, Format::kFP32, targets) gives (the same counts, extrema,
// histogram, target counts and exactly rounded sum; sum_sq within the few ulps by which
// compute_stats' own splits differ), each piece measured by compute_stats' kernel just before it
// is rounded, while it is in cache, instead of in a pass of its own. One thread. For a caller that both quantises a tensor and
// wants its statistics (the trainer's GEMM inputs, for the agent's fused statistics). `out` may
// alias x. Throws as fake_quantize does, and as compute_stats does on a bad target.
RecipeCounts fake_quantize_with_stats(const float* x, float* out, std::size_t rows,
                                      std::size_t cols, const Recipe& recipe,
                                      std::span<const TargetSpec> targets, TensorStats* stats);

// The same counts for a tensor stored in a statistics storage format (is_stats_storage_format:
// FP32, FP16, BF16, ...; n elements, rows of row_length; row_length 0 = one row; it must divide
// n). Narrow storage is converted to FP32 (convert_to_fp32) a strip of block rows at a time and
// goes through the same code. What `ampscope stats --target RECIPE` and the
// agent report.
RecipeCounts recipe_counts(const void* data, std::size_t n, Format dtype, std::size_t row_length,
                           const Recipe& recipe);

// Delayed scaling's state for one tensor (Transformer Engine's semantics): the amaxes of the
// last `length` steps; the scale for the next step is max_elem / max(history) / 2^margin
// ("max" reduction) or from the most recent amax ("most_recent"). A zero, Inf or NaN amax
// keeps the previous scale (a NaN anywhere in a "max" window counts as NaN); an infinite scale is
// clamped to FP32 max; the rule is current scaling's, one function. Starts at scale 1, empty.
// set_margin and set_length recompute the scale from the history as it then stands.
class AmaxHistory {
 public:
  enum class Reduction : std::uint8_t { kMax = 0, kMostRecent = 1 };
  AmaxHistory(Format element, int length, int margin, Reduction reduction = Reduction::kMax);

  float scale() const { return scale_; }
  // Records this step's amax and updates the scale for the next step.
  void push(float amax);
  std::span<const float> history() const { return history_; }  // oldest first
  int margin() const { return margin_; }
  void set_margin(int margin);
  void set_length(int length);  // keeps the newest min(length, size) entries
  // Puts back a saved state (a checkpoint's): the amaxes, oldest first (at most `length`), and
  // the scale in force. The scale is state of its own: a window of zero or non-finite amaxes
  // keeps the scale an earlier window gave, which the amaxes alone cannot say. Throws
  // ampscope::Error on a history longer than the length or a scale not finite and positive.
  void restore(std::span<const float> history, float scale);

 private:
  void update_scale();
  Format element_;
  int length_;
  int margin_;
  Reduction reduction_;
  std::vector<float> history_;
  float scale_ = 1.0f;
};

}  // namespace ampscope
