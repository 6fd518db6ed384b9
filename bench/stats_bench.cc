// Statistics throughput benchmark; bench/run_bench.sh runs it.
//
// For each storage type (FP32, FP16, BF16) it fills one buffer (256 MiB by default: far above
// the last-level cache, so every call streams from DRAM) with synthetic gradients
// (gradient_data.h) and times, interleaved on that same buffer:
//   - the memory-read ceiling (memory_read.h) on the thread count compute_stats uses, and
//   - ampscope::compute_stats with the configured targets, called the way a user calls it;
// then compute_stats at every SIMD level from scalar up to the active one (the speedup of the
// vector kernels, measured in one round-robin), for FP32 once more without targets, and
// ampscope::recipe_counts with an MX recipe (mxfp8_e4m3 by default, rows of 4096: one thread,
// what `ampscope stats --target mxfp8_e4m3` runs), keys stats_gbps_<dtype>_mx.
// Throughput is bytes of input per second (GB = 1e9 bytes) from the median call time.
// It writes one JSON fragment of flat keys, most prefixed `stats_`, that bench/merge_results.py
// merges into results.json, and prints each row as it is measured.
//
// Why not Google Benchmark (it is available): the figures wanted are ratios between functions
// timed on the same buffers in one round-robin (warm-up, then median of N interleaved rounds,
// timing.h). Benchmark 1.7 times each benchmark separately, has no warm-up control, and would
// need a custom reporter plus a post-processing step to produce the ratios.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ampscope/cpu_features.h"
#include "ampscope/formats.h"
#include "ampscope/recipe.h"
#include "ampscope/tensor_stats.h"
#include "gradient_data.h"
#include "memory_read.h"
#include "timing.h"

namespace ampscope::bench {
namespace {

using nlohmann::json;

struct Flags {
  double buffer_mib = 256;
  int warmup = 1;
  int reps = 5;
  int simd_reps = 3;  // the scalar rows are slow and compute-bound: fewer calls suffice
  int threads = 0;
  std::vector<std::string> targets = {"fp16@0", "e4m3@0"};
  std::string mx_recipe = "mxfp8_e4m3";
  std::size_t mx_row_length = 4096;  // a hidden size: rows of 128 MX blocks
  std::string out;
};

// The same rule as the kernels' pool (hardware concurrency, at least 1, at most 16), so that
// the memory-read ceiling runs on as many threads as compute_stats does by default.
int default_thread_count() {
  const unsigned hc = std::thread::hardware_concurrency();
  return static_cast<int>(std::clamp(hc == 0 ? 1u : hc, 1u, 16u));
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<void, FreeDeleter>;

constexpr std::size_t kPage = 4096;

Buffer allocate(std::size_t bytes) {
  void* p = std::aligned_alloc(kPage, bytes);
  if (p == nullptr) throw std::bad_alloc();
  return Buffer(p);
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  }
  return "unknown";
}

std::string utc_timestamp() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

struct Row {
  std::string name;  // "memory_read", "compute_stats" or "recipe_counts"
  Format dtype;
  std::string simd;  // SIMD level of compute_stats; "" for memory_read
  bool targets;      // whether compute_stats had the target list
  std::size_t bytes;
  Timing timing;

