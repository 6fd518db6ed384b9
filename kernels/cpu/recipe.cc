// Scaled recipes (recipe.h). Design: one Quantizer walks a row-major [rows, cols] FP32 view in
// strips of block_rows rows; within a strip it takes groups of blocks small enough to stay in
// L1/L2, finds each block's amax (pass 1), derives the block's encode and decode scales
// (recipe_rules::block_scale, where every edge case sits), then rounds every element (pass 2).
// The per-tensor recipes are one "block" covering everything, with the scale decided up front.
//
// The rules themselves (element rounding, the scales, what is counted) are
// ampscope/detail/recipe_rules.h's, which the device fake_quantize compiles too. Element
// rounding adds and subtracts 2^(quantum exponent + 23), which rounds to a multiple of the
// quantum, ties to even, in FP32's own arithmetic (tests/kernels/recipe_test.cc checks it
// against round_to over every binade). That arithmetic, like the scales', depends on MXCSR,
// which belongs to the host process (the agent runs inside one that may have set FTZ/DAZ or
// another rounding mode), so every entry point runs under the default MXCSR
// (ScopedDefaultMxcsr).
#include "ampscope/recipe.h"

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <limits>

#include "ampscope/check.h"
#include "ampscope/convert.h"
#include "ampscope/detail/recipe_rules.h"
#include "convert_internal.h"  // ScopedDefaultMxcsr
#include "stats_internal.h"    // StatsAccumulator, select_kernel

namespace ampscope {
namespace {

constexpr float kMinNormal = 0x1p-126f;
constexpr int kMaxMargin = 64;
constexpr int kMaxBlockSide = 65536;

bool is_element_format(Format f) {
  return f != Format::kFP32 && f != Format::kFP16 && f != Format::kBF16 &&
         format_info(f).total_bits <= 8;
}

using recipe_rules::abs_of;
using recipe_rules::finite_bits;

using recipe_rules::BlockKind;
using recipe_rules::BlockScale;
using recipe_rules::ElementTally;
using recipe_rules::RecipeParams;
using recipe_rules::RounderParams;

// Quantises n finite-or-not values with one scale (recipe_rules::quantize_finite; kDivide: x /
// enc). Non-finite inputs pass through unchanged (counted elsewhere). The grid and the tally are
// copied into locals for the loop: `out` is a float*, so the compiler would otherwise reload the
// grid's floats and store the tally after every element (1.5x slower on NVFP4); the tally's sums
// still add in element order.
template <bool kDivide>
void quantize_span(const float* x, float* out, std::size_t n, float enc, float dec,
                   const RounderParams& r, ElementTally& t) {
  const RounderParams grid = r;
  ElementTally tally = t;
  for (std::size_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float q =
        finite_bits(v) ? recipe_rules::quantize_finite(v, enc, dec, kDivide, grid, tally) : v;
    if (out) out[i] = q;
  }
  t = tally;
}

float finite_amax(const float* x, std::size_t n) {
  float m = 0.0f;
  for (std::size_t i = 0; i < n; ++i) {
    const float a = abs_of(x[i]);
    if (finite_bits(a) && a > m) m = a;
  }
  return m;
}

// Current scaling's scale from an amax (AmaxHistory); `previous` when amax is 0, Inf or NaN.
float scale_from_amax(Format element, float amax, int margin, float previous) {
  if (!(amax > 0.0f) || !std::isfinite(amax)) return previous;  // 0, Inf, NaN
  return recipe_rules::current_scale(static_cast<float>(format_info(element).max_finite), amax,
                                     margin);
}

void check_recipe(const Recipe& r) {
  AMPSCOPE_CHECK(is_element_format(r.element),
                 "recipe element must be an FP8/FP6/FP4 format, "
                 "found ",
                 format_name(r.element));
  if (is_block_recipe(r.scaling)) {
    AMPSCOPE_CHECK(r.block_rows >= 1 && r.block_cols >= 1 && r.block_rows <= kMaxBlockSide &&
                       r.block_cols <= kMaxBlockSide,
                   "block must be from 1x1 to ", kMaxBlockSide, "x", kMaxBlockSide, ", found ",
                   r.block_rows, "x", r.block_cols);
  }
  if (r.scaling == Scaling::kNVFP4) {
    AMPSCOPE_CHECK(format_info(r.element).total_bits == 4, "nvfp4 needs E2M1 elements, found ",
                   format_name(r.element));
  }
  if (r.scaling == Scaling::kDelayed) {
    AMPSCOPE_CHECK(std::isfinite(r.scale) && r.scale >= kMinNormal,
                   "delayed scale must be finite and at least 2^-126, found ", r.scale);
  }
  if (r.scaling == Scaling::kCurrent) {
    AMPSCOPE_CHECK(r.margin >= 0 && r.margin <= kMaxMargin, "margin must be from 0 to ", kMaxMargin,
                   ", found ", r.margin);
  }
}

// Per-tensor recipes and nvfp4 read the tensor's amax before rounding anything (delayed only to
// report it: `out` may overwrite x).
bool needs_tensor_amax(Scaling s) { return s != Scaling::kTile && s != Scaling::kMX; }

// Blocks a strip is cut into per group: about 16K elements, so that a group read by the amax
// pass is still in cache for the rounding pass.
constexpr std::size_t kGroupElements = std::size_t{1} << 14;
// FP16/BF16 inputs are converted to FP32 this many elements (or one strip) at a time.
constexpr std::size_t kChunkElements = std::size_t{1} << 16;

// The statistics side of fake_quantize_with_stats: compute_stats' own FP32 kernel run on each
// piece of x as the quantiser reaches it, into one accumulator, as compute_stats runs it on its
// threads' parts: the result does not depend on the cut but for sum_sq's last bits.
class StatsTap {
 public:
  explicit StatsTap(std::span<const TargetSpec> targets)
      : targets_(targets),
        thresholds_(detail::compute_thresholds(targets)),
        acc_(targets.size()),
        kernel_(detail::select_kernel(active_simd_level(), Format::kFP32, 0, StatsOptions{})) {}

