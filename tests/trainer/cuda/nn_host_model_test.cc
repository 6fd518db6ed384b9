// The device element code of the trainer kernels, run on the host (nn_host_model.h), against the
// CPU back end and the CPU loss scalers. Needs no GPU. Everything without a transcendental
// function is compared bit for bit: the element functions are the CPU back end's expressions
// (same operations, same order, no contraction), so any difference is a bug in the device code's
// semantics (a missed rounding, a wrong accumulate, a NaN taking another branch), not noise.
// GELU goes through an exponential, which the CPU back end computes with its own vectorised
// exp and the device with expf (each within about an ulp): it gets the reduction tolerance of
// backend_test_util.h for the format it is rounded to.
#include "nn_host_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include "ampscope/trainer/backend.h"
#include "ampscope/trainer/loss_scaler.h"
#include "backend_test_util.h"

namespace ampscope::trainer::testing {
namespace {

// Shapes around the warp (32) and block (256) widths, primes, and 1.
constexpr std::int64_t kSizes[] = {1, 7, 31, 33, 256, 257, 1009};

using Param = std::tuple<Precision, std::int64_t>;

class NnHostModelTest : public ::testing::TestWithParam<Param> {
 protected:
  std::unique_ptr<Backend> cpu_ = make_cpu_backend({.blas_threads = 1});
  const Precision& p() const { return std::get<0>(GetParam()); }
  std::int64_t n() const { return std::get<1>(GetParam()); }
  Tensor view(Bits& b) { return Tensor(b.data(), b.dtype, {static_cast<std::int64_t>(b.size())}); }
};

// Inputs with values that round differently in FP16 and BF16, that overflow FP16 and that are
// not finite, so the rounding and overflow paths are all taken.
Bits probe_input(std::int64_t n, Format f, std::uint32_t seed, float scale = 3.0f) {
  std::vector<float> v = random_values(static_cast<std::size_t>(n), seed, scale);
  const float specials[] = {1.0f + 0x1p-11f, 65519.0f, 70000.0f, -0.0f, 0x1p-25f, 0x1.8p-24f};
  for (std::size_t i = 0; i < std::size(specials) && 3 * i < v.size(); ++i) v[3 * i] = specials[i];
  return Bits::from(v, f);
}

TEST_P(NnHostModelTest, AddMatchesCpu) {
  Bits a = probe_input(n(), p().in, 1), b = probe_input(n(), p().in, 2);
  Bits ref(p().out, n()), got(p().out, n());
  cpu_->add(view(ref), view(a), view(b), p().compute);
  host_add(got.data(), p().out, a.data(), p().in, b.data(), p().in, n(), p().compute);
  EXPECT_TRUE(same_bits(ref, got));
}

TEST_P(NnHostModelTest, ConvertMatchesCpu) {
  Bits src = probe_input(n(), p().in, 3);
  Bits ref(p().out, n()), got(p().out, n());
  cpu_->convert(view(ref), view(src));
  host_convert(got.data(), p().out, src.data(), p().in, n());
  EXPECT_TRUE(same_bits(ref, got));
}

TEST_P(NnHostModelTest, GeluForwardMatchesCpu) {
  Bits inp = probe_input(n(), p().in, 4);
  Bits ref(p().out, n()), got(p().out, n());
  cpu_->gelu_forward(view(ref), view(inp), p().compute);
  host_gelu_forward(got.data(), p().out, inp.data(), p().in, n(), p().compute);
  EXPECT_TRUE(close(ref.values(), got.values(), reduction_tolerance(p().compute, p().out)));
}

TEST_P(NnHostModelTest, GeluBackwardMatchesCpu) {
  Bits inp = probe_input(n(), p().in, 5), dout = probe_input(n(), p().in, 6, 0.5f);
  Bits ref(p().out, n()), got(p().out, n());
  cpu_->gelu_backward(view(ref), view(dout), view(inp), p().compute);
  host_gelu_backward(got.data(), p().out, dout.data(), p().in, inp.data(), p().in, n(),
                     p().compute);
  EXPECT_TRUE(close(ref.values(), got.values(), reduction_tolerance(p().compute, p().out)));
}

TEST_P(NnHostModelTest, CrossEntropyBackwardMatchesCpu) {
  const std::int64_t N = 3, V = n();
  std::vector<float> probs = random_values(static_cast<std::size_t>(N * V), 7, 0.3f);
  for (auto& x : probs) x = std::fabs(x);
  std::vector<std::int32_t> targets = {0, static_cast<std::int32_t>(V - 1),
                                       static_cast<std::int32_t>(V / 2)};
  Bits ref(p().out, N * V), got(p().out, N * V);
  // 2^-20: small enough that FP16 flushes part of it to subnormals or zero.
  const float dloss = 0x1p-20f;
  cpu_->cross_entropy_backward(Tensor(ref.data(), p().out, {N, V}),
                               Tensor(probs.data(), Format::kFP32, {N, V}), targets.data(), dloss,
                               p().compute);
  host_cross_entropy_backward(got.data(), p().out, probs.data(), targets.data(), N, V, dloss,
                              p().compute);
  EXPECT_TRUE(same_bits(ref, got));
}

// The accumulate path of every gradient output, through the CPU's matmul_backward with one row
// (its contribution is one exact FP32 product per element).
TEST_P(NnHostModelTest, AccumulateMatchesCpuGradientOutput) {
  const std::int64_t OC = 3, C = n();
  Bits dout = probe_input(OC, p().in, 8), inp = probe_input(C, p().in, 9);
  Bits w(p().in, OC * C);
  Bits ref = probe_input(OC * C, p().out, 10), got = ref;
  cpu_->matmul_backward(Tensor{}, Tensor(ref.data(), p().out, {OC, C}), Tensor{},
                        Tensor(dout.data(), p().in, {1, OC}), Tensor(inp.data(), p().in, {1, C}),
                        Tensor(w.data(), p().in, {OC, C}), p().compute);
  const std::vector<float> d = dout.values(), x = inp.values();
  std::vector<float> contribution(static_cast<std::size_t>(OC * C));
  for (std::int64_t o = 0; o < OC; ++o) {
    for (std::int64_t c = 0; c < C; ++c) {
      // A dot product of one term, summed from +0 as sgemm does (so -0 products become +0).
      contribution[o * C + c] =
          0.0f + host_round_to_format(d[o], p().compute) * host_round_to_format(x[c], p().compute);
    }
  }
  host_commit_accumulate(got.data(), p().out, contribution.data(), OC * C, p().compute);
  EXPECT_TRUE(same_bits(ref, got));
}

TEST_P(NnHostModelTest, UnscaleMatchesCpuAndFindsNonFinite) {
  for (float bad : {0.0f, INFINITY, -INFINITY, NAN}) {
    std::vector<float> g = random_values(static_cast<std::size_t>(n()), 11, 1000.0f);
    g[static_cast<std::size_t>(n() / 2)] = bad == 0.0f ? g[0] : bad;
    Bits ref = Bits::from(g, p().out), got = ref;
    float found = 0.0f;
    const float inv = host_inverse_scale(1024.0f);
    cpu_->unscale_and_check(view(ref), inv, Tensor(&found, Format::kFP32, {1}));
    const bool host_found = host_unscale(got.data(), p().out, n(), inv);
    EXPECT_EQ(host_found, found != 0.0f) << bad;
    EXPECT_EQ(host_found, bad != 0.0f) << bad;
    EXPECT_TRUE(same_bits(ref, got)) << bad;
  }
}

TEST_P(NnHostModelTest, AdamWMatchesCpuOverSteps) {
  const Format f = p().out;  // parameters, grads and moments share the parameter format
  Bits params = probe_input(n(), f, 12, 0.1f), m(f, n()), v(f, n());
  Bits ref_p = params, ref_m = m, ref_v = v;
  for (std::int64_t step = 1; step <= 4; ++step) {
    Bits grads = probe_input(n(), f, 13 + static_cast<std::uint32_t>(step), 0.01f);
    AdamWParams hp;
    hp.lr = 3e-3f;
    hp.weight_decay = 0.1f;
    hp.step = step;
    cpu_->adamw(view(ref_p), view(grads), view(ref_m), view(ref_v), hp);
    cuda::nn::AdamWArgs args;
    args.lr = hp.lr;
    args.beta1 = hp.beta1;
    args.beta2 = hp.beta2;
    args.eps = hp.eps;
    args.weight_decay = hp.weight_decay;
    args.step = step;
    host_adamw(params.data(), grads.data(), m.data(), v.data(), f, n(), args);
    ASSERT_TRUE(same_bits(ref_p, params)) << "step " << step;
    ASSERT_TRUE(same_bits(ref_m, m)) << "step " << step;
    ASSERT_TRUE(same_bits(ref_v, v)) << "step " << step;
  }
}

INSTANTIATE_TEST_SUITE_P(PrecisionsAndSizes, NnHostModelTest,
                         ::testing::Combine(::testing::ValuesIn(precisions()),
                                            ::testing::ValuesIn(kSizes)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param).name) + "_n" +
                                  std::to_string(std::get<1>(info.param));
                         });

