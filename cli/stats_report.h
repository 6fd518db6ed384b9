// The two renderings of `ampscope stats`: a report for people and one JSON object for scripts.
// Both are pure functions of the statistics; they do no I/O besides writing to `out`.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "ampscope/formats.h"
#include "ampscope/recipe.h"
#include "ampscope/tensor_stats.h"

namespace ampscope::cli {

// What the report says about the tensor besides its statistics.
struct TensorInfo {
  std::string path;
  std::string descr;             // the file's dtype as written, e.g. "<u2"
  Format dtype = Format::kFP32;  // how the elements were read
  std::vector<std::uint64_t> shape;
  bool fortran_order = false;
};

// The readable report: counts with shares, extrema, mean and RMS, the dynamic range, the binade
// histogram against the FP16/BF16/E4M3/E5M2 ranges, a table of the targets, and a table of the
// recipes (counts, SQNR, the tensor scale or the block scales' binades).
void print_stats_text(std::ostream& out, const TensorInfo& info, const TensorStats& stats,
                      const std::vector<RecipeCounts>& recipes = {});

// One line of JSON: the TensorStats fields under their own names, plus "dtype" and "shape", and
// "recipes": per recipe its canonical text, its parameters and every RecipeCounts field, plus
// "sqnr_db" (null when it is not a finite number: see signal_sq and error_sq).
// Doubles are written so that they parse back to the same value.
void print_stats_json(std::ostream& out, const TensorInfo& info, const TensorStats& stats,
                      const std::vector<RecipeCounts>& recipes = {});

// How the bulk of binade e (values in [2^e, 2^(e+1)), at scale 1) fares in format f:
// 'N' normal, 's' subnormal, '0' rounds to zero, 'X' overflows. Exposed for tests.
char binade_mark(int e, Format f);

}  // namespace ampscope::cli
