// Policy application: PolicyUpdates from the server are validated when they arrive (on the
// stream's reader thread) and applied on the training thread at the start of exactly their
// effective_from_step, through the trainer's ScalerControl and PrecisionOverrides. Every
// update gets one outcome (applied at step S, or refused and why) in the report of the step
// it concerns: the effective step when it was applied or came too late, the next step when it
// was refused on arrival.
//
// Validation (telemetry.proto PolicyUpdate): loss_scale, min_scale and max_scale are finite
// powers of two, > 0, with min <= loss_scale <= max (the update's bounds, else the scaler's
// current ones); growth_factor >= 1; backoff_factor in (0, 1]; growth_interval and hysteresis
// >= 1; every name in fp32_tensors maps to a layer the trainer can compute in FP32; run_id is
// this run's; a policy id is handled once, also across restarts (the spool remembers it).
//
// FP32 fallback: the server recommends tensors by the names the trainer reports them under
// ("h1.attn.scores"); the trainer's override set takes layers ("h1.attn.core").
// PrecisionOverrides::layer_of maps each name (on the stream's reader thread when the update
// arrives, on the training thread when it applies), and the FP32 set applied is the
// de-duplicated layers, in the order of their first tensor. A name that maps to no layer
// refuses the whole update, as any invalid field does: an update is one decision, applied or
// refused as a unit, and part of it would be a state the server never decided.
//
// Per-layer precision of an FP8/FP4 run (attach_gemm_precision): bf16_gemms names capable GEMM
// layers (the attached GEMM overrides' capable_layers(), by their own names, de-duplicated in
// order; refused when no GEMM overrides are attached), applied through their replace();
// amax_history_length in [1, 1024] and amax_margin in [0, 64] go to RecipeControl::schedule,
// refused unless a RecipeControl is attached whose run uses delayed scaling. They are fields of
// the one update like the others: the whole update is applied or refused.
//
// Fallback: when the server has been unreachable for policy_fallback_after and an update
// changed the scaler's configuration, the local scaler's own configuration (as it was when
// attached; the current scale stays) is restored at the next step, so the run is not left
// with a policy nobody supervises. Its backoff is the safety net throughout. The fallback
// leaves the precision the policy chose in place (the FP32 set, the BF16 GEMM set and delayed
// scaling's history length and margin): each moved the run to more precision or more headroom,
// and undoing that without the server would bring back what the policy moved away from; only
// the server moves a layer back to its recipe.
//
// Ranks (config.h, PolicyAgreementMode): single and independent apply as above. none (several
// ranks, no agreement) refuses every update on arrival. per_step defers everything to the
// agreement: vote() says the highest seq received and whether this rank wants to fall back;
// after the host reduced the votes, agreed() sets what the next begin_step does: apply every
// update with seq <= the agreed seq whose effective step has come (in seq order, validated
// against the scaler's state at that step, so every rank reaches the same outcome; an update
// whose effective step had passed applies late, together), and fall back when any rank asked.
// An update without a seq cannot be agreed on and is refused. A host that stops agreeing
// leaves updates waiting; after kAgreementSilentSteps steps with updates waiting and no
// agreed() call a notice says so (once).
//
// Thread safety: receive(), set_connected(), vote(), agreed() and the getters from any thread;
// attach_*() and begin_step() by the recorder, one caller at a time (its step lock).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ampscope/agent/config.h"
#include "ampscope/agent/interfaces.h"
#include "ampscope/v1/telemetry.pb.h"
#include "notices.h"
#include "record.h"

namespace ampscope::agent {

class Spool;

// Empty when `u` may be applied to a scaler with `current` settings (`has_scaler`: one is
// attached) and through `overrides` (nullptr: none attached), otherwise one line naming the
// field. *fp32_layers, when given, receives the FP32 set the update makes (fp32_layers_of).
std::string validate_update(const v1::PolicyUpdate& u, const std::string& run_id,
                            const ScalerSettings& current, bool has_scaler,
                            const PrecisionOverrides* overrides,
                            std::vector<std::string>* fp32_layers = nullptr);

// Empty when u's FP8/FP4 fields may be applied: bf16_gemms through GEMM overrides whose capable
// layers are *capable_gemms (nullptr: none attached), amax_history_length and amax_margin to a
// recipe control (has_recipe) whose run uses delayed scaling (recipe_delayed); otherwise one line
// naming the field. *bf16_layers, when given, receives the BF16 set the update makes.
std::string validate_gemm_update(const v1::PolicyUpdate& u,
                                 const std::vector<std::string>* capable_gemms, bool has_recipe,
                                 bool recipe_delayed,
                                 std::vector<std::string>* bf16_layers = nullptr);

// The layers u.fp32_tensors() name through overrides.layer_of, de-duplicated in the order of
// their first tensor. Empty when every name maps, otherwise one line naming the first that does
// not (or whose mapping threw).
std::string fp32_layers_of(const v1::PolicyUpdate& u, const PrecisionOverrides& overrides,
                           std::vector<std::string>* layers);

class PolicyApplier {
 public:
  PolicyApplier(const AgentConfig& config, Spool* spool, Notices* notices);

