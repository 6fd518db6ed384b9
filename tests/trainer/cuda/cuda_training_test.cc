// End to end: the same training run (seed, data, model) on the CPU and the CUDA back end. The
// CPU run is the reference; the CUDA run must follow it step by step within a tolerance that
// grows with the precision mode's rounding (a one-ulp difference in an FP16/BF16 activation is
// legitimate, and training amplifies it slowly), skip the same steps, and keep the same scale.
// The FP8/FP4 modes too (quantised on the device bit for bit as on the CPU, but a one-ulp BF16
// difference upstream can move an element to the next code; fp8-delayed and fp8-current through
// real FP8 GEMMs where the device has them, which sum in another order); on the CPU each of them
// learns in these 12 steps (loss 3.88 -> 3.09). Skips itself without a device.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "../counting_backend.h"
#include "ampscope/cuda/device.h"
#include "ampscope/trainer/precision.h"
#include "ampscope/trainer/trainer.h"
#include "cuda_backend.h"

namespace ampscope::trainer {
namespace {

struct Case {
  const char* name;
  PrecisionMode mode;
  double first_step_rtol;  // loss of step 0: only the forward differs
  double last_step_rtol;   // after `steps` updates
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

constexpr int kSteps = 12;

std::vector<StepEvent> train(const Case& c, std::unique_ptr<Backend> backend,
                             const std::vector<Injection>& injections = {}) {
  TrainerConfig config;
  config.model.context = 32;
  config.model.n_embd = 64;
  config.model.n_head = 4;
  config.model.n_layer = 2;
  config.precision = c.mode;
  config.batch = 4;
  config.steps = kSteps;
  config.warmup_steps = 2;
  config.seed = 7;
  config.injections = injections;
  Trainer trainer(config, Corpus::synthetic(), std::move(backend));
  std::vector<StepEvent> events;
  for (int i = 0; i < kSteps; ++i) events.push_back(trainer.step());
  return events;
}

class CudaTrainingTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (!cuda::cuda_device_available()) GTEST_SKIP() << "no CUDA driver or device on this machine";
  }
};

TEST_P(CudaTrainingTest, FollowsTheCpuRunOfTheSameSeed) {
  const Case c = GetParam();
  const auto cpu = train(c, make_cpu_backend({.blas_threads = 1}));
  const auto gpu = train(c, make_cuda_backend());
  ASSERT_EQ(cpu.size(), gpu.size());
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    const double rtol = c.first_step_rtol + (c.last_step_rtol - c.first_step_rtol) *
                                                static_cast<double>(i) /
                                                static_cast<double>(cpu.size() - 1);
    EXPECT_NEAR(gpu[i].loss, cpu[i].loss, rtol * cpu[i].loss) << "step " << i;
    EXPECT_EQ(gpu[i].skipped, cpu[i].skipped) << "step " << i;
    EXPECT_EQ(gpu[i].loss_scale, cpu[i].loss_scale) << "step " << i;
    EXPECT_NEAR(gpu[i].grad_norm, cpu[i].grad_norm, 10 * rtol * cpu[i].grad_norm) << "step " << i;
  }
  EXPECT_LT(gpu.back().loss, gpu.front().loss) << "the CUDA run does not learn";
}

// fp8-delayed and fp8-current run their GEMMs as cuBLASLt FP8 GEMMs on a device that has them
// (every dimension here is a multiple of 16); with fp8_gemms off they emulate, as the CPU does.
// Both follow the CPU run.
TEST_P(CudaTrainingTest, EmulatedFp8GemmsFollowTheCpuRunToo) {
  const Case c = GetParam();
  if (c.mode != PrecisionMode::kFP8Delayed && c.mode != PrecisionMode::kFP8Current) {
    GTEST_SKIP() << "block recipes always emulate";
  }
  const auto cpu = train(c, make_cpu_backend({.blas_threads = 1}));
  const auto gpu = train(c, make_cuda_backend({.fp8_gemms = false}));
  ASSERT_EQ(cpu.size(), gpu.size());
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    EXPECT_NEAR(gpu[i].loss, cpu[i].loss, c.last_step_rtol * cpu[i].loss) << "step " << i;
  }
}

// The step's scalars (found_inf, the squared norm, the loss of every micro-batch) stay on the
// device until the one read at the end of the step.
TEST_P(CudaTrainingTest, AStepReadsFromTheDeviceOnce) {
  const Case c = GetParam();
  if (PrecisionPolicy::for_mode(c.mode).scaled_gemms) {
    GTEST_SKIP() << "the FP8/FP4 modes wait for each quantised operand's counts";
  }
  TrainerConfig config;
  config.model = {.vocab_size = 0, .context = 32, .n_embd = 64, .n_head = 4, .n_layer = 2};
  config.precision = c.mode;
  config.batch = 4;
  config.accum = 3;
  config.steps = 4;
  config.eval_batches = 0;
  auto counting = std::make_unique<testing::CountingBackend>(make_cuda_backend());
  testing::CountingBackend& backend = *counting;
  Trainer trainer(config, Corpus::synthetic(), std::move(counting));
  for (int i = 0; i < config.steps; ++i) {
    backend.reset();
    const StepEvent e = trainer.step();
    EXPECT_EQ(backend.host_reads(), 1) << "step " << i;
    EXPECT_TRUE(std::isfinite(e.loss)) << "step " << i;
  }
}

// Overflow injected into the logits' gradient: both back ends find it, skip the step and back
// the scale off.
TEST_P(CudaTrainingTest, SkipsTheSameOverflowingStep) {
  const Case c = GetParam();
  if (c.mode != PrecisionMode::kAmpFP16) GTEST_SKIP() << "only amp-fp16 scales dynamically";
  const std::vector<Injection> inj = {{Injection::Kind::kOverflow, "logits.grad", 3}};
  const auto cpu = train(c, make_cpu_backend({.blas_threads = 1}), inj);
  const auto gpu = train(c, make_cuda_backend(), inj);
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    EXPECT_EQ(gpu[i].skipped, cpu[i].skipped) << "step " << i;
    EXPECT_EQ(gpu[i].scale_after, cpu[i].scale_after) << "step " << i;
  }
  EXPECT_TRUE(gpu[3].skipped);
}

INSTANTIATE_TEST_SUITE_P(
    Modes, CudaTrainingTest,
    ::testing::Values(Case{"fp32", PrecisionMode::kFP32, 1e-5, 1e-3},
                      Case{"amp_fp16", PrecisionMode::kAmpFP16, 1e-3, 1e-2},
                      Case{"amp_bf16", PrecisionMode::kAmpBF16, 1e-2, 3e-2},
                      // amp-bf16's plus quantisation's: first bounds, not yet run on a GPU.
                      Case{"fp8_delayed", PrecisionMode::kFP8Delayed, 1e-2, 5e-2},
                      Case{"fp8_current", PrecisionMode::kFP8Current, 1e-2, 5e-2},
                      Case{"mxfp8", PrecisionMode::kMXFP8, 1e-2, 5e-2},
                      Case{"nvfp4", PrecisionMode::kNVFP4, 2e-2, 1e-1}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace ampscope::trainer
