// The CPU back end's precision contract (backend.h): inputs rounded to the compute format,
// FP32 accumulation, results rounded to the compute format and stored in 16 bits, overflow to
// Inf as on hardware, accumulation of rounded contributions. Inputs are chosen so that every
// FP32 sum is exact, which makes the expected values independent of BLAS summation order.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "ampscope/convert.h"
#include "ampscope/tensor_stats.h"
#include "ampscope/trainer/backend.h"
#include "layers/matmul/matmul.h"

namespace ampscope::trainer {
namespace {

class BackendPrecisionTest : public ::testing::TestWithParam<Format> {
 protected:
  std::unique_ptr<Backend> be_ = make_cpu_backend({.blas_threads = 1});
};

TEST_P(BackendPrecisionTest, MatmulRoundsInputsAndOutputToTheComputeFormat) {
  const Format f = GetParam();
  const std::int64_t N = 3, C = 5, OC = 4;
  std::vector<float> x(N * C), w(OC * C);
  // 1 + 2^-13 is not representable in FP16 (10 fraction bits) or BF16 (7): it rounds to 1.
  for (std::int64_t i = 0; i < N * C; ++i) x[i] = (1.0f + 0x1p-13f) * static_cast<float>(i % 7 - 3);
  for (std::int64_t i = 0; i < OC * C; ++i) w[i] = 0.125f * static_cast<float>(i % 5 - 2) + 0x1p-14f;
  std::vector<std::uint16_t> out(N * OC);
  be_->matmul_forward(Tensor(out.data(), f, {N, OC}), Tensor(x.data(), Format::kFP32, {N, C}),
                      Tensor(w.data(), Format::kFP32, {OC, C}), Tensor{}, f);
  // The layer's reference on the rounded inputs, its FP32 result rounded once more.
  std::vector<float> xr(x.size()), wr(w.size()), expected(N * OC);
  for (std::size_t i = 0; i < x.size(); ++i) xr[i] = round_to(x[i], f);
  for (std::size_t i = 0; i < w.size(); ++i) wr[i] = round_to(w[i], f);
  layers::matmul_forward_reference(expected.data(), xr.data(), wr.data(), nullptr, N, C, OC);
  for (std::int64_t i = 0; i < N * OC; ++i) {
    EXPECT_EQ(decode(out[i], f), round_to(expected[i], f)) << i;
  }
}

TEST_P(BackendPrecisionTest, ResultsAboveMaxFiniteBecomeInfOnlyInFp16) {
  const Format f = GetParam();
  std::vector<float> x = {300.0f, 300.0f}, w = {128.0f, 128.0f};  // 76800 > 65504
  std::uint16_t out = 0;
  be_->matmul_forward(Tensor(&out, f, {1, 1}), Tensor(x.data(), Format::kFP32, {1, 2}),
                      Tensor(w.data(), Format::kFP32, {1, 2}), Tensor{}, f);
  if (f == Format::kFP16) {
    EXPECT_TRUE(std::isinf(decode(out, f)));
  } else {
    EXPECT_EQ(decode(out, f), 76800.0f);
  }
}

TEST_P(BackendPrecisionTest, WeightGradContributionsAreRoundedThenAccumulatedInFp32) {
  const Format f = GetParam();
  // dW (1,1) = sum_n dout[n] * x[n] = 1 + 2^-13 (not representable in f): rounds to 1.
  std::vector<float> dout = {1.0f, 0x1p-13f}, x = {1.0f, 1.0f}, w = {1.0f};
  std::vector<float> dw = {0.5f};
  be_->matmul_backward(Tensor{}, Tensor(dw.data(), Format::kFP32, {1, 1}), Tensor{},
                       Tensor(dout.data(), Format::kFP32, {2, 1}),
                       Tensor(x.data(), Format::kFP32, {2, 1}),
                       Tensor(w.data(), Format::kFP32, {1, 1}), f);
  EXPECT_EQ(dw[0], 1.5f);
  // The same in FP32 keeps the small part.
  be_->matmul_backward(Tensor{}, Tensor(dw.data(), Format::kFP32, {1, 1}), Tensor{},
                       Tensor(dout.data(), Format::kFP32, {2, 1}),
                       Tensor(x.data(), Format::kFP32, {2, 1}),
                       Tensor(w.data(), Format::kFP32, {1, 1}), Format::kFP32);
  EXPECT_EQ(dw[0], 2.5f + 0x1p-13f);
}

TEST_P(BackendPrecisionTest, SmallGradientsUnderflowToZeroInFp16Storage) {
  const Format f = GetParam();
  std::vector<float> probs = {0.5f, 0.5f};
  std::int32_t target = 0;
  std::vector<std::uint16_t> dlogits(2);
  // (p - y) * dloss = +-0.5 * 2^-26: below FP16's smallest subnormal 2^-24, normal in BF16.
  be_->cross_entropy_backward(Tensor(dlogits.data(), f, {1, 2}),
                              Tensor(probs.data(), Format::kFP32, {1, 2}), &target, 0x1p-26f,
                              Format::kFP32);
  if (f == Format::kFP16) {
    EXPECT_EQ(decode(dlogits[1], f), 0.0f);
  } else {
    EXPECT_EQ(decode(dlogits[1], f), 0x1p-27f);
  }
}

TEST_P(BackendPrecisionTest, UnscaleFindsInfAndNaN) {
  const Format f = GetParam();
  std::vector<float> g = {4.0f, 8.0f, INFINITY};
  std::vector<std::uint16_t> h(3);
  convert_from_fp32(g.data(), h.data(), 3, f);
  float found = 0.0f;
  be_->unscale_and_check(Tensor(h.data(), f, {3}), 0.25f, Tensor(&found, Format::kFP32, {1}));
  EXPECT_EQ(found, 1.0f);
  EXPECT_EQ(decode(h[0], f), 1.0f);
  EXPECT_EQ(decode(h[1], f), 2.0f);
  found = 0.0f;
  g = {4.0f, 8.0f, 16.0f};
  convert_from_fp32(g.data(), h.data(), 3, f);
  be_->unscale_and_check(Tensor(h.data(), f, {3}), 0.25f, Tensor(&found, Format::kFP32, {1}));
  EXPECT_EQ(found, 0.0f);
}

// Fused statistics: the unscale pass that also measures parts of the gradients leaves the same
// values and found_inf as unscale_and_check, and each part's statistics are compute_stats() of
// the unscaled part. Parts leave gaps (unscaled by the plain pass) and hold the values that
// matter: NaN, Inf, zeros, subnormals, the largest finite.
void check_fused_unscale(Backend& be, Format f, float inv_scale, bool poison) {
  const std::int64_t n = 40000 + (std::int64_t{1} << 20);  // a part large enough to spread
  std::vector<float> g(n);
  for (std::int64_t i = 0; i < n; ++i) {
    g[i] = std::ldexp(1.0f + static_cast<float>(i % 97) / 97.0f, static_cast<int>(i % 41) - 30) *
           (i % 3 == 0 ? -1.0f : 1.0f);
  }
  g[5] = 0.0f;
  g[6] = static_cast<float>(format_info(f).max_finite);
  g[7] = static_cast<float>(format_info(f).min_subnormal());
  if (poison) {
    g[20001] = NAN;  // inside the second part
    g[39990] = -INFINITY;  // in the gap before the large part
  }
  const std::size_t bytes = static_cast<std::size_t>(storage_bytes(f));
  std::vector<unsigned char> plain(n * bytes), fused(n * bytes);
  convert_from_fp32(g.data(), plain.data(), n, f);
  fused = plain;
  float found_plain = 0.0f, found_fused = 0.0f;
  be.unscale_and_check(Tensor(plain.data(), f, {n}), inv_scale,
                       Tensor(&found_plain, Format::kFP32, {1}));
  std::vector<TensorStats> stats(4);
  const std::vector<TargetSpec> targets = {{Format::kFP16, 10}, {Format::kE4M3, 0}};
  std::vector<Backend::StatsRequest> requests = {{20000, 17, targets, &stats[1]},
                                                 {0, 19999, targets, &stats[0]},
                                                 {20017, 19000, {}, &stats[2]},
                                                 {40000, n - 40000, targets, &stats[3]}};
  be.unscale_check_and_measure(Tensor(fused.data(), f, {n}), inv_scale,
                               Tensor(&found_fused, Format::kFP32, {1}), requests);
  EXPECT_EQ(plain, fused) << "inv_scale " << inv_scale;
  EXPECT_EQ(found_plain, found_fused) << "inv_scale " << inv_scale;
  EXPECT_EQ(found_fused, poison ? 1.0f : 0.0f);
  for (const Backend::StatsRequest& r : requests) {
    const TensorStats want = compute_stats_reference(fused.data() + r.offset * bytes,
                                                     static_cast<std::size_t>(r.numel), f,
                                                     r.targets);
    const TensorStats& got = *r.out;
    EXPECT_EQ(got.numel, want.numel);
    EXPECT_EQ(got.zeros, want.zeros);
    EXPECT_EQ(got.nan, want.nan);
    EXPECT_EQ(got.pos_inf, want.pos_inf);
    EXPECT_EQ(got.neg_inf, want.neg_inf);
    EXPECT_EQ(got.max_abs, want.max_abs);
    EXPECT_EQ(got.min_abs_nonzero, want.min_abs_nonzero);
    EXPECT_EQ(got.histogram, want.histogram);
    EXPECT_EQ(got.targets, want.targets);
    // Sums agree within rounding: sqrt(n * sum_sq) bounds sum(|x|) (Cauchy-Schwarz).
    const double abs_sum = std::sqrt(static_cast<double>(r.numel) * want.sum_sq);
    EXPECT_NEAR(got.sum, want.sum, 1e-12 * abs_sum);
    EXPECT_NEAR(got.sum_sq, want.sum_sq, 1e-12 * want.sum_sq);
  }
}

TEST_P(BackendPrecisionTest, FusedUnscaleEqualsUnscaleThenComputeStats) {
  const Format f = GetParam();
  // 1/1024 and 0: statistics in the pass; 4 (a loss scale below 1): the plain pass, then stats.
  for (float inv_scale : {1.0f / 1024.0f, 1.0f, 0.0f, 4.0f}) {
    for (bool poison : {false, true}) check_fused_unscale(*be_, f, inv_scale, poison);
  }
}

TEST(BackendFusedUnscaleTest, Fp32GradientsToo) {
  auto be = make_cpu_backend({.blas_threads = 1});
  for (float inv_scale : {1.0f / 65536.0f, 4.0f}) {
    for (bool poison : {false, true}) check_fused_unscale(*be, Format::kFP32, inv_scale, poison);
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, BackendPrecisionTest,
                         ::testing::Values(Format::kFP16, Format::kBF16),
                         [](const auto& info) { return std::string(format_name(info.param)); });

// Faults injected into attention's scores and probabilities land where the softmax and the
// product read them (one sequence, 3 tokens, 2 heads of 2 channels).
class AttentionFaultTest : public ::testing::Test {
 protected:
  static constexpr std::int64_t B = 1, T = 3, C = 4, NH = 2, hs = C / NH;
  struct Result {
    std::vector<float> out, scores, probs;
  };
  Result run(Format compute, const AttentionFaults& faults) {
    std::vector<float> qkv(B * T * 3 * C);
    for (std::size_t i = 0; i < qkv.size(); ++i) qkv[i] = 0.25f * static_cast<float>(i % 5) - 0.5f;
    std::vector<std::uint16_t> out16(B * T * C), scores16(B * NH * T * T);
    std::vector<float> out32(out16.size()), scores32(scores16.size()), probs(scores16.size());
    const bool half = compute != Format::kFP32;
    void* out = half ? static_cast<void*>(out16.data()) : out32.data();
    void* scores = half ? static_cast<void*>(scores16.data()) : scores32.data();
    be_->attention_forward(Tensor(out, compute, {B, T, C}), Tensor(scores, compute, {B, NH, T, T}),
                           Tensor(probs.data(), Format::kFP32, {B, NH, T, T}),
                           Tensor(qkv.data(), Format::kFP32, {B, T, 3 * C}), int(NH), compute,
                           Format::kFP32, faults);
    Result r{std::vector<float>(out16.size()), std::vector<float>(scores16.size()), probs};
    convert_to_fp32(out, r.out.data(), r.out.size(), compute);
    convert_to_fp32(scores, r.scores.data(), r.scores.size(), compute);
    return r;
  }
  std::unique_ptr<Backend> be_ = make_cpu_backend({.blas_threads = 1});
};

TEST_F(AttentionFaultTest, AScoreAboveFp16SpoilsItsRowInFp16AndChangesNothingInFp32) {
  AttentionFaults faults;
  faults.scores = ElementFault{0, 131008.0f};  // query 0's one score (key 0), sequence 0, head 0
  const Result fp16 = run(Format::kFP16, faults), clean16 = run(Format::kFP16, {});
  EXPECT_TRUE(std::isinf(fp16.scores[0]));
  EXPECT_TRUE(std::isnan(fp16.probs[0]));
  for (std::int64_t c = 0; c < C; ++c) {
    EXPECT_EQ(std::isnan(fp16.out[c]), c < hs) << c;  // token 0's context in head 0 only
  }
  for (std::size_t i = hs; i < fp16.out.size(); ++i) EXPECT_EQ(fp16.out[i], clean16.out[i]) << i;

  const Result fp32 = run(Format::kFP32, faults), clean32 = run(Format::kFP32, {});
  EXPECT_EQ(fp32.scores[0], 131008.0f);
  EXPECT_EQ(fp32.probs, clean32.probs);  // a row with one key has probability 1 for any score
  EXPECT_EQ(fp32.out, clean32.out);
}

TEST_F(AttentionFaultTest, AProbabilityFaultIsWhatTheProductReads) {
  AttentionFaults faults;
  faults.probs = ElementFault{NH * T * T - T, 0.5f};  // head 1, query 2, key 0
  const Result hit = run(Format::kFP32, faults), clean = run(Format::kFP32, {});
  EXPECT_EQ(hit.probs[NH * T * T - T], 0.5f);
  EXPECT_EQ(hit.scores, clean.scores);
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t c = 0; c < C; ++c) {
      const std::size_t i = static_cast<std::size_t>(t * C + c);
      EXPECT_EQ(hit.out[i] != clean.out[i], t == 2 && c >= hs) << t << "," << c;
    }
  }
}

TEST(TensorTest, SixteenBitTensorsUseTwoBytesPerElement) {
  EXPECT_EQ(Tensor(nullptr, Format::kFP16, {3, 5}).bytes(), 30u);
  EXPECT_EQ(Tensor(nullptr, Format::kBF16, {3, 5}).bytes(), 30u);
  EXPECT_EQ(Tensor(nullptr, Format::kFP32, {3, 5}).bytes(), 60u);
}

}  // namespace
}  // namespace ampscope::trainer
