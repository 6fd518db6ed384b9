// Statistics of device tensors: CudaStatsJob (kernels/include/ampscope/cuda/tensor_stats.h) on
// a side stream, ordered after the work already queued on the training stream, with the
// training stream made to wait (an event, not the host) until the statistics kernel has read
// the tensor, so the trainer may reuse the buffer afterwards. The result comes back into the
// job's pinned buffer asynchronously; the worker thread collects it. Nothing here synchronises
// the training stream with the host.
//
// Built with AMPSCOPE_ENABLE_CUDA (gpu_stats_cuda.cc); otherwise create() says why not
// (gpu_stats_none.cc). Thread safety: launch() by the recorder (one caller at a time); collect() and the
// jobs' destructors on the worker thread.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "ampscope/formats.h"
#include "ampscope/tensor_stats.h"

namespace ampscope::agent {

// Whether this build has CUDA and the process sees a device (never throws).
bool cuda_device_present();

class GpuJob {
 public:
  virtual ~GpuJob() = default;  // returns the job to its pool
  // Waits for the result (on the job's event only). False with a reason on a CUDA error.
  virtual bool collect(TensorStats* out, std::string* error) = 0;
};

class GpuStats {
 public:
  virtual ~GpuStats() = default;
  // nullptr with a one-line reason when there is no CUDA build, driver or device.
  static std::unique_ptr<GpuStats> create(std::string* why_not);
  // Orders the statistics of n elements at device address `data` after the work queued on
  // `stream` (a cudaStream_t). nullptr with a reason when no job is free or CUDA fails.
  virtual std::shared_ptr<GpuJob> launch(const void* data, std::size_t n, Format dtype,
                                         const TargetSpec* target, void* stream,
                                         std::string* error) = 0;
};

}  // namespace ampscope::agent