  void add(const float* x, std::size_t n) {
    if (n > 0) kernel_(x, n, Format::kFP32, thresholds_, acc_);
  }
  // The finite amax of what was added (finite_amax's value).
  float amax() const { return std::bit_cast<float>(acc_.max_abs_bits); }
  TensorStats finish() const { return acc_.finish(targets_); }

 private:
  std::span<const TargetSpec> targets_;
  std::vector<detail::TargetThresholds> thresholds_;
  detail::StatsAccumulator acc_;
  detail::StatsKernel kernel_;
};

class Quantizer {
 public:
  // With a tap, every element is added to it just before it is rounded (the caller adds what
  // it reads itself first: a tensor amax pass).
  Quantizer(const Recipe& recipe, float tensor_amax, StatsTap* tap = nullptr)
      : recipe_(recipe), params_(recipe_rules::recipe_params(recipe)), tap_(tap) {
    counts_.recipe = recipe;
    counts_.amax = tensor_amax;
    scale_ = recipe_rules::tensor_scale(params_, tensor_amax);
    counts_.tensor_scale = scale_;
    if (scale_ != 0.0f) inverse_ = 1.0f / scale_;
  }

  // Rows [0, rows) of a [rows, cols] view: a whole number of block strips, or the tensor's last.
  void add_rows(const float* x, float* out, std::size_t rows, std::size_t cols) {
    if (rows == 0 || cols == 0) return;
    if (!is_block_recipe(recipe_.scaling)) {
      const std::size_t n = rows * cols;
      // With a tap, in groups that stay in cache from the statistics to the rounding.
      const std::size_t step = tap_ != nullptr ? kGroupElements : std::max<std::size_t>(n, 1);
      for (std::size_t i = 0; i < n; i += step) {
        const std::size_t m = std::min(step, n - i);
        if (tap_ != nullptr) tap_->add(x + i, m);
        count_inputs(x + i, m);
        quantize_span<false>(x + i, out ? out + i : nullptr, m, scale_, inverse_,
                             params_.element, tally_);
      }
      return;
    }
    const auto br = static_cast<std::size_t>(recipe_.block_rows);
    // With a tap, whole strips of about a group's size at a time (one call per short strip
    // would cost more than the kernel saves).
    const std::size_t tap_rows = br * std::max<std::size_t>(1, kGroupElements / (br * cols));
    for (std::size_t r0 = 0; r0 < rows; r0 += br) {
      if (tap_ != nullptr && r0 % tap_rows == 0) {
        tap_->add(x + r0 * cols, (std::min(rows, r0 + tap_rows) - r0) * cols);  // contiguous
      }
      add_strip(x, out, r0, std::min(rows, r0 + br), cols);
    }
  }

