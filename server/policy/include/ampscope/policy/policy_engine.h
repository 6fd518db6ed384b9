// The loss-scaler policy engine: a pure library that turns a run's
// step reports into scaler decisions. No I/O, no clock, no randomness: the same inputs in the
// same order give the same decisions, also across save_state()/restore().
//
// Modes
//   observe        never decides; still tracks the run so that last_evaluation() says what the
//                  headroom mode would choose.
//   static-params  pushes one configured scaler configuration, once, on the first report.
//   headroom       chooses the largest power-of-two loss scale whose predicted overflow is zero
//                  with a margin of m binades, over a sliding window of recent steps, from the
//                  histograms (or max_abs) of every tensor the loss scale multiplies
//                  (activation_grad and weight_grad), in each tensor's own format. It lowers at
//                  once, raises only after K consecutive evaluations agree, stays in [min, max]
//                  and tells the local scaler to stop probing (a very large growth_interval):
//                  the local scaler's backoff stays as the safety net.
//                  A found_inf step is evaluated at once. A scaled tensor whose finite values
//                  reach within one binade of its format's top overflowed because of the scale:
//                  the window ceiling drops to log2(scale) - 1 for window_steps, and the scale
//                  drops at once to an estimate of the true top: the highest of the tensor's
//                  last clean top in the window plus one binade and an extrapolation of its
//                  tail from the share of its values that overflowed, at most
//                  blind_drop_binades above the format's top (also when nothing finite or only
//                  max_abs is known). Non-finite values far above a tensor's finite values, or
//                  a step whose first offender is a forward tensor, are an outlier no scale
//                  avoids and move nothing. found_inf with no reported tensor showing it caps
//                  the ceiling at log2(loss_scale) - 1.
//   FP32 fallback  (with static-params or headroom) recommends tensors to keep in FP32 when they
//                  keep overflowing or their dynamic range does not fit their format.
//   GEMM precision (with static-params or headroom) moves the GEMMs of layers whose FP8/FP4
//                  quantisers keep underflowing, saturating or losing SQNR to BF16, worst first
//                  and for at most a share of the layers; moves them back when what-if counts
//                  of the recipe stay clean; under delayed scaling shortens the amax history
//                  (or raises the margin) when amaxes keep outrunning the delayed scale.
//
// Domains. A tensor's values are measured as stored and carry TensorInput::scale (the loss scale
// for scaled gradients, 1 otherwise). The engine moves every histogram into the unscaled domain
// before it compares or stores anything:
//   - scale a power of two (every scaler with growth/backoff 2 and 0.5): bin e moves to
//     e - log2(scale), exactly (a binade is scale invariant under a power of two).
//   - scale finite, > 0 but not a power of two (a static 1000, growth 1.5): the shift is
//     floor(log2(scale)). Each bin then lands in the unscaled bin that holds its largest possible
//     value, so upper ends (the overflow side) are never underestimated; the cost is at most one
//     binade of extra caution. max_abs moves the same way: floor(log2(max_abs)) minus the
//     same shift.
//   - scale not finite or <= 0: the report is rejected (PolicyError naming the field).
// Decided loss scales are always powers of two.
//
// Ownership and thread safety: PolicyEngine is a value type holding one run's state; it is not
// thread-safe (the server serialises calls per run). Free functions are re-entrant.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ampscope/check.h"
#include "ampscope/formats.h"
#include "ampscope/loss_scale.h"
#include "ampscope/recipe.h"
#include "ampscope/vocabulary.h"
#include "ampscope/tensor_stats.h"

