// Tensor statistics on the device: the CUDA version of compute_stats (ampscope/tensor_stats.h),
// same contract and same TensorStats, for FP32, FP16 and BF16 storage in device memory.
//
// Stream-ordered and non-blocking: launch() enqueues, on the caller's stream, a reset of the
// job's device accumulators, one statistics kernel, a copy of the result into the job's pinned
// host buffer and an event. Nothing is synchronised: the training stream keeps running, and the
// caller collects the result later with ready() (polls the event) or wait() (waits on the event
// only, never on the stream or the device).
//
//   CudaStatsJob job;                           // allocates; do it once, outside the step loop
//   job.launch(grad, n, Format::kBF16, targets, stream);
//   ...                                          // later, e.g. on the agent's thread
//   if (job.ready()) TensorStats s = job.wait();
//
// Exactness: counts, the histogram, max_abs and min_abs_nonzero equal the CPU reference's.
// sum and sum_sq are exactly rounded, as the CPU's: per-binade integer sums on the device,
// rounded once on the host (the same from run to run, whatever the order of the blocks).
//
// Ownership: a job owns a small device buffer (about 9 KiB), a pinned host buffer of the same
// size and an event, all created on the device that is current when it is constructed, which must
// be the current device at launch(). Construction and destruction allocate and free device memory
// (cudaFree may synchronise the device): keep jobs alive and reuse them. The job does not own
// the tensor: device_data must stay valid and unchanged until the kernel has run on `stream`.
// Thread safety: one job is used by one thread at a time; distinct jobs are independent. A job
// holds one result at a time: launch() requires the previous launch to have been collected by
// wait(); use several jobs to have several tensors in flight. Not for streams under CUDA graph
// capture: the result buffers belong to the job, not to a graph that could be replayed.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <span>

#include "ampscope/formats.h"
#include "ampscope/tensor_stats.h"

namespace ampscope::cuda {

// The most (target format, scale) pairs one launch can count exactly; the kernel keeps their
// counters in registers.
inline constexpr int kCudaStatsMaxTargets = 8;

class CudaStatsJob {
 public:
  // max_targets in [0, kCudaStatsMaxTargets]: the most targets launch() will accept.
  // Throws ampscope::Error on a bad argument or when CUDA cannot allocate.
  explicit CudaStatsJob(int max_targets = kCudaStatsMaxTargets);
  ~CudaStatsJob();  // waits for a launch still in flight; never throws
  CudaStatsJob(CudaStatsJob&&) noexcept;
  CudaStatsJob& operator=(CudaStatsJob&&) noexcept;
  CudaStatsJob(const CudaStatsJob&) = delete;
  CudaStatsJob& operator=(const CudaStatsJob&) = delete;

  // Enqueues the statistics of n elements of `dtype` storage at device_data (any alignment;
  // null only when n == 0) for `targets` on `stream`. Throws ampscope::Error, before anything is
  // enqueued, when dtype is not FP32/FP16/BF16, there are more than max_targets targets, a
  // target's scale is outside [-kMaxScaleLog2, kMaxScaleLog2], device_data is not
  // device-accessible, a launch is still uncollected, or the launch fails.
  void launch(const void* device_data, std::size_t n, Format dtype,
              std::span<const TargetSpec> targets, cudaStream_t stream);

  // True when a launch is in flight and its result has arrived in host memory (the event has
  // completed). False when nothing is launched. Does not block.
  bool ready() const;

  // Blocks the calling thread until the result of the launch in flight has arrived (on the
  // job's event only), then returns it; the job is then free for the next launch. Throws
  // ampscope::Error when nothing is in flight or CUDA reports an error.
  TensorStats wait();

  int max_targets() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ampscope::cuda
