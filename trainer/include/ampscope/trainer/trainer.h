// The mixed-precision training loop around Gpt: gradient accumulation, loss scaling, unscaling
// with a found_inf check, global-norm clipping, AdamW on FP32 master weights, the LR schedule,
// validation, checkpoints and fault injection.
//
// One step() is one effective batch:
//   scale = scaler.begin_step(step)                    (fixed for the whole effective batch)
//   for each of `accum` micro-batches: forward, backward with dloss = scale * shrink / accum
//   grads *= 1/scale (inv computed in FP64, cast to FP32), found_inf = any non-finite
//   the back end updates the scale state from found_inf (update_loss_scale, on its device)
//   one read brings found_inf, the norm, the loss and the new scale state to the host
//   found_inf: skip the update, the LR schedule does not advance
//   else: clip to grad_clip by the global norm, AdamW at lr = schedule(applied updates)
//   scaler.end_step(...) adopts the back end's new state (once per effective batch)
// Every mode checks found_inf and skips a non-finite update; FP32 and BF16 simply do so with a
// static scale of 1.
//
// Data parallel (docs/multi-rank.md): with N ranks each step is one global effective batch of
// N x accum micro-batches of `batch` sequences. Rank r takes micro-batch (step*accum + micro)*N
// + r of the one batch stream all ranks draw, the seed is scale * shrink / (accum * N), and
// the gradients are summed over ranks (FP32) before unscaling, so N ranks x accum A train as
// one rank x accum A*N: the same batches and divisor, and the same bits for 2 ranks x accum 1
// against 1 x accum 2 (a sum of two terms has one order; larger sums differ in FP32 rounding
// only). Then one small max all-reduce of host doubles per step
// carries found_inf (every rank skips the same steps), the policy votes (PolicyAgreement) and
// every rank's loss. Weights, moments, scaler, schedule and data position stay identical on
// every rank; rank 0 writes checkpoints.
// FP8/FP4 modes (precision.h): the linear layers quantise their GEMM inputs by the mode's
// recipe; gemm_precision() moves layers to BF16 and changes delayed scaling's settings at a
// step; under fp8-delayed each step's amaxes are max-reduced over ranks (in the step's one
// all-reduce) and pushed into the histories after the step, so every rank holds the same.
// Thread safety: the Trainer runs on one thread; scaler(), fp32_overrides() and
// gemm_precision() may be used from others (see their headers).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ampscope/trainer/backend.h"
#include "ampscope/trainer/communicator.h"
#include "ampscope/trainer/data.h"
#include "ampscope/trainer/hooks.h"
#include "ampscope/trainer/loss_scaler.h"
#include "ampscope/trainer/lr_schedule.h"
#include "ampscope/trainer/model.h"
#include "ampscope/trainer/precision.h"

namespace ampscope::trainer {

struct TrainerConfig {
  GptConfig model;  // vocab_size 0: taken from the corpus
  PrecisionMode precision = PrecisionMode::kFP32;
  std::optional<ScalerConfig> scaler;  // unset: default_scaler(precision)
  int batch = 8;
  int accum = 1;
  std::int64_t steps = 200;
  std::uint64_t seed = 1;
  float lr = 3e-3f;
  float min_lr = 3e-4f;
  std::int64_t warmup_steps = 20;
  float weight_decay = 0.1f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float grad_clip = 1.0f;  // 0 disables clipping
  double val_fraction = 0.1;
  std::vector<Injection> injections;
  std::optional<int> inject_rank;  // unset: every rank injects; set: only this rank
  float grad_shrink = 1.0f;  // multiplies every gradient (induces underflow in FP16)
  // Unset: grad_shrink throughout. Set: the factor moves geometrically from grad_shrink at
  // step 0 to grad_shrink_end at the last step (gradients that shrink over training).
  std::optional<float> grad_shrink_end;
  // Validation loss (StepEvent::val_loss) after every `eval_every`-th step and after the last
  // one; eval_every 0: after the last step only; eval_batches 0: never.
  std::int64_t eval_every = 0;
  int eval_batches = 4;
  // fp8-delayed: every layer's amax history length and margin unless GemmPrecisionSet says
  // otherwise for it (--fp8-amax-history, --fp8-margin).
  DelayedSettings fp8_delayed;
  // FP8/FP4 modes: measure each layer's loss cost on every n-th observed step (0: never;
  // Gpt::set_loss_cost_every; --loss-cost-every).
  int loss_cost_every = 16;
};

// Dynamic (PyTorch defaults) for amp-fp16; static 1 for fp32, fp16 and amp-bf16.
ScalerConfig default_scaler(PrecisionMode mode);
// Empty when valid, otherwise a one-line reason naming the field.
std::string validate(const TrainerConfig& config);

class Trainer {
 public:
  // Throws ampscope::Error with a one-line message on an invalid configuration or corpus, or a
  // communicator that cannot reduce the back end's memory. `comm` null: a single process.
  Trainer(const TrainerConfig& config, const Corpus& corpus, std::unique_ptr<Backend> backend,
          std::unique_ptr<Communicator> comm = nullptr);
  ~Trainer();

