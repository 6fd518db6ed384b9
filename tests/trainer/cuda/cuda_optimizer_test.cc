// The optimizer kernels of ampscope/cuda/nn_optimizer.h on the device:
//   - the multi-tensor unscale over many tensors of mixed formats and sizes (empty, 1, primes,
//     several chunks, more tensors than one launch takes) against the CPU back end tensor by
//     tensor, bit for bit;
//   - the same unscale with fused statistics, against the CPU reference statistics;
//   - the loss-scale update on the device against the trainer's scalers, step by step;
//   - a whole optimizer-side step that reads the host once: unscale by the device-resident
//     scale, the squared norm and the scale update, then one copy of {found_inf, sum_sq, state}.
// Skips itself without a device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "ampscope/cuda/check.h"
#include "ampscope/cuda/device.h"
#include "ampscope/cuda/nn_optimizer.h"
#include "ampscope/tensor_stats.h"
#include "ampscope/trainer/backend.h"
#include "ampscope/trainer/loss_scaler.h"
#include "backend_test_util.h"

namespace ampscope::trainer::testing {
namespace {

namespace nn = ::ampscope::cuda::nn;

class CudaOptimizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::cuda_device_available()) GTEST_SKIP() << "no CUDA driver or device on this machine";
    AMPSCOPE_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    for (void* p : allocations_) (void)cudaFree(p);
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  }
  void* device_copy(const void* host, std::size_t bytes) {
    void* p = nullptr;
    AMPSCOPE_CHECK_CUDA(cudaMalloc(&p, bytes == 0 ? 1 : bytes));
    allocations_.push_back(p);
    if (bytes > 0) AMPSCOPE_CHECK_CUDA(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice));
    return p;
  }
  void download(void* host, const void* device, std::size_t bytes) {
    AMPSCOPE_CHECK_CUDA(cudaStreamSynchronize(stream_));
    if (bytes > 0) AMPSCOPE_CHECK_CUDA(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost));
  }

  cudaStream_t stream_ = nullptr;
  std::vector<void*> allocations_;
  std::unique_ptr<Backend> cpu_ = make_cpu_backend({.blas_threads = 1});
};

TEST_F(CudaOptimizerTest, MultiTensorUnscaleMatchesCpuPerTensor) {
  // 150 tensors: more than one launch's table (96), sizes from 0 to several 64Ki-element chunks.
  const std::int64_t sizes[] = {0, 1, 7, 31, 257, 65535, 65536, 65537, 200003};
  const Format formats[] = {Format::kFP32, Format::kFP16, Format::kBF16};
  std::vector<Bits> ref;
  std::vector<nn::GradientTensor> grads;
  for (int i = 0; i < 150; ++i) {
    const std::int64_t n = sizes[i % std::size(sizes)];
    const Format f = formats[(i / 3) % 3];
    ref.push_back(random_bits(static_cast<std::size_t>(n), f, 100 + i, 1000.0f));
    grads.push_back({device_copy(ref.back().data(), ref.back().bytes.size()), f, n});
  }
  float* found = static_cast<float*>(device_copy(std::vector<float>{0.0f}.data(), 4));
  const float inv = static_cast<float>(1.0 / 1024.0);
  nn::unscale_and_check(grads, inv, found, stream_);
  float cpu_found = 0.0f;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    cpu_->unscale_and_check(
        Tensor(ref[i].data(), ref[i].dtype, {static_cast<std::int64_t>(ref[i].size())}), inv,
        Tensor(&cpu_found, Format::kFP32, {1}));
    Bits got(ref[i].dtype, ref[i].size());
    download(got.data(), grads[i].data, got.bytes.size());
    ASSERT_TRUE(same_bits(ref[i], got)) << "tensor " << i;
  }
  float gpu_found = -1.0f;
  download(&gpu_found, found, 4);
  EXPECT_EQ(gpu_found, 0.0f);

  // One Inf in the last tensor of the second launch is found.
  const float inf = INFINITY;
  Bits bad = Bits::from({inf}, grads[140].dtype);
  AMPSCOPE_CHECK_CUDA(cudaMemcpy(static_cast<std::byte*>(grads[140].data), bad.data(),
                                 bad.bytes.size(), cudaMemcpyHostToDevice));
  nn::unscale_and_check(grads, inv, found, stream_);
  download(&gpu_found, found, 4);
  EXPECT_EQ(gpu_found, 1.0f);
}

