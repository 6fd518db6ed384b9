// The one place where ampscope-train meets ampscope::agent: the trainer's hooks (tensor
// observer, step listener, ScalerHandle, Fp32OverrideSet, GemmPrecisionSet) mapped onto the
// agent's interfaces,
// and the agent's command-line flags. Neither library knows the other; only ampscope-train
// links both.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ampscope/agent/agent.h"
#include "ampscope/trainer/trainer.h"

namespace CLI {
class App;
}

namespace ampscope::trainer {

// The agent's flags as given; empty strings are "not given".
struct AgentFlags {
  // (key, value) in command-line order, keys of ampscope::agent::set_option.
  std::vector<std::pair<std::string, std::string>> options;
};

// Adds --server, --run-id, --token-file, --spool-dir, the sampling flags (--sample-counts,
// --sample-full-every, --sample-full-on-nonfinite, --sample-full-on-scale-change,
// --sample-count-roles, --sample-full-roles, --sample-full-ranks, --stats-thread,
// --cupti-every) and --agent KEY=VALUE (any other agent option) to `app`.
void add_agent_flags(CLI::App& app, AgentFlags* flags);

class AgentAdapter;

// Builds the agent's configuration (defaults, then AMPSCOPE_* variables, then the flags; rank,
// world size and data-parallel size always from the trainer's communicator, and per-step
// policy agreement on several ranks unless policy_agreement says otherwise) and
// attaches it to `trainer` when a server, run id or spool directory is configured. Returns
// nullptr when the agent is not wanted. Throws ampscope::Error (a usage error) on a bad
// option; when the agent cannot start, prints why and returns nullptr (training goes on).
std::unique_ptr<AgentAdapter> attach_agent(Trainer& trainer, const AgentFlags& flags);

// What the Hello says about `trainer`'s run.
agent::RunInfo run_info(Trainer& trainer);

// The trainer's tensor as the agent's (borrowing the same data and name).
agent::TensorView to_agent_view(const TensorView& tensor);

// The name a quantised GEMM input is reported under: its own name for the operand's first use
// (input and weight: forward; output_grad: dgrad), "<name>@<use>" for the others ("h0.mlp.fc
// .weight@dgrad", "h0.mlp.fc.output_grad@wgrad"), so that a block recipe's quantisation along
// each GEMM's reduction axis is a quantiser of its own.
std::string quantizer_name(const QuantizedGemmInput& input);

class AgentAdapter final : public TensorObserver, public StepListener, public PolicyAgreement {
 public:
  // Attaches the agent's scaler and override controls, and in the FP8/FP4 modes its GEMM
  // precision (Gemms, RecipeSettings); with install_hooks, also sets itself as the trainer's
  // observer and step listener (a caller that switches observers forwards the
  // hooks itself, as bench/agent_overhead.cc does).
  AgentAdapter(Trainer& trainer, std::unique_ptr<agent::Agent> agent, bool install_hooks = true);
  ~AgentAdapter() override;

  bool observe_step(std::int64_t step) override;
  void on_tensor(const TensorView& tensor) override;
  // Fused statistics: the agent's target (Agent::stats_target) and Agent::observe_stats.
  std::optional<std::vector<TargetSpec>> stats_targets(const TensorView& meta) override;
  void on_tensor_stats(const TensorView& tensor, const TensorStats& stats) override;
  // FP8/FP4 modes: the quantiser's counts as Agent::observe_quantizer, under quantizer_name().
  void on_quantized(const QuantizedGemmInput& input) override;
  void on_step(const StepEvent& event) override;
  // The per-step policy agreement (installed when the agent's mode is per_step: several ranks).
  PolicyVote vote() override;
  void agreed(const PolicyVote& vote) override;

  // Flushes (up to the agent's flush_timeout) and prints a one-line summary to stderr.
  void finish();
  agent::Agent& agent() { return *agent_; }

  class Overrides;
  class Gemms;
  class RecipeSettings;

 private:
  class Scaler;
  Trainer& trainer_;
  std::unique_ptr<Scaler> scaler_;
  std::unique_ptr<Overrides> overrides_;
  std::unique_ptr<Gemms> gemms_;            // FP8/FP4 modes only
  std::unique_ptr<RecipeSettings> recipe_;  // FP8/FP4 modes only
  std::unique_ptr<agent::Agent> agent_;
  std::size_t num_params_;
  bool installed_;
  std::size_t unscaled_seen_ = 0;  // after-unscale weight grads seen this step
  void count_unscaled(const TensorView& t);
  double step_seconds_ = 0.0;  // the trainer's step times, summed
};

// The trainer's Fp32OverrideSet as the agent's PrecisionOverrides, with the model's names:
// capable layers are its layer_names(), and layer_of() is Gpt::layer_of. Both referents must
// outlive it. Thread safety: capable_layers() and layer_of() from any thread (they read what
// does not change after construction); replace() as Fp32OverrideSet allows.
class AgentAdapter::Overrides final : public agent::PrecisionOverrides {
 public:
  Overrides(Fp32OverrideSet& set, const Gpt& model) : set_(set), model_(model) {}
  std::vector<std::string> capable_layers() const override { return set_.valid_layers(); }
  std::string replace(const std::vector<std::string>& layers, std::int64_t from_step) override;
  std::string layer_of(std::string_view tensor) const override { return model_.layer_of(tensor); }

 private:
  Fp32OverrideSet& set_;
  const Gpt& model_;
};

// The trainer's GemmPrecisionSet as the agent's GEMM overrides (Agent::attach_gemm_precision):
// capable layers are the linear layers of an FP8/FP4 run (its valid_layers(), Gpt::gemm_layers),
// and replace() makes exactly the given layers the BF16 set from `from_step` on: the others,
// "*" included, go back to the recipe; a layer already in BF16 by then keeps its entry, one not
// yet (or due later) enters at `from_step`. Nothing changes when a name is not a linear layer.
// The set must outlive it. Thread safety: as GemmPrecisionSet's (every member, any thread).
class AgentAdapter::Gemms final : public agent::PrecisionOverrides {
 public:
  explicit Gemms(GemmPrecisionSet& set) : set_(set) {}
  std::vector<std::string> capable_layers() const override { return set_.valid_layers(); }
  std::string replace(const std::vector<std::string>& layers, std::int64_t from_step) override;

 private:
  GemmPrecisionSet& set_;
};

// fp8-delayed's settings as the agent steers them: a RecipeChange becomes the "*" entry of the
// GemmPrecisionSet (every layer's history length and margin) from its step, the fields it
// leaves unset as they are in force at that step (the "*" entry, else the run's
// TrainerConfig::fp8_delayed). delayed() is fixed at construction (the run's mode).
class AgentAdapter::RecipeSettings final : public agent::RecipeControl {
 public:
  RecipeSettings(GemmPrecisionSet& set, const DelayedSettings& run_default, bool delayed)
      : set_(set), default_(run_default), delayed_(delayed) {}
  bool delayed() const override { return delayed_; }
  std::string schedule(const agent::RecipeChange& change) override;

 private:
  GemmPrecisionSet& set_;
  DelayedSettings default_;
  bool delayed_;
};

}  // namespace ampscope::trainer