  double gbps() const { return static_cast<double>(bytes) / timing.median() / 1e9; }
  double best_gbps() const { return static_cast<double>(bytes) / timing.min() / 1e9; }
};

json to_json(const Row& r) {
  return {{"name", r.name},
          {"dtype", format_name(r.dtype)},
          {"simd", r.simd},
          {"targets", r.targets},
          {"bytes", r.bytes},
          {"median_ms", r.timing.median() * 1e3},
          {"min_ms", r.timing.min() * 1e3},
          {"gbps", r.gbps()},
          {"best_gbps", r.best_gbps()}};
}

void print_row(const Row& r) {
  std::string label = r.name + " " + std::string(format_name(r.dtype));
  if (!r.simd.empty()) label += " simd=" + r.simd;
  if (r.name == "compute_stats" && !r.targets) label += " no-targets";
  if (r.name == "recipe_counts") label += " 1 thread";
  std::printf("  %-42s %9.2f ms/call (min %9.2f)  %7.2f GB/s\n", label.c_str(),
              r.timing.median() * 1e3, r.timing.min() * 1e3, r.gbps());
  std::fflush(stdout);
}

json counts_json(const TensorStats& s) {
  json targets = json::array();
  for (const TargetCounts& t : s.targets) {
    targets.push_back({{"target", to_string(t.target)},
                       {"overflow", t.overflow},
                       {"underflow", t.underflow},
                       {"subnormal", t.subnormal}});
  }
  return {{"numel", s.numel},
          {"zeros", s.zeros},
          {"nan", s.nan},
          {"pos_inf", s.pos_inf},
          {"neg_inf", s.neg_inf},
          {"max_abs", s.max_abs},
          {"min_abs_nonzero", s.min_abs_nonzero},
          {"sum", s.sum},
          {"sum_sq", s.sum_sq},
          {"histogram_min_exponent", s.histogram.min_exponent},
          {"histogram_max_exponent", s.histogram.max_exponent()},
          {"targets", targets}};
}

class StatsBench {
 public:
  StatsBench(const Flags& flags, std::vector<TargetSpec> targets, const Recipe& mx)
      : flags_(flags),
        targets_(std::move(targets)),
        mx_(mx),
        threads_(flags.threads > 0 ? flags.threads : default_thread_count()),
        bytes_(static_cast<std::size_t>(flags.buffer_mib * 1024 * 1024) / kPage * kPage) {
    options_.max_threads = flags.threads;  // 0: the pool size, which threads_ matches
  }

  json run() {
    // Other work on the machine skews every figure; the results say how busy it was.
    double load[1] = {-1.0};
    if (getloadavg(load, 1) == 1) load_average_ = load[0];
    std::printf(
        "statistics benchmark (%s build): %zu-byte buffers, %d threads, simd %s, "
        "targets %s, median of %d calls (%d per SIMD level) after %d warm-up\n",
        AMPSCOPE_BENCH_BUILD_TYPE, bytes_, threads_, level_name(active_simd_level()).c_str(),
        targets_text().c_str(), flags_.reps, flags_.simd_reps, flags_.warmup);
    for (Format dtype : {Format::kFP32, Format::kFP16, Format::kBF16}) run_dtype(dtype);
    return fragment();
  }

 private:
  void run_dtype(Format dtype) {
    const std::size_t n = bytes_ / static_cast<std::size_t>(storage_bytes(dtype));
    Buffer buffer = allocate(bytes_);
    const void* data = buffer.get();
    fill_gradients(buffer.get(), n, dtype, GradientSpec{}, threads_);

    // One untimed call of each also yields what later calls must reproduce: the sum proves the
    // reads happened, the counts let a reader compare with the PyTorch peer.
    const std::uint64_t expected_sum = read_sum_u64(data, bytes_, threads_);
    checks_[std::string(format_name(dtype))] = counts_json(stats(data, n, dtype, true));

    auto read = [&] {
      if (read_sum_u64(data, bytes_, threads_) != expected_sum) {
        throw std::runtime_error("memory read returned a different sum");
      }
    };
    const std::function<void()> headline[] = {read, [&] { stats(data, n, dtype, true); }};
    const auto ht = time_interleaved(headline, flags_.warmup, flags_.reps);
    add_row({"memory_read", dtype, "", false, bytes_, ht[0]});
    add_row({"compute_stats", dtype, level_name(active_simd_level()), true, bytes_, ht[1]});

    // The vector speedup: every level from scalar up to the active one, in one round-robin.
    std::vector<std::function<void()>> levels;
    std::vector<SimdLevel> names;
    for (int l = 0; l <= static_cast<int>(active_simd_level()); ++l) {
      const auto level = static_cast<SimdLevel>(l);
      names.push_back(level);
      levels.push_back([&, level] { stats(data, n, dtype, true, level); });
    }
    const auto lt = time_interleaved(levels, flags_.warmup, flags_.simd_reps);
    for (std::size_t i = 0; i < lt.size(); ++i) {
      add_row({"compute_stats", dtype, level_name(names[i]), true, bytes_, lt[i]}, "simd");
    }

    if (dtype == Format::kFP32) {
      const std::function<void()> bare[] = {[&] { stats(data, n, dtype, false); }};
      const auto bt = time_interleaved(bare, flags_.warmup, flags_.reps);
      add_row({"compute_stats", dtype, level_name(active_simd_level()), false, bytes_, bt[0]});
    }

    // The MX recipe's counts over the same buffer, whole rows (the tail that does not fill a
    // row is left out).
    const std::size_t rows = n / flags_.mx_row_length;
    const std::size_t mx_n = rows * flags_.mx_row_length;
    const RecipeCounts mx = recipe_counts(data, mx_n, dtype, flags_.mx_row_length, mx_);
    checks_[std::string(format_name(dtype)) + "_mx"] = {
        {"recipe", to_string(mx_)},  {"values", mx.values},       {"underflow", mx.underflow},
        {"subnormal", mx.subnormal}, {"saturated", mx.saturated}, {"blocks", mx.blocks},
        {"sqnr_db", mx.sqnr_db()}};
    const std::function<void()> recipe[] = {[&] {
      if (recipe_counts(data, mx_n, dtype, flags_.mx_row_length, mx_) != mx) {
        throw std::runtime_error("recipe_counts gave different counts on the same data");
      }
    }};
    const auto rt = time_interleaved(recipe, flags_.warmup, flags_.reps);
    const std::size_t mx_bytes = mx_n * static_cast<std::size_t>(storage_bytes(dtype));
    add_row({"recipe_counts", dtype, "", true, mx_bytes, rt[0]});
  }