  RecipeCounts finish() {
    counts_.underflow = tally_.underflow;
    counts_.subnormal = tally_.subnormal;
    counts_.saturated = tally_.saturated;
    counts_.overflow += tally_.overflow;
    counts_.signal_sq = tally_.signal_sq;
    counts_.error_sq = tally_.error_sq;
    counts_.scale_histogram = BinadeHistogram::from_dense(histogram_);
    return counts_;
  }

 private:
  void count_inputs(const float* x, std::size_t n) {
    std::uint64_t nonfinite = 0;
    for (std::size_t i = 0; i < n; ++i) nonfinite += finite_bits(x[i]) ? 0 : 1;
    counts_.nonfinite += nonfinite;
    counts_.values += n - nonfinite;
  }

  void add_strip(const float* x, float* out, std::size_t r0, std::size_t r1, std::size_t cols) {
    const auto bc = static_cast<std::size_t>(recipe_.block_cols);
    const std::size_t strip_rows = r1 - r0;
    const std::size_t blocks = (cols + bc - 1) / bc;
    const std::size_t per_group = std::max<std::size_t>(1, kGroupElements / (strip_rows * bc));
    amax_.resize(per_group);
    nonfinite_.resize(per_group);
    scales_.resize(per_group);
    for (std::size_t b0 = 0; b0 < blocks; b0 += per_group) {
      const std::size_t b1 = std::min(blocks, b0 + per_group);
      std::fill(amax_.begin(), amax_.end(), 0.0f);
      std::fill(nonfinite_.begin(), nonfinite_.end(), 0);
      for (std::size_t r = r0; r < r1; ++r) {
        for (std::size_t b = b0; b < b1; ++b) {
          const std::size_t c0 = b * bc;
          const std::size_t n = std::min(cols, c0 + bc) - c0;
          const float* row = x + r * cols + c0;
          std::uint64_t bad = 0;
          float m = amax_[b - b0];
          for (std::size_t i = 0; i < n; ++i) {
            const float a = abs_of(row[i]);
            if (!finite_bits(a)) {
              ++bad;
            } else if (a > m) {
              m = a;
            }
          }
          amax_[b - b0] = m;
          nonfinite_[b - b0] += bad;
          counts_.nonfinite += bad;
          counts_.values += n - bad;
        }
      }
      for (std::size_t b = b0; b < b1; ++b) {
        const BlockScale s = recipe_rules::block_scale(params_, amax_[b - b0],
                                                       nonfinite_[b - b0] != 0, scale_);
        scales_[b - b0] = s;
        ++counts_.blocks;
        if (s.kind == BlockKind::kZero) ++counts_.zero_blocks;
        if (s.kind == BlockKind::kNaN) ++counts_.nan_blocks;
        if (s.kind == BlockKind::kScaled) ++histogram_[floor_log2(s.dec) - kHistogramMinExponent];
        if (amax_[b - b0] > counts_.amax) counts_.amax = amax_[b - b0];
      }
      for (std::size_t b = b0; b < b1; ++b) {
        const std::uint64_t saturated_before = tally_.saturated;
        for (std::size_t r = r0; r < r1; ++r) {
          const std::size_t c0 = b * bc;
          const std::size_t n = std::min(cols, c0 + bc) - c0;
          const std::size_t offset = r * cols + c0;
          quantize_block_row(x + offset, out ? out + offset : nullptr, n, scales_[b - b0]);
        }
        if (tally_.saturated != saturated_before) ++counts_.saturated_blocks;
      }
    }
  }

  void quantize_block_row(const float* x, float* out, std::size_t n, const BlockScale& s) {
    const bool multiply = recipe_.scaling == Scaling::kMX;  // x / 2^k as x * 2^-k, exactly
    switch (s.kind) {
      case BlockKind::kZero:
        if (out && out != x) std::copy(x, x + n, out);
        return;
      case BlockKind::kScaled:
        if (multiply) {
          quantize_span<false>(x, out, n, s.enc, s.dec, params_.element, tally_);
        } else {
          quantize_span<true>(x, out, n, s.enc, s.dec, params_.element, tally_);
        }
        return;
      case BlockKind::kNaN:
        for (std::size_t i = 0; i < n; ++i) {
          const float q = recipe_rules::nan_block_element(x[i], tally_);
          if (out) out[i] = q;
        }
        return;
      case BlockKind::kAllZero: {
        ElementTally tally = tally_;  // in a local for the loop, as in quantize_span
        for (std::size_t i = 0; i < n; ++i) {
          const float q = recipe_rules::all_zero_block_element(x[i], tally);
          if (out) out[i] = q;
        }
        tally_ = tally;
        return;
      }
    }
  }

