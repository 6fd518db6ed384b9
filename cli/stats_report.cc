// Rendering of `ampscope stats`. The readable report is laid out for a terminal of 100 columns;
// the histogram is the centre piece because it is what a user compares with the formats.
#include "stats_report.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "npy.h"

namespace ampscope::cli {
namespace {

// The formats a user compares a tensor with, in the order of the histogram's mark columns.
constexpr std::array<Format, 4> kComparedFormats = {Format::kFP16, Format::kBF16, Format::kE4M3,
                                                    Format::kE5M2};
constexpr int kBarWidth = 40;

// Everything formatted through here is short (numbers, format names, labels): no path or other
// user text, so the fixed buffer cannot truncate.
template <typename... Args>
std::string printf_string(const char* fmt, Args... args) {
  char buf[256];
  std::snprintf(buf, sizeof buf, fmt, args...);
  return buf;
}

std::string count_string(std::uint64_t n) {
  return printf_string("%llu", static_cast<unsigned long long>(n));
}

// Shares are rounded to two decimals, but a share that is not exactly 0 or 100% never prints as
// such: one NaN in a billion values is the finding, not a rounding error.
std::string share_string(std::uint64_t count, std::uint64_t total) {
  if (total == 0) return "-";
  if (count == 0) return "0%";
  if (count == total) return "100%";
  const double pct = 100.0 * static_cast<double>(count) / static_cast<double>(total);
  if (pct < 0.005) return "<0.01%";
  if (pct >= 99.995) return ">99.99%";
  return printf_string("%.2f%%", pct);
}

std::string value_string(double v) { return printf_string("%.7g", v); }

// "= 2^-28.30": where a magnitude sits on the binade axis of the histogram.
std::string log2_string(double v) { return printf_string("= 2^%.2f", std::log2(v)); }

void print_header(std::ostream& out, const TensorInfo& info) {
  out << info.path << ": " << format_name(info.dtype) << " ('" << info.descr << "'), shape "
      << npy::shape_to_string(info.shape) << (info.fortran_order ? ", Fortran order" : "")
      << "\n\n";
}

void print_count_row(std::ostream& out, const char* label, std::uint64_t n, std::uint64_t total) {
  out << printf_string("  %-16s %14s  %s\n", label, count_string(n).c_str(),
                       share_string(n, total).c_str());
}

void print_counts(std::ostream& out, const TensorStats& s) {
  out << printf_string("  %-16s %14s\n", "elements", count_string(s.numel).c_str());
  print_count_row(out, "zeros", s.zeros, s.numel);
  print_count_row(out, "NaN", s.nan, s.numel);
  print_count_row(out, "+Inf", s.pos_inf, s.numel);
  print_count_row(out, "-Inf", s.neg_inf, s.numel);
  print_count_row(out, "finite nonzero", s.finite_nonzero(), s.numel);
}

// Mean and RMS are over the finite values, zeros included: what the sums cover.
void print_magnitudes(std::ostream& out, const TensorStats& s) {
  const std::uint64_t finite = s.numel - s.nonfinite();
  if (s.finite_nonzero() > 0) {
    out << printf_string("  %-16s %14s  %s\n", "max |x|", value_string(s.max_abs).c_str(),
                         log2_string(s.max_abs).c_str());
    out << printf_string("  %-16s %14s  %s\n", "min |x| > 0",
                         value_string(s.min_abs_nonzero).c_str(),
                         log2_string(s.min_abs_nonzero).c_str());
    out << printf_string("  %-16s %14.2f  binades\n", "dynamic range",
                         std::log2(s.max_abs) - std::log2(s.min_abs_nonzero));
  }
  if (finite > 0) {
    const double n = static_cast<double>(finite);
    out << printf_string("  %-16s %14s  (over finite values)\n", "mean",
                         value_string(s.sum / n).c_str());
    out << printf_string("  %-16s %14s\n", "RMS", value_string(std::sqrt(s.sum_sq / n)).c_str());
  }
}

void print_format_ranges(std::ostream& out) {
  out << printf_string("  %-8s %-14s %-14s %s\n", "format", "normal e", "subnormal e",
                       "max finite");
  for (Format f : kComparedFormats) {
    const FormatInfo& fi = format_info(f);
    const std::string normal = printf_string("%d .. %d", fi.min_normal_exponent, fi.max_exponent);
    const std::string subnormal =
        printf_string("%d .. %d", fi.min_subnormal_exponent, fi.min_normal_exponent - 1);
    out << printf_string("  %-8s %-14s %-14s %.7g\n", fi.name, normal.c_str(), subnormal.c_str(),
                         fi.max_finite);
  }
}

std::string bar(std::uint64_t count, std::uint64_t largest) {
  if (count == 0) return "";
  // At least one character, so that a handful of values far out in the tail stay visible.
  const double frac = static_cast<double>(count) / static_cast<double>(largest);
  const int len = std::max(1, static_cast<int>(std::lround(frac * kBarWidth)));
  return std::string(static_cast<std::size_t>(len), '#');
}

void print_histogram(std::ostream& out, const TensorStats& s) {
  const BinadeHistogram& h = s.histogram;
  out << "\nbinade histogram: e = floor(log2 |x|) over the finite nonzero values\n\n";
  if (h.empty()) {
    out << "  (no finite nonzero values)\n";
    return;
  }
  print_format_ranges(out);
  out << "  marks: N normal, s subnormal, 0 rounds to zero, X overflows (bulk of the binade, "
         "unscaled)\n\n";
  out << "      e           count    share  fp16 bf16 e4m3 e5m2\n";
  const std::uint64_t total = h.total();
  const std::uint64_t largest = *std::max_element(h.counts.begin(), h.counts.end());
  // Largest magnitudes first, like a number line read from the top.
  for (int e = h.max_exponent(); e >= h.min_exponent; --e) {
    const std::uint64_t c = h.count_at(e);
    std::string marks;
    for (Format f : kComparedFormats) marks += printf_string("    %c", binade_mark(e, f));
    out << printf_string("  %5d %15s %8s%s  |%s\n", e, count_string(c).c_str(),
                         share_string(c, total).c_str(), marks.c_str(), bar(c, largest).c_str());
  }
}

void print_targets(std::ostream& out, const TensorStats& s) {
  if (s.targets.empty()) return;
  out << "\ntargets: x * 2^k rounded to nearest even into the format; shares of all " << s.numel
      << " elements\n";
  out << printf_string("  %-12s %15s %8s %15s %8s %15s %8s\n", "target", "overflow", "share",
                       "underflow", "share", "subnormal", "share");
  for (const TargetCounts& t : s.targets) {
    out << printf_string(
        "  %-12s %15s %8s %15s %8s %15s %8s\n", to_string(t.target).c_str(),
        count_string(t.overflow).c_str(), share_string(t.overflow, s.numel).c_str(),
        count_string(t.underflow).c_str(), share_string(t.underflow, s.numel).c_str(),
        count_string(t.subnormal).c_str(), share_string(t.subnormal, s.numel).c_str());
  }
}

std::string sqnr_string(const RecipeCounts& c) {
  const double db = c.sqnr_db();
  if (std::isnan(db)) return "-";
  if (std::isinf(db)) return "exact";
  return printf_string("%.2f", db);
}

// "block scales 2^-12 .. 2^3 over 4096 blocks (12 zero, 3 saturated, 0 NaN)" and the binades as
// "e:count" pairs, wrapped to the report's width.
void print_block_scales(std::ostream& out, const RecipeCounts& c) {
  const BinadeHistogram& h = c.scale_histogram;
  std::string line = "    " + count_string(c.blocks) + " blocks (" + count_string(c.zero_blocks) +
                     " zero, " + count_string(c.saturated_blocks) + " with a saturated value, " +
                     count_string(c.nan_blocks) + " NaN)";
  if (h.empty()) {
    out << line << "\n";
    return;
  }
  line += printf_string("; scales 2^%d .. 2^%d:", h.min_exponent, h.max_exponent());
  for (int e = h.min_exponent; e <= h.max_exponent(); ++e) {
    const std::uint64_t n = h.count_at(e);
    if (n == 0) continue;
    const std::string item = printf_string(" %d:", e) + count_string(n);
    if (line.size() + item.size() > 98) {
      out << line << "\n";
      line = "     ";
    }
    line += item;
  }
  out << line << "\n";
}

void print_recipes(std::ostream& out, const std::vector<RecipeCounts>& recipes) {
  if (recipes.empty()) return;
  out << "\nrecipes: x scaled, rounded to nearest even into the element (saturating) and decoded; "
         "shares of\nthe finite values; SQNR = 10 log10(sum x^2 / sum (x - decoded)^2)\n";
  out << printf_string("  %-20s %10s %7s %10s %7s %10s %7s %9s %8s\n", "recipe", "underflow",
                       "share", "subnormal", "share", "saturated", "share", "overflow", "SQNR dB");
  for (const RecipeCounts& c : recipes) {
    const std::uint64_t n = c.values;
    std::string name = to_string(c.recipe);
    if (name.size() > 20) {
      out << "  " << name << "\n";
      name.clear();
    }
    out << printf_string("  %-20s %10s %7s %10s %7s %10s %7s %9s %8s\n", name.c_str(),
                         count_string(c.underflow).c_str(), share_string(c.underflow, n).c_str(),
                         count_string(c.subnormal).c_str(), share_string(c.subnormal, n).c_str(),
                         count_string(c.saturated).c_str(), share_string(c.saturated, n).c_str(),
                         count_string(c.overflow).c_str(), sqnr_string(c).c_str());
    if (c.recipe.scaling == Scaling::kCurrent || c.recipe.scaling == Scaling::kDelayed) {
      out << "    scale " << value_string(c.tensor_scale) << " (" << log2_string(c.tensor_scale)
          << "), amax " << value_string(c.amax) << "\n";
      continue;
    }
    if (c.recipe.scaling == Scaling::kNVFP4) {
      out << "    tensor decode scale " << value_string(c.tensor_scale) << " ("
          << log2_string(c.tensor_scale) << "), amax " << value_string(c.amax) << "\n";
    }
    print_block_scales(out, c);
  }
}

nlohmann::ordered_json recipe_json(const RecipeCounts& c) {
  nlohmann::ordered_json j;
  const Recipe& r = c.recipe;
  j["recipe"] = to_string(r);
  j["scaling"] = std::string(scaling_name(r.scaling));
  j["element"] = std::string(format_name(r.element));
  if (is_block_recipe(r.scaling)) {
    j["block_rows"] = r.block_rows;
    j["block_cols"] = r.block_cols;
  }
  if (r.scaling == Scaling::kMX) {
    j["scale_rounding"] = r.rounding == ScaleRounding::kCeil ? "ceil" : "floor";
  }
  if (r.scaling == Scaling::kCurrent) j["margin"] = r.margin;
  j["values"] = c.values;
  j["nonfinite"] = c.nonfinite;
  j["underflow"] = c.underflow;
  j["subnormal"] = c.subnormal;
  j["saturated"] = c.saturated;
  j["overflow"] = c.overflow;
  j["amax"] = c.amax;
  j["signal_sq"] = c.signal_sq;
  j["error_sq"] = c.error_sq;
  const double db = c.sqnr_db();
  j["sqnr_db"] = std::isfinite(db) ? nlohmann::ordered_json(db) : nlohmann::ordered_json(nullptr);
  j["tensor_scale"] = c.tensor_scale;
  j["blocks"] = c.blocks;
  j["zero_blocks"] = c.zero_blocks;
  j["saturated_blocks"] = c.saturated_blocks;
  j["nan_blocks"] = c.nan_blocks;
  j["scale_histogram"] = {{"min_exponent", c.scale_histogram.min_exponent},
                          {"counts", c.scale_histogram.counts}};
  return j;
}

}  // namespace

char binade_mark(int e, Format f) {
  // The binade's midpoint 1.5 * 2^e stands for its bulk: thresholds sit at a binade's edge (the
  // underflow tie 2^(min_subnormal-1)) or near its top (max finite + ulp/2), except for E4M3,
  // whose top binade [256, 512) overflows from 464 on.
  const FormatInfo& fi = format_info(f);
  const double y = std::ldexp(1.5, e);
  const bool overflows =
      fi.overflow_inclusive ? y >= fi.overflow_threshold : y > fi.overflow_threshold;
  if (overflows) return 'X';
  if (y <= 0.5 * fi.min_subnormal()) return '0';
  if (y < fi.min_normal() - 0.5 * fi.min_subnormal()) return 's';
  return 'N';
}

void print_stats_text(std::ostream& out, const TensorInfo& info, const TensorStats& stats,
                      const std::vector<RecipeCounts>& recipes) {
  print_header(out, info);
  print_counts(out, stats);
  print_magnitudes(out, stats);
  print_histogram(out, stats);
  print_targets(out, stats);
  print_recipes(out, recipes);
}

void print_stats_json(std::ostream& out, const TensorInfo& info, const TensorStats& s,
                      const std::vector<RecipeCounts>& recipes) {
  // ordered_json keeps the fields in TensorStats order. nlohmann writes doubles in the shortest
  // form that parses back to the same value (at most max_digits10 = 17 significant digits).
  nlohmann::ordered_json j;
  j["dtype"] = std::string(format_name(info.dtype));
  j["shape"] = info.shape;
  j["numel"] = s.numel;
  j["zeros"] = s.zeros;
  j["nan"] = s.nan;
  j["pos_inf"] = s.pos_inf;
  j["neg_inf"] = s.neg_inf;
  j["max_abs"] = s.max_abs;
  j["min_abs_nonzero"] = s.min_abs_nonzero;
  j["sum"] = s.sum;
  j["sum_sq"] = s.sum_sq;
  j["histogram"] = {{"min_exponent", s.histogram.min_exponent}, {"counts", s.histogram.counts}};
  j["targets"] = nlohmann::ordered_json::array();
  for (const TargetCounts& t : s.targets) {
    j["targets"].push_back({{"format", std::string(format_name(t.target.format))},
                            {"scale_log2", t.target.scale_log2},
                            {"overflow", t.overflow},
                            {"underflow", t.underflow},
                            {"subnormal", t.subnormal}});
  }
  j["recipes"] = nlohmann::ordered_json::array();
  for (const RecipeCounts& c : recipes) j["recipes"].push_back(recipe_json(c));
  out << j.dump() << "\n";
}

}  // namespace ampscope::cli