  TensorStats stats(const void* data, std::size_t n, Format dtype, bool with_targets,
                    std::optional<SimdLevel> level = std::nullopt) {
    StatsOptions options = options_;
    options.simd = level;
    TensorStats s = compute_stats(
        data, n, dtype,
        with_targets ? std::span<const TargetSpec>(targets_) : std::span<const TargetSpec>(),
        options);
    if (s.numel != n) throw std::runtime_error("compute_stats saw a different element count");
    return s;
  }

  void add_row(Row row, const std::string& group = "headline") {
    print_row(row);
    json j = to_json(row);
    j["group"] = group;
    rows_.push_back(j);
    const std::string d(format_name(row.dtype));
    auto& f = keys_;
    if (group == "simd") {
      f["stats_gbps_" + d + "_" + row.simd] = row.gbps();
      f["stats_ms_per_call_" + d + "_" + row.simd] = row.timing.median() * 1e3;
      return;
    }
    if (row.name == "recipe_counts") {
      f["stats_gbps_" + d + "_mx"] = row.gbps();
      f["stats_ms_per_call_" + d + "_mx"] = row.timing.median() * 1e3;
      return;
    }
    if (row.name == "memory_read") {
      f["memory_read_gbps_" + d] = row.gbps();
      f["memory_read_ms_per_call_" + d] = row.timing.median() * 1e3;
      f["memory_read_best_gbps_" + d] = row.best_gbps();
    } else if (!row.targets) {
      f["stats_gbps_" + d + "_no_targets"] = row.gbps();
      f["stats_ms_per_call_" + d + "_no_targets"] = row.timing.median() * 1e3;
    } else {
      f["stats_gbps_" + d] = row.gbps();
      f["stats_ms_per_call_" + d] = row.timing.median() * 1e3;
      f["stats_bandwidth_ratio_" + d] = row.gbps() / f["memory_read_gbps_" + d].get<double>();
      // From the fastest calls: what the kernel reaches when the machine is not busy elsewhere.
      f["stats_bandwidth_ratio_best_" + d] =
          row.best_gbps() / f["memory_read_best_gbps_" + d].get<double>();
    }
  }