  Recipe recipe_;
  RecipeParams params_;
  StatsTap* tap_;
  float scale_ = 1.0f;    // current, delayed: s; nvfp4: g
  float inverse_ = 1.0f;  // fl32(1 / s)
  RecipeCounts counts_;
  ElementTally tally_;
  std::array<std::uint64_t, kHistogramBins> histogram_{};
  std::vector<float> amax_;
  std::vector<std::uint64_t> nonfinite_;
  std::vector<BlockScale> scales_;
};

}  // namespace

double RecipeCounts::sqnr_db() const {
  if (signal_sq == 0.0) return std::numeric_limits<double>::quiet_NaN();
  if (error_sq == 0.0) return std::numeric_limits<double>::infinity();
  return 10.0 * std::log10(signal_sq / error_sq);
}

RecipeCounts fake_quantize(const float* x, float* out, std::size_t rows, std::size_t cols,
                           const Recipe& recipe) {
  check_recipe(recipe);
  const detail::ScopedDefaultMxcsr mxcsr;
  const float amax = needs_tensor_amax(recipe.scaling) ? finite_amax(x, rows * cols) : 0.0f;
  Quantizer q(recipe, amax);
  q.add_rows(x, out, rows, cols);
  return q.finish();
}

RecipeCounts fake_quantize_with_stats(const float* x, float* out, std::size_t rows,
                                      std::size_t cols, const Recipe& recipe,
                                      std::span<const TargetSpec> targets, TensorStats* stats) {
  check_recipe(recipe);
  AMPSCOPE_CHECK(stats != nullptr, "fake_quantize_with_stats needs somewhere to put the stats");
  AMPSCOPE_CHECK(rows * cols == 0 || x != nullptr, "null data pointer for ", rows * cols,
                 " elements");
  const detail::ScopedDefaultMxcsr mxcsr;
  StatsTap tap(targets);
  RecipeCounts counts;
  if (recipe.scaling == Scaling::kCurrent || recipe.scaling == Scaling::kNVFP4) {
    // The scale needs the tensor's amax before anything is rounded: the statistics pass gives
    // it (the amax pass fake_quantize makes), then the rounding pass reads x once more.
    tap.add(x, rows * cols);
    Quantizer q(recipe, tap.amax());
    q.add_rows(x, out, rows, cols);
    counts = q.finish();
  } else {
    // Delayed (its scale is given), tile and MX (block amaxes): one walk. A delayed recipe
    // reports the tensor's amax, which is the statistics' max_abs.
    Quantizer q(recipe, 0.0f, &tap);
    q.add_rows(x, out, rows, cols);
    counts = q.finish();
    if (recipe.scaling == Scaling::kDelayed) counts.amax = tap.amax();
  }
  *stats = tap.finish();
  return counts;
}

RecipeCounts recipe_counts(const void* data, std::size_t n, Format dtype, std::size_t row_length,
                           const Recipe& recipe) {
  AMPSCOPE_CHECK(is_stats_storage_format(dtype),
                 "recipe_counts reads a statistics storage "
                 "format (fp32, fp16, bf16, ...), found ",
                 format_name(dtype));
  const std::size_t cols = row_length == 0 ? n : row_length;
  AMPSCOPE_CHECK(cols == 0 || n % cols == 0, "row length ", cols, " does not divide ", n,
                 " elements");
  const std::size_t rows = cols == 0 ? 0 : n / cols;
  if (dtype == Format::kFP32) {
    return fake_quantize(static_cast<const float*>(data), nullptr, rows, cols, recipe);
  }
  check_recipe(recipe);
  const detail::ScopedDefaultMxcsr mxcsr;
  const auto* bytes = static_cast<const std::byte*>(data);
  const auto row_bytes = cols * static_cast<std::size_t>(storage_bytes(dtype));
  // Chunks of about kChunkElements: whole strips of block rows; or, where blocks are one row
  // high (and for per-tensor recipes), pieces of a long row cut at a block boundary, which
  // leaves every block as it is in the whole row.
  const std::size_t strip =
      is_block_recipe(recipe.scaling) ? static_cast<std::size_t>(recipe.block_rows) : 1;
  const std::size_t block_cols =
      is_block_recipe(recipe.scaling) ? static_cast<std::size_t>(recipe.block_cols) : 1;
  const bool split_rows = strip == 1 && cols > kChunkElements;
  const std::size_t piece = std::max(block_cols, kChunkElements / block_cols * block_cols);
  const std::size_t rows_per_chunk =
      strip * std::max<std::size_t>(1, kChunkElements / std::max<std::size_t>(1, strip * cols));
  std::vector<float> buffer(split_rows ? piece : std::min(rows, rows_per_chunk) * cols);
  // Calls fn(values, rows, cols) on each chunk converted to FP32, in order.
  auto for_each_chunk = [&](auto&& fn) {
    if (split_rows) {
      for (std::size_t r = 0; r < rows; ++r) {
        for (std::size_t c = 0; c < cols; c += piece) {
          const std::size_t m = std::min(cols - c, piece);
          convert_to_fp32(bytes + r * row_bytes + c * (row_bytes / cols), buffer.data(), m, dtype);
          fn(buffer.data(), std::size_t{1}, m);
        }
      }
      return;
    }
    for (std::size_t r = 0; r < rows; r += rows_per_chunk) {
      const std::size_t chunk_rows = std::min(rows - r, rows_per_chunk);
      convert_to_fp32(bytes + r * row_bytes, buffer.data(), chunk_rows * cols, dtype);
      fn(buffer.data(), chunk_rows, cols);
    }
  };
  float amax = 0.0f;
  if (needs_tensor_amax(recipe.scaling)) {
    for_each_chunk([&](const float* v, std::size_t r, std::size_t c) {
      amax = std::max(amax, finite_amax(v, r * c));
    });
  }
  Quantizer q(recipe, amax);
  for_each_chunk(
      [&](const float* v, std::size_t r, std::size_t c) { q.add_rows(v, nullptr, r, c); });
  return q.finish();
}

AmaxHistory::AmaxHistory(Format element, int length, int margin, Reduction reduction)
    : element_(element), length_(length), margin_(margin), reduction_(reduction) {
  AMPSCOPE_CHECK(is_element_format(element), "amax history element must be FP8/FP6/FP4, found ",
                 format_name(element));
  AMPSCOPE_CHECK(length >= 1, "amax history length must be at least 1, found ", length);
  AMPSCOPE_CHECK(margin >= 0 && margin <= kMaxMargin, "margin must be from 0 to ", kMaxMargin,
                 ", found ", margin);
}

void AmaxHistory::push(float amax) {
  if (static_cast<int>(history_.size()) == length_) history_.erase(history_.begin());
  history_.push_back(amax);
  update_scale();
}

void AmaxHistory::set_margin(int margin) {
  AMPSCOPE_CHECK(margin >= 0 && margin <= kMaxMargin, "margin must be from 0 to ", kMaxMargin,
                 ", found ", margin);
  margin_ = margin;
  update_scale();
}

void AmaxHistory::set_length(int length) {
  AMPSCOPE_CHECK(length >= 1, "amax history length must be at least 1, found ", length);
  length_ = length;
  if (static_cast<int>(history_.size()) > length) {
    history_.erase(history_.begin(), history_.end() - length);
  }
  update_scale();
}

bool is_block_recipe(Scaling s) {
  return s == Scaling::kTile || s == Scaling::kMX || s == Scaling::kNVFP4;
}

std::string_view scaling_name(Scaling s) {
  switch (s) {
    case Scaling::kCurrent:
      return "current";
    case Scaling::kDelayed:
      return "delayed";
    case Scaling::kTile:
      return "tile";
    case Scaling::kMX:
      return "mx";
    case Scaling::kNVFP4:
      return "nvfp4";
  }
  return "?";
}

void AmaxHistory::restore(std::span<const float> history, float scale) {
  AMPSCOPE_CHECK(history.size() <= static_cast<std::size_t>(length_), history.size(),
                 " amaxes for a history of length ", length_);
  AMPSCOPE_CHECK(std::isfinite(scale) && scale > 0.0f, "a delayed scale must be finite and ",
                 "positive, found ", scale);
  history_.assign(history.begin(), history.end());
  scale_ = scale;
}

void AmaxHistory::update_scale() {
  if (history_.empty()) return;
  const detail::ScopedDefaultMxcsr mxcsr;
  float amax = history_.back();
  if (reduction_ == Reduction::kMax) {
    // A NaN anywhere in the window makes the reduction NaN (torch.max propagates it).
    for (const float a : history_) {
      if (std::isnan(a) || a > amax) amax = a;
      if (std::isnan(amax)) break;
    }
  }
  scale_ = scale_from_amax(element_, amax, margin_, scale_);
}

// ---- Parsing and printing -----------------------------------------------------------------

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> parts;
  std::size_t start = 0;
  while (true) {
    const std::size_t p = s.find(sep, start);
    parts.push_back(s.substr(start, p == std::string_view::npos ? p : p - start));
    if (p == std::string_view::npos) return parts;
    start = p + 1;
  }
}

