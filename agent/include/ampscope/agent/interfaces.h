// The agent's own view of a training loop: what it is shown (tensors, steps) and what it may
// steer (the loss scaler, the set of layers computed in FP32). The agent knows no particular
// trainer; an adapter maps a trainer's hooks onto these types (ampscope-train's is
// trainer/src/agent_adapter.cc).
//
// Ownership: views are borrowed for the duration of a call only. ScalerControl and
// PrecisionOverrides are owned by the caller and must outlive the Agent they are attached to.
// Thread safety: see each interface.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ampscope/formats.h"
#include "ampscope/loss_scale.h"
#include "ampscope/vocabulary.h"

namespace ampscope::agent {

// Roles, phases, devices and scaler kinds are ampscope/vocabulary.h's (TensorRole,
// TensorPhase, Device, ScalerKind), shared with every trainer and the server.

// One tensor at one point of a step. `data` holds numel elements of `dtype` storage (float, or
// 16-bit patterns for FP16/BF16), dense, valid only during the call. On Device::kCuda it is a
// device pointer and `stream` the cudaStream_t the data is ordered on.
struct TensorView {
  // Any bytes: sent as written when it is valid UTF-8 without control characters within 256
  // bytes, escaped otherwise (docs/agent.md, "Names and text").
  std::string_view name;
  TensorRole role = TensorRole::kActivation;
  TensorPhase phase = TensorPhase::kUnknown;
  Format dtype = Format::kFP32;
  const void* data = nullptr;
  std::span<const std::int64_t> shape;  // numel is their product (1 for an empty shape)
  Device device = Device::kCpu;
  void* stream = nullptr;
  double scale = 1.0;  // the loss scale the stored values carry (1 when unscaled)
  int micro_step = 0;
  int order = 0;  // execution order within the step, from 0
  // For gradients: the narrowest format the values pass through at this scale (where they can
  // overflow). Unset: the run's compute format (PyTorch autocast casts weight gradients through
  // it). A trainer whose weight gradients stay in FP32 says FP32, so that the loss-scale policy
  // does not size the scale against an FP16 they never see.
  std::optional<Format> held;
};

// One optimizer step (one effective batch), reported after it finished.
struct StepInfo {
  std::int64_t step = 0;
  double loss = 0.0;
  double loss_scale = 1.0;   // used this step
  double scale_after = 1.0;  // after the scaler's update
  bool found_inf = false;
  bool skipped = false;
  double grad_norm = 0.0;
  double lr = 0.0;
  std::int64_t tokens = 0;
  double step_time_s = 0.0;
  std::int64_t optimizer_steps = 0;
  std::vector<std::string> fp32_layers;
  // FP8/FP4 runs: the layers of the GEMM overrides whose GEMMs ran in BF16 this step.
  std::vector<std::string> bf16_gemms;
  std::optional<double> val_loss;  // validation loss after this step, where evaluated
};

// A loss scaler's configuration, as the Hello reports it and a fallback restores it.
// Defaults: PyTorch GradScaler's (ampscope/loss_scale.h).
struct ScalerSettings {
  ScalerKind kind = ScalerKind::kDynamic;
  double scale = kGradScalerInitScale;
  double growth_factor = gradscaler_rule().growth_factor;
  double backoff_factor = gradscaler_rule().backoff_factor;
  std::int64_t growth_interval = gradscaler_rule().growth_interval;
  int hysteresis = 0;        // 0: none
  double min_scale = 0.0;    // 0: none
  double max_scale = 0.0;    // 0: none
};

// A change to the scaler; unset fields keep their value.
struct ScalerChange {
  std::int64_t effective_from_step = 0;
  std::optional<double> scale;
  std::optional<double> growth_factor;
  std::optional<double> backoff_factor;
  std::optional<std::int64_t> growth_interval;
  std::optional<int> hysteresis;
  std::optional<double> min_scale;
  std::optional<double> max_scale;
};

// The trainer's loss scaler as the agent steers it. The agent calls schedule() on the training
// thread from Agent::begin_step(step) with effective_from_step == step, before the trainer
// reads the step's scale, so a change governs exactly that step.
// Thread safety: settings() may be called from any thread; schedule() from the training thread.
class ScalerControl {
 public:
  virtual ~ScalerControl() = default;
  virtual ScalerSettings settings() const = 0;
  // Empty when accepted, otherwise a one-line reason (the scaler's own validation).
  virtual std::string schedule(const ScalerChange& change) = 0;
};

// One rank's vote in the per-step policy agreement (config.h, PolicyAgreementMode::kPerStep):
// the highest policy seq it has received, and whether it wants its local scaler's
// configuration back. The host reduces the ranks' votes to the lowest seq and "any fallback"
// (one max all-reduce of {-received_seq, fallback}, fused with its found_inf reduction) and
// hands the result back to every rank.
struct PolicyVote {
  std::uint64_t received_seq = 0;
  bool fallback = false;
};

// A set of layers the trainer computes at a higher precision than the run's default, steered
// by the policy: the layers computed in FP32 (the FP32 fallback, Agent::attach_overrides), or
// in an FP8/FP4 run the linear layers whose GEMMs run in BF16 instead of the recipe
// (Agent::attach_gemm_precision; there tensors are quantiser layers and layer_of is identity).
// Thread safety: capable_layers() and layer_of() from any thread (the agent validates updates on
// its reader thread); replace() from the training thread, called by Agent::begin_step(step) with
// from_step == step.
class PrecisionOverrides {
 public:
  virtual ~PrecisionOverrides() = default;
  // The layer names replace() accepts.
  virtual std::vector<std::string> capable_layers() const = 0;
  // Makes `layers` exactly the FP32 set from `from_step` on. Empty when accepted, otherwise a
  // one-line reason; on failure nothing changes.
  virtual std::string replace(const std::vector<std::string>& layers, std::int64_t from_step) = 0;
  // The capable layer whose FP32 override computes `tensor` (the policy recommends tensors by
  // the names the trainer reports them under: "h1.attn.scores" is computed by layer
  // "h1.attn.core"), or empty when no capable layer does. Default: `tensor` itself when it is
  // a capable layer.
  virtual std::string layer_of(std::string_view tensor) const {
    for (const std::string& l : capable_layers()) {
      if (l == tensor) return l;
    }
    return {};
  }
};

// A change to the delayed scaling recipe of every quantiser of an FP8 run (Transformer
// Engine's amax_history_len and margin); unset fields keep their value.
struct RecipeChange {
  std::int64_t effective_from_step = 0;
  std::optional<int> amax_history_length;  // [1, 1024]
  std::optional<int> margin;               // binades, [0, 64]
};

// The run's scaling recipe as the agent steers it. schedule() is called as
// ScalerControl::schedule is: on the training thread from Agent::begin_step(step) with
// effective_from_step == step.
class RecipeControl {
 public:
  virtual ~RecipeControl() = default;
  // Whether the run uses delayed scaling (an update that changes it is refused otherwise).
  virtual bool delayed() const = 0;
  // Empty when accepted, otherwise a one-line reason; on failure nothing changes.
  virtual std::string schedule(const RecipeChange& change) = 0;
};

// Points of a step the trainer may mark for the NVTX timeline; the agent infers forward,
// backward and unscale/check from the phases of the tensors it is shown.
enum class StepPhase : std::uint8_t {
  kForward = 0,
  kBackward = 1,
  kUnscaleCheck = 2,
  kOptimizer = 3,
};

}  // namespace ampscope::agent