namespace ampscope::policy {

// Invalid configuration, invalid input or an unreadable saved state. The message names the
// field ("headroom.margin_binades must be in [0, 32], got -1").
class PolicyError : public Error {
 public:
  using Error::Error;
};

// ---------------------------------------------------------------------------------------------
// Input: one report per (step, rank).

// Roles and scaler kinds are ampscope/vocabulary.h's; is_loss_scaled() names the roles whose
// values the loss scale multiplies (activation_grad and weight_grad).

struct TensorInput {
  std::string name;  // the trainer's tensor name; the FP32 fallback recommends these names
  TensorRole role = TensorRole::kActivation;
  Format storage = Format::kFP32;  // format the values were measured in
  // Format the values are held in at the current scale (wire: targets[0].format). For amp-fp16
  // gradients this is FP16 even when measured from an FP32 buffer. Unset: `storage`.
  std::optional<Format> target;
  // Factor the stored values carry (wire: TensorStats.scale): the step's loss scale for scaled
  // gradients, 1 otherwise. Finite and > 0.
  double scale = 1.0;
  // Where in the step it was measured. Merging ranks tells a rank's own gradients (backward)
  // from gradients every replica holds after the all-reduce (after_unscale) by it.
  TensorPhase phase = TensorPhase::kUnknown;

  // As measured (scaled). Absent for count-only samples.
  std::optional<BinadeHistogram> histogram;
  // Largest finite |x| as stored; with no histogram it alone bounds the top of the tensor.
  std::optional<double> max_abs;

  std::uint64_t numel = 0;
  std::uint64_t nan = 0;
  std::uint64_t pos_inf = 0;
  std::uint64_t neg_inf = 0;
  // Exact counts for format() at the scale in use, when the agent measured them
  // (wire: targets[0] when its scale_log2 is the current one). overflow counts as overflow
  // evidence; underflow is validated but not used by any decision yet.
  std::optional<std::uint64_t> overflow;
  std::optional<std::uint64_t> underflow;

