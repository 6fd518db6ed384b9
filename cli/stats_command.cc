// `ampscope stats`: map the file, decide how to read its elements, one compute_stats pass,
// render. Everything the user typed is checked before the file is opened, so a typo in --target
// does not cost a pass over a large tensor.
#include "stats_command.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <iostream>
#include <memory>

#include "command.h"
#include "stats_report.h"

namespace ampscope::cli {
namespace {

struct StatsArgs {
  std::string file;
  std::string dtype = "auto";
  std::vector<std::string> targets;
  bool json = false;
};

// NumPy's name for a dtype, to go with the descr in messages: "float64" for '<f8'.
std::string numpy_name(const npy::Dtype& d) {
  const std::string bits = std::to_string(8 * d.itemsize);
  switch (d.kind) {
    case 'b':
      return "bool";
    case 'i':
      return "int" + bits;
    case 'u':
      return "uint" + bits;
    case 'f':
      return "float" + bits;
    case 'c':
      return "complex" + bits;
    default:
      return "void" + bits;
  }
}

std::string describe(const npy::Header& h) {
  return "'" + h.descr + "' (" + numpy_name(h.dtype) + ")";
}

void run_stats(const StatsArgs& args) {
  const std::optional<Format> requested = parse_dtype_option(args.dtype);
  const StatsTargets targets = parse_targets(args.targets);
  const npy::NpyFile file = npy::load_npy(args.file);
  const npy::Header& h = file.header();
  const Format dtype = resolve_dtype(h, requested, args.file);
  const std::size_t row_length = recipe_row_length(h, targets.recipes, args.file);
  const TensorStats stats = compute_stats(file.data(), h.numel(), dtype, targets.formats);
  std::vector<RecipeCounts> recipes;
  for (const Recipe& r : targets.recipes) {
    recipes.push_back(recipe_counts(file.data(), h.numel(), dtype, row_length, r));
  }
  const TensorInfo info{args.file, h.descr, dtype, h.shape, h.fortran_order};
  if (args.json) {
    print_stats_json(std::cout, info, stats, recipes);
  } else {
    print_stats_text(std::cout, info, stats, recipes);
  }
}

}  // namespace

std::optional<Format> parse_dtype_option(const std::string& text) {
  if (text == "auto") return std::nullopt;
  const std::optional<Format> f = parse_format(text);
  if (!f || !is_stats_storage_format(*f)) {
    throw UsageError("--dtype '" + text + "': expected auto, fp32, fp16, bf16, e4m3 or e5m2");
  }
  return f;
}

Format resolve_dtype(const npy::Header& h, std::optional<Format> requested,
                     const std::string& path) {
  const npy::Dtype& d = h.dtype;
  const bool is_float = d.kind == 'f';
  // Frameworks save bfloat16 tensors as their bits: uint16/int16 (torch .view), void (ml_dtypes).
  const bool is_raw_word = d.kind == 'u' || d.kind == 'i' || d.kind == 'V';
  if (!requested) {
    if (is_float && d.itemsize == 4) return Format::kFP32;
    if (is_float && d.itemsize == 2) return Format::kFP16;
    if (is_raw_word && d.itemsize == 2) {
      throw InputError(path + ": dtype " + describe(h) +
                       " holds raw 16-bit words; pass --dtype bf16 (or fp16) to say what they are");
    }
    throw InputError(path + ": unsupported dtype " + describe(h) +
                     "; ampscope stats reads float32 ('<f4'), float16 ('<f2') and bfloat16 bits "
                     "as uint16 ('<u2') with --dtype bf16");
  }
  const std::size_t width = static_cast<std::size_t>(storage_bytes(*requested));
  // A float file is only ever read as its own format: float16 bits are not bfloat16 bits.
  const bool float_matches = is_float && *requested != Format::kBF16;
  if (d.itemsize == width && (is_raw_word || float_matches)) return *requested;
  throw InputError(path + ": --dtype " + std::string(format_name(*requested)) + " reads " +
                   std::to_string(width) + "-byte " +
                   (*requested == Format::kBF16 ? "" : "float or ") +
                   "integer words, but the file holds " + describe(h));
}

StatsTargets parse_targets(const std::vector<std::string>& texts) {
  StatsTargets targets;
  for (const std::string& text : texts) {
    std::string error;
    if (looks_like_recipe(text)) {
      const std::optional<Recipe> r = parse_recipe(text, &error);
      if (!r) throw UsageError("--target '" + text + "': " + error);
      targets.recipes.push_back(*r);
    } else {
      const std::optional<TargetSpec> t = parse_target(text, &error);
      if (!t) throw UsageError("--target '" + text + "': " + error);
      targets.formats.push_back(*t);
    }
  }
  return targets;
}

std::size_t recipe_row_length(const npy::Header& h, const std::vector<Recipe>& recipes,
                              const std::string& path) {
  if (h.shape.empty()) return 1;  // a scalar: one row of one
  const bool blocks = std::any_of(recipes.begin(), recipes.end(), [](const Recipe& r) {
    return r.scaling == Scaling::kTile || r.scaling == Scaling::kMX || r.scaling == Scaling::kNVFP4;
  });
  if (blocks && h.fortran_order && h.shape.size() >= 2) {
    throw InputError(path + ": Fortran-order array of shape " + npy::shape_to_string(h.shape) +
                     ": block recipes read blocks along the last dimension, which Fortran order "
                     "does not store contiguously; save np.ascontiguousarray(x) instead");
  }
  return static_cast<std::size_t>(h.shape.back());
}

void add_stats_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("stats", "Statistics of a tensor saved with numpy.save");
  cmd->footer(
      "Prints counts of zeros, NaN and Inf, extrema, mean and RMS, the binade histogram against\n"
      "the FP16/BF16/FP8 ranges, and exact counts for each --target.\n\n"
      "A --target is FORMAT@K (x * 2^K rounded into FORMAT) or a scaled RECIPE; recipes read\n"
      "rows along the array's last dimension (docs/numerics.md, 'Scaled recipes'):\n"
      "  mxfp8_e4m3 mxfp8_e5m2 mxfp6_e3m2 mxfp6_e2m3 mxfp4\n"
      "                                OCP MX: 1x32 blocks, E8M0 scale 2^(floor(log2 amax) - "
      "emax);\n"
      "                                :block=RxC (32x1: down the columns), :ceil (scale rounded "
      "up)\n"
      "  nvfp4                         E2M1 in 1x16 blocks, E4M3 block scales, FP32 tensor scale;\n"
      "                                :block=RxC\n"
      "  ELEMENT:current[:margin=M]    per-tensor scale max / amax / 2^M\n"
      "  ELEMENT:scale=S               per-tensor scale S (delayed scaling)\n"
      "  ELEMENT:tile=RxC              FP32 scale amax / max per RxC tile (1x128, 128x128)\n"
      "  ELEMENT: e4m3 e5m2 e3m2 e2m3 e2m1\n"
      "For each: values that underflow, become subnormal, saturate or overflow, the SQNR (dB)\n"
      "and the block scales' binades.\n\n" +
      std::string(kExitStatusHelp));
  // The callback outlives this function; the options write into this shared state.
  auto args = std::make_shared<StatsArgs>();
  cmd->add_option("FILE", args->file,
                  "A .npy file (format 1.0, 2.0 or 3.0) of float32 or "
                  "float16 values, or of bfloat16 bits saved as uint16")
      ->required()
      ->type_name("");
  cmd->add_option("--dtype", args->dtype,
                  "How to read the elements: auto (float32/float16 as stored), fp32, fp16, "
                  "bf16, e4m3 or e5m2 (these also read integer or void words of their width as "
                  "that format's bits: bfloat16 as uint16, float8 as uint8)")
      ->type_name("auto|fp32|fp16|bf16|e4m3|e5m2")
      ->default_str("auto");
  cmd->add_option(
         "--target", args->targets,
         "FORMAT@SCALE_LOG2, e.g. fp16@16 or e4m3@-3 (repeatable): exact counts of "
         "values that overflow, underflow or become subnormal when x * 2^SCALE_LOG2 is "
         "rounded into FORMAT (fp32, fp16, bf16, e4m3, e5m2, e3m2, e2m3, e2m1); or a scaled "
         "RECIPE, "
         "e.g. mxfp8_e4m3, nvfp4, e4m3:current (listed below)")
      ->type_name("FORMAT@K|RECIPE");
  cmd->add_flag("--json", args->json,
                "Print one JSON object (TensorStats fields plus dtype and shape, and the "
                "RecipeCounts of each recipe under \"recipes\") instead of the report");
  cmd->callback([args] { run_stats(*args); });
}

}  // namespace ampscope::cli
