// Precision modes of the trainer and the per-tensor formats each implies. The mode is chosen in
// this one place; model code asks the policy. The FP8/FP4 modes add, on top of amp-bf16, the
// quantisation of the linear layers' GEMM inputs by a scaling recipe (ampscope/recipe.h):
// gemm_recipe() says which recipe each operand of each GEMM gets, DelayedScaling holds the amax
// histories of the delayed recipe, and GemmPrecisionSet is the per-layer precision a policy
// changes at a step (docs/trainer.md, "FP8 and FP4 recipes").
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ampscope/formats.h"
#include "ampscope/recipe.h"

namespace ampscope::trainer {

enum class PrecisionMode {
  kFP32 = 0,        // everything FP32
  kFP16 = 1,        // everything FP16, no master weights: the known-bad baseline
  kAmpFP16 = 2,     // FP16 matmuls and activations, FP32 master weights, softmax, LayerNorm, loss
  kAmpBF16 = 3,     // the same with BF16
  kFP8Delayed = 4,  // amp-bf16 + per-tensor delayed scaling, E4M3 forward, E5M2 gradients
  kFP8Current = 5,  // amp-bf16 + per-tensor current scaling, E4M3 forward, E5M2 gradients
  kMXFP8 = 6,       // amp-bf16 + MXFP8 (E4M3, 32-element E8M0-scaled blocks) for every operand
  kNVFP4 = 7,       // amp-bf16 + NVFP4 (E2M1, 16-element E4M3-scaled blocks, FP32 tensor scale)
};

std::string_view precision_name(PrecisionMode mode);
// Accepts fp32, fp16, amp-fp16, amp-bf16, fp8-delayed, fp8-current, mxfp8, nvfp4. nullopt when
// unknown.
std::optional<PrecisionMode> parse_precision(std::string_view name);
// Every mode's name, in enum order (the command line's choices).
std::vector<std::string> precision_names();

struct PrecisionPolicy {
  // Storage of parameters, their gradients and the optimizer moments (the master copy in AMP).
  Format param = Format::kFP32;
  // Whether FP32 master weights exist next to a low-precision compute copy.
  bool master_weights = false;
  // Matmuls, attention products, GELU and their outputs.
  Format compute = Format::kFP32;
  // Residual stream (embeddings and residual adds): FP32 in AMP because an FP32 + FP16 add
  // promotes to FP32 under autocast.
  Format residual = Format::kFP32;
  // LayerNorm, softmax and cross-entropy (autocast's FP32 list).
  Format fp32_ops = Format::kFP32;
  // The FP8/FP4 modes: the linear layers' GEMM inputs are quantised by gemm_recipe().
  bool scaled_gemms = false;

  static PrecisionPolicy for_mode(PrecisionMode mode);
};

// ---- FP8/FP4 recipes of the linear layers ----------------------------------------------------
// A linear layer Y (N,OC) = X (N,C) W (OC,C)^T runs three GEMMs, each reducing over one axis:
//   forward  Y  = X W^T     reduces over C:  X blocks along its rows, W along its rows
//   dgrad    dX = dY W      reduces over OC: dY blocks along its rows, W down its columns
//   wgrad    dW = dY^T X    reduces over N:  dY and X blocks down their columns
// Block recipes (MX, NVFP4) put their blocks along the reduction axis (1 x k over a row-major
// [rows, cols] view when it is the last axis, k x 1 when it is the first); per-tensor recipes
// quantise an operand the same way in every GEMM that reads it.
enum class GemmOperand : std::uint8_t { kInput = 0, kWeight = 1, kOutputGrad = 2 };
enum class GemmUse : std::uint8_t { kForward = 0, kDgrad = 1, kWgrad = 2 };

std::string_view operand_name(GemmOperand operand);  // "input", "weight", "output_grad"
std::string_view gemm_use_name(GemmUse use);         // "forward", "dgrad", "wgrad"

// The recipe `mode` applies to `operand` in the GEMM `use`; nullopt for modes without scaled
// GEMMs and for an operand the GEMM does not read (the input in dgrad, the weight in wgrad).
// A current recipe carries margin `margin`; a delayed recipe's scale is 1 here and its margin 0
// (the caller sets DelayedScaling's scale, which already holds the margin, so the recipe reads
// back from its canonical text unchanged). The recipe of every mode:
//   fp8-delayed  delayed, E4M3 input and weight, E5M2 output_grad (Transformer Engine's HYBRID)
//   fp8-current  current, the same formats
//   mxfp8        mx E4M3, 32-element blocks along the reduction axis, scale rounded down (OCP)
//   nvfp4        nvfp4 E2M1, 16-element blocks along the reduction axis
std::optional<Recipe> gemm_recipe(PrecisionMode mode, GemmOperand operand, GemmUse use,
                                  int margin = 0);
// The block length of a block mode along the reduction axis (32, 16), 0 for per-tensor modes.
int gemm_block_length(PrecisionMode mode);

// Delayed scaling's settings of one layer (Transformer Engine's amax_history_len and margin;
// the reduction is "max").
struct DelayedSettings {
  int history_length = 16;
  int margin = 0;
  friend bool operator==(const DelayedSettings&, const DelayedSettings&) = default;
};

// The amax histories of a run under fp8-delayed: one per GEMM input (layer x operand), in a
// fixed order. Within a step every quantisation of an input uses the scale its history gives at
// the step's start; the largest amax seen in the step (over micro-batches and GEMMs) is pushed
// at the step's end (end_step), after its use, as Transformer Engine does. Owned by the Trainer,
// used on its thread.
class DelayedScaling {
 public:
  struct Input {
    std::string name;   // "h0.attn.qkv.input"
    std::string layer;  // "h0.attn.qkv"
    GemmOperand operand = GemmOperand::kInput;
  };
  DelayedScaling(const std::vector<std::string>& layers, const DelayedSettings& settings);

