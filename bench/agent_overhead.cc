// The agent's overhead on a training step (docs/benchmarks.md): the built-in trainer's step
// time with the agent at default sampling and with full statistics (histograms) on every step,
// each divided by the step time without the agent. One process, one run: the same trainer
// keeps training while the observer is switched between blocks of steps, and the blocks are
// interleaved (time_interleaved), so drift of a shared machine hits every configuration alike.
// The agent spools to a temporary directory and has no server: the network thread's cost is
// not on the training thread either way.
//
//   ampscope_agent_bench --out FRAGMENT.json [--warmup-steps 30] [--steps-per-block 4]
//                        [--rounds 8] [--precision amp-fp16] [--key-suffix ''] [model flags]
//
// Writes agent_overhead_ratio_default and agent_overhead_ratio_full (targets <= 1.01 and
// <= 1.05), the same ratios of process CPU time (agent_overhead_cpu_ratio_*) and the figures
// behind them, each key followed by --key-suffix. An FP8/FP4
// --precision (fp8-delayed, ...) also hands the agent every quantiser's counts
// (TensorObserver::on_quantized, Agent::observe_quantizer) on the steps it observes:
// `--precision fp8-delayed --key-suffix _fp8` gives agent_overhead_ratio_full_fp8. Those modes
// also measure each layer's loss cost on every --loss-cost-every-th observed step (the
// trainer's default 4; 0: never), one extra GEMM per layer there: part of what is measured.
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <string_view>
#include <vector>

#include "agent_adapter.h"
#include "ampscope/agent/agent.h"
#include "ampscope/trainer/trainer.h"
#include "timing.h"

namespace {

using namespace ampscope;
using namespace ampscope::trainer;

// Forwards the trainer's hooks to the adapter chosen for the block (or to none).
class Switch final : public TensorObserver, public StepListener {
 public:
  AgentAdapter* active = nullptr;
  bool observe_step(std::int64_t step) override {
    return active != nullptr && active->observe_step(step);
  }
  void on_tensor(const TensorView& t) override {
    if (active != nullptr) active->on_tensor(t);
  }
  // Fused statistics: the unscale pass measures the gradients the agent wants.
  std::optional<std::vector<TargetSpec>> stats_targets(const TensorView& meta) override {
    return active != nullptr ? active->stats_targets(meta) : std::nullopt;
  }
  void on_tensor_stats(const TensorView& t, const TensorStats& stats) override {
    if (active != nullptr) active->on_tensor_stats(t, stats);
  }
  void on_quantized(const QuantizedGemmInput& q) override {
    if (active != nullptr) active->on_quantized(q);
  }
  void on_step(const StepEvent& e) override {
    if (active != nullptr) active->on_step(e);
  }
};

// User and system CPU time of the whole process so far.
double process_cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  const auto seconds = [](const timeval& t) { return t.tv_sec + t.tv_usec * 1e-6; };
  return seconds(u.ru_utime) + seconds(u.ru_stime);
}