// Fused statistics: the multi-tensor unscale that also measures every other tensor leaves the
// same values and found_inf as the plain one, and each measured tensor's statistics equal the
// CPU reference's of the unscaled values (counts, histogram, targets, extrema bit for bit; the
// sums exactly rounded on both sides). The data holds zeros, NaN, Inf, subnormals and values
// that cancel; 150 tensors take two launches.
void expect_same_stats(const TensorStats& want, const TensorStats& got, int i) {
  EXPECT_EQ(got.numel, want.numel) << "tensor " << i;
  EXPECT_EQ(got.zeros, want.zeros) << "tensor " << i;
  EXPECT_EQ(got.nan, want.nan) << "tensor " << i;
  EXPECT_EQ(got.pos_inf, want.pos_inf) << "tensor " << i;
  EXPECT_EQ(got.neg_inf, want.neg_inf) << "tensor " << i;
  EXPECT_EQ(got.max_abs, want.max_abs) << "tensor " << i;
  EXPECT_EQ(got.min_abs_nonzero, want.min_abs_nonzero) << "tensor " << i;
  EXPECT_EQ(got.histogram, want.histogram) << "tensor " << i;
  EXPECT_EQ(got.targets, want.targets) << "tensor " << i;
  EXPECT_EQ(got.sum, want.sum) << "tensor " << i;
  // sum_sq: within a few ulps (the CPU's is, the device's is exactly rounded).
  EXPECT_NEAR(got.sum_sq, want.sum_sq, 8 * 0x1p-52 * want.sum_sq) << "tensor " << i;
}

TEST_F(CudaOptimizerTest, FusedUnscaleMeasuresWhatItWrites) {
  const std::int64_t sizes[] = {0, 1, 7, 31, 257, 65535, 65536, 65537, 200003};
  const Format formats[] = {Format::kFP32, Format::kFP16, Format::kBF16};
  const std::vector<TargetSpec> targets = {{Format::kFP16, 10}, {Format::kE4M3, 0}};
  std::vector<Bits> ref;
  std::vector<nn::GradientTensor> grads, plain;
  int slots = 0;
  for (int i = 0; i < 150; ++i) {
    const std::int64_t n = sizes[i % std::size(sizes)];
    const Format f = formats[(i / 3) % 3];
    std::vector<float> v = random_values(static_cast<std::size_t>(n), 300 + i, 1000.0f);
    if (n > 8) {
      v[0] = 0.0f;
      v[1] = 1e-30f;  // subnormal once unscaled in FP16/BF16 terms, tiny in FP32
      v[2] = 3.0e38f;  // cancels with v[3] in the sum (FP32 only: Inf in FP16)
      v[3] = -3.0e38f;
      if (i % 7 == 0) v[4] = NAN;
      if (i % 11 == 0) v[5] = -INFINITY;
    }
    ref.push_back(Bits::from(v, f));
    const int slot = i % 2 == 0 ? slots++ : -1;
    grads.push_back({device_copy(ref.back().data(), ref.back().bytes.size()), f, n, slot});
    plain.push_back({device_copy(ref.back().data(), ref.back().bytes.size()), f, n});
  }
  float* found = static_cast<float*>(device_copy(std::vector<float>{0.0f}.data(), 4));
  float* found_plain = static_cast<float*>(device_copy(std::vector<float>{0.0f}.data(), 4));
  const float inv = static_cast<float>(1.0 / 1024.0);
  nn::GradientStats stats(slots);
  nn::unscale_check_and_measure(grads, inv, found, targets, stats, stream_);
  const std::vector<TensorStats> measured = stats.wait();
  ASSERT_EQ(measured.size(), static_cast<std::size_t>(slots));
  nn::unscale_and_check(plain, inv, found_plain, stream_);
  for (std::size_t i = 0; i < ref.size(); ++i) {
    Bits got(ref[i].dtype, ref[i].size()), want(ref[i].dtype, ref[i].size());
    download(got.data(), grads[i].data, got.bytes.size());
    download(want.data(), plain[i].data, want.bytes.size());
    ASSERT_TRUE(same_bits(want, got)) << "tensor " << i;
    if (grads[i].stats_slot < 0) continue;
    const TensorStats reference = compute_stats_reference(want.data(), want.size(),
                                                          want.dtype, targets);
    expect_same_stats(reference, measured[static_cast<std::size_t>(grads[i].stats_slot)],
                      static_cast<int>(i));
  }
  float a = -1.0f, b = -1.0f;
  download(&a, found, 4);
  download(&b, found_plain, 4);
  EXPECT_EQ(a, 1.0f);
  EXPECT_EQ(a, b);
}

