#include "agent_adapter.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>

#include "ampscope/check.h"

namespace ampscope::trainer {
namespace {

agent::ScalerSettings settings_of(const ScalerState& s) {
  agent::ScalerSettings a;
  a.kind = s.config.kind;
  a.scale = s.scale;
  a.growth_factor = s.config.growth_factor;
  a.backoff_factor = s.config.backoff_factor;
  a.growth_interval = s.config.growth_interval;
  a.hysteresis = s.config.kind == ScalerKind::kHysteresis ? s.config.hysteresis : 0;
  a.min_scale = s.config.min_scale;
  a.max_scale = s.config.max_scale;
  return a;
}

// The compute format of a precision mode: what its matmuls produce.
Format compute_format(PrecisionMode m) { return PrecisionPolicy::for_mode(m).compute; }

}  // namespace

// The trainer's ScalerHandle as the agent's ScalerControl.
class AgentAdapter::Scaler final : public agent::ScalerControl {
 public:
  explicit Scaler(ScalerHandle& handle) : handle_(handle) {}
  agent::ScalerSettings settings() const override { return settings_of(handle_.state()); }
  std::string schedule(const agent::ScalerChange& c) override {
    ScalerUpdate u;
    u.effective_from_step = c.effective_from_step;
    if (c.scale) u.scale = static_cast<float>(*c.scale);
    u.growth_factor = c.growth_factor;
    u.backoff_factor = c.backoff_factor;
    u.growth_interval = c.growth_interval;
    u.hysteresis = c.hysteresis;
    if (c.min_scale) u.min_scale = static_cast<float>(*c.min_scale);
    if (c.max_scale) u.max_scale = static_cast<float>(*c.max_scale);
    return handle_.schedule(u);
  }