  // Before the first step (not thread-safe against receive()).
  void attach_scaler(ScalerControl* scaler);
  void attach_overrides(PrecisionOverrides* overrides);
  // delayed() is asked here, once: the run's recipe does not change, and validation on the
  // reader thread then calls no trainer code for it.
  void attach_gemm_precision(PrecisionOverrides* gemms, RecipeControl* recipe);
  ScalerControl* scaler() const { return scaler_; }
  const std::vector<std::string>& capable_layers() const { return capable_; }
  const std::vector<std::string>& capable_gemms() const { return capable_gemms_; }

  // An update from the server.
  void receive(const v1::PolicyUpdate& update);
  // The stream is (dis)connected; drives the fallback.
  void set_connected(bool connected);

  // The per-step agreement (per_step mode). agreed() returns empty, or why it was refused.
  PolicyVote vote();
  std::string agreed(const PolicyVote& agreed);
  PolicyAgreementMode mode() const { return mode_; }
  // The highest policy seq received (once available, see policy_receive_delay); the Hello's
  // last_policy_seq.
  std::uint64_t received_seq();
  // The highest seq applied or refused at a step so far (the reports' policy_seq).
  std::uint64_t step_seq() const { return step_seq_.load(); }

  // Training thread, at the start of `step`: applies what is due and appends the outcomes that
  // belong to this step.
  void begin_step(std::int64_t step, std::vector<PolicyOutcome>* outcomes);

  std::uint64_t applied() const { return applied_.load(); }
  std::uint64_t refused() const { return refused_.load(); }

 private:
  using Clock = std::chrono::steady_clock;
  struct Pending {
    v1::PolicyUpdate update;
    std::string refusal;  // non-empty: refused on arrival, reported at the next step
    Clock::time_point available_at;  // arrival + policy_receive_delay
  };
  // Moves the pending updates `due` says are due out of pending_, in (seq, effective step)
  // order.
  template <typename Due>
  std::vector<Pending> take_due(Due due);
  void refresh_received_locked(Clock::time_point now);
  // validate_update and validate_gemm_update against what is attached; the FP32 and BF16 sets
  // the update makes.
  std::string validate(const v1::PolicyUpdate& u, const ScalerSettings& current,
                       std::vector<std::string>* fp32_layers,
                       std::vector<std::string>* bf16_layers) const;
  void apply(const v1::PolicyUpdate& u, std::int64_t step, std::vector<PolicyOutcome>* out);
  void refuse(const Pending& p, std::string reason, std::vector<PolicyOutcome>* out);
  bool wants_fallback() const;
  void fall_back(std::int64_t step);

  const AgentConfig& config_;
  const PolicyAgreementMode mode_;
  Spool* spool_;
  Notices* notices_;
  ScalerControl* scaler_ = nullptr;
  PrecisionOverrides* overrides_ = nullptr;
  PrecisionOverrides* gemms_ = nullptr;
  RecipeControl* recipe_ = nullptr;
  bool recipe_delayed_ = false;
  ScalerSettings original_;
  std::vector<std::string> capable_;
  std::vector<std::string> capable_gemms_;

  std::mutex mu_;
  std::vector<Pending> pending_;  // guarded by mu_
  std::vector<std::string> seen_;  // ids handled by this process, guarded by mu_
  std::uint64_t received_seq_ = 0;  // guarded by mu_
  std::atomic<bool> has_pending_{false};
  std::atomic<std::uint64_t> agreed_seq_{0};
  std::atomic<bool> agreed_fallback_{false};
  std::atomic<std::uint64_t> step_seq_{0};
  std::atomic<std::int64_t> steps_since_agreed_{0};  // begin_step calls since agreed()

  std::atomic<bool> connected_{false};
  std::atomic<std::int64_t> disconnected_since_ns_{0};  // steady clock; 0: never connected
  std::atomic<bool> scaler_changed_{false};  // an applied update changed the config
  std::atomic<std::uint64_t> applied_{0};
  std::atomic<std::uint64_t> refused_{0};
};

}  // namespace ampscope::agent
