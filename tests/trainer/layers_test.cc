// Each layer's tuned CPU version (trainer/layers/<layer>/<layer>_cpu.cc) against its plain
// reference (<layer>_reference.cc), at every SIMD level this CPU has, on shapes that are not
// multiples of the vector width (1xN, primes) and on two threads. Elementwise operations that
// are one FP32 operation per element (add, scale, column sums, the embedding) must match bit
// for bit; the others within the tolerances stated at each check (FP32 sums in another order
// against FP64 references rounded once, Cephes expf against the C library's).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "ampscope/cpu_features.h"
#include "layers/attention/attention.h"
#include "layers/cpu_exec.h"
#include "layers/cross_entropy/cross_entropy.h"
#include "layers/elementwise/elementwise.h"
#include "layers/embedding/embedding.h"
#include "layers/gelu/gelu.h"
#include "layers/layernorm/layernorm.h"
#include "layers/matmul/matmul.h"
#include "random_tensor.h"

namespace ampscope::trainer::layers {
namespace {

using testing::randn;

// |got - want| <= rtol * |want| + atol * max|want| for every element.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, double rtol,
                  double atol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0.0;
  for (float w : want) scale = std::max(scale, static_cast<double>(std::abs(w)));
  int bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - want[i]);
    if (!(err <= rtol * std::abs(want[i]) + atol * scale) && bad++ < 5) {
      ADD_FAILURE() << what << "[" << i << "]: " << got[i] << ", reference " << want[i];
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

std::vector<SimdLevel> levels() {
  std::vector<SimdLevel> out;
  for (int l = 0; l <= static_cast<int>(max_supported_simd_level()); ++l) {
    out.push_back(static_cast<SimdLevel>(l));
  }
  return out;
}

// Lengths around the 16-lane vector and the kChunk task size.
const std::vector<std::size_t> kLengths = {1, 7, 16, 31, 97, kChunk + 13};

class LayersTest : public ::testing::TestWithParam<SimdLevel> {
 protected:
  ScratchPool scratch_;
  Workers workers_{2};
  CpuExec ex_{scratch_, workers_, GetParam()};
};

TEST_P(LayersTest, ElementwiseKernelsMatchTheReferences) {
  const ElementwiseKernels& k = elementwise_kernels(GetParam());
  for (std::size_t n : kLengths) {
    const std::string at = " n=" + std::to_string(n);
    auto a = randn(n, 1), b = randn(n, 2);
    std::vector<float> got(n), want(n);
    k.add(a.data(), b.data(), got.data(), n);
    add_reference(a.data(), b.data(), want.data(), n);
    EXPECT_EQ(got, want) << "add" << at;
    k.scale(a.data(), 0.375f, got.data(), n);
    scale_reference(a.data(), 0.375f, want.data(), n);
    EXPECT_EQ(got, want) << "scale" << at;
    a[n / 2] = INFINITY;
    EXPECT_TRUE(k.scale_and_check(a.data(), 0.5f, got.data(), n)) << at;
    a[n / 2] = NAN;
    EXPECT_TRUE(k.scale_and_check(a.data(), 0.5f, got.data(), n)) << at;
    a[n / 2] = 1.0f;
    EXPECT_EQ(k.scale_and_check(a.data(), 0.5f, got.data(), n),
              scale_and_check_reference(a.data(), 0.5f, want.data(), n));
    EXPECT_EQ(got, want) << "scale_and_check" << at;
    // FP64 sums of exact FP32 squares, in another order: a few FP64 ulps.
    const double sq = k.sum_squares(a.data(), n), sq_ref = sum_squares_reference(a.data(), n);
    EXPECT_NEAR(sq, sq_ref, 1e-13 * sq_ref) << at;
    // Cephes expf within a few FP32 ulps of the C library's.
    k.exp_shifted(a.data(), 0.25f, -0.5f, got.data(), n);
    exp_shifted_reference(a.data(), 0.25f, -0.5f, want.data(), n);
    expect_close(got, want, 4e-7, 0.0, "exp_shifted" + at);
  }
}

TEST_P(LayersTest, ColumnSumsAddRowsInOrderLikeTheReference) {
  const ElementwiseKernels& k = elementwise_kernels(GetParam());
  for (std::size_t cols : {1, 17, 64}) {
    const std::size_t rows = 13;
    auto x = randn(rows * cols, 3);
    auto got = randn(cols, 4), want = got;
    k.add_column_sums(x.data(), rows, cols, got.data());
    add_column_sums_reference(x.data(), rows, cols, want.data());
    EXPECT_EQ(got, want) << cols;
  }
}

TEST_P(LayersTest, AdamWMatchesTheReference) {
  const ElementwiseKernels& k = elementwise_kernels(GetParam());
  AdamWScalars s{0.9f, 0.1f, 0.95f, 0.05f, 0.19f, 0.0975f, 0.9999f, 3e-3f, 1e-8f};
  for (std::size_t n : kLengths) {
    auto g = randn(n, 5), p = randn(n, 6), m = randn(n, 7, 0.1);
    auto v = randn(n, 8, 0.1);
    for (auto& x : v) x = x * x;
    std::vector<float> po(n), mo(n), vo(n), pr(n), mr(n), vr(n);
    k.adamw(g.data(), p.data(), m.data(), v.data(), po.data(), mo.data(), vo.data(), n, s);
    adamw_reference(g.data(), p.data(), m.data(), v.data(), pr.data(), mr.data(), vr.data(), n, s);
    // The vector levels may fuse a * b + c: an ulp or two on each term.
    const std::string at = " n=" + std::to_string(n);
    expect_close(po, pr, 1e-6, 1e-7, "adamw params" + at);
    expect_close(mo, mr, 1e-6, 1e-7, "adamw m" + at);
    expect_close(vo, vr, 1e-6, 1e-7, "adamw v" + at);
  }
}

TEST_P(LayersTest, GeluMatchesItsDefinition) {
  for (std::size_t n : kLengths) {
    auto x = randn(n, 9, 3.0), d = randn(n, 10);
    std::vector<float> got(n), want(n);
    // tanh through one exponential: ~1e-7 absolute near 0, a few ulps elsewhere.
    gelu_forward_cpu(ex_, x.data(), got.data(), n);
    gelu_forward_reference(x.data(), want.data(), n);
    expect_close(got, want, 1e-6, 1e-7, "gelu_forward n=" + std::to_string(n));
    // sech^2 = 1 - t^2 cancels where t is near -1 or 1: an error of ~1e-7 in t times
    // 0.5 |x| sqrt(2/pi) (1 + 0.134 x^2), up to ~1e-5 |dout| at |x| = 12 (4 sigma here), where
    // the gradient itself is near 0.
    gelu_backward_cpu(ex_, x.data(), d.data(), got.data(), n);
    gelu_backward_reference(x.data(), d.data(), want.data(), n);
    expect_close(got, want, 1e-5, 1e-5, "gelu_backward n=" + std::to_string(n));
  }
}

TEST_P(LayersTest, LayerNormMatchesItsDefinition) {
  for (std::size_t C : {1, 7, 16, 67}) {
    const std::size_t N = 5;
    const std::string at = " C=" + std::to_string(C);
    auto x = randn(N * C, 11, 2.0), w = randn(C, 12), b = randn(C, 13), d = randn(N * C, 14);
    for (auto& v : x) v += 3.0f;  // a mean far from 0: the variance must not cancel
    std::vector<float> out(N * C), mean(N), rstd(N), out_r(N * C), mean_r(N), rstd_r(N);
    layernorm_forward_cpu(ex_, x.data(), w.data(), b.data(), out.data(), mean.data(), rstd.data(),
                          N, C);
    layernorm_forward_reference(x.data(), w.data(), b.data(), out_r.data(), mean_r.data(),
                                rstd_r.data(), N, C);
    // A row of one element normalises to 0: only the bias is left, exactly.
    expect_close(out, out_r, 1e-5, 1e-5, "layernorm out" + at);
    expect_close(mean, mean_r, 1e-6, 1e-6, "layernorm mean" + at);
    expect_close(rstd, rstd_r, 1e-5, 0.0, "layernorm rstd" + at);
    // Accumulating outputs start from nonzero values.
    auto di = randn(N * C, 15), dw = randn(C, 16), db = randn(C, 17);
    auto di_r = di, dw_r = dw, db_r = db;
    layernorm_backward_cpu(ex_, x.data(), w.data(), d.data(), mean_r.data(), rstd_r.data(),
                           di.data(), dw.data(), db.data(), N, C);
    layernorm_backward_reference(x.data(), w.data(), d.data(), mean_r.data(), rstd_r.data(),
                                 di_r.data(), dw_r.data(), db_r.data(), N, C);
    expect_close(di, di_r, 1e-4, 1e-5, "layernorm dinp" + at);
    expect_close(dw, dw_r, 1e-5, 1e-5, "layernorm dweight" + at);
    expect_close(db, db_r, 1e-5, 1e-5, "layernorm dbias" + at);
  }
}

TEST_P(LayersTest, EmbeddingMatchesItsDefinitionBitForBit) {
  const std::size_t B = 3, T = 5, C = 19, V = 7;
  auto wte = randn(V * C, 21), wpe = randn(T * C, 22), d = randn(B * T * C, 23);
  const std::vector<std::int32_t> tokens = {0, 3, 3, 6, 1, 0, 2, 2, 2, 5, 4, 6, 6, 0, 1};
  std::vector<float> out(B * T * C), out_r(B * T * C);
  embedding_forward_cpu(ex_, out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
  embedding_forward_reference(out_r.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
  EXPECT_EQ(out, out_r);
  auto dwte = randn(V * C, 24), dwpe = randn(T * C, 25);
  auto dwte_r = dwte, dwpe_r = dwpe;
  embedding_backward_cpu(ex_, dwte.data(), dwpe.data(), d.data(), tokens.data(), B, T, C);
  embedding_backward_reference(dwte_r.data(), dwpe_r.data(), d.data(), tokens.data(), B, T, C);
  EXPECT_EQ(dwte, dwte_r);
  EXPECT_EQ(dwpe, dwpe_r);
}

TEST_P(LayersTest, MatmulMatchesItsDefinition) {
  struct Shape {
    std::size_t N, C, OC;
  };
  for (const Shape& s : {Shape{1, 1, 1}, Shape{1, 31, 17}, Shape{13, 7, 5}, Shape{64, 48, 33}}) {
    const std::string at =
        " " + std::to_string(s.N) + "x" + std::to_string(s.C) + "x" + std::to_string(s.OC);
    auto x = randn(s.N * s.C, 31), w = randn(s.OC * s.C, 32), b = randn(s.OC, 33);
    auto d = randn(s.N * s.OC, 34);
    std::vector<float> out(s.N * s.OC), out_r(s.N * s.OC);
    matmul_forward_cpu(ex_, out.data(), x.data(), w.data(), b.data(), s.N, s.C, s.OC);
    matmul_forward_reference(out_r.data(), x.data(), w.data(), b.data(), s.N, s.C, s.OC);
    // FP32 dot products of up to 64 terms of order 1 against FP64 ones.
    expect_close(out, out_r, 1e-5, 1e-5, "matmul out" + at);
    std::vector<float> di(s.N * s.C), dw(s.OC * s.C), db(s.OC);
    std::vector<float> di_r(s.N * s.C), dw_r(s.OC * s.C), db_r(s.OC);
    matmul_backward_cpu(ex_, di.data(), dw.data(), db.data(), d.data(), x.data(), w.data(), s.N,
                        s.C, s.OC);
    matmul_backward_reference(di_r.data(), dw_r.data(), db_r.data(), d.data(), x.data(), w.data(),
                              s.N, s.C, s.OC);
    expect_close(di, di_r, 1e-5, 1e-5, "matmul dinp" + at);
    expect_close(dw, dw_r, 1e-5, 1e-5, "matmul dweight" + at);
    expect_close(db, db_r, 1e-5, 1e-5, "matmul dbias" + at);
  }
}

TEST_P(LayersTest, AttentionMatchesItsDefinition) {
  const std::int64_t B = 2, T = 7, C = 12, NH = 3;
  auto qkv = randn(B * T * 3 * C, 41), d = randn(B * T * C, 42);
  std::vector<float> out(B * T * C), scores(B * NH * T * T), probs(B * NH * T * T);
  std::vector<float> out_r(out.size()), scores_r(scores.size()), probs_r(probs.size());
  attention_forward_cpu(ex_, out.data(), scores.data(), probs.data(), qkv.data(), B, T, C, NH,
                        Format::kFP32, Format::kFP32, {});
  attention_forward_reference(out_r.data(), scores_r.data(), probs_r.data(), qkv.data(), B, T, C,
                              NH);
  expect_close(scores, scores_r, 1e-5, 1e-6, "attention scores");
  expect_close(probs, probs_r, 1e-5, 1e-6, "attention probs");
  expect_close(out, out_r, 1e-5, 1e-5, "attention out");
  std::vector<float> dqkv(qkv.size()), dqkv_r(qkv.size());
  attention_backward_cpu(ex_, dqkv.data(), d.data(), qkv.data(), probs_r.data(), B, T, C, NH,
                         Format::kFP32, Format::kFP32);
  attention_backward_reference(dqkv_r.data(), d.data(), qkv.data(), probs_r.data(), B, T, C, NH);
  expect_close(dqkv, dqkv_r, 1e-4, 1e-5, "attention dqkv");
}

TEST_P(LayersTest, CrossEntropyMatchesItsDefinition) {
  for (std::size_t V : {1, 7, 65, 130}) {
    const std::size_t N = 6;
    const std::string at = " V=" + std::to_string(V);
    auto logits = randn(N * V, 51, 3.0);
    std::vector<std::int32_t> targets(N);
    for (std::size_t i = 0; i < N; ++i) targets[i] = static_cast<std::int32_t>((i * 5) % V);
    std::vector<float> losses(N), probs(N * V), losses_r(N), probs_r(N * V);
    cross_entropy_forward_cpu(ex_, losses.data(), probs.data(), logits.data(), targets.data(), N,
                              V);
    cross_entropy_forward_reference(losses_r.data(), probs_r.data(), logits.data(), targets.data(),
                                    N, V);
    expect_close(probs, probs_r, 1e-5, 1e-7, "cross_entropy probs" + at);
    expect_close(losses, losses_r, 1e-5, 1e-6, "cross_entropy losses" + at);
    std::vector<float> dl(N * V), dl_r(N * V);
    cross_entropy_backward_cpu(ex_, dl.data(), probs_r.data(), targets.data(), 0.125f, N, V);
    cross_entropy_backward_reference(dl_r.data(), probs_r.data(), targets.data(), 0.125f, N, V);
    expect_close(dl, dl_r, 1e-6, 1e-7, "cross_entropy dlogits" + at);
  }
}

INSTANTIATE_TEST_SUITE_P(EveryLevelOfThisCpu, LayersTest, ::testing::ValuesIn(levels()),
                         [](const auto& info) { return std::string(simd_level_name(info.param)); });

}  // namespace
}  // namespace ampscope::trainer::layers
