// ampscope-train: trains the built-in GPT on the synthetic corpus or a text file, in one of the
// precision modes, with checkpoints, fault injection, a progress line and a JSON-lines log.
// Bad input (flags, values, data file, checkpoint) gives one line on stderr and exit code 2;
// a failure while training gives one line and exit code 1.
// Under mpirun it trains data parallel (docs/multi-rank.md): rank 0 prints the progress and
// summary lines and writes checkpoints and --log-json FILE; rank r > 0 logs to FILE.rank<r>.
// An error on one rank prints its line and ends the whole job (MPI_Abort), so that no rank
// waits forever in a collective.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "agent_adapter.h"
#include "ampscope/check.h"
#include "ampscope/trainer/trainer.h"
#include "cuda_backend.h"

namespace {

using namespace ampscope::trainer;
using ampscope::parse_scaler_kind;
using ampscope::ScalerKind;
using ampscope::Device;

struct Options {
  std::string precision = "amp-fp16";
  std::string device = "cpu";
  std::string fp8_gemm = "auto";
  std::string comm = "auto";
  std::int64_t steps = 300;
  std::int64_t stop_at = 0;
  std::uint64_t seed = 1;
  int batch = 16;
  int accum = 1;
  float lr = 3e-3f;
  std::optional<float> min_lr;
  std::int64_t warmup = 20;
  float weight_decay = 0.1f;
  float grad_clip = 1.0f;
  int context = 64;
  int width = 128;
  int heads = 4;
  int layers = 4;
  std::string data;
  double val_fraction = 0.1;
  std::int64_t eval_every = 50;
  int eval_batches = 4;
  std::string checkpoint_dir;
  std::int64_t checkpoint_every = 0;
  bool resume = false;
  std::string scaler;
  std::optional<float> init_scale;
  std::optional<std::int64_t> growth_interval;
  std::optional<int> hysteresis;
  std::optional<float> min_scale;
  std::vector<std::string> inject_nan, inject_inf, fp32_layers, bf16_gemms;
  std::optional<int> fp8_amax_history, fp8_margin, loss_cost_every;
  std::vector<std::int64_t> inject_overflow;
  std::int64_t inject_overflow_every = 0;
  std::string inject_overflow_tensor;
  std::optional<int> inject_rank;
  float grad_shrink = 1.0f;
  std::optional<float> grad_shrink_end;
  std::string log_json;
  int threads = 0;
  bool quiet = false;
  AgentFlags agent;
};

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

std::string one_line(std::string s) {
  for (char& c : s) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

// "NAME@STEP" -> (NAME, STEP).
std::pair<std::string, std::int64_t> split_at_step(const std::string& spec, const char* flag,
                                                   bool step_optional) {
  const auto at = spec.rfind('@');
  if (at == std::string::npos) {
    if (step_optional && !spec.empty()) return {spec, 0};
    throw UsageError(std::string(flag) + ": expected NAME@STEP, got '" + spec + "'");
  }
  const std::string name = spec.substr(0, at), step = spec.substr(at + 1);
  std::size_t used = 0;
  long long v = -1;
  try {
    v = std::stoll(step, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (name.empty() || used != step.size() || step.empty() || v < 0) {
    throw UsageError(std::string(flag) + ": expected NAME@STEP with STEP >= 0, got '" + spec +
                     "'");
  }
  return {name, v};
}

TrainerConfig to_config(const Options& o) {
  TrainerConfig c;
  auto mode = parse_precision(o.precision);
  if (!mode) throw UsageError("--precision: unknown mode '" + o.precision + "'");
  c.precision = *mode;
  c.model.context = o.context;
  c.model.n_embd = o.width;
  c.model.n_head = o.heads;
  c.model.n_layer = o.layers;
  if (o.width % o.heads != 0) {
    throw UsageError("--heads " + std::to_string(o.heads) + " does not divide --width " +
                     std::to_string(o.width));
  }
  c.steps = o.steps;
  c.seed = o.seed;
  c.batch = o.batch;
  c.accum = o.accum;
  c.lr = o.lr;
  c.min_lr = o.min_lr.value_or(o.lr / 10.0f);
  c.warmup_steps = o.warmup;
  c.weight_decay = o.weight_decay;
  c.grad_clip = o.grad_clip;
  c.val_fraction = o.val_fraction;
  c.grad_shrink = o.grad_shrink;
  c.grad_shrink_end = o.grad_shrink_end;
  c.eval_every = o.eval_every;
  c.eval_batches = o.eval_batches;
  if ((o.fp8_amax_history || o.fp8_margin) && c.precision != PrecisionMode::kFP8Delayed) {
    throw UsageError("--fp8-amax-history and --fp8-margin apply to --precision fp8-delayed");
  }
  if (!o.bf16_gemms.empty() && !PrecisionPolicy::for_mode(c.precision).scaled_gemms) {
    throw UsageError("--bf16-gemm applies to --precision fp8-delayed, fp8-current, mxfp8, nvfp4");
  }
  if (o.loss_cost_every && !PrecisionPolicy::for_mode(c.precision).scaled_gemms) {
    throw UsageError("--loss-cost-every applies to --precision fp8-delayed, fp8-current, mxfp8, "
                     "nvfp4");
  }
  c.loss_cost_every = o.loss_cost_every.value_or(c.loss_cost_every);
  c.fp8_delayed.history_length = o.fp8_amax_history.value_or(c.fp8_delayed.history_length);
  c.fp8_delayed.margin = o.fp8_margin.value_or(c.fp8_delayed.margin);
  ScalerConfig s = default_scaler(c.precision);
  if (!o.scaler.empty()) {
    auto kind = parse_scaler_kind(o.scaler);
    if (!kind) throw UsageError("--scaler: unknown scaler '" + o.scaler + "'");
    if (*kind == ScalerKind::kHysteresis) {
      s = ScalerConfig::megatron_defaults();
    } else if (*kind == ScalerKind::kDynamic) {
      s = ScalerConfig::pytorch_defaults();
    } else {
      s = ScalerConfig::static_scale(s.kind == ScalerKind::kStatic ? s.init_scale
                                                                   : ampscope::kGradScalerInitScale);
    }
  }
  if (o.init_scale) s.init_scale = *o.init_scale;
  if (o.growth_interval) s.growth_interval = *o.growth_interval;
  if (o.hysteresis) s.hysteresis = *o.hysteresis;
  if (o.min_scale) s.min_scale = *o.min_scale;
  if (std::string e = validate(s); !e.empty()) throw UsageError("scaler: " + e);
  c.scaler = s;
  for (const auto& spec : o.inject_nan) {
    auto [name, step] = split_at_step(spec, "--inject-nan", false);
    c.injections.push_back({Injection::Kind::kNaN, name, step});
  }
  for (const auto& spec : o.inject_inf) {
    auto [name, step] = split_at_step(spec, "--inject-inf", false);
    c.injections.push_back({Injection::Kind::kInf, name, step});
  }
  // An overflow goes into a logits gradient (a loss scale too high), or into the forward
  // activation --inject-overflow-tensor names (a value its layer cannot hold in FP16).
  std::string overflow_into = "logits.grad";
  if (!o.inject_overflow_tensor.empty()) {
    const auto activations = Gpt::activation_names(c.model);
    if (std::find(activations.begin(), activations.end(), o.inject_overflow_tensor) ==
        activations.end()) {
      throw UsageError("--inject-overflow-tensor: '" + o.inject_overflow_tensor +
                       "' is not a forward activation of the model (e.g. h0.attn.scores, "
                       "h0.mlp.fc, logits)");
    }
    overflow_into = o.inject_overflow_tensor;
  }
  for (auto step : o.inject_overflow) {
    c.injections.push_back({Injection::Kind::kOverflow, overflow_into, step});
  }
  if (o.inject_overflow_every > 0) {
    for (std::int64_t step = o.inject_overflow_every; step < c.steps;
         step += o.inject_overflow_every) {
      c.injections.push_back({Injection::Kind::kOverflow, overflow_into, step});
    }
  }
  c.inject_rank = o.inject_rank;
  if (std::string e = validate(c); !e.empty()) throw UsageError(e);
  return c;
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const auto t = static_cast<long long>(s + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%lld:%02lld:%02lld", t / 3600, (t / 60) % 60, t % 60);
  return buf;
}

nlohmann::json to_json(const StepEvent& e) {
  nlohmann::json j = {{"step", e.step},
                      {"loss", e.loss},
                      {"loss_scale", e.loss_scale},
                      {"scale_after", e.scale_after},
                      {"found_inf", e.found_inf},
                      {"skipped", e.skipped},
                      {"grad_norm", e.grad_norm},
                      {"lr", e.lr},
                      {"tokens", e.tokens},
                      {"step_time_s", e.step_time_s},
                      {"optimizer_steps", e.optimizer_steps}};
  if (!e.fp32_layers.empty()) j["fp32_layers"] = e.fp32_layers;
  if (!e.bf16_gemms.empty()) j["bf16_gemms"] = e.bf16_gemms;
  if (e.val_loss) j["val_loss"] = *e.val_loss;
  return j;
}

// The communicator --comm asks for (auto: by launch and device). `mpi` is set when MPI is
// needed and lives until main returns.
std::unique_ptr<Communicator> make_communicator(const Options& o, std::optional<MpiRuntime>& mpi,
                                                int* argc, char*** argv) {
  const Device device = o.device == "cuda" ? Device::kCuda : Device::kCpu;
  const CommKind kind = resolve_comm_kind(*parse_comm_kind(o.comm), device, launched_by_mpi());
  if (kind == CommKind::kMpi && device != Device::kCpu) {
    throw UsageError("--comm mpi reduces host memory: use --device cpu, or --comm nccl");
  }
  if (kind == CommKind::kNccl && device != Device::kCuda) {
    throw UsageError("--comm nccl reduces device memory: use --device cuda, or --comm mpi");
  }
  if (kind == CommKind::kSingle) return make_single_communicator();
  mpi.emplace(argc, argv);  // throws when the build has no MPI
  if (kind == CommKind::kMpi) return make_mpi_communicator(*mpi);
  return make_nccl_communicator(*mpi, mpi->local_rank());
}

// `cuda` names the device of this rank (the one the NCCL communicator was given).
int run(const Options& o, std::unique_ptr<Communicator> comm, const CudaBackendOptions& cuda) {
  const TrainerConfig config = to_config(o);
  if (o.device == "cuda") {
    if (std::string why = cuda_backend_unavailable_reason(cuda); !why.empty()) {
      throw UsageError("--device cuda: " + why);
    }
  }
  const Corpus corpus = o.data.empty() ? Corpus::synthetic() : Corpus::from_file(o.data);
  std::unique_ptr<Backend> backend;
  if (o.device == "cuda") {
    backend = make_cuda_backend(cuda);
  } else {
    CpuBackendOptions bo;
    bo.blas_threads = o.threads;
    backend = make_cpu_backend(bo);
  }
  const std::string backend_name = backend->name();
  const std::string comm_name = comm->name();
  Trainer trainer(config, corpus, std::move(backend), std::move(comm));
  const bool lead = trainer.rank() == 0;  // prints, and writes --log-json FILE itself
  for (const auto& spec : o.fp32_layers) {
    auto [name, step] = split_at_step(spec, "--fp32-layer", true);
    if (std::string e = trainer.fp32_overrides().add(name, step); !e.empty()) throw UsageError(e);
  }
  for (const auto& spec : o.bf16_gemms) {
    auto [name, step] = split_at_step(spec, "--bf16-gemm", true);
    if (std::string e = trainer.gemm_precision().add_bf16(name, step); !e.empty()) {
      throw UsageError(e);
    }
  }
  const std::string ckpt =
      o.checkpoint_dir.empty() ? "" : (std::filesystem::path(o.checkpoint_dir) / "checkpoint.bin");
  if (o.resume) {
    if (ckpt.empty()) throw UsageError("--resume needs --checkpoint-dir");
    if (!std::filesystem::exists(ckpt)) throw UsageError("no checkpoint at '" + ckpt + "'");
    trainer.load_checkpoint(ckpt);
  }
  // After the checkpoint: the agent's Hello reports the restored scaler.
  const std::unique_ptr<AgentAdapter> agent = attach_agent(trainer, o.agent);
  std::ofstream log;
  if (!o.log_json.empty()) {
    const std::string path =
        lead ? o.log_json : o.log_json + ".rank" + std::to_string(trainer.rank());
    log.open(path, std::ios::trunc);
    if (!log.good()) throw UsageError("--log-json: cannot write '" + path + "'");
  }

  const bool tty = lead && !o.quiet && isatty(STDERR_FILENO) == 1;
  if (lead) {
    const std::string ranks =
        trainer.world_size() > 1
            ? ", " + std::to_string(trainer.world_size()) + " ranks (" + comm_name + ")"
            : "";
    std::fprintf(stderr, "ampscope-train: %s, %lld parameters, vocab %d (%s), %s%s, scaler %s\n",
                 std::string(precision_name(config.precision)).c_str(),
                 static_cast<long long>(trainer.model().num_parameters()),
                 trainer.config().model.vocab_size, corpus.source().c_str(),
                 backend_name.c_str(), ranks.c_str(),
                 std::string(scaler_kind_name(trainer.scaler().state().config.kind)).c_str());
  }
  double train_time = 0.0;
  std::int64_t tokens = 0, skipped = 0, ran = 0;
  StepEvent last;
  std::optional<double> last_val;
  const std::int64_t stop = o.stop_at > 0 ? std::min(o.stop_at, config.steps) : config.steps;
  while (trainer.next_step() < stop) {
    last = trainer.step();
    ++ran;
    train_time += last.step_time_s;
    tokens += last.tokens;
    skipped += last.skipped ? 1 : 0;
    const std::int64_t done = trainer.next_step();
    if (last.val_loss) last_val = last.val_loss;
    if (log.is_open()) log << to_json(last).dump() << '\n' << std::flush;
    if (!ckpt.empty() && o.checkpoint_every > 0 && done % o.checkpoint_every == 0) {
      trainer.save_checkpoint(ckpt);
    }
    const double tps = train_time > 0 ? static_cast<double>(tokens) / train_time : 0.0;
    const double eta = static_cast<double>(stop - done) * train_time / ran;
    if (tty) {
      std::fprintf(stderr, "\r\033[Kstep %lld/%lld | loss %.4f | scale %g | %.0f tok/s | ETA %s",
                   static_cast<long long>(done), static_cast<long long>(config.steps), last.loss,
                   static_cast<double>(last.scale_after), tps, format_duration(eta).c_str());
      if (last.skipped) std::fprintf(stderr, " | skipped");
    }
  }
  if (tty) std::fprintf(stderr, "\n");
  if (!ckpt.empty()) trainer.save_checkpoint(ckpt);
  if (agent) agent->finish();
  if (!lead) return 0;
  const double tps = train_time > 0 ? static_cast<double>(tokens) / train_time : 0.0;
  std::printf("steps %lld | final loss %.4f | val loss %s | skipped %lld | scale %g | %.0f tok/s\n",
              static_cast<long long>(trainer.next_step()), last.loss,
              last_val ? std::to_string(*last_val).c_str() : "-", static_cast<long long>(skipped),
              static_cast<double>(trainer.scaler().scale()), tps);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Train the built-in GPT in a chosen precision mode and watch mixed precision "
               "succeed or fail.",
               "ampscope-train"};
  app.add_option("--precision", o.precision,
                 "fp32 | fp16 | amp-fp16 | amp-bf16 | fp8-delayed | fp8-current | mxfp8 | nvfp4 "
                 "(the last four: amp-bf16 with the linear layers' GEMM inputs quantised by the "
                 "recipe)")
      ->check(CLI::IsMember(precision_names()))
      ->capture_default_str();
  app.add_option("--device", o.device,
                 "cpu | cuda (the first CUDA device; under NCCL, one device per rank of a node)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--fp8-gemm", o.fp8_gemm,
                 "auto | emulate: with --device cuda, fp8-delayed and fp8-current run their GEMMs "
                 "as cuBLASLt FP8 GEMMs where the GPU (sm_89+) and the shapes (multiples of 16) "
                 "allow (auto), or always as dequantised FP32 GEMMs (emulate, the CPU's)")
      ->check(CLI::IsMember({"auto", "emulate"}))
      ->capture_default_str();
  app.add_option("--comm", o.comm,
                 "data parallel collectives: auto | single | mpi | nccl (auto: single unless "
                 "launched by mpirun; then mpi for --device cpu, nccl for cuda). Run N ranks "
                 "with mpirun -np N; --batch and --accum are per rank")
      ->check(CLI::IsMember({"auto", "single", "mpi", "nccl"}))
      ->capture_default_str();
  app.add_option("--steps", o.steps, "optimizer steps (effective batches)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--stop-at", o.stop_at,
                 "stop after this step (checkpointing at exit) as if preempted; the LR schedule "
                 "still spans --steps")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--seed", o.seed, "seed for weights and batch order")->capture_default_str();
  app.add_option("--batch", o.batch, "sequences per micro-batch")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  app.add_option("--accum", o.accum, "micro-batches per optimizer step")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  app.add_option("--lr", o.lr, "peak learning rate")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--min-lr", o.min_lr, "final learning rate of the cosine (default lr/10)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--warmup", o.warmup, "linear warmup updates")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--weight-decay", o.weight_decay, "AdamW weight decay on 2-D weights")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--grad-clip", o.grad_clip, "global-norm clip after unscaling (0: off)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--context", o.context, "sequence length")
      ->check(CLI::Range(1, 1 << 14))
      ->capture_default_str();
  app.add_option("--width", o.width, "embedding width")->check(CLI::Range(1, 1 << 14))->capture_default_str();
  app.add_option("--heads", o.heads, "attention heads")->check(CLI::Range(1, 1 << 10))->capture_default_str();
  app.add_option("--layers", o.layers, "transformer blocks")->check(CLI::Range(1, 1 << 10))->capture_default_str();
  app.add_option("--data", o.data, "text file (character vocabulary); default: built-in corpus");
  app.add_option("--val-fraction", o.val_fraction, "share of the data held out for validation")
      ->check(CLI::Range(0.001, 0.9))
      ->capture_default_str();
  app.add_option("--eval-every", o.eval_every, "validation loss every N steps (0: only after the last)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--eval-batches", o.eval_batches, "validation batches per evaluation")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  app.add_option("--checkpoint-dir", o.checkpoint_dir,
                 "write DIR/checkpoint.bin every --checkpoint-every steps and at exit");
  app.add_option("--checkpoint-every", o.checkpoint_every, "steps between checkpoints (0: exit only)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_flag("--resume", o.resume, "continue from DIR/checkpoint.bin of --checkpoint-dir");
  app.add_option("--scaler", o.scaler,
                 "static | dynamic | hysteresis (default: dynamic for amp-fp16, else static 1)")
      ->check(CLI::IsMember({"static", "dynamic", "hysteresis"}));
  app.add_option("--init-scale", o.init_scale, "initial (or static) loss scale")
      ->check(CLI::PositiveNumber);
  app.add_option("--growth-interval", o.growth_interval, "clean steps before the scale grows")
      ->check(CLI::PositiveNumber);
  app.add_option("--hysteresis", o.hysteresis, "inf steps tolerated before backing off (hysteresis)")
      ->check(CLI::PositiveNumber);
  app.add_option("--min-scale", o.min_scale, "lowest scale after backoff")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--inject-nan", o.inject_nan, "NaN into TENSOR at STEP: TENSOR@STEP (repeatable)");
  app.add_option("--inject-inf", o.inject_inf, "Inf into TENSOR at STEP: TENSOR@STEP (repeatable)");
  app.add_option("--inject-overflow", o.inject_overflow,
                 "at STEP, one logits gradient exceeds its format's max finite (repeatable; "
                 "see --inject-overflow-tensor)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--inject-overflow-every", o.inject_overflow_every,
                 "--inject-overflow at every K-th step (K, 2K, ...)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--inject-overflow-tensor", o.inject_overflow_tensor,
                 "--inject-overflow(-every) sets element 0 of this forward activation (e.g. "
                 "h1.attn.scores), micro-batch 0, to twice the compute format's max finite "
                 "instead: Inf where its layer computes in FP16, finite where it runs in FP32");
  app.add_option("--inject-rank", o.inject_rank,
                 "only this rank injects --inject-nan/--inject-inf/--inject-overflow "
                 "(default: every rank)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--grad-shrink", o.grad_shrink, "multiply every gradient (induces underflow)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--grad-shrink-end", o.grad_shrink_end,
                 "gradient multiplier at the last step; it moves geometrically from "
                 "--grad-shrink (gradients shrinking over training)")
      ->check(CLI::PositiveNumber);
  app.add_option("--fp32-layer", o.fp32_layers, "compute LAYER in FP32 from STEP: LAYER[@STEP]");
  app.add_option("--bf16-gemm", o.bf16_gemms,
                 "FP8/FP4 modes: run linear LAYER (e.g. h0.mlp.fc, or *) in BF16, unquantised, "
                 "from STEP: LAYER[@STEP] (repeatable)");
  app.add_option("--fp8-amax-history", o.fp8_amax_history,
                 "fp8-delayed: amax history length per GEMM input (default 16; Transformer "
                 "Engine's default is 1024)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--fp8-margin", o.fp8_margin,
                 "fp8-delayed: scale = max / amax / 2^margin (default 0)")
      ->check(CLI::Range(0, 64));
  app.add_option("--loss-cost-every", o.loss_cost_every,
                 "FP8/FP4 modes with --server or --agent: measure what each layer's recipe "
                 "costs the loss on every N-th observed step (one extra GEMM per layer; 0: "
                 "never; default 16)")
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--log-json", o.log_json,
                 "write one JSON object per step to FILE (rank r > 0 of a multi-rank run: to "
                 "FILE.rank<r>)");
  app.add_option("--threads", o.threads, "OpenBLAS threads for --device cpu (0: its default)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  app.add_flag("--quiet", o.quiet, "no progress line");
  add_agent_flags(app, &o.agent);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "ampscope-train: error: %s\n", one_line(e.what()).c_str());
    return 2;
  }
  std::optional<MpiRuntime> mpi;
  // One line on stderr; in a multi-rank job, naming the rank and ending every rank.
  const auto fail = [&mpi](const std::exception& e, int code) {
    const bool multi = mpi && mpi->world_size() > 1;
    std::fprintf(stderr, "ampscope-train: error: %s%s\n",
                 multi ? ("rank " + std::to_string(mpi->world_rank()) + ": ").c_str() : "",
                 one_line(e.what()).c_str());
    if (multi) {
      std::fflush(stderr);
      mpi->abort(code);
    }
    return code;
  };
  try {
    std::unique_ptr<Communicator> comm = make_communicator(o, mpi, &argc, &argv);
    CudaBackendOptions cuda;
    if (comm->name() == "nccl") cuda.device = mpi->local_rank();
    cuda.fp8_gemms = o.fp8_gemm == "auto";
    return run(o, std::move(comm), cuda);
  } catch (const UsageError& e) {
    return fail(e, 2);
  } catch (const ampscope::Error& e) {
    return fail(e, 2);
  } catch (const std::exception& e) {
    return fail(e, 1);
  }
}