template <typename T>
bool parse_number(std::string_view s, T& value) {
  const char* end = s.data() + s.size();
  const auto [ptr, ec] = std::from_chars(s.data(), end, value);
  return !s.empty() && ec == std::errc() && ptr == end;
}

bool parse_shape(std::string_view s, int& rows, int& cols) {
  const std::size_t x = s.find('x');
  if (x == std::string_view::npos) return false;
  if (!parse_number(s.substr(0, x), rows) || !parse_number(s.substr(x + 1), cols)) return false;
  return rows >= 1 && cols >= 1 && rows <= kMaxBlockSide && cols <= kMaxBlockSide;
}

// The element formats a recipe can name: FP8, FP6 and FP4.
std::optional<Format> parse_element(std::string_view name) {
  const std::optional<Format> f = parse_format(name);
  if (!f || !is_element_format(*f)) return std::nullopt;
  return f;
}

struct MxName {
  const char* name;
  Format element;
};
constexpr MxName kMxNames[] = {{"mxfp8_e4m3", Format::kE4M3},
                               {"mxfp8_e5m2", Format::kE5M2},
                               {"mxfp6_e3m2", Format::kE3M2},
                               {"mxfp6_e2m3", Format::kE2M3},
                               {"mxfp4", Format::kE2M1}};