TEST(NnHostModelRoundingTest, RoundToFormatMatchesReference) {
  std::vector<float> probes = random_values(4096, 21, 100.0f);
  for (float x :
       {0.0f, -0.0f, 1.0f + 0x1p-11f, 1.0f + 0x1p-8f, 65504.0f, 65519.99f, 65520.0f, -65520.0f,
        0x1p-24f, 0x1p-25f, 0x1.8p-25f, 0x1p-133f, 3.4e38f, INFINITY, -INFINITY}) {
    probes.push_back(x);
  }
  for (Format f : {Format::kFP32, Format::kFP16, Format::kBF16}) {
    for (float x : probes) {
      const float ref = round_to(x, f), got = host_round_to_format(x, f);
      EXPECT_TRUE(ref == got || (std::isnan(ref) && std::isnan(got)))
          << format_name(f) << " " << x << ": " << ref << " vs " << got;
    }
    EXPECT_TRUE(std::isnan(host_round_to_format(NAN, f)));
  }
}

// The device loss-scale rule against the trainer's scalers, over random found_inf sequences
// with short growth intervals so growth, backoff, floors, caps and hysteresis all happen.
class LossScaleHostModelTest : public ::testing::TestWithParam<ScalerConfig> {};

TEST_P(LossScaleHostModelTest, MatchesCpuScalerStepByStep) {
  const ScalerConfig config = GetParam();
  auto cpu = std::make_unique<LossScaler>(config);
  LossScaleState state;
  state.scale = config.init_scale;
  state.hysteresis_tracker = config.hysteresis;
  const LossScaleRule& rule = config;
  std::mt19937 rng(31);
  std::bernoulli_distribution inf(0.2);
  for (int step = 0; step < 2000; ++step) {
    const bool found = inf(rng);
    cpu->update(found);
    host_update_loss_scale(state, rule, found);
    const ScalerState ref = cpu->state();
    ASSERT_EQ(ref.scale, state.scale) << "step " << step;
    ASSERT_EQ(ref.growth_tracker, state.growth_tracker) << "step " << step;
    if (config.kind == ScalerKind::kHysteresis) {
      ASSERT_EQ(ref.hysteresis_tracker, state.hysteresis_tracker) << "step " << step;
    }
  }
}

