// The recorder: the training side of the agent. At begin_step it waits for the server when
// policy_lockstep asks for it (lockstep.h), applies the policy updates due at the step and
// decides what to measure (sampling); observe measures host tensors on the
// calling thread, or copies them for the worker, and launches device statistics; it keeps the
// step's NVTX ranges and CUPTI range; end_step hands the step's record to the delivery pipeline.
//
// Owner: the thread inside a step call. The step calls (begin_step, observe, mark_phase,
// end_step, attach_*, close, release_devices) are serialised by step_mu_, held for the whole
// call, so every member below it is used by one thread at a time: the training thread in the
// usual loop, an autograd thread while its hook is inside observe. A step call from a thread
// that already holds step_mu_ (a ScalerControl or PrecisionOverrides callback re-entering the
// agent from begin_step) is refused with kFailedPrecondition, counted and reported once as a
// notice instead of deadlocking. Other threads read only the atomics (steps(),
// training_thread_s(), refused_calls(), held_by_this_thread()).
//
// Per-thread resources stay on their thread: the step and phase NVTX ranges are pushed and
// popped on the thread that called begin_step (observe on another thread moves no phase
// range), and a CUPTI range is closed only on the thread that opened it (an end_step on another
// thread stops the collector, with a notice).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "ampscope/agent/agent.h"
#include "cupti_collector.h"
#include "gpu_stats.h"
#include "lockstep.h"
#include "notices.h"
#include "record.h"
#include "sampling.h"

namespace ampscope::agent {

class Delivery;
class PolicyApplier;

class Recorder {
 public:
  // Everything is borrowed and must outlive the recorder. `resume_skip_through`: the last step
  // a previous process reported (its re-runs are not reported again); -1 for none.
  Recorder(const AgentConfig& config, const RunInfo& run, Notices* notices,
           PolicyApplier* policy, Delivery* delivery, std::int64_t resume_skip_through);
  ~Recorder();

  // Before the first step; kFailedPrecondition after it.
  Status attach_scaler(ScalerControl* scaler);
  Status attach_overrides(PrecisionOverrides* overrides);
  Status attach_gemm_precision(PrecisionOverrides* gemms, RecipeControl* recipe);

  // The step calls (agent.h). begin_step starts the delivery pipeline on the first step. After
  // close() they do nothing: begin_step returns false, the others kFailedPrecondition.
  bool begin_step(std::int64_t step);
  Status observe(const TensorView& tensor);
  // Agent::observe_stats and Agent::stats_target (agent.h).
  Status observe_stats(const TensorView& meta, const TensorStats& stats);
  std::optional<TargetSpec> stats_target(const TensorView& meta);
  // Agent::observe_quantizer (agent.h).
  Status observe_quantizer(const QuantizerView& q);
  Status mark_phase(StepPhase phase);
  Status end_step(const StepInfo& info);
  // What observe() of a tensor of `role` in `phase` would measure at this point of the step:
  // 0 nothing, 1 counts, 2 full statistics (0 outside a step and when refused).
  int wanted(TensorRole role, TensorPhase phase);

  // Refuses every later step call; waits for the one in progress, if any.
  void close();
  // Frees the GPU statistics and the CUPTI collector (after the worker finished with their jobs).
  void release_devices();

  // Refuses `call` because the calling thread is inside a step call already: counts it, says
  // so once as a notice and returns kFailedPrecondition.
  Status refuse_reentry(const char* call);

  // Any thread.
  bool held_by_this_thread() const {
    return holder_.load(std::memory_order_relaxed) == std::this_thread::get_id();
  }
  std::uint64_t steps() const { return steps_.load(std::memory_order_relaxed); }
  double training_thread_s() const {
    return static_cast<double>(training_ns_.load(std::memory_order_relaxed)) * 1e-9;
  }
  std::uint64_t refused_calls() const { return refused_calls_.load(std::memory_order_relaxed); }

 private:
  class Call;

  Status attach_before_start(const char* what) const;
  bool start_sample(const TensorView& t, TensorSample& s, bool stats_given = false);
  bool adopt_stats(const TensorView& t, const TensorStats& stats, TensorSample& s);
  bool measure_into(const TensorView& t, TensorSample& s);
  bool measure_here(const void* data, TensorSample& s, bool upgrade_on_nonfinite,
                    bool* nonfinite = nullptr);
  void drop_sample(const std::string& why);
  std::string wire_name(std::string_view name);
  bool copy_for_worker(const void* data, TensorSample& s);
  bool on_nvtx_thread() const { return std::this_thread::get_id() == nvtx_thread_; }
  void nvtx_phase_to(TensorPhase phase);
  void nvtx_close_step();
  void cupti_begin(std::int64_t step);
  void cupti_end();

  const AgentConfig& config_;
  const RunInfo& run_;
  Notices* notices_;
  PolicyApplier* policy_;
  Delivery* delivery_;
  const std::int64_t resume_skip_through_;

  std::mutex step_mu_;
  std::atomic<std::thread::id> holder_{};  // the thread holding step_mu_, if any

  // Guarded by step_mu_.
  Lockstep lockstep_;
  Sampler sampler_;
  bool started_ = false;  // the first step began: the pipeline runs, attach_* are refused
  bool closed_ = false;
  bool in_step_ = false;
  bool observing_ = false;
  double step_scale_ = 1.0;
  int sampled_this_step_ = 0;
  bool nonfinite_this_step_ = false;
  bool saw_device_tensor_ = false;
  std::thread::id nvtx_thread_;  // where the step's NVTX ranges are pushed
  int nvtx_depth_ = 0;           // ranges pushed: step + phase
  TensorPhase nvtx_phase_ = TensorPhase::kUnknown;
  bool phase_open_ = false;
  std::unique_ptr<GpuStats> gpu_;
  bool gpu_tried_ = false;
  std::unique_ptr<CuptiCollector> cupti_;
  bool cupti_tried_ = false;
  bool cupti_open_ = false;
  std::thread::id cupti_thread_;  // where the open CUPTI range was pushed
  StepRecord current_;            // after gpu_: its jobs go before the pool that made them

  // Any thread.
  std::atomic<std::uint64_t> steps_{0};
  std::atomic<std::int64_t> training_ns_{0};
  std::atomic<std::uint64_t> refused_calls_{0};
};

}  // namespace ampscope::agent