  Format format() const { return target.value_or(storage); }
  std::uint64_t nonfinite() const { return nan + pos_inf + neg_inf; }
};

// One GEMM input as a scaled low-precision recipe quantised it (wire: QuantizerStats).
struct QuantizerInput {
  std::string name;   // "h1.mlp.fc.output_grad@wgrad"
  std::string layer;  // the layer whose GEMM it feeds ("h1.mlp.fc"); empty: not movable
  TensorRole role = TensorRole::kActivation;
  // True: the layer's GEMM ran in BF16 and the recipe was only measured on its input.
  bool what_if = false;
  // The recipe applied (with what_if: measured) and its counts; the engine reads values,
  // underflow, saturated, overflow, amax, the SQNR sums and tensor_scale.
  RecipeCounts counts;
  std::vector<float> amax_history;  // delayed scaling: the history s came from, oldest first
  // On a layer's output-gradient quantiser: what the recipe's rounding of the layer's forward
  // output costs the loss to first order, nats (with what_if: would cost). Finite.
  std::optional<double> loss_cost;
};

struct StepInput {
  std::string run_id;
  int rank = 0;
  std::int64_t step = 0;     // >= 0; reports may arrive out of step order across ranks
  double loss_scale = 1.0;   // scale used for this step's backward; finite, > 0
  double scale_after = 1.0;  // scale after the local scaler's update; finite, > 0
  bool found_inf = false;    // any rank's; the headroom mode re-evaluates at once
  bool skipped = false;
  std::vector<TensorInput> tensors;  // any subset of the step's tensors, in any order
  // The first measured tensor, in execution order, that held a non-finite value (wire:
  // first_offender; over ranks, the earliest). A tensor the loss scale does not multiply (an
  // activation, the loss, a weight) means the step's non-finite gradients came from the forward
  // pass, which no loss scale avoids; the FP32 fallback counts only this tensor's non-finite
  // values as its own (those of later tensors are the offender's, propagated).
  struct Offender {
    std::string name;
    TensorRole role = TensorRole::kActivation;
  };
  std::optional<Offender> first_offender;
  // The step's quantisers, any ranks, phases and micro-steps (each layer counts once per step).
  std::vector<QuantizerInput> quantizers;
};

// ---------------------------------------------------------------------------------------------
// The run's loss scaler (from Hello), with the rules of ampscope/loss_scale.h.

inline constexpr double kFp32Max = kFp32MaxScale;

// Defaults: PyTorch GradScaler's (ampscope/loss_scale.h).
struct ScalerConfig {
  ScalerKind kind = ScalerKind::kDynamic;
  double scale = kGradScalerInitScale;  // the current (or initial) scale
  double growth_factor = gradscaler_rule().growth_factor;
  double backoff_factor = gradscaler_rule().backoff_factor;
  std::int64_t growth_interval = gradscaler_rule().growth_interval;
  int hysteresis = gradscaler_rule().hysteresis;
  double min_scale = 0.0;  // 0: no floor
  double max_scale = kFp32Max;
  friend bool operator==(const ScalerConfig&, const ScalerConfig&) = default;
};

// A partial scaler configuration: unset fields are left as they are. Used both for the
// static-params mode's configuration and for a decision's scaler fields.
struct ScalerSettings {
  std::optional<double> loss_scale;
  std::optional<std::int64_t> growth_interval;
  std::optional<double> growth_factor;
  std::optional<double> backoff_factor;
  std::optional<int> hysteresis;
  std::optional<double> min_scale;
  std::optional<double> max_scale;
  bool empty() const;
  friend bool operator==(const ScalerSettings&, const ScalerSettings&) = default;
};

// ---------------------------------------------------------------------------------------------
// Engine configuration. validate() lists the ranges; defaults are the ones the README explains.

enum class PolicyMode : std::uint8_t { kObserve = 0, kStaticParams = 1, kHeadroom = 2 };
std::string_view mode_name(PolicyMode mode);  // observe, static-params, headroom
std::optional<PolicyMode> parse_mode(std::string_view name);

struct HeadroomParams {
  // Binades kept free between the largest value seen in the window and the first binade that
  // could overflow: the chosen scale puts every value below 2^(max_exponent - margin) of the
  // format (FP16, margin 1: below 2^14 = 16384, at least 4x from 65504).
  int margin_binades = 1;
  // Steps whose reports form the evidence; the ceiling is the minimum over them.
  int window_steps = 200;
  // Steps between evaluations (a found_inf step is evaluated at once regardless).
  int update_every_steps = 10;
  // A raise needs this many consecutive evaluations whose target is at least
  // min_raise_binades above the scale in use; it then goes to the lowest of those targets.
  int raise_after_evaluations = 3;
  int min_raise_binades = 1;
  // Lower when the target is more than this many binades below the scale in use.
  int lower_tolerance_binades = 0;
  // Bounds of every decided scale: powers of two in [2^-126, 2^127], min_scale <= max_scale.
  // Decisions also stay inside the run's own [min_scale, max_scale] when the two overlap.
  double min_scale = 1.0;           // Megatron's floor
  double max_scale = 4294967296.0;  // 2^32, Megatron's initial scale
  // growth_interval pushed to a dynamic or hysteresis local scaler with the first evaluation
  // (and again after set_run_scaler() brings back a smaller one), so that it stops probing
  // upward and skipping a step per probe. 0: leave the local growth interval alone.
  std::int64_t local_growth_interval = 1000000000;
  // The most binades an overflowed tensor's top is estimated above its format's top at the
  // scale that overflowed (so the most one overflow lowers the scale, before the margin); also
  // the estimate when the tensor leaves nothing to extrapolate from (no finite value, or only
  // max_abs without a histogram) and no clean report of it is in the window.
  int blind_drop_binades = 8;
  friend bool operator==(const HeadroomParams&, const HeadroomParams&) = default;
};

struct Fp32FallbackParams {
  bool enabled = false;
  // A tensor is recommended when at least min_reports of its last window_reports reported
  // steps overflowed (non-finite values, or overflow > 0) or did not fit the format's range.
  // Tensors are keyed by name (ranks and phases of one step count once). FP32 tensors are never
  // recommended. A gradient's overflow at a loss scale the engine did not choose (above the
  // last decided one, or before the first) is the scale's fault and does not count.
  int window_reports = 16;  // 1..64
  int min_reports = 4;      // 1..window_reports
  // Dynamic range = (top exponent - bottom exponent) of the unscaled histogram after trimming
  // this fraction of the values from each end; it does not fit when it exceeds
  // max_exponent - min_subnormal_exponent of the format (FP16: 39, E4M3: 17, E5M2: 31).
  double range_trim_fraction = 1e-3;  // [0, 0.25)
  // At most this many tensors are ever recommended (the worst first).
  int max_tensors = 32;
  friend bool operator==(const Fp32FallbackParams&, const Fp32FallbackParams&) = default;
};

// Per-layer precision of FP8/FP4 runs (docs/policy.md, "Per-layer precision (FP8/FP4)"). A
// quantiser report is harmful when its underflow share of finite values, its saturated plus
// overflowed share, or its SQNR break a limit; the SQNR floor is the element format's nominal
// rounding SQNR 10 log10(3 * 4^(m+1)) dB (m mantissa bits) minus sqnr_margin_db.
struct GemmPrecisionParams {
  bool enabled = false;
  // A layer moves to BF16 when at least min_reports of its last window_reports reported steps
  // (recipe applied) had a harmful quantiser.
  int window_reports = 8;  // 1..64
  int min_reports = 4;     // 1..window_reports
  double max_underflow_share = 0.25;  // (0, 1]
  double max_saturated_share = 0.03;  // (0, 1]
  double sqnr_margin_db = 6.02;       // [0, 60]
  // At most floor(max_bf16_share x layers seen) layers are in BF16 at once.
  double max_bf16_share = 0.25;  // [0, 1]
  // Back to the recipe when its last promote_reports what-if reports all stayed within the limits
  // scaled by promote_factor (shares x factor, SQNR margin x factor) and the layer has been in
  // BF16 for its dwell: min_dwell_steps, doubled each time the layer has come back before (up
  // to 64 x), so that a layer the recipe keeps harming spends ever longer in BF16.
  int promote_reports = 8;     // 1..64
  double promote_factor = 0.5;  // (0, 1]
  std::int64_t min_dwell_steps = 100;  // 0..10^6
  // Delayed scaling: when spike_reports of the last window_reports reported steps had an amax
  // past its delayed scale, halve the amax history (>= 1), then raise the margin by one binade up
  // to max_amax_margin.
  int spike_reports = 3;    // 1..window_reports
  int max_amax_margin = 4;  // 0..64
  // Layers whose reports carry a loss cost (QuantizerInput::loss_cost) are judged by it, not by
  // the limits above (which then only name the cause). Over a layer's last loss_cost_reports
  // measured steps (a step's ranks and micro-steps averaged), mean m with standard error se: it
  // moves to BF16 when m - loss_cost_z x se >= min_loss_cost nats (recipe applied), the largest
  // m first, ahead of layers judged by the limits; back when, after min_dwell_steps, the what-if
  // costs give m + loss_cost_z x se <= min_loss_cost x promote_factor.
  double min_loss_cost = 5e-4;  // (0, 1e6]
  int loss_cost_reports = 16;   // 2..1024
  double loss_cost_z = 2.0;     // [0, 10]
  friend bool operator==(const GemmPrecisionParams&, const GemmPrecisionParams&) = default;
};

struct EngineConfig {
  PolicyMode mode = PolicyMode::kObserve;
  // effective_from_step = the latest step seen + lead_steps (>= 1), so that every rank switches
  // on the same step and the update reaches them before it.
  int lead_steps = 2;
  // After a decided scale becomes effective, reports are given this many steps to show it
  // before the engine trusts the reported scale over its own decision again.
  int apply_grace_steps = 8;
  // static-params: what to push (at least one field set; scale a power of two is not required
  // here, the operator chose it).
  ScalerSettings static_params;
  HeadroomParams headroom;
  Fp32FallbackParams fp32_fallback;
  GemmPrecisionParams gemm_precision;
  friend bool operator==(const EngineConfig&, const EngineConfig&) = default;
};

// Empty when valid, otherwise one line naming the first bad field and its allowed range.
std::string validate(const EngineConfig& config);
std::string validate(const ScalerConfig& config);

// ---------------------------------------------------------------------------------------------
// Output.

struct PolicyDecision {
  std::uint64_t policy_id = 0;  // 1, 2, 3, ... per run, never reused (survives restore)
  // The step from which every rank applies it: always > every step seen so far.
  std::int64_t effective_from_step = 0;
  // Scaler fields to change; a loss_scale decided by headroom is a power of two within
  // [headroom.min_scale, headroom.max_scale].
  ScalerSettings scaler;
  // The complete FP32 fallback set from effective_from_step on (sorted, possibly empty): a
  // receiver replaces its set with it, so the latest decision alone is enough after a reconnect.
  std::vector<std::string> fp32_tensors;
  // The complete set of layers whose GEMMs run in BF16 from effective_from_step on (sorted,
  // possibly empty), replacing any earlier one as fp32_tensors does.
  std::vector<std::string> bf16_gemms;
  // Delayed scaling's run-wide settings to change (unset: keep).
  std::optional<int> amax_history_length;
  std::optional<int> amax_margin;
  // Human-readable: the numbers that led to the decision (window, ceiling, margin, tensor).
  std::string reason;
};

// What the last evaluation found (for metrics and `ampscope show`; also kept in observe mode).
struct Evaluation {
  std::int64_t step = -1;  // latest step seen when evaluated; -1: never evaluated
  // log2 of the largest overflow-free scale over the window, before margin and bounds.
  std::optional<int> ceiling_log2;
  // log2 of the scale headroom wants: ceiling - margin, clamped to the bounds.
  std::optional<int> target_log2;
  double scale_in_use = 0.0;    // what the engine believes the run uses now
  int consecutive_raises = 0;   // evaluations in a row that asked for a raise
  std::string limiting_tensor;  // the tensor that set the ceiling, empty when none
};

// ---------------------------------------------------------------------------------------------

class PolicyEngine {
 public:
  // Throws PolicyError when validate(config) or validate(run_scaler) fails, or run_id is empty.
  PolicyEngine(std::string run_id, EngineConfig config, ScalerConfig run_scaler);

