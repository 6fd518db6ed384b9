// The optimizer side of the trainer on the device: the fused multi-tensor unscale + non-finite
// check, the global gradient norm, clipping, AdamW on FP32 master weights, and the loss-scale
// update, all stream-ordered so that a training step needs at most one host read (found_inf,
// the squared norm and the new scale sit next to each other in device memory and come back in
// one copy).
//
// CPU references: the trainer's CPU back end (unscale_and_check, sum_squares, scale, adamw) and
// the loss-scale rules of ampscope/loss_scale.h (PyTorch GradScaler and Megatron semantics). The
// element arithmetic is the same expression in the same order, compiled without FMA
// contraction, so unscale, scale, AdamW and the scale update are bit-exact; sum_squares is an
// FP64 sum in another order.
//
// Arrays as in ampscope/cuda/nn.h (device memory, FP32 or FP16/BF16 bit patterns).
// Errors: ampscope::Error on a violated precondition or a failed launch.
// Thread safety: launchers are re-entrant.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "ampscope/cuda/nn.h"
#include "ampscope/formats.h"
#include "ampscope/loss_scale.h"
#include "ampscope/tensor_stats.h"

namespace ampscope::cuda::nn {

// One gradient tensor of a multi-tensor launch.
struct GradientTensor {
  void* data = nullptr;
  Format dtype = Format::kFP32;
  std::int64_t numel = 0;
  // unscale_check_and_measure: the GradientStats slot that receives the statistics of this
  // tensor's unscaled values; -1: not measured. One tensor per slot.
  int stats_slot = -1;
};

// Tensors per launch of the multi-tensor kernel (their table travels in the kernel's
// parameters); longer lists take one launch per this many tensors.
inline constexpr int kMultiTensorMaxPerLaunch = 96;

// Every gradient g of every tensor becomes g * inv_scale (FP32 product, stored in the tensor's
// format), and *found_inf (FP32, device) is set to 1 when any g (before unscaling) is NaN or
// Inf; it is never cleared here. One launch for up to kMultiTensorMaxPerLaunch tensors.
void unscale_and_check(std::span<const GradientTensor> grads, float inv_scale, float* found_inf,
                       cudaStream_t stream);

// The same, with inv_scale = float(1 / double(state->scale)) computed on the device (what the
// trainer computes on the host), so the scale never has to come back to the host.
void unscale_and_check(std::span<const GradientTensor> grads, const LossScaleState* state,
                       float* found_inf, cudaStream_t stream);

// Fused statistics: the device accumulators and host results of the statistics that
// unscale_check_and_measure takes of up to `capacity` gradients, about 9 KiB of device memory
// and as much pinned host memory per slot, allocated at construction (on the current device;
// cudaFree at destruction may synchronise the device: keep one and reuse it).
// Thread safety: one launch at a time; wait() on the thread that launched or any other, once.
class GradientStats {
 public:
  explicit GradientStats(int capacity);
  ~GradientStats();  // waits for a launch in flight; never throws
  GradientStats(const GradientStats&) = delete;
  GradientStats& operator=(const GradientStats&) = delete;

  int capacity() const;
  // Blocks the calling thread until the results of the last launch have arrived in host memory
  // (on the launch's event, not the device), then returns one TensorStats per slot in
  // [0, slots used by the launch). Throws ampscope::Error when nothing is in flight.
  std::vector<TensorStats> wait();

  struct Impl;

 private:
  friend void unscale_check_and_measure(std::span<const GradientTensor> grads,
                                        float inv_scale, float* found_inf,
                                        std::span<const TargetSpec> targets,
                                        GradientStats& stats, cudaStream_t stream);
  std::unique_ptr<Impl> impl_;
};

// unscale_and_check (the same values and the same *found_inf), also measuring, in the same
// pass over memory (one read and one write of each gradient), the unscaled values as stored of
// every tensor with stats_slot >= 0 into that slot of `stats`: compute_stats()'s statistics
// (ampscope/tensor_stats.h) counting `targets` (at most kCudaStatsMaxTargets), counts,
// histogram, extrema and target counts identical to the CPU reference's, sum and sum_sq
// exactly rounded. The slots are reset, the results copied to stats' host memory and an event
// recorded, all on `stream`; collect them with stats.wait(). Throws ampscope::Error, before
// anything is enqueued, on a slot outside stats.capacity() or used twice, or a launch of stats
// still uncollected.
void unscale_check_and_measure(std::span<const GradientTensor> grads, float inv_scale,
                               float* found_inf, std::span<const TargetSpec> targets,
                               GradientStats& stats, cudaStream_t stream);

// *sum_sq (FP32, device) = sum of x^2 over x (n), accumulated in FP64. Deterministic for a given
// device and n (fixed grid, fixed reduction trees).
void sum_squares(float* sum_sq, ConstArray x, std::int64_t n, cudaStream_t stream);

// *acc (FP64, device) += (sum of x (n >= 1)) / n, summed in FP64 the same way: the training
// loss of a micro-batch added on the device, so that it comes back with the step's one read.
void accumulate_mean(double* acc, ConstArray x, std::int64_t n, cudaStream_t stream);

// *out (FP64, device) = sum of a[i] x b[i] over n elements, products and sum in FP64 the same
// way (the trainer's loss cost: dout dotted with a layer's output error).
void sum_products(double* out, ConstArray a, ConstArray b, std::int64_t n, cudaStream_t stream);

// x (n) *= factor.
void scale(Array x, std::int64_t n, float factor, cudaStream_t stream);

struct AdamWArgs {
  float lr = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  std::int64_t step = 1;  // 1-based count of applied updates, for bias correction
};
// PyTorch AdamW (decoupled weight decay, bias-corrected) on params, grads, m, v (n each).
// FP32 arithmetic; each result stored in its tensor's format (FP32 master weights and moments
// in the AMP modes).
void adamw(Array params, ConstArray grads, Array m, Array v, std::int64_t n, const AdamWArgs& args,
           cudaStream_t stream);

// The loss scaler's state (ampscope::LossScaleState) lives in device memory; the rule
// (ampscope::LossScaleRule) is the one in ampscope/loss_scale.h that the CPU scalers follow.
// One update of *state (device) from *found_inf (device, nonzero = found) by `rule`: a single
// thread on `stream`, no host read.
void update_loss_scale(LossScaleState* state, const float* found_inf, const LossScaleRule& rule,
                       cudaStream_t stream);

}  // namespace ampscope::cuda::nn
