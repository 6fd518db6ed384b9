// Device statistics through the agent's GPU path (side stream, events, async copy-back)
// against the CPU reference. Skips itself without a CUDA device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "ampscope/convert.h"
#include "ampscope/tensor_stats.h"
#include "gpu_stats.h"

namespace ampscope::agent {
namespace {

class GpuStatsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device";
    std::string why;
    gpu_ = GpuStats::create(&why);
    ASSERT_TRUE(gpu_) << why;
    ASSERT_EQ(cudaStreamCreate(&train_), cudaSuccess);
  }
  void TearDown() override {
    if (train_ != nullptr) cudaStreamDestroy(train_);
  }
  std::unique_ptr<GpuStats> gpu_;
  cudaStream_t train_ = nullptr;
};

TEST_F(GpuStatsTest, MatchesTheReferenceWithoutSynchronisingTheTrainingStream) {
  const std::size_t n = 100003;
  std::vector<std::uint16_t> host(n);
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.0f, 3.0f);
  for (auto& h : host) h = fp32_to_fp16(d(rng));
  host[17] = 0x7e00;  // NaN
  void* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, n * 2), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(dev, host.data(), n * 2, cudaMemcpyHostToDevice, train_), cudaSuccess);
  const TargetSpec target{Format::kFP16, 4};
  std::string error;
  auto job = gpu_->launch(dev, n, Format::kFP16, &target, train_, &error);
  ASSERT_TRUE(job) << error;
  // The training stream may overwrite the buffer now: it waits for the statistics kernel.
  ASSERT_EQ(cudaMemsetAsync(dev, 0, n * 2, train_), cudaSuccess);
  TensorStats got;
  ASSERT_TRUE(job->collect(&got, &error)) << error;
  const TensorStats ref =
      compute_stats_reference(host.data(), n, Format::kFP16, std::span<const TargetSpec>(&target, 1));
  EXPECT_EQ(got.nan, 1u);
  EXPECT_EQ(got.numel, ref.numel);
  EXPECT_EQ(got.zeros, ref.zeros);
  EXPECT_EQ(got.max_abs, ref.max_abs);
  EXPECT_EQ(got.histogram, ref.histogram);
  ASSERT_EQ(got.targets.size(), 1u);
  EXPECT_EQ(got.targets[0], ref.targets[0]);
  cudaStreamSynchronize(train_);
  cudaFree(dev);
}

TEST_F(GpuStatsTest, ManyJobsInFlightComeBackInOrder) {
  const std::size_t n = 4096;
  std::vector<float> host(n, 1.0f);
  void* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, n * 4), cudaSuccess);
  std::vector<std::shared_ptr<GpuJob>> jobs;
  for (int i = 0; i < 300; ++i) {
    host[0] = static_cast<float>(i + 2);
    ASSERT_EQ(cudaMemcpy(dev, host.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
    std::string error;
    jobs.push_back(gpu_->launch(dev, n, Format::kFP32, nullptr, train_, &error));
    ASSERT_TRUE(jobs.back()) << error;
    cudaStreamSynchronize(train_);  // the next copy must not race the kernel in this test
  }
  for (int i = 0; i < 300; ++i) {
    TensorStats s;
    std::string error;
    ASSERT_TRUE(jobs[i]->collect(&s, &error)) << error;
    EXPECT_EQ(s.max_abs, static_cast<double>(i + 2));
  }
  cudaFree(dev);
}

}  // namespace
}  // namespace ampscope::agent