std::unique_ptr<AgentAdapter> make_adapter(Trainer& trainer, const std::string& run,
                                           const std::filesystem::path& spool, bool full) {
  agent::AgentConfig c;
  c.run_id = run;
  c.spool_dir = spool.string();
  c.flush_timeout = std::chrono::milliseconds(0);
  if (full) {
    c.sampling.full_every = 1;
  }
  if (const char* roles = std::getenv("AMPSCOPE_BENCH_AGENT_COUNT_ROLES")) {
    if (std::string e = agent::set_option(c, "sample_count_roles", roles); !e.empty()) {
      throw std::runtime_error(e);
    }
  }
  // Further agent options for a measurement, "key=value;key=value" (the flight recorder's).
  if (const char* extra = std::getenv("AMPSCOPE_BENCH_AGENT_OPTIONS")) {
    std::string_view rest(extra);
    while (!rest.empty()) {
      const std::string_view item = rest.substr(0, rest.find(';'));
      rest.remove_prefix(std::min(rest.size(), item.size() + 1));
      const auto eq = item.find('=');
      if (item.empty()) continue;
      if (std::string e = eq == std::string_view::npos
                              ? "expected key=value, got '" + std::string(item) + "'"
                              : agent::set_option(c, item.substr(0, eq), item.substr(eq + 1));
          !e.empty()) {
        throw std::runtime_error("AMPSCOPE_BENCH_AGENT_OPTIONS: " + e);
      }
    }
  }
  if (const char* mode = std::getenv("AMPSCOPE_BENCH_AGENT_STATS_THREAD")) {
    if (std::string e = agent::set_option(c, "stats_thread", mode); !e.empty()) {
      throw std::runtime_error(e);
    }
  }
  std::unique_ptr<agent::Agent> a;
  const agent::Status s = agent::Agent::create(c, run_info(trainer), &a);
  if (!s.ok()) throw std::runtime_error("agent: " + s.message);
  return std::make_unique<AgentAdapter>(trainer, std::move(a), /*install_hooks=*/false);
}

}  // namespace

