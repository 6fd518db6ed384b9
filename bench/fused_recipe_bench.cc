// The FP8/FP4 quantiser with and without the statistics fused into it (docs/benchmarks.md).
//
// A trainer under an FP8/FP4 recipe quantises each GEMM input (fake_quantize: an amax pass where
// the scale needs one, then the rounding pass), and an agent taking full statistics measures
// the same tensor again (compute_stats). fake_quantize_with_stats measures each piece just
// before it rounds it, while it is in cache. This times, on a GEMM input of the agent
// benchmark's model (1,024 tokens x 512 features, FP32 holding BF16 values), interleaved on the
// same buffer:
//   separate  fake_quantize, then compute_stats with the targets (the kernels' pool, as the
//             agent calls it)
//   fused     fake_quantize_with_stats with the same targets (one thread)
// for a delayed (E4M3, the scale current scaling would pick), a current (E4M3), an MX
// (mxfp8_e4m3) and an NVFP4 recipe, and writes recipe_stats_fused_speedup_<recipe> (separate
// time / fused time) with both times. Checks first that both give the same counts and
// statistics.
//
//   ampscope_fused_recipe_bench --out FRAGMENT.json [--rows 1024] [--cols 512] [--calls 20]
//                               [--reps 15] [--targets bf16@0,e4m3@0]
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ampscope/convert.h"
#include "ampscope/recipe.h"
#include "ampscope/tensor_stats.h"
#include "gradient_data.h"
#include "timing.h"

namespace {

using namespace ampscope;

struct Case {
  std::string label;
  Recipe recipe;
};

Recipe parsed(const std::string& text) {
  std::string error;
  const auto r = parse_recipe(text, &error);
  if (!r) throw std::runtime_error("recipe '" + text + "': " + error);
  return *r;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t rows = 1024, cols = 512;
  int calls = 20, reps = 15;
  std::vector<std::string> target_texts = {"bf16@0", "e4m3@0"};
  std::string out;
  CLI::App app{"fake_quantize + compute_stats against fake_quantize_with_stats"};
  app.add_option("--rows", rows, "GEMM input rows (tokens)")->capture_default_str();
  app.add_option("--cols", cols, "GEMM input columns (the reduction axis)")->capture_default_str();
  app.add_option("--calls", calls, "calls per timed round")->capture_default_str();
  app.add_option("--reps", reps, "timed rounds (median)")->capture_default_str();
  app.add_option("--targets", target_texts, "what-if targets of the statistics")->delimiter(',');
  app.add_option("--out", out, "JSON fragment to write")->required();
  CLI11_PARSE(app, argc, argv);

  try {
    std::vector<TargetSpec> targets;
    for (const std::string& t : target_texts) {
      std::string error;
      const auto spec = parse_target(t, &error);
      if (!spec) throw std::runtime_error("target '" + t + "': " + error);
      targets.push_back(*spec);
    }
    const std::size_t n = rows * cols;
    // Activation-like values as the trainer's BF16 GEMM inputs hold them.
    std::vector<float> x(n), q(n);
    bench::fill_gradients(x.data(), n, Format::kFP32, bench::GradientSpec{}, 1);
    std::vector<std::uint16_t> bf16(n);
    convert_from_fp32(x.data(), bf16.data(), n, Format::kBF16);
    convert_to_fp32(bf16.data(), x.data(), n, Format::kBF16);

    Recipe delayed = parsed("e4m3:current");
    delayed.scaling = Scaling::kDelayed;
    delayed.scale = static_cast<float>(
        fake_quantize(x.data(), nullptr, rows, cols, parsed("e4m3:current")).tensor_scale);
    const Case cases[] = {{"delayed", delayed},
                          {"current", parsed("e4m3:current")},
                          {"mx", parsed("mxfp8_e4m3")},
                          {"nvfp4", parsed("nvfp4")}};

    nlohmann::ordered_json j;
    for (const Case& c : cases) {
      TensorStats fused_stats;
      const RecipeCounts fused_counts =
          fake_quantize_with_stats(x.data(), q.data(), rows, cols, c.recipe, targets, &fused_stats);
      const TensorStats stats = compute_stats(x.data(), n, Format::kFP32, targets);
      if (fused_counts != fake_quantize(x.data(), q.data(), rows, cols, c.recipe) ||
          fused_stats.histogram != stats.histogram || fused_stats.sum != stats.sum ||
          fused_stats.targets != stats.targets) {
        throw std::runtime_error(c.label + ": the fused and the separate results differ");
      }
      const std::function<void()> fns[] = {
          [&] {
            for (int i = 0; i < calls; ++i) {
              fake_quantize(x.data(), q.data(), rows, cols, c.recipe);
              compute_stats(x.data(), n, Format::kFP32, targets);
            }
          },
          [&] {
            TensorStats s;
            for (int i = 0; i < calls; ++i) {
              fake_quantize_with_stats(x.data(), q.data(), rows, cols, c.recipe, targets, &s);
            }
          }};
      const auto t = bench::time_interleaved(fns, /*warmup=*/2, reps);
      const double separate = t[0].median() / calls, fused = t[1].median() / calls;
      j["recipe_stats_fused_speedup_" + c.label] = separate / fused;
      j["recipe_stats_separate_ms_" + c.label] = separate * 1e3;
      j["recipe_stats_fused_ms_" + c.label] = fused * 1e3;
      std::printf("%-8s %-22s separate %7.3f ms  fused %7.3f ms  speedup %.2fx\n", c.label.c_str(),
                  to_string(c.recipe).c_str(), separate * 1e3, fused * 1e3, separate / fused);
    }
    j["recipe_stats_shape"] = std::to_string(rows) + "x" + std::to_string(cols);
    j["recipe_stats_targets"] = target_texts;
    j["recipe_stats_calls_per_round"] = calls;
    j["recipe_stats_rounds"] = reps;
    double load[1] = {-1.0};
    if (getloadavg(load, 1) == 1) j["recipe_stats_load_average_1min"] = load[0];
    j["recipe_stats_build_type"] = AMPSCOPE_BENCH_BUILD_TYPE;
    std::ofstream(out) << j.dump(2) << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ampscope_fused_recipe_bench: %s\n", e.what());
    return 1;
  }
}