constexpr const char* kGrammar =
    "expected mxfp8_e4m3, mxfp8_e5m2, mxfp6_e3m2, mxfp6_e2m3, mxfp4 (options :block=RxC, :ceil), "
    "nvfp4 (:block=RxC), or ELEMENT:current[:margin=M], ELEMENT:scale=S, ELEMENT:tile=RxC with "
    "ELEMENT one of e4m3, e5m2, e3m2, e2m3, e2m1";

std::optional<Recipe> fail(std::string* error, const std::string& message) {
  if (error) *error = message;
  return std::nullopt;
}

std::string block_error(std::string_view option, std::string_view value) {
  return std::string(option) + " must be ROWSxCOLS with each from 1 to " +
         std::to_string(kMaxBlockSide) + " (found '" + std::string(value) + "')";
}

std::optional<Recipe> parse_block_recipe(Recipe r, const std::vector<std::string_view>& options,
                                         std::string* error) {
  const bool mx = r.scaling == Scaling::kMX;
  bool seen_block = false;
  bool seen_ceil = false;
  for (const std::string_view opt : options) {
    if (opt.starts_with("block=")) {
      if (seen_block) return fail(error, "block given twice");
      seen_block = true;
      if (!parse_shape(opt.substr(6), r.block_rows, r.block_cols)) {
        return fail(error, block_error("block", opt.substr(6)));
      }
    } else if (mx && opt == "ceil") {
      if (seen_ceil) return fail(error, "ceil given twice");
      seen_ceil = true;
      r.rounding = ScaleRounding::kCeil;
    } else {
      return fail(error, "unknown option '" + std::string(opt) + "' for " +
                             (mx ? "an MX recipe (block=RxC, ceil)" : "nvfp4 (block=RxC)"));
    }
  }
  return r;
}

