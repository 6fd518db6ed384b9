// GpuStats with CUDA: a pool of CudaStatsJob (each holds one result at a time), one side
// stream and two events per launch ordering side after training and training after side.
#include <cuda_runtime_api.h>

#include <exception>
#include <mutex>
#include <vector>

#include "ampscope/cuda/device.h"
#include "ampscope/cuda/tensor_stats.h"
#include "gpu_stats.h"

namespace ampscope::agent {
namespace {

// Jobs in flight at most: about four steps of a large model's tensors.
constexpr std::size_t kMaxJobs = 2048;

std::string cuda_error(const char* what, cudaError_t e) {
  return std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

class Pool;

class PooledJob final : public GpuJob {
 public:
  PooledJob(std::shared_ptr<Pool> pool, std::unique_ptr<cuda::CudaStatsJob> job)
      : pool_(std::move(pool)), job_(std::move(job)) {}
  ~PooledJob() override;
  bool collect(TensorStats* out, std::string* error) override {
    try {
      *out = job_->wait();
      collected_ = true;
      return true;
    } catch (const std::exception& e) {
      *error = e.what();
      return false;
    }
  }
  cuda::CudaStatsJob& job() { return *job_; }

 private:
  std::shared_ptr<Pool> pool_;
  std::unique_ptr<cuda::CudaStatsJob> job_;
  bool collected_ = false;
  friend class Pool;
};

class Pool : public std::enable_shared_from_this<Pool> {
 public:
  // A free job, or a new one while fewer than kMaxJobs exist; nullptr otherwise.
  std::unique_ptr<cuda::CudaStatsJob> take(std::string* error) {
    {
      std::lock_guard lock(mu_);
      if (!free_.empty()) {
        auto j = std::move(free_.back());
        free_.pop_back();
        return j;
      }
      if (created_ >= kMaxJobs) {
        *error = "all " + std::to_string(kMaxJobs) + " GPU statistics jobs are in flight";
        return nullptr;
      }
      ++created_;
    }
    try {
      return std::make_unique<cuda::CudaStatsJob>(1);
    } catch (const std::exception& e) {
      std::lock_guard lock(mu_);
      --created_;
      *error = e.what();
      return nullptr;
    }
  }
  void give_back(std::unique_ptr<cuda::CudaStatsJob> job, bool collected) {
    // A job whose result was never collected still has a launch in flight; its destructor
    // waits for it, so it is retired rather than reused.
    std::lock_guard lock(mu_);
    if (collected) {
      free_.push_back(std::move(job));
    } else {
      --created_;
    }
  }

 private:
  std::mutex mu_;
  std::vector<std::unique_ptr<cuda::CudaStatsJob>> free_;
  std::size_t created_ = 0;
};

PooledJob::~PooledJob() { pool_->give_back(std::move(job_), collected_); }

class CudaGpuStats final : public GpuStats {
 public:
  CudaGpuStats() : pool_(std::make_shared<Pool>()) {}
  ~CudaGpuStats() override {
    if (side_ != nullptr) cudaStreamDestroy(side_);
    if (before_ != nullptr) cudaEventDestroy(before_);
    if (after_ != nullptr) cudaEventDestroy(after_);
  }

  bool init(std::string* error) {
    cudaError_t e = cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&before_, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&after_, cudaEventDisableTiming);
    if (e != cudaSuccess) {
      *error = cuda_error("creating the side stream", e);
      return false;
    }
    return true;
  }

  std::shared_ptr<GpuJob> launch(const void* data, std::size_t n, Format dtype,
                                 const TargetSpec* target, void* stream,
                                 std::string* error) override {
    auto job = pool_->take(error);
    if (!job) return nullptr;
    auto pooled = std::make_shared<PooledJob>(pool_, std::move(job));
    auto train = static_cast<cudaStream_t>(stream);
    // Side stream after the training stream's work so far (the tensor is complete)...
    cudaError_t e = cudaEventRecord(before_, train);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(side_, before_, 0);
    if (e != cudaSuccess) {
      *error = cuda_error("ordering the side stream", e);
      return nullptr;  // the job goes back unlaunched (collected_ false: retired)
    }
    try {
      std::span<const TargetSpec> targets;
      if (target != nullptr) targets = std::span<const TargetSpec>(target, 1);
      pooled->job().launch(data, n, dtype, targets, side_);
    } catch (const std::exception& ex) {
      *error = ex.what();
      return nullptr;
    }
    // ...and the training stream after the statistics kernel has read it.
    e = cudaEventRecord(after_, side_);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(train, after_, 0);
    if (e != cudaSuccess) {
      *error = cuda_error("ordering the training stream", e);
      // The launch is in flight; the worker still collects it.
    }
    return pooled;
  }

 private:
  std::shared_ptr<Pool> pool_;
  cudaStream_t side_ = nullptr;
  cudaEvent_t before_ = nullptr;
  cudaEvent_t after_ = nullptr;
};

}  // namespace

bool cuda_device_present() { return cuda::cuda_device_available(); }

std::unique_ptr<GpuStats> GpuStats::create(std::string* why_not) {
  if (!cuda::cuda_device_available()) {
    *why_not = "no CUDA device";
    return nullptr;
  }
  auto g = std::make_unique<CudaGpuStats>();
  if (!g->init(why_not)) return nullptr;
  return g;
}

}  // namespace ampscope::agent