 private:
  ScalerHandle& handle_;
};

std::string AgentAdapter::Overrides::replace(const std::vector<std::string>& layers,
                                             std::int64_t from_step) {
  for (const auto& l : layers) {
    if (std::find(set_.valid_layers().begin(), set_.valid_layers().end(), l) ==
        set_.valid_layers().end()) {
      return "unknown layer '" + l + "'";
    }
  }
  // Called at the start of from_step (before the forward pass reads the set): removing now
  // and adding from from_step is exactly "this set from from_step on".
  for (const auto& [name, step] : set_.entries()) {
    if (std::find(layers.begin(), layers.end(), name) == layers.end()) set_.remove(name);
  }
  for (const auto& l : layers) {
    if (std::string e = set_.add(l, from_step); !e.empty()) return e;
  }
  return {};
}

std::string AgentAdapter::Gemms::replace(const std::vector<std::string>& layers,
                                         std::int64_t from_step) {
  const std::vector<std::string>& valid = set_.valid_layers();
  for (const auto& l : layers) {
    if (std::find(valid.begin(), valid.end(), l) == valid.end()) {
      return "unknown linear layer '" + l + "'";
    }
  }
  if (from_step < 0) return "from_step must be >= 0, got " + std::to_string(from_step);
  // Called at the start of from_step, before the step reads the set (as Overrides::replace).
  for (const auto& [name, step] : set_.bf16_entries()) {
    if (std::find(layers.begin(), layers.end(), name) == layers.end()) set_.remove_bf16(name);
  }
  const auto entries = set_.bf16_entries();
  for (const auto& l : layers) {
    const auto it =
        std::find_if(entries.begin(), entries.end(), [&](const auto& e) { return e.first == l; });
    if (it != entries.end() && it->second <= from_step) continue;
    if (std::string e = set_.add_bf16(l, from_step); !e.empty()) return e;
  }
  return {};
}

std::string AgentAdapter::RecipeSettings::schedule(const agent::RecipeChange& c) {
  if (!delayed_) return "the run does not use delayed scaling";
  DelayedSettings s = set_.delayed("*", c.effective_from_step).value_or(default_);
  if (c.amax_history_length) s.history_length = *c.amax_history_length;
  if (c.margin) s.margin = *c.margin;
  return set_.set_delayed("*", s, c.effective_from_step);
}

void add_agent_flags(CLI::App& app, AgentFlags* flags) {
  auto add = [&](const std::string& flag, const std::string& key, const std::string& help) {
    app.add_option_function<std::string>(
           flag, [flags, key](const std::string& v) { flags->options.emplace_back(key, v); }, help)
        ->group("Agent (also AMPSCOPE_<KEY> variables)");
  };
  add("--server", "server",
      "ampscope-server address host:port, or several as a:50051,b:50051 (tried in order); "
      "attaches the agent");
  add("--run-id", "run_id", "run id the server files the reports under");
  add("--token-file", "token_file", "file whose first line is the server's token");
  add("--spool-dir", "spool_dir", "directory for unacknowledged reports (default: a temp dir)");
  add("--sample-counts", "sample_counts", "NaN/Inf/max counts every step (on|off)");
  add("--sample-count-roles", "sample_count_roles", "roles counted every step (comma list)");
  add("--sample-full-every", "sample_full_every", "full statistics every N steps (0: never)");
  add("--sample-full-on-nonfinite", "sample_full_on_nonfinite",
      "full statistics from a non-finite value on, and the next step (on|off)");
  add("--sample-full-on-scale-change", "sample_full_on_scale_change",
      "full statistics on the step after a loss-scale change (on|off)");
  add("--sample-full-roles", "sample_full_roles", "roles measured in full (comma list)");
  add("--sample-full-ranks", "sample_full_ranks",
      "ranks that send full statistics: auto|all|node|every:K|comma list");
  add("--stats-thread", "stats_thread",
      "measure on the training thread or a worker: caller|worker");
  add("--cupti-every", "cupti_every", "tensor-core utilisation every N steps on a GPU (0: off)");
  app.add_option_function<std::vector<std::string>>(
         "--agent",
         [flags](const std::vector<std::string>& kvs) {
           for (const auto& kv : kvs) {
             const auto eq = kv.find('=');
             if (eq == std::string::npos || eq == 0) {
               throw CLI::ValidationError("--agent", "expected KEY=VALUE, got '" + kv + "'");
             }
             flags->options.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
           }
         },
         "any other agent option KEY=VALUE (repeatable), e.g. spool_max_bytes=1G")
      ->group("Agent (also AMPSCOPE_<KEY> variables)");
}

std::unique_ptr<AgentAdapter> attach_agent(Trainer& trainer, const AgentFlags& flags) {
  agent::AgentConfig config;
  if (std::string e = agent::apply_environment(config); !e.empty()) throw Error(e);
  for (const auto& [key, value] : flags.options) {
    if (std::string e = agent::set_option(config, key, value); !e.empty()) throw Error(e);
  }
  // The layout is the communicator's, whatever the options said. Pure data parallelism:
  // replicated gradients, and this trainer always votes, so several ranks agree per step
  // unless an option asked otherwise (policy_agreement=independent: a negative control).
  config.rank = static_cast<std::uint32_t>(trainer.rank());
  config.world_size = static_cast<std::uint32_t>(trainer.world_size());
  config.data_parallel_size = config.world_size;
  config.gradients_sharded = false;
  if (config.world_size > 1 && config.policy_agreement == agent::PolicyAgreementMode::kAuto) {
    config.policy_agreement = agent::PolicyAgreementMode::kPerStep;
  }
  const bool wanted = !config.server.empty() || !config.run_id.empty() || !config.spool_dir.empty();
  if (!wanted) return nullptr;
  if (config.run_id.empty()) throw Error("--run-id (or AMPSCOPE_RUN_ID) is needed by the agent");
  std::unique_ptr<agent::Agent> a;
  if (agent::Status s = agent::Agent::create(config, run_info(trainer), &a); !s.ok()) {
    if (s.code == agent::StatusCode::kInvalidArgument) throw Error("agent: " + s.message);
    std::fprintf(stderr, "ampscope-train: agent not attached: %s\n", s.message.c_str());
    return nullptr;
  }
  return std::make_unique<AgentAdapter>(trainer, std::move(a));
}

agent::RunInfo run_info(Trainer& trainer) {
  agent::RunInfo run;
  run.trainer = std::string("ampscope-train ") + agent::version();
  run.precision = std::string(precision_name(trainer.config().precision));
  run.compute_format = compute_format(trainer.config().precision);
  run.scaler = settings_of(trainer.scaler().state());
  return run;
}

AgentAdapter::AgentAdapter(Trainer& trainer, std::unique_ptr<agent::Agent> agent,
                           bool install_hooks)
    : trainer_(trainer),
      scaler_(std::make_unique<Scaler>(trainer.scaler())),
      overrides_(std::make_unique<Overrides>(trainer.fp32_overrides(), trainer.model())),
      agent_(std::move(agent)),
      num_params_(trainer.model().params().size()),
      installed_(install_hooks) {
  agent_->attach_scaler(scaler_.get());
  agent_->attach_overrides(overrides_.get());
  const PrecisionMode mode = trainer.config().precision;
  if (PrecisionPolicy::for_mode(mode).scaled_gemms) {
    gemms_ = std::make_unique<Gemms>(trainer.gemm_precision());
    recipe_ = std::make_unique<RecipeSettings>(
        trainer.gemm_precision(), trainer.config().fp8_delayed, mode == PrecisionMode::kFP8Delayed);
    agent_->attach_gemm_precision(gemms_.get(), recipe_.get());
  }
  if (installed_) {
    trainer_.set_observer(this);
    trainer_.add_step_listener(this);
  }
  if (agent::resolved_agreement(agent_->config()) == agent::PolicyAgreementMode::kPerStep) {
    trainer_.set_policy_agreement(this);
  }
}

AgentAdapter::~AgentAdapter() {
  if (installed_) trainer_.set_observer(nullptr);
  trainer_.set_policy_agreement(nullptr);
  agent_->shutdown(std::chrono::milliseconds(0));
}

bool AgentAdapter::observe_step(std::int64_t step) {
  unscaled_seen_ = 0;
  return agent_->begin_step(step);
}

agent::TensorView to_agent_view(const TensorView& t) {
  agent::TensorView v;
  v.name = t.name;
  v.role = t.role;
  v.phase = t.phase;
  v.dtype = t.dtype;
  v.data = t.data;
  v.shape = t.shape;
  v.device = t.device;
  v.stream = t.stream;
  v.scale = t.scale;
  v.micro_step = t.micro_step;
  v.order = t.order;
  // The model says where each weight gradient can overflow (Gpt::grad_held): the layer's
  // compute format for matmul weights and biases (each micro-batch's contribution is rounded to
  // it before the buffer adds it up), the gradient buffer's format (FP32 in the AMP modes) for
  // LayerNorm, wpe and the tied wte, whose compute-format part is shown on its own as
  // "lm_head". Activation gradients stay unset: the run's compute format, which they pass
  // through as operands of the next product.
  v.held = t.held;
  return v;
}

void AgentAdapter::on_tensor(const TensorView& t) {
  agent_->observe(to_agent_view(t));
  count_unscaled(t);
}

std::optional<std::vector<TargetSpec>> AgentAdapter::stats_targets(const TensorView& meta) {
  if (auto target = agent_->stats_target(to_agent_view(meta))) {
    return std::vector<TargetSpec>{*target};
  }
  return std::nullopt;
}

void AgentAdapter::on_tensor_stats(const TensorView& t, const TensorStats& stats) {
  // Refused statistics (a notice says why) leave the tensor to the agent's own measurement.
  if (!agent_->observe_stats(to_agent_view(t), stats).ok()) agent_->observe(to_agent_view(t));
  count_unscaled(t);
}

std::string quantizer_name(const QuantizedGemmInput& q) {
  const GemmUse first = q.operand == GemmOperand::kOutputGrad ? GemmUse::kDgrad : GemmUse::kForward;
  std::string name(q.name);
  if (q.use != first) name.append("@").append(gemm_use_name(q.use));
  return name;
}

void AgentAdapter::on_quantized(const QuantizedGemmInput& q) {
  const std::string name = quantizer_name(q);
  agent::QuantizerView v;
  v.name = name;
  v.role = q.role;
  v.phase = q.phase;
  v.micro_step = q.micro_step;
  v.counts = q.counts;
  v.amax_history = q.amax_history;
  v.layer = q.layer;
  v.what_if = q.what_if;
  v.loss_cost = q.loss_cost;
  agent_->observe_quantizer(v);
}

// The trainer shows every weight gradient once after unscaling, then runs the norm and the
// optimizer: the last of them opens the optimizer's range.
void AgentAdapter::count_unscaled(const TensorView& t) {
  if (t.phase == TensorPhase::kAfterUnscale && ++unscaled_seen_ == num_params_) {
    agent_->mark_phase(agent::StepPhase::kOptimizer);
  }
}

void AgentAdapter::on_step(const StepEvent& e) {
  agent::StepInfo i;
  i.step = e.step;
  i.loss = e.loss;
  i.loss_scale = e.loss_scale;
  i.scale_after = e.scale_after;
  i.found_inf = e.found_inf;
  i.skipped = e.skipped;
  i.grad_norm = e.grad_norm;
  i.lr = e.lr;
  i.tokens = e.tokens;
  i.step_time_s = e.step_time_s;
  i.optimizer_steps = e.optimizer_steps;
  i.fp32_layers = e.fp32_layers;
  i.bf16_gemms = e.bf16_gemms;
  i.val_loss = e.val_loss;
  step_seconds_ += e.step_time_s;
  agent_->end_step(i);
}

PolicyVote AgentAdapter::vote() {
  const agent::PolicyVote v = agent_->policy_vote();
  return {v.received_seq, v.fallback};
}

void AgentAdapter::agreed(const PolicyVote& v) {
  // Refused only on a broken reduction (a seq above this rank's): then nothing new applies
  // here, and the agent reports why in a notice.
  if (const agent::Status s = agent_->policy_agreed({v.received_seq, v.fallback}); !s.ok()) {
    agent_->add_notice("ampscope-train: policy agreement refused: " + s.message);
  }
}

void AgentAdapter::finish() {
  const agent::Status s = agent_->shutdown(agent_->config().flush_timeout);
  const agent::Counters c = agent_->counters();
  const double share = step_seconds_ > 0 ? 100.0 * c.training_thread_s / step_seconds_ : 0.0;
  std::fprintf(stderr,
               "ampscope-agent: %llu steps, %llu reports spooled, acknowledged up to seq %llu, "
               "%llu dropped, %llu reconnects, %llu policy updates applied, %llu refused; "
               "training thread %.2f%% of step time%s%s\n",
               static_cast<unsigned long long>(c.steps),
               static_cast<unsigned long long>(c.reports_spooled),
               static_cast<unsigned long long>(c.reports_acked),
               static_cast<unsigned long long>(c.dropped_reports),
               static_cast<unsigned long long>(c.reconnects),
               static_cast<unsigned long long>(c.policies_applied),
               static_cast<unsigned long long>(c.policies_refused), share, s.ok() ? "" : "; ",
               s.ok() ? "" : s.message.c_str());
}

}  // namespace ampscope::trainer