  const std::vector<Input>& inputs() const { return inputs_; }
  // The index of (layer, operand), or -1 when the layer is not one of the constructor's.
  int index(std::string_view layer, GemmOperand operand) const;
  const AmaxHistory& history(std::size_t i) const { return histories_[i]; }
  const DelayedSettings& settings(std::size_t i) const { return settings_[i]; }
  float scale(std::size_t i) const { return histories_[i].scale(); }

  // Applies a layer's settings from this step on (a changed length keeps the newest entries;
  // the scale follows the new margin at once).
  void apply(std::size_t i, const DelayedSettings& settings);
  // Records an amax of input i in this step (finite, >= 0).
  void record(std::size_t i, double amax);
  // This step's amaxes, -Inf for inputs not quantised this step (a max all-reduce over ranks
  // keeps that meaning); end_step pushes the finite ones and starts the next step.
  std::span<const double> step_amaxes() const { return step_amax_; }
  void end_step(std::span<const double> amaxes);
  // A checkpoint's state: settings, history (oldest first) and scale of input i. Throws
  // ampscope::Error when the pushes do not give back `scale`.
  void restore(std::size_t i, const DelayedSettings& settings, std::span<const float> history,
               float scale);

 private:
  std::vector<Input> inputs_;
  std::vector<AmaxHistory> histories_;
  std::vector<DelayedSettings> settings_;
  std::vector<double> step_amax_;
};

// Per-layer precision of the FP8/FP4 modes (the policy engine's per-layer precision): a linear
// layer moved to BF16 from a step on runs its GEMMs without quantisation (as amp-bf16 does), and
// back when removed; a delayed recipe's margin and history length change per layer (or "*",
// every layer; a layer's own entry wins) from a step on. Layers are "h{i}.attn.qkv",
// "h{i}.attn.proj", "h{i}.mlp.fc", "h{i}.mlp.proj". A layer in the Fp32OverrideSet computes in
// FP32 and is not quantised either.
// Thread safety: every member is safe to call from any thread; the trainer reads the set once
// per step, so a change takes effect at the next step boundary at the earliest.
class GemmPrecisionSet {
 public:
  explicit GemmPrecisionSet(std::vector<std::string> valid_layers = {});

  // Moves `layer` ("*": every layer) to BF16 from `from_step` on. Returns an empty string on
  // success, otherwise a one-line reason (unknown layer, negative step).
  std::string add_bf16(std::string_view layer, std::int64_t from_step);
  // Back to the recipe (at the next step the trainer reads the set).
  bool remove_bf16(std::string_view layer);
  bool bf16(std::string_view layer, std::int64_t step) const;
  // The layers in BF16 at `step` (entries, "*" as written), sorted.
  std::vector<std::string> bf16_layers(std::int64_t step) const;
  std::vector<std::pair<std::string, std::int64_t>> bf16_entries() const;

  // Delayed scaling's settings for `layer` ("*": the default of every layer) from `from_step`
  // on. history_length >= 1, margin in [0, 64]; otherwise a one-line reason.
  std::string set_delayed(std::string_view layer, const DelayedSettings& settings,
                          std::int64_t from_step);
  bool remove_delayed(std::string_view layer);
  // The settings in force for `layer` at `step`: its own entry if due, else "*"'s if due.
  std::optional<DelayedSettings> delayed(std::string_view layer, std::int64_t step) const;
  struct DelayedEntry {
    std::string layer;
    DelayedSettings settings;
    std::int64_t from_step = 0;
  };
  std::vector<DelayedEntry> delayed_entries() const;  // sorted by layer

  void clear();
  const std::vector<std::string>& valid_layers() const { return valid_; }

 private:
  std::string check(std::string_view layer, std::int64_t from_step) const;
  std::vector<std::string> valid_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::int64_t> bf16_from_;
  std::unordered_map<std::string, std::pair<DelayedSettings, std::int64_t>> delayed_;
};

}  // namespace ampscope::trainer