TEST_F(CudaOptimizerTest, FusedUnscaleRefusesMisuse) {
  std::vector<float> v(16, 1.0f);
  void* d = device_copy(v.data(), v.size() * 4);
  float* found = static_cast<float*>(device_copy(std::vector<float>{0.0f}.data(), 4));
  nn::GradientStats stats(1);
  const nn::GradientTensor twice[] = {{d, Format::kFP32, 8, 0},
                                      {static_cast<float*>(d) + 8, Format::kFP32, 8, 0}};
  EXPECT_THROW(nn::unscale_check_and_measure(twice, 1.0f, found, {}, stats, stream_), Error);
  const nn::GradientTensor outside[] = {{d, Format::kFP32, 16, 1}};
  EXPECT_THROW(nn::unscale_check_and_measure(outside, 1.0f, found, {}, stats, stream_), Error);
  EXPECT_THROW(stats.wait(), Error);  // nothing was launched
  const nn::GradientTensor one[] = {{d, Format::kFP32, 16, 0}};
  nn::unscale_check_and_measure(one, 0.5f, found, {}, stats, stream_);
  EXPECT_THROW(nn::unscale_check_and_measure(one, 0.5f, found, {}, stats, stream_), Error);
  EXPECT_EQ(stats.wait().at(0).sum, 8.0);
}

// The device-resident step: found_inf = 0; unscale by the state's scale; sum of squares;
// update the scale; one host read of all of it.
struct StepScalars {
  float found_inf;
  float sum_sq;
  LossScaleState state;
};

TEST_F(CudaOptimizerTest, DeviceScaleUpdateFollowsTheCpuScalersWithOneReadPerStep) {
  for (ScalerConfig config :
       {ScalerConfig::pytorch_defaults(), ScalerConfig::megatron_defaults()}) {
    config.growth_interval = 3;
    auto cpu = std::make_unique<LossScaler>(config);
    StepScalars init{};
    init.state.scale = config.init_scale;
    init.state.hysteresis_tracker = config.hysteresis;
    auto* scalars = static_cast<StepScalars*>(device_copy(&init, sizeof(init)));
    const std::int64_t n = 4099;
    std::mt19937 rng(5);
    std::bernoulli_distribution overflow(0.25);
    for (int step = 0; step < 40; ++step) {
      std::vector<float> g = random_values(n, 200 + step, 100.0f);
      const bool inject = overflow(rng);
      if (inject) g[static_cast<std::size_t>(step)] = INFINITY;
      Bits bits = Bits::from(g, Format::kFP16);
      nn::GradientTensor t{device_copy(bits.data(), bits.bytes.size()), Format::kFP16, n};
      AMPSCOPE_CHECK_CUDA(cudaMemsetAsync(&scalars->found_inf, 0, sizeof(float), stream_));
      nn::unscale_and_check(std::span(&t, 1), &scalars->state, &scalars->found_inf, stream_);
      nn::sum_squares(&scalars->sum_sq, nn::ConstArray{t.data, t.dtype}, n, stream_);
      nn::update_loss_scale(&scalars->state, &scalars->found_inf, config, stream_);
      StepScalars got{};
      download(&got, scalars, sizeof(got));  // the step's one read

      const float scale_before = cpu->scale();
      cpu->update(inject);
      EXPECT_EQ(got.found_inf != 0.0f, inject) << "step " << step;
      EXPECT_EQ(got.state.scale, cpu->state().scale) << "step " << step;
      EXPECT_EQ(got.state.growth_tracker, cpu->state().growth_tracker) << "step " << step;
      if (config.kind == ScalerKind::kHysteresis) {
        EXPECT_EQ(got.state.hysteresis_tracker, cpu->state().hysteresis_tracker) << step;
      }
      // The gradients were unscaled by the scale before the update, as the CPU would.
      Bits ref = bits;
      float cpu_found = 0.0f;
      cpu_->unscale_and_check(Tensor(ref.data(), Format::kFP16, {n}),
                              static_cast<float>(1.0 / static_cast<double>(scale_before)),
                              Tensor(&cpu_found, Format::kFP32, {1}));
      Bits unscaled(Format::kFP16, static_cast<std::size_t>(n));
      download(unscaled.data(), t.data, unscaled.bytes.size());
      ASSERT_TRUE(same_bits(ref, unscaled)) << "step " << step;
    }
  }
}

}  // namespace
}  // namespace ampscope::trainer::testing
