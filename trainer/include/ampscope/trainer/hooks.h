// Hooks through which an observer (the ampscope agent, a test, a logger) watches and steers a
// training run. The trainer depends on nothing outside these interfaces; the agent defines its
// own and one small adapter (in ampscope-train's main) connects the two.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ampscope/formats.h"
#include "ampscope/recipe.h"
#include "ampscope/tensor_stats.h"
#include "ampscope/vocabulary.h"
#include "ampscope/trainer/backend.h"
#include "ampscope/trainer/precision.h"

namespace ampscope::trainer {

// Roles, phases and devices are ampscope/vocabulary.h's.

// A tensor as the observer sees it. `data` is only valid during the callback and points to
// device memory when device != kCpu (then `stream` is the back end's native stream handle and
// any work on the data must be ordered on it). Values are as stored: `scale` is the loss scale
// they carry (the scale used this step for gradients before unscaling, 1 otherwise).
struct TensorView {
  std::string_view name;
  TensorRole role = TensorRole::kActivation;
  TensorPhase phase = TensorPhase::kForward;
  Format dtype = Format::kFP32;
  const void* data = nullptr;
  std::span<const std::int64_t> shape;
  Device device = Device::kCpu;
  void* stream = nullptr;
  float scale = 1.0f;
  std::int64_t step = 0;
  int micro_step = 0;
  int order = 0;  // position in execution order within the step, from 0
  // For gradients: the narrowest format the values pass through at this scale, where they can
  // overflow (model.cc, Gpt::grad_held, says what that is for each parameter). Unset where the
  // model does not say (activation gradients): then the run's compute format.
  std::optional<Format> held;
};

// What the quantiser of an FP8/FP4 mode (precision.h) measured on one GEMM input: the counts
// fake_quantize returned from the pass that quantised it (no second pass over the data). Valid
// during the callback only.
//   name      "<layer>.<operand>": "h0.attn.qkv.input", "h0.attn.qkv.weight",
//             "h0.attn.qkv.output_grad" (the layers GemmPrecisionSet names)
//   role      kActivation (input), kWeight (weight), kActivationGrad (output_grad)
//   use       the GEMM that read the quantised values. Per-tensor recipes quantise an operand
//             once per micro-batch and every GEMM reads that: input and weight are reported
//             with kForward, output_grad with kDgrad. Block recipes quantise again for each
//             GEMM along its reduction axis: also weight (kDgrad), output_grad and input
//             (kWgrad), each with its own block shape in `recipe`.
//   recipe    the recipe applied (a delayed recipe's scale is the one used)
//   counts    fake_quantize's RecipeCounts of this quantisation (counts.recipe == recipe)
//   amax_history  fp8-delayed: the input's history (oldest first) the scale came from, before
//             this step's amax is pushed; empty for the other recipes
//   what_if   the layer runs BF16 (GemmPrecisionSet) and nothing was quantised: `counts` are
//             what the recipe would have done to the input the BF16 GEMM read, read as the
//             quantised GEMM reads it (Backend::gemm_operand_counts); the same reports as the
//             quantised path, on observed steps only. Under fp8-delayed the scale is the one
//             the history holds (it records no amax while the layer runs BF16).
// `scale` is the loss scale output_grad carries (1 for input and weight).
struct QuantizedGemmInput {
  std::string_view name;
  std::string_view layer;
  GemmOperand operand = GemmOperand::kInput;
  TensorRole role = TensorRole::kActivation;
  TensorPhase phase = TensorPhase::kForward;
  GemmUse use = GemmUse::kForward;
  Recipe recipe;
  RecipeCounts counts;
  std::span<const float> amax_history;
  float scale = 1.0f;
  std::int64_t step = 0;
  int micro_step = 0;
  bool what_if = false;
  // On a layer's output-gradient report of its first use (dgrad), on the steps the model
  // measures it (Gpt::set_loss_cost_every): sum(dout x (Y_recipe - Y)) / dloss, the change in
  // the micro-batch's mean loss the recipe's rounding of the forward output Y causes, to first
  // order (with what_if, the change it would cause). Finite.
  std::optional<double> loss_cost;
};

// Called on the training thread, synchronously, in execution order. Implementations must not
// throw and should return quickly (copy what they need).
class TensorObserver {
 public:
  virtual ~TensorObserver() = default;
  // Asked once at the start of each step; false skips every on_tensor call of that step.
  virtual bool observe_step(std::int64_t step) = 0;
  virtual void on_tensor(const TensorView& tensor) = 0;
  // Fused statistics, for tensors whose values the trainer reads in a pass of its own anyway
  // (the weight gradients' unscale). Before that pass: the targets full statistics of `meta`
  // (data not yet final) should count, or nullopt when the observer does not want them (then
  // the trainer shows the tensor with on_tensor as usual).
  virtual std::optional<std::vector<TargetSpec>> stats_targets(const TensorView& meta) {
    (void)meta;
    return std::nullopt;
  }
  // After the pass, instead of on_tensor: `tensor` (its data final, valid during the call) and
  // compute_stats() of it with the targets stats_targets() returned.
  virtual void on_tensor_stats(const TensorView& tensor, const TensorStats& stats) {
    (void)stats;
    on_tensor(tensor);
  }
  // FP8/FP4 modes: after each GEMM of a quantised linear layer, once per input it quantised
  // (QuantizedGemmInput says which), and of a layer moved to BF16, once per input the recipe
  // would have quantised (what_if), on steps observe_step() accepted. Default: nothing.
  virtual void on_quantized(const QuantizedGemmInput& input) { (void)input; }
};

// One optimizer step (one effective batch).
struct StepEvent {
  std::int64_t step = 0;       // 0-based index of this step
  // The effective batch is global: every rank's micro-batches of the step (docs/multi-rank.md);
  // loss, found_inf, grad_norm and tokens are the same on every rank.
  double loss = 0.0;           // mean unscaled training loss over the effective batch
  float loss_scale = 1.0f;     // scale used for this step's backward
  float scale_after = 1.0f;    // scale after the scaler's update
  bool found_inf = false;
  bool skipped = false;        // optimizer step not applied (found_inf)
  double grad_norm = 0.0;      // global L2 norm after unscaling, before clipping
  float lr = 0.0f;             // the learning rate of this step (not applied when skipped)
  std::int64_t tokens = 0;     // tokens in the effective batch
  double step_time_s = 0.0;
  std::int64_t optimizer_steps = 0;  // applied updates so far, after this step
  std::vector<std::string> fp32_layers;  // layers computed in FP32 this step
  // FP8/FP4 modes: the GemmPrecisionSet's layers this step, "*" as every linear layer, in
  // execution order (one also in the FP32 set computes in FP32).
  std::vector<std::string> bf16_gemms;
  std::optional<double> val_loss;        // validation loss after this step, when evaluated
};

class StepListener {
 public:
  virtual ~StepListener() = default;
  virtual void on_step(const StepEvent& event) = 0;
};

// One rank's vote in the per-step policy agreement of a multi-rank run (docs/multi-rank.md):
// the highest policy seq it holds with every lower one, and whether it wants the local scaler's
// configuration back (its server has been unreachable too long). The trainer reduces the votes
// of all ranks together with found_inf (one max all-reduce of {found_inf, -received_seq,
// fallback}), so the agreed vote is the lowest seq any rank holds and "some rank wants to fall
// back": every rank applies the same updates, and falls back, at the same step, and no rank
// waits for an update it has not received.
struct PolicyVote {
  std::uint64_t received_seq = 0;
  bool fallback = false;
};

// Supplies and receives the votes (the agent's adapter). Called on the training thread once
// per step: vote() after the step's gradients are checked, agreed() with the reduced vote
// right after, before the next step begins. Implementations must not throw.
class PolicyAgreement {
 public:
  virtual ~PolicyAgreement() = default;
  virtual PolicyVote vote() = 0;
  virtual void agreed(const PolicyVote& vote) = 0;
};

// Layers that compute in FP32 from a given step on (the policy engine's FP32 fallback). Named
// layers are matmul-like producers: "h{i}.attn.qkv", "h{i}.attn.core", "h{i}.attn.proj",
// "h{i}.mlp.fc", "h{i}.mlp.gelu", "h{i}.mlp.proj", "lm_head"; "*" means every layer.
// Thread safety: every member is safe to call from any thread; the trainer reads the set once
// per step, so a change takes effect at the next step boundary at the earliest.
class Fp32OverrideSet {
 public:
  explicit Fp32OverrideSet(std::vector<std::string> valid_layers = {});

  // Adds (or moves) `layer` to FP32 from `from_step` on. Returns an empty string on success,
  // otherwise a one-line reason (unknown layer, negative step).
  std::string add(std::string_view layer, std::int64_t from_step);
  bool remove(std::string_view layer);
  void clear();
  bool active(std::string_view layer, std::int64_t step) const;
  // The layers active at `step`, sorted.
  std::vector<std::string> active_layers(std::int64_t step) const;
  // Every entry with its first step.
  std::vector<std::pair<std::string, std::int64_t>> entries() const;
  const std::vector<std::string>& valid_layers() const { return valid_; }

 private:
  std::vector<std::string> valid_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::int64_t> from_step_;
};

}  // namespace ampscope::trainer