  // Feeds one report and returns the decisions it triggers (usually none, at most one).
  // Throws PolicyError naming the field when the report is invalid (other run, negative step,
  // scale not finite or <= 0, histogram outside [-149, 127], counts above numel or a quantiser's
  // above its values); the engine is then unchanged.
  std::vector<PolicyDecision> observe(const StepInput& input);

  // The run's scaler changed outside the engine (a new Hello). Validated like the constructor.
  void set_run_scaler(const ScalerConfig& run_scaler);

  // The layers the run can move to BF16 (Hello.bf16_capable_gemms): the per-layer precision's
  // cap (max_bf16_share) counts them from the start, not only the layers that have reported.
  // Returns whether any was new (the state changed). Nothing when gemm_precision is off.
  bool add_gemm_layers(const std::vector<std::string>& layers);

  // The whole state as a versioned JSON document (config included), and back. Restoring and
  // feeding the same inputs gives the same decisions as the original engine would have. The
  // document is a few tens of KB for 200 tracked tensors: persist it with each decision and
  // periodically, not with every report.
  // restore() throws PolicyError on a malformed or incompatible document.
  std::string save_state() const;
  static PolicyEngine restore(std::string_view saved);

  const std::string& run_id() const { return run_id_; }
  const EngineConfig& config() const { return config_; }
  // The run's scaler as the engine believes it now: the Hello's configuration with the fields
  // of every decision since applied.
  const ScalerConfig& run_scaler() const { return run_scaler_; }
  // The latest decision as it was issued; nullopt before any.
  const std::optional<PolicyDecision>& last_decision() const { return last_decision_; }
  // Everything decided so far merged into one decision (later fields win, the current FP32
  // set), carrying the latest policy_id and effective_from_step = latest step + lead_steps: what
  // the server sends to an agent that (re)attaches and answers GetPolicy with. nullopt before
  // any decision.
  std::optional<PolicyDecision> current_policy() const;
  const Evaluation& last_evaluation() const { return evaluation_; }
  std::int64_t latest_step() const { return latest_step_; }