std::optional<Recipe> parse_element_recipe(Format element,
                                           const std::vector<std::string_view>& options,
                                           std::string* error) {
  Recipe r;
  r.element = element;
  bool have_kind = false;
  bool seen_margin = false;
  for (const std::string_view opt : options) {
    const bool is_kind = opt == "current" || opt.starts_with("scale=") || opt.starts_with("tile=");
    if (is_kind && have_kind) {
      return fail(error,
                  "'" + std::string(opt) + "': give one of current, scale=S and tile=RxC, once");
    }
    if (opt == "current") {
      r.scaling = Scaling::kCurrent;
    } else if (opt.starts_with("scale=")) {
      r.scaling = Scaling::kDelayed;
      const std::string_view v = opt.substr(6);
      if (!parse_number(v, r.scale) || !std::isfinite(r.scale) || r.scale < kMinNormal) {
        return fail(error, "scale must be a finite FP32 number from 2^-126 to FP32 max (found '" +
                               std::string(v) + "')");
      }
    } else if (opt.starts_with("tile=")) {
      r.scaling = Scaling::kTile;
      if (!parse_shape(opt.substr(5), r.block_rows, r.block_cols)) {
        return fail(error, block_error("tile", opt.substr(5)));
      }
    } else if (opt.starts_with("margin=")) {
      if (seen_margin) return fail(error, "margin given twice");
      seen_margin = true;
      const std::string_view v = opt.substr(7);
      if (!parse_number(v, r.margin) || r.margin < 0 || r.margin > kMaxMargin) {
        return fail(error, "margin must be an integer from 0 to " + std::to_string(kMaxMargin) +
                               " (found '" + std::string(v) + "')");
      }
    } else {
      return fail(error, "unknown option '" + std::string(opt) +
                             "': expected current, margin=M, scale=S or tile=RxC");
    }
    have_kind = have_kind || is_kind;
  }
  if (!have_kind) {
    return fail(error, "a recipe on " + std::string(format_name(element)) +
                           " needs current, scale=S or tile=RxC");
  }
  if (seen_margin && r.scaling != Scaling::kCurrent) {
    return fail(error, "margin applies to current scaling only");
  }
  return r;
}

}  // namespace

std::optional<Recipe> parse_recipe(std::string_view text, std::string* error) {
  const std::string s = lower(text);
  const std::vector<std::string_view> parts = split(s, ':');
  const std::vector<std::string_view> options(parts.begin() + 1, parts.end());
  for (const std::string_view opt : options) {
    if (opt.empty()) return fail(error, "empty option (two ':' in a row or a trailing ':')");
  }
  const std::string_view name = parts[0];
  for (const MxName& mx : kMxNames) {
    if (name != mx.name) continue;
    Recipe r;
    r.scaling = Scaling::kMX;
    r.element = mx.element;
    r.block_rows = 1;
    r.block_cols = 32;
    return parse_block_recipe(r, options, error);
  }
  if (name == "nvfp4") {
    Recipe r;
    r.scaling = Scaling::kNVFP4;
    r.element = Format::kE2M1;
    r.block_rows = 1;
    r.block_cols = 16;
    return parse_block_recipe(r, options, error);
  }
  const std::optional<Format> element = parse_element(name);
  if (!element) return fail(error, "unknown recipe '" + std::string(name) + "': " + kGrammar);
  return parse_element_recipe(*element, options, error);
}

std::string to_string(const Recipe& r) {
  const std::string element(format_name(r.element));
  const std::string block = std::to_string(r.block_rows) + "x" + std::to_string(r.block_cols);
  switch (r.scaling) {
    case Scaling::kMX: {
      std::string s = "mx_" + element;  // not reached: every element has an MX name
      for (const MxName& mx : kMxNames) {
        if (r.element == mx.element) s = mx.name;
      }
      if (r.block_rows != 1 || r.block_cols != 32) s += ":block=" + block;
      if (r.rounding == ScaleRounding::kCeil) s += ":ceil";
      return s;
    }
    case Scaling::kNVFP4:
      return (r.block_rows != 1 || r.block_cols != 16) ? "nvfp4:block=" + block : "nvfp4";
    case Scaling::kCurrent:
      return element + ":current" + (r.margin ? ":margin=" + std::to_string(r.margin) : "");
    case Scaling::kDelayed: {
      char buf[32];
      const auto res = std::to_chars(buf, buf + sizeof buf, r.scale);  // shortest round trip
      return element + ":scale=" + std::string(buf, res.ptr);
    }
    case Scaling::kTile:
      return element + ":tile=" + block;
  }
  return element;
}

bool looks_like_recipe(std::string_view text) {
  const std::string s = lower(text);
  return s.find(':') != std::string::npos || s.starts_with("mx") || s.starts_with("nv");
}

}  // namespace ampscope