int main(int argc, char** argv) {
  std::string out, precision = "amp-fp16", suffix;
  int warmup_steps = 30, steps_per_block = 4, rounds = 8, width = 128, layers = 4, heads = 4, context = 64,
      batch = 16, threads = 0, loss_cost_every = TrainerConfig{}.loss_cost_every;
  CLI::App app{"Step time of the built-in trainer with and without the ampscope agent"};
  app.add_option("--out", out, "JSON fragment to write")->required();
  app.add_option("--warmup-steps", warmup_steps,
                 "steps before timing (the loss scale settles; early overflows would make the "
                 "agent take full statistics)")
      ->capture_default_str();
  app.add_option("--steps-per-block", steps_per_block, "steps per timed block")->capture_default_str();
  app.add_option("--rounds", rounds, "timed rounds (each: one block per configuration)")
      ->capture_default_str();
  app.add_option("--width", width)->capture_default_str();
  app.add_option("--layers", layers)->capture_default_str();
  app.add_option("--heads", heads)->capture_default_str();
  app.add_option("--context", context)->capture_default_str();
  app.add_option("--batch", batch)->capture_default_str();
  app.add_option("--threads", threads, "OpenBLAS threads (0: its default)")->capture_default_str();
  app.add_option("--precision", precision, "the trainer's precision mode")
      ->check(CLI::IsMember(precision_names()))
      ->capture_default_str();
  app.add_option("--key-suffix", suffix, "appended to every key written (e.g. _fp8)");
  app.add_option("--loss-cost-every", loss_cost_every,
                 "FP8/FP4 modes: the trainer's loss cost on every N-th observed step (0: never)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  try {
    TrainerConfig config;
    config.precision = *parse_precision(precision);
    config.model.n_embd = width;
    config.model.n_layer = layers;
    config.model.n_head = heads;
    config.model.context = context;
    config.batch = batch;
    config.steps = 1 << 20;
    config.loss_cost_every = loss_cost_every;
    const Corpus corpus = Corpus::synthetic();
    CpuBackendOptions bo;
    bo.blas_threads = threads;
    Trainer trainer(config, corpus, make_cpu_backend(bo));
    for (int i = 0; i < warmup_steps; ++i) trainer.step();
    Switch sw;
    trainer.set_observer(&sw);
    trainer.add_step_listener(&sw);

    const auto spool = std::filesystem::temp_directory_path() /
                       ("ampscope-agent-bench-" + std::to_string(::getpid()));
    auto default_agent = make_adapter(trainer, "bench-default", spool, false);
    auto full_agent = make_adapter(trainer, "bench-full", spool, true);

    // Beside the wall time, the process's CPU time of each block (every thread: the trainer's,
    // OpenBLAS's, the kernels' pool, the agent's worker): on a machine shared with other work
    // the wall time carries their load, the CPU time much less of it.
    bench::Timing cpu[3];
    auto block = [&](int config, AgentAdapter* a) {
      return [&, config, a] {
        sw.active = a;
        const double cpu_before = process_cpu_seconds();
        for (int i = 0; i < steps_per_block; ++i) trainer.step();
        cpu[config].seconds.push_back(process_cpu_seconds() - cpu_before);
      };
    };
    const std::function<void()> fns[] = {block(0, nullptr), block(1, default_agent.get()),
                                         block(2, full_agent.get())};
    const auto t = bench::time_interleaved(fns, /*warmup=*/1, rounds);
    sw.active = nullptr;
    for (bench::Timing& c : cpu) c.seconds.erase(c.seconds.begin());  // the warm-up round
    const auto per_step = [&](int i) { return t[i].median() / steps_per_block; };
    const auto cpu_per_step = [&](int i) { return cpu[i].median() / steps_per_block; };
    const double base = per_step(0), def = per_step(1), full = per_step(2);
    const agent::Counters cd = default_agent->agent().counters();
    const agent::Counters cf = full_agent->agent().counters();
    default_agent.reset();
    full_agent.reset();
    std::filesystem::remove_all(spool);

    nlohmann::ordered_json j;
    const auto key = [&](const char* name) { return name + suffix; };
    j[key("agent_overhead_ratio_default")] = def / base;
    j[key("agent_overhead_ratio_full")] = full / base;
    j[key("agent_bench_step_s_without")] = base;
    j[key("agent_bench_step_s_default")] = def;
    j[key("agent_bench_step_s_full")] = full;
    j[key("agent_bench_training_thread_s_per_step_default")] =
        cd.steps > 0 ? cd.training_thread_s / static_cast<double>(cd.steps) : 0.0;
    j[key("agent_bench_training_thread_s_per_step_full")] =
        cf.steps > 0 ? cf.training_thread_s / static_cast<double>(cf.steps) : 0.0;
    j[key("agent_overhead_cpu_ratio_default")] = cpu_per_step(1) / cpu_per_step(0);
    j[key("agent_overhead_cpu_ratio_full")] = cpu_per_step(2) / cpu_per_step(0);
    j[key("agent_bench_cpu_s_per_step_without")] = cpu_per_step(0);
    j[key("agent_bench_cpu_s_per_step_default")] = cpu_per_step(1);
    j[key("agent_bench_cpu_s_per_step_full")] = cpu_per_step(2);
    double load[1] = {-1.0};
    if (getloadavg(load, 1) == 1) j[key("agent_bench_load_average_1min")] = load[0];
    j[key("agent_bench_dropped_reports")] = cd.dropped_reports + cf.dropped_reports;
    j[key("agent_bench_model")] = precision + " gpt width " + std::to_string(width) + " layers " +
                                  std::to_string(layers) + " context " + std::to_string(context) +
                                  " batch " + std::to_string(batch) + " (cpu)";
    j[key("agent_bench_warmup_steps")] = warmup_steps;
    j[key("agent_bench_steps_per_block")] = steps_per_block;
    j[key("agent_bench_rounds")] = rounds;
    j[key("agent_bench_loss_cost_every")] = loss_cost_every;
    j[key("agent_bench_build_type")] = AMPSCOPE_BENCH_BUILD_TYPE;
    std::ofstream(out) << j.dump(2) << "\n";
    std::printf(
        "agent overhead (%s): default %.4f, full %.4f (step %.1f ms without the agent; "
        "agent on the training thread %.2f / %.2f ms per step; CPU time ratios %.4f / %.4f)\n",
        precision.c_str(), def / base, full / base, base * 1e3,
        j[key("agent_bench_training_thread_s_per_step_default")].get<double>() * 1e3,
        j[key("agent_bench_training_thread_s_per_step_full")].get<double>() * 1e3,
        cpu_per_step(1) / cpu_per_step(0), cpu_per_step(2) / cpu_per_step(0));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ampscope_agent_bench: %s\n", e.what());
    return 1;
  }
}