 private:
  // The engine's memory of one step inside the window, all ranks merged.
  struct StepSummary {
    std::int64_t step = 0;
    std::optional<int> ceiling_log2;   // min over scaled tensors and overflow evidence
    std::string limiting;              // what set ceiling_log2, for reasons
    std::optional<int> reaction_log2;  // estimate after an overflow, for the immediate reaction
    std::string reaction_why;
    bool found_inf = false;
  };
  // A scaled tensor's last report without a non-finite value or an overflow: where its values
  // ended (unscaled top binade), the basis of the estimate when it overflows later.
  struct CleanTop {
    std::string name;
    std::int64_t step = 0;
    int top = 0;
  };
  // Flags over a bounded window of reported steps: ranks, phases and micro-steps of one step OR
  // into one entry; a step older than a full window is dropped. The FP32 fallback's and the
  // GEMM precision's evidence both live in these.
  struct StepFlags {
    std::vector<std::int64_t> steps;  // ascending
    std::vector<std::uint8_t> flags;  // per step
    void add(std::int64_t step, std::uint8_t flag, int window);
    int count(std::uint8_t mask) const;  // steps with any bit of mask
    void clear() { steps.clear(), flags.clear(); }
  };
  // FP32-fallback evidence about one tensor name: its last window_reports reported steps.
  struct TensorTrack {
    std::string name;
    Format format = Format::kFP16;  // as last reported
    int range = 0;                  // trimmed dynamic range last reported, binades
    StepFlags reports;              // bit 0 overflowed, bit 1 range did not fit
  };
  // The worst harmful quantiser report of a layer, for reasons and for ranking.
  struct GemmFinding {
    std::string text;    // "h1.mlp.fc.output_grad@wgrad underflow 41.2% of finite values"
    std::string recipe;  // "nvfp4"
    double severity = 0.0;  // how many times over its limit (noise power ratio for SQNR)
    std::int64_t step = -1;
    // Takes a finding of `at` when it is of a later step, or of the same step and worse.
    void keep(std::int64_t at, std::string what, std::string of_recipe, double worse);
  };
  // Loss costs over a bounded window of measured steps: one entry per step, the mean of its
  // ranks' and micro-steps' costs. A step counts once a later step has been reported (until
  // then another rank may still add to it): `window` complete steps are kept, and the latest.
  struct CostWindow {
    std::vector<std::int64_t> steps;  // ascending
    std::vector<double> sums;         // per step
    std::vector<int> counts;          // per step
    void add(std::int64_t step, double cost, int window);
    // The steps before `latest` (at most `window`, the newest): the mean of their means and
    // its standard error (their sample standard deviation / sqrt(steps); 0 below 2 steps).
    struct Complete {
      int steps = 0;
      double mean = 0.0;
      double se = 0.0;
    };
    Complete complete(std::int64_t latest, int window) const;
    void clear() { steps.clear(), sums.clear(), counts.clear(); }
  };
  // GEMM-precision evidence about one layer.
  struct GemmTrack {
    std::string layer;
    StepFlags applied;  // recipe applied: bit 0 harmful
    StepFlags what_if;  // while in BF16: bit 0 outside the stricter limits
    GemmFinding worst;  // latest harmful report's worst quantiser
    std::int64_t bf16_from_step = -1;  // effective step of its move to BF16; -1: in the recipe
    bool costed = false;       // a loss cost was reported: judged by cost, not by the limits
    CostWindow cost;           // recipe applied
    CostWindow what_if_cost;   // while in BF16, from its effective step on
    GemmFinding cause;         // latest applied report's quantiser nearest a limit (any severity)
    int returns = 0;           // times it came back to the recipe: its dwell doubles each time
    double moved_cost = 0.0;   // its cost's lower bound (m - z se) when it last moved to BF16
    // In BF16 but reported with the recipe applied from its move's effective step on (the agent
    // refused the update, or the trainer cannot move it): the steps, up to apply_grace_steps.
    StepFlags unheeded;
    int refusals = 0;              // moves that did not take effect: its hold doubles each time
    std::int64_t held_until = -1;  // not moved to BF16 again before this step
  };

