// The one place where ampscope-train meets ampscope::agent: the trainer's hooks (tensor
// observer, step listener, ScalerHandle, Fp32OverrideSet) mapped onto the agent's interfaces,
// and the agent's command-line flags. Neither library knows the other; only ampscope-train
// links both.
#pragma once

#include <chrono>
#include <memory>
#include <string>
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
// --sample-count-roles, --sample-full-roles, --stats-thread, --cupti-every) and
// --agent KEY=VALUE (any other agent option) to `app`.
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

class AgentAdapter final : public TensorObserver, public StepListener, public PolicyAgreement {
 public:
  // Attaches the agent's scaler and override controls; with install_hooks, also sets itself as
  // the trainer's observer and step listener (a caller that switches observers forwards the
  // hooks itself, as bench/agent_overhead.cc does).
  AgentAdapter(Trainer& trainer, std::unique_ptr<agent::Agent> agent, bool install_hooks = true);
  ~AgentAdapter() override;

  bool observe_step(std::int64_t step) override;
  void on_tensor(const TensorView& tensor) override;
  void on_step(const StepEvent& event) override;
  // The per-step policy agreement (installed when the agent's mode is per_step: several ranks).
  PolicyVote vote() override;
  void agreed(const PolicyVote& vote) override;

  // Flushes (up to the agent's flush_timeout) and prints a one-line summary to stderr.
  void finish();
  agent::Agent& agent() { return *agent_; }

 private:
  class Scaler;
  class Overrides;
  Trainer& trainer_;
  std::unique_ptr<Scaler> scaler_;
  std::unique_ptr<Overrides> overrides_;
  std::unique_ptr<agent::Agent> agent_;
  std::size_t num_params_;
  bool installed_;
  std::size_t unscaled_seen_ = 0;  // after-unscale weight grads seen this step
  double step_seconds_ = 0.0;      // the trainer's step times, summed
};

}  // namespace ampscope::trainer