  // One effective batch; evaluates the validation loss first when it is due (see
  // TrainerConfig::eval_every), so that step listeners receive it.
  StepEvent step();
  // The gradient multiplier of `step` (TrainerConfig::grad_shrink, grad_shrink_end).
  double grad_shrink_at(std::int64_t step) const;
  // Mean loss over `batches` fixed validation batches (forward only, no observer calls).
  double evaluate(int batches);

  void set_observer(TensorObserver* observer) { observer_ = observer; }
  void add_step_listener(StepListener* listener) { listeners_.push_back(listener); }
  // The per-step policy vote (hooks.h); null: this rank votes {0, no fallback}.
  void set_policy_agreement(PolicyAgreement* agreement) { agreement_ = agreement; }
  ScalerHandle& scaler() { return scaler_; }
  Fp32OverrideSet& fp32_overrides() { return overrides_; }
  GemmPrecisionSet& gemm_precision() { return gemm_; }
  // fp8-delayed's amax histories (null in the other modes). Trainer thread only.
  const DelayedScaling* delayed_scaling() const { return delayed_.get(); }

  std::int64_t next_step() const { return step_; }
  std::int64_t optimizer_steps() const { return updates_; }
  const TrainerConfig& config() const { return config_; }
  const Gpt& model() const { return *model_; }
  Gpt& model() { return *model_; }
  const LrSchedule& lr_schedule() const { return schedule_; }
  int rank() const { return comm_->rank(); }
  int world_size() const { return comm_->size(); }

  // Writes weights, moments, scaler state, step, applied updates, data position and config
  // to `path` atomically (temporary file + rename), with a CRC-32 over the contents. Every rank
  // calls it: rank 0 writes, then all wait for one another (the file is complete everywhere
  // once it returns).
  void save_checkpoint(const std::string& path) const;
  // Restores a checkpoint written by a trainer of the same model shape and precision (every
  // rank reads the same file; step and data position are global). Throws ampscope::Error with
  // a one-line reason otherwise.
  void load_checkpoint(const std::string& path);

 private:
  void next_batch();
  void write_checkpoint(const std::string& path) const;
  void all_reduce_grads(const Tensor& grads);
  // fp8-delayed: each history takes the settings in force for its layer at `step`.
  void apply_delayed_settings(std::int64_t step);

  TrainerConfig config_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Communicator> comm_;
  std::vector<Injection> injections_;  // this rank's (TrainerConfig::inject_rank)
  DataLoader loader_;  // before model_: a corpus too short fails before any allocation
  std::unique_ptr<Gpt> model_;
  ScalerHandle scaler_;
  Fp32OverrideSet overrides_;
  GemmPrecisionSet gemm_;
  std::unique_ptr<DelayedScaling> delayed_;
  LrSchedule schedule_;
  TensorObserver* observer_ = nullptr;
  std::vector<StepListener*> listeners_;
  PolicyAgreement* agreement_ = nullptr;
  std::unique_ptr<Buffer> reduce_fp32_;  // FP32 copy of 16-bit gradients for the sum over ranks
  std::unique_ptr<Buffer> scalars_;  // StepScalars (found_inf, sum_sq, loss) on the device
  std::int64_t step_ = 0;
  std::int64_t updates_ = 0;
  Batch batch_;
};

}  // namespace ampscope::trainer
