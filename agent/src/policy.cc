#include "policy.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <sstream>
#include <string_view>

#include "ampscope/text.h"
#include "spool.h"

namespace ampscope::agent {
namespace {

// The wire's bound on Hello.fp32_capable_layers and bf16_capable_gemms, and so on a set.
constexpr std::size_t kMaxLayers = 4096;
constexpr std::uint32_t kMaxAmaxHistoryLength = 1024;
constexpr std::uint32_t kMaxAmaxMargin = 64;
constexpr std::int64_t kAgreementSilentSteps = 100;
constexpr double kFp32Max = 3.4028234663852886e38;

bool power_of_two(double v) {
  if (!std::isfinite(v) || v <= 0.0) return false;
  int e = 0;
  return std::frexp(v, &e) == 0.5;
}

// An outcome goes back to the server in a report, whose rules take a PolicyOutcome's policy_id
// and reason as clean text (ampscope/text.h) of at most 64 and 512 bytes: one that breaks them
// is refused. The update's own text (its ids, run id, tensor names) and the trainer's exception
// text are therefore made clean text (escaped, cut) where they enter a reason or an outcome.
constexpr std::size_t kOutcomeIdMaxBytes = text::kShortTextMaxBytes;
constexpr std::size_t kOutcomeReasonMaxBytes = text::kNoticeMaxBytes;
constexpr std::size_t kQuotedMaxBytes = 128;

std::string clean(std::string_view s, std::size_t max_bytes) {
  return text::clean_text(s, max_bytes);
}

// An update without an id still gets its outcome (refused), under the id "(none)".
std::string outcome_id(std::string_view policy_id) {
  return policy_id.empty() ? "(none)" : clean(policy_id, kOutcomeIdMaxBytes);
}

std::string num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

ScalerChange to_change(const v1::PolicyUpdate& u, std::int64_t step) {
  ScalerChange c;
  c.effective_from_step = step;
  if (u.has_loss_scale()) c.scale = u.loss_scale();
  if (u.has_growth_factor()) c.growth_factor = u.growth_factor();
  if (u.has_backoff_factor()) c.backoff_factor = u.backoff_factor();
  if (u.has_growth_interval()) c.growth_interval = u.growth_interval();
  if (u.has_hysteresis()) c.hysteresis = static_cast<int>(u.hysteresis());
  if (u.has_min_scale()) c.min_scale = u.min_scale();
  if (u.has_max_scale()) c.max_scale = u.max_scale();
  return c;
}

bool changes_scaler(const v1::PolicyUpdate& u) {
  return u.has_loss_scale() || u.has_growth_factor() || u.has_backoff_factor() ||
         u.has_growth_interval() || u.has_hysteresis() || u.has_min_scale() || u.has_max_scale();
}

bool changes_recipe(const v1::PolicyUpdate& u) {
  return u.has_amax_history_length() || u.has_amax_margin();
}

RecipeChange to_recipe_change(const v1::PolicyUpdate& u, std::int64_t step) {
  RecipeChange c;
  c.effective_from_step = step;
  if (u.has_amax_history_length()) {
    c.amax_history_length = static_cast<int>(u.amax_history_length());
  }
  if (u.has_amax_margin()) c.margin = static_cast<int>(u.amax_margin());
  return c;
}

bool changes_config(const v1::PolicyUpdate& u) {
  return u.has_growth_factor() || u.has_backoff_factor() || u.has_growth_interval() ||
         u.has_hysteresis() || u.has_min_scale() || u.has_max_scale();
}

}  // namespace

std::string fp32_layers_of(const v1::PolicyUpdate& u, const PrecisionOverrides& overrides,
                           std::vector<std::string>* layers) {
  layers->clear();
  for (int i = 0; i < u.fp32_tensors_size(); ++i) {
    const std::string& name = u.fp32_tensors(i);
    const std::string where =
        "fp32_tensors[" + std::to_string(i) + "]: '" + clean(name, kQuotedMaxBytes) + "'";
    std::string layer;
    // The trainer's code, on the reader thread too, where nothing else would catch.
    try {
      layer = overrides.layer_of(name);
    } catch (const std::exception& e) {
      return where + ": mapping it to a layer failed: " + clean(e.what(), kQuotedMaxBytes);
    } catch (...) {
      return where + ": mapping it to a layer failed";
    }
    if (layer.empty()) return where + " is not a layer the trainer can compute in FP32";
    if (std::find(layers->begin(), layers->end(), layer) == layers->end()) {
      layers->push_back(std::move(layer));
    }
  }
  return {};
}

std::string validate_update(const v1::PolicyUpdate& u, const std::string& run_id,
                            const ScalerSettings& current, bool has_scaler,
                            const PrecisionOverrides* overrides,
                            std::vector<std::string>* fp32_layers) {
  if (u.policy_id().empty()) return "policy_id: must not be empty";
  if (!u.run_id().empty() && u.run_id() != run_id) {
    return "run_id: '" + clean(u.run_id(), kQuotedMaxBytes) + "' is not this run ('" + run_id +
           "')";
  }
  if (u.effective_from_step() < 0) {
    return "effective_from_step: must be >= 0, got " + std::to_string(u.effective_from_step());
  }
  if (changes_scaler(u) && !has_scaler) return "no loss scaler is attached to the agent";
  if (u.has_min_scale() && !power_of_two(u.min_scale())) {
    return "min_scale: must be a finite power of two > 0, got " + num(u.min_scale());
  }
  if (u.has_max_scale() && !power_of_two(u.max_scale())) {
    return "max_scale: must be a finite power of two > 0, got " + num(u.max_scale());
  }
  const double lo = u.has_min_scale() ? u.min_scale() : current.min_scale;
  const double hi = u.has_max_scale() ? u.max_scale()
                                      : (current.max_scale > 0.0 ? current.max_scale : kFp32Max);
  if (lo > hi) return "max_scale: " + num(hi) + " is below min_scale " + num(lo);
  if (u.has_loss_scale()) {
    if (!power_of_two(u.loss_scale())) {
      return "loss_scale: must be a finite power of two > 0, got " + num(u.loss_scale());
    }
    if (u.loss_scale() < lo || u.loss_scale() > hi) {
      return "loss_scale: " + num(u.loss_scale()) + " is outside [" + num(lo) + ", " + num(hi) +
             "]";
    }
  }
  if (u.has_growth_factor() && !(std::isfinite(u.growth_factor()) && u.growth_factor() >= 1.0)) {
    return "growth_factor: must be finite and >= 1, got " + num(u.growth_factor());
  }
  if (u.has_backoff_factor() && !(u.backoff_factor() > 0.0 && u.backoff_factor() <= 1.0)) {
    return "backoff_factor: must be in (0, 1], got " + num(u.backoff_factor());
  }
  if (u.has_growth_interval() && u.growth_interval() < 1) {
    return "growth_interval: must be >= 1, got 0";
  }
  if (u.has_hysteresis() && u.hysteresis() < 1) return "hysteresis: must be >= 1, got 0";
  if (u.fp32_tensors_set()) {
    if (overrides == nullptr) return "fp32_tensors: no FP32 override set is attached to the agent";
    if (static_cast<std::size_t>(u.fp32_tensors_size()) > kMaxLayers) {
      return "fp32_tensors: " + std::to_string(u.fp32_tensors_size()) + " names, at most " +
             std::to_string(kMaxLayers);
    }
    std::vector<std::string> layers;
    if (std::string err = fp32_layers_of(u, *overrides, &layers); !err.empty()) return err;
    if (fp32_layers != nullptr) *fp32_layers = std::move(layers);
  }
  return {};
}

std::string validate_gemm_update(const v1::PolicyUpdate& u,
                                 const std::vector<std::string>* capable_gemms, bool has_recipe,
                                 bool recipe_delayed, std::vector<std::string>* bf16_layers) {
  if (u.bf16_gemms_set()) {
    if (capable_gemms == nullptr) {
      return "bf16_gemms: no GEMM precision set is attached to the agent";
    }
    if (static_cast<std::size_t>(u.bf16_gemms_size()) > kMaxLayers) {
      return "bf16_gemms: " + std::to_string(u.bf16_gemms_size()) + " names, at most " +
             std::to_string(kMaxLayers);
    }
    std::vector<std::string> layers;
    for (int i = 0; i < u.bf16_gemms_size(); ++i) {
      const std::string& name = u.bf16_gemms(i);
      if (std::find(capable_gemms->begin(), capable_gemms->end(), name) == capable_gemms->end()) {
        return "bf16_gemms[" + std::to_string(i) + "]: '" + clean(name, kQuotedMaxBytes) +
               "' is not a GEMM layer the trainer can run in BF16";
      }
      if (std::find(layers.begin(), layers.end(), name) == layers.end()) layers.push_back(name);
    }
    if (bf16_layers != nullptr) *bf16_layers = std::move(layers);
  }
  if (changes_recipe(u)) {
    const char* field = u.has_amax_history_length() ? "amax_history_length" : "amax_margin";
    if (!has_recipe) return std::string(field) + ": no recipe control is attached to the agent";
    if (!recipe_delayed) return std::string(field) + ": the run does not use delayed scaling";
  }
  if (u.has_amax_history_length() &&
      (u.amax_history_length() < 1 || u.amax_history_length() > kMaxAmaxHistoryLength)) {
    return "amax_history_length: must be in [1, " + std::to_string(kMaxAmaxHistoryLength) +
           "], got " + std::to_string(u.amax_history_length());
  }
  if (u.has_amax_margin() && u.amax_margin() > kMaxAmaxMargin) {
    return "amax_margin: must be in [0, " + std::to_string(kMaxAmaxMargin) + "], got " +
           std::to_string(u.amax_margin());
  }
  return {};
}

PolicyApplier::PolicyApplier(const AgentConfig& config, Spool* spool, Notices* notices)
    : config_(config), mode_(resolved_agreement(config)), spool_(spool), notices_(notices) {}

void PolicyApplier::attach_scaler(ScalerControl* scaler) {
  std::lock_guard lock(mu_);
  scaler_ = scaler;
  if (scaler_ != nullptr) original_ = scaler_->settings();
}

void PolicyApplier::attach_overrides(PrecisionOverrides* overrides) {
  std::lock_guard lock(mu_);
  overrides_ = overrides;
  capable_ = overrides_ != nullptr ? overrides_->capable_layers() : std::vector<std::string>{};
}

void PolicyApplier::attach_gemm_precision(PrecisionOverrides* gemms, RecipeControl* recipe) {
  // The trainer's code, asked before the lock: it may not call back into the agent anyway.
  std::vector<std::string> capable =
      gemms != nullptr ? gemms->capable_layers() : std::vector<std::string>{};
  const bool delayed = recipe != nullptr && recipe->delayed();
  std::lock_guard lock(mu_);
  gemms_ = gemms;
  recipe_ = recipe;
  recipe_delayed_ = delayed;
  capable_gemms_ = std::move(capable);
}

std::string PolicyApplier::validate(const v1::PolicyUpdate& u, const ScalerSettings& current,
                                    std::vector<std::string>* fp32_layers,
                                    std::vector<std::string>* bf16_layers) const {
  std::string err =
      validate_update(u, config_.run_id, current, scaler_ != nullptr, overrides_, fp32_layers);
  if (!err.empty()) return err;
  return validate_gemm_update(u, gemms_ != nullptr ? &capable_gemms_ : nullptr, recipe_ != nullptr,
                              recipe_delayed_, bf16_layers);
}

void PolicyApplier::receive(const v1::PolicyUpdate& update) {
  std::lock_guard lock(mu_);
  const std::string& id = update.policy_id();
  const Clock::time_point now = Clock::now();
  // The server sends the policy in force again on every new stream; one outcome per id.
  if (!id.empty()) {
    const bool seen = std::find(seen_.begin(), seen_.end(), id) != seen_.end() ||
                      (spool_ != nullptr && spool_->policy_seen(id));
    if (seen) {
      // Handled before (by this process or, per the spool, an earlier one): still received.
      received_seq_ = std::max(received_seq_, update.seq());
      return;
    }
    seen_.push_back(id);
    if (spool_ != nullptr) spool_->record_policy(id);
  }
  Pending p;
  p.update = update;
  p.available_at = now + config_.policy_receive_delay;
  switch (mode_) {
    case PolicyAgreementMode::kNone:
      p.refusal = "world_size " + std::to_string(config_.world_size) +
                  " without a per-step agreement (policy_agreement=none): an update would apply "
                  "on different steps on different ranks";
      break;
    case PolicyAgreementMode::kPerStep:
      // Validated when it applies, against the state every rank has at that step.
      if (update.seq() == 0) p.refusal = "seq: missing; ranks can only agree on numbered updates";
      break;
    default: {
      // The trainer's code, on the reader thread, where nothing else would catch.
      ScalerSettings current;
      std::string failed;
      try {
        if (scaler_ != nullptr) current = scaler_->settings();
      } catch (const std::exception& e) {
        failed = e.what();
      } catch (...) {
        failed = "unknown error";
      }
      if (failed.empty()) {
        p.refusal = validate(update, current, nullptr, nullptr);
      } else {
        p.refusal = "the scaler's settings() failed: " + failed;
        notices_->raise("policy:settings", "policy: the scaler's settings() threw while an update "
                                           "arrived (" + failed + "); the update is refused");
      }
    }
  }
  pending_.push_back(std::move(p));
  has_pending_.store(true, std::memory_order_release);
  refresh_received_locked(now);
}

void PolicyApplier::refresh_received_locked(Clock::time_point now) {
  for (const Pending& p : pending_) {
    if (p.available_at <= now) received_seq_ = std::max(received_seq_, p.update.seq());
  }
}

std::uint64_t PolicyApplier::received_seq() {
  std::lock_guard lock(mu_);
  refresh_received_locked(Clock::now());
  return received_seq_;
}

void PolicyApplier::set_connected(bool connected) {
  const bool was = connected_.exchange(connected);
  if (was && !connected) disconnected_since_ns_.store(now_ns());
  if (connected) disconnected_since_ns_.store(0);
}

PolicyVote PolicyApplier::vote() {
  PolicyVote v;
  v.received_seq = received_seq();
  v.fallback = wants_fallback();
  return v;
}

std::string PolicyApplier::agreed(const PolicyVote& agreed) {
  if (mode_ != PolicyAgreementMode::kPerStep) {
    return "policy_agreement is " + std::string(agreement_name(mode_)) + ", not per_step";
  }
  if (const std::uint64_t have = received_seq(); agreed.received_seq > have) {
    return "agreed seq " + std::to_string(agreed.received_seq) + " is above the " +
           std::to_string(have) + " this rank received (reduce the negated seqs with max)";
  }
  agreed_seq_.store(agreed.received_seq);
  if (agreed.fallback) agreed_fallback_.store(true);
  steps_since_agreed_.store(0);
  return {};
}

template <typename Due>
std::vector<PolicyApplier::Pending> PolicyApplier::take_due(Due due) {
  std::vector<Pending> out;
  {
    std::lock_guard lock(mu_);
    const Clock::time_point now = Clock::now();
    refresh_received_locked(now);
    auto keep = std::stable_partition(pending_.begin(), pending_.end(), [&](const Pending& p) {
      return p.available_at > now || !due(p);
    });
    out.assign(std::make_move_iterator(keep), std::make_move_iterator(pending_.end()));
    pending_.erase(keep, pending_.end());
    has_pending_.store(!pending_.empty(), std::memory_order_release);
  }
  // So that two updates due together apply as the server ordered them.
  std::stable_sort(out.begin(), out.end(), [](const Pending& a, const Pending& b) {
    return std::pair(a.update.seq(), a.update.effective_from_step()) <
           std::pair(b.update.seq(), b.update.effective_from_step());
  });
  return out;
}

void PolicyApplier::begin_step(std::int64_t step, std::vector<PolicyOutcome>* outcomes) {
  if (mode_ == PolicyAgreementMode::kPerStep) {
    if (agreed_fallback_.exchange(false) && scaler_changed_.load()) fall_back(step);
    if (steps_since_agreed_.fetch_add(1) + 1 == kAgreementSilentSteps &&
        has_pending_.load(std::memory_order_acquire)) {
      notices_->raise("policy: per_step agreement, but no agreed vote for " +
                      std::to_string(kAgreementSilentSteps) +
                      " steps: updates wait (the host must call policy_agreed every step)");
    }
  } else if (wants_fallback()) {
    fall_back(step);
  }
  if (!has_pending_.load(std::memory_order_acquire)) return;
  std::vector<Pending> due;
  if (mode_ == PolicyAgreementMode::kPerStep) {
    const std::uint64_t agreed = agreed_seq_.load();
    due = take_due([&](const Pending& p) {
      return !p.refusal.empty() ||
             (p.update.seq() <= agreed && p.update.effective_from_step() <= step);
    });
  } else {
    due = take_due([&](const Pending& p) {
      return !p.refusal.empty() || p.update.effective_from_step() <= step;
    });
  }
  for (const Pending& p : due) {
    if (!p.refusal.empty()) {
      refuse(p, p.refusal, outcomes);
    } else if (mode_ != PolicyAgreementMode::kPerStep && p.update.effective_from_step() < step) {
      refuse(p,
             "effective_from_step " + std::to_string(p.update.effective_from_step()) +
                 " had begun before the update arrived (now at step " + std::to_string(step) +
                 ")",
             outcomes);
    } else {
      apply(p.update, step, outcomes);
    }
    step_seq_.store(std::max(step_seq_.load(), p.update.seq()));
  }
}

void PolicyApplier::refuse(const Pending& p, std::string reason,
                           std::vector<PolicyOutcome>* out) {
  PolicyOutcome o;
  o.policy_id = outcome_id(p.update.policy_id());
  o.reason = clean(reason, kOutcomeReasonMaxBytes);
  refused_.fetch_add(1);
  out->push_back(std::move(o));
}

void PolicyApplier::apply(const v1::PolicyUpdate& u, std::int64_t step,
                          std::vector<PolicyOutcome>* out) {
  PolicyOutcome o;
  o.policy_id = outcome_id(u.policy_id());
  // Re-checked against the state now: the scale may have moved since the update arrived.
  std::vector<std::string> layers, gemm_layers;
  std::string err = validate(u, scaler_ != nullptr ? scaler_->settings() : ScalerSettings{},
                             &layers, &gemm_layers);
  if (err.empty() && changes_scaler(u)) err = scaler_->schedule(to_change(u, step));
  if (err.empty() && u.fp32_tensors_set()) {
    err = overrides_->replace(layers, step);
    if (!err.empty()) err = "fp32_tensors: " + err;
  }
  if (err.empty() && u.bf16_gemms_set()) {
    err = gemms_->replace(gemm_layers, step);
    if (!err.empty()) err = "bf16_gemms: " + err;
  }
  if (err.empty() && changes_recipe(u)) {
    err = recipe_->schedule(to_recipe_change(u, step));
    if (!err.empty()) err = "delayed scaling: " + err;
  }
  if (err.empty()) {
    o.applied = true;
    applied_.fetch_add(1);
    if (changes_config(u)) scaler_changed_.store(true);
  } else {
    o.reason = clean(err, kOutcomeReasonMaxBytes);
    refused_.fetch_add(1);
  }
  out->push_back(std::move(o));
}

bool PolicyApplier::wants_fallback() const {
  if (!scaler_changed_.load() || scaler_ == nullptr || config_.policy_fallback_after.count() <= 0) {
    return false;
  }
  const std::int64_t since = disconnected_since_ns_.load();
  if (since == 0 || connected_.load()) return false;
  const auto limit =
      std::chrono::duration_cast<std::chrono::nanoseconds>(config_.policy_fallback_after).count();
  return now_ns() - since >= limit;
}

void PolicyApplier::fall_back(std::int64_t step) {
  ScalerChange c;
  c.effective_from_step = step;
  c.growth_factor = original_.growth_factor;
  c.backoff_factor = original_.backoff_factor;
  c.growth_interval = original_.growth_interval;
  if (original_.hysteresis > 0) c.hysteresis = original_.hysteresis;
  c.min_scale = original_.min_scale;
  if (original_.max_scale > 0.0) c.max_scale = original_.max_scale;
  const std::string err = scaler_->schedule(c);
  scaler_changed_.store(false);
  const std::string why = mode_ == PolicyAgreementMode::kPerStep
                              ? "a rank's server was unreachable for "
                              : "server unreachable for ";
  const std::string secs = std::to_string(config_.policy_fallback_after.count() / 1000);
  if (err.empty()) {
    notices_->raise("policy: " + why + secs +
                    " s; the local scaler's configuration is back from step " +
                    std::to_string(step));
  } else {
    notices_->raise("policy: " + why + secs +
                    " s; restoring the local scaler's configuration failed: " + err);
  }
}

}  // namespace ampscope::agent