  void check_input(const StepInput& input) const;
  void check_quantizers(const StepInput& input) const;
  bool record(const StepInput& input);  // true when the report fed the window
  std::optional<int> clean_top(const std::string& name) const;  // within the window
  void remember_clean_tops(const StepInput& input);
  void record_tracks(const StepInput& input);
  void evaluate(const StepInput& input, ScalerSettings* scaler, std::vector<std::string>* why);
  std::optional<int> window_ceiling(std::string* limiting) const;
  bool update_fp32_set(std::vector<std::string>* why);
  // GEMM precision (gemm_precision.cc).
  void record_gemms(const StepInput& input);
  GemmTrack& gemm_track(const std::string& layer);
  bool update_bf16_set(std::vector<std::string>* why);
  bool drop_unheeded_moves(std::vector<std::string>* why);
  bool update_delayed(PolicyDecision* recipe, std::vector<std::string>* why);
  bool overflow_explained_by_scale(double tensor_scale) const;
  PolicyDecision make_decision(const ScalerSettings& scaler, const PolicyDecision& recipe,
                               std::string reason);
  double scale_in_use() const;

  std::string run_id_;
  EngineConfig config_;
  ScalerConfig run_scaler_;

  std::int64_t latest_step_ = -1;
  std::int64_t next_evaluation_step_ = 0;
  std::int64_t last_reacted_step_ = -1;  // last found_inf step evaluated at once
  double reported_scale_ = 0.0;          // scale_after at the latest step (smallest over ranks)
  std::uint64_t next_policy_id_ = 1;
  bool static_pushed_ = false;
  std::optional<double> commanded_scale_;  // the last loss scale the engine decided
  std::int64_t commanded_from_step_ = -1;
  int consecutive_raises_ = 0;
  std::optional<int> lowest_raise_target_;  // over the current run of raise votes
  std::vector<StepSummary> window_;         // ascending by step
  std::vector<TensorTrack> tracks_;         // ascending by name
  std::vector<CleanTop> clean_tops_;        // ascending by name
  std::vector<std::string> fp32_set_;       // ascending
  std::vector<GemmTrack> gemm_tracks_;      // ascending by layer
  std::vector<std::string> bf16_set_;       // ascending
  // Delayed scaling: steps whose amax outran the delayed scale, counted from delayed_from_step_
  // (the effective step of the last history or margin change) on.
  StepFlags delayed_spikes_;
  GemmFinding delayed_worst_;
  std::int64_t delayed_from_step_ = 0;
  int amax_history_seen_ = 0;              // the longest amax history reported
  std::optional<int> amax_margin_seen_;    // the margin the latest delayed scale implies
  std::optional<int> amax_history_length_;  // decided
  std::optional<int> amax_margin_;          // decided
  ScalerSettings cumulative_;               // every decided scaler field, latest value
  std::optional<PolicyDecision> last_decision_;
  Evaluation evaluation_;

  friend struct StateCodec;
};

// Building blocks, exposed for tests and for the server's what-if queries.

// log2 of the largest power-of-two scale 2^k at which predict_from_histogram() says no value of
// `unscaled` can overflow `format` (overflow.upper == 0). nullopt for an empty histogram.
// For FP16 this is 14 - max_exponent: the top bin must land at or below [2^14, 2^15).
std::optional<int> overflow_free_scale_log2(const BinadeHistogram& unscaled, Format format);

// The histogram of the values divided by `scale` (see "Domains" above). Throws PolicyError when
// scale is not finite or <= 0.
BinadeHistogram to_unscaled(const BinadeHistogram& measured, double scale);

// Trimmed dynamic range in binades: top minus bottom exponent after dropping `trim_fraction` of
// the values from each end (at least one value is kept). 0 for an empty histogram.
int trimmed_dynamic_range(const BinadeHistogram& histogram, double trim_fraction);

}  // namespace ampscope::policy