ScalerConfig with(ScalerConfig c, float init, std::int64_t interval, float min_scale,
                  float max_scale) {
  c.init_scale = init;
  c.growth_interval = interval;
  c.min_scale = min_scale;
  c.max_scale = max_scale;
  return c;
}

INSTANTIATE_TEST_SUITE_P(
    Scalers, LossScaleHostModelTest,
    ::testing::Values(with(ScalerConfig::pytorch_defaults(), 65536.0f, 3, 0.0f, kFp32MaxScale),
                      with(ScalerConfig::pytorch_defaults(), 65536.0f, 2, 4.0f, 1048576.0f),
                      // Growth past FP32's range: the product is Inf and the scale stays.
                      with(ScalerConfig::pytorch_defaults(), 0x1p126f, 1, 0.0f, kFp32MaxScale),
                      with(ScalerConfig::megatron_defaults(), 4294967296.0f, 3, 1.0f,
                           kFp32MaxScale),
                      with(ScalerConfig::megatron_defaults(), 0x1p126f, 1, 1.0f, kFp32MaxScale),
                      ScalerConfig::static_scale(128.0f)),
    [](const auto& info) { return "config" + std::to_string(info.index); });

TEST(NnHostModelScaleTest, InverseScaleIsTheTrainersFormula) {
  for (float s : {1.0f, 3.0f, 65536.0f, 0x1p-20f, 1e30f, 7.0e-39f}) {
    EXPECT_EQ(host_inverse_scale(s), static_cast<float>(1.0 / static_cast<double>(s))) << s;
  }
}

}  // namespace
}  // namespace ampscope::trainer::testing