  json fragment() {
    json f = keys_;
    const std::string active = level_name(active_simd_level());
    for (const char* d : {"fp32", "fp16", "bf16"}) {
      const std::string base = std::string("stats_gbps_") + d + "_";
      f[std::string("stats_vector_speedup_") + d] =
          f[base + active].get<double>() / f[base + "scalar"].get<double>();
    }
    f["stats_buffer_bytes"] = bytes_;
    f["stats_threads"] = threads_;
    f["stats_simd_level"] = active;
    f["stats_simd_max_supported"] = level_name(max_supported_simd_level());
    f["stats_targets"] = targets_text();
    f["stats_mx_recipe"] = to_string(mx_);
    f["stats_mx_row_length"] = flags_.mx_row_length;
    f["stats_mx_threads"] = 1;
    f["stats_warmup_calls"] = flags_.warmup;
    f["stats_timed_calls"] = flags_.reps;
    f["stats_simd_timed_calls"] = flags_.simd_reps;
    f["stats_build_type"] = AMPSCOPE_BENCH_BUILD_TYPE;
    f["stats_timing"] = "median of the timed calls; read and stats calls interleaved";
    f["stats_rows"] = rows_;
    f["stats_check"] = checks_;
    f["stats_timestamp"] = utc_timestamp();
    f["cpu_model"] = cpu_model();
    f["cpu_logical_cores"] = std::thread::hardware_concurrency();
    f["stats_load_average_1min"] = load_average_;
    return f;
  }

  static std::string level_name(SimdLevel level) { return std::string(simd_level_name(level)); }

  std::string targets_text() const {
    std::string text;
    for (const TargetSpec& t : targets_) text += (text.empty() ? "" : ",") + to_string(t);
    return text;
  }

  Flags flags_;
  std::vector<TargetSpec> targets_;
  Recipe mx_;
  int threads_;
  std::size_t bytes_;
  StatsOptions options_;
  double load_average_ = -1.0;
  json keys_ = json::object();
  json rows_ = json::array();
  json checks_ = json::object();
};

}  // namespace
}  // namespace ampscope::bench

int main(int argc, char** argv) {
  using namespace ampscope;
  bench::Flags flags;
  CLI::App app{"Statistics throughput of ampscope::compute_stats against the memory-read speed"};
  app.add_option("--buffer-mib", flags.buffer_mib, "Bytes per buffer, in MiB (above the LLC)")
      ->check(CLI::Range(1.0, 65536.0));
  app.add_option("--warmup", flags.warmup, "Untimed calls before timing")
      ->check(CLI::Range(0, 100));
  app.add_option("--reps", flags.reps, "Timed calls; the median is reported")
      ->check(CLI::Range(1, 1000));
  app.add_option("--simd-reps", flags.simd_reps, "Timed calls per SIMD level (the comparison)")
      ->check(CLI::Range(1, 1000));
  app.add_option("--threads", flags.threads,
                 "Threads for both (0: the kernels' pool size, hardware concurrency capped at 16)")
      ->check(CLI::Range(0, 16));
  app.add_option("--targets", flags.targets, "What-if targets, e.g. fp16@0 e4m3@0")->delimiter(',');
  app.add_option("--mx-recipe", flags.mx_recipe,
                 "Recipe timed through recipe_counts for the stats_gbps_*_mx keys");
  app.add_option("--mx-row-length", flags.mx_row_length, "Row length for that recipe")
      ->check(CLI::Range(1, 1 << 24));
  app.add_option("--out", flags.out, "JSON fragment to write")->required();
  CLI11_PARSE(app, argc, argv);

  if (flags.threads > bench::default_thread_count()) {
    std::cerr << "ampscope_stats_bench: --threads " << flags.threads
              << " exceeds the kernels' pool (" << bench::default_thread_count()
              << " threads), so compute_stats would run on fewer threads than the read\n";
    return 2;
  }
  std::vector<TargetSpec> targets;
  for (const std::string& text : flags.targets) {
    std::string error;
    const auto t = parse_target(text, &error);
    if (!t) {
      std::cerr << "ampscope_stats_bench: bad target '" << text << "': " << error << "\n";
      return 2;
    }
    targets.push_back(*t);
  }
  std::string error;
  const std::optional<Recipe> mx = parse_recipe(flags.mx_recipe, &error);
  if (!mx) {
    std::cerr << "ampscope_stats_bench: bad --mx-recipe '" << flags.mx_recipe << "': " << error
              << "\n";
    return 2;
  }
  try {
    const nlohmann::json fragment = bench::StatsBench(flags, std::move(targets), *mx).run();
    std::ofstream out(flags.out);
    out << fragment.dump(2) << "\n";
    if (!out) {
      std::cerr << "ampscope_stats_bench: cannot write " << flags.out << "\n";
      return 1;
    }
  } catch (const std::exception& e) {
    std::cerr << "ampscope_stats_bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
