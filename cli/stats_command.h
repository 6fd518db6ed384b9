// `ampscope stats FILE.npy`: statistics of a tensor saved with NumPy.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ampscope/formats.h"
#include "ampscope/recipe.h"
#include "ampscope/tensor_stats.h"
#include "npy.h"

namespace CLI {
class App;
}

namespace ampscope::cli {

// Registers the subcommand and its options on `app`; its callback runs the command.
void add_stats_command(CLI::App& app);

// The --dtype value: nullopt for "auto", else a statistics storage format (fp32, fp16, bf16,
// e4m3, e5m2, or an alias parse_format knows). Throws UsageError otherwise.
std::optional<Format> parse_dtype_option(const std::string& text);

// The storage format to read the file's elements as. Without --dtype, float32 and float16 files
// are read as they are; with it, raw words of the right width (uint16 holding bfloat16 bits,
// say) are reinterpreted too. Throws InputError naming `path` when the two do not fit.
Format resolve_dtype(const npy::Header& header, std::optional<Format> requested,
                     const std::string& path);

// The --target values, in the order given: FORMAT@K targets (a format and a power-of-two
// factor) and scaled recipes (mxfp8_e4m3, nvfp4, e4m3:current, ...), told apart by
// looks_like_recipe.
struct StatsTargets {
  std::vector<TargetSpec> formats;
  std::vector<Recipe> recipes;
};

// Parses every --target value. Throws UsageError naming the bad one.
StatsTargets parse_targets(const std::vector<std::string>& texts);

// The row length recipes read a file's elements in: its last dimension (1 for a scalar, 0 for
// an empty shape). Block recipes need C order; a Fortran-order array of two or more dimensions
// is refused for them (InputError naming `path`); per-tensor recipes read it either way.
std::size_t recipe_row_length(const npy::Header& header, const std::vector<Recipe>& recipes,
                              const std::string& path);

}  // namespace ampscope::cli
