// Finite-difference gradient checks of every layer of the CPU back end and of the whole model,
// in FP32. Central differences with step eps on inputs of order 1; a layer's scalar objective
// is L = sum_i out_i * r_i with fixed random r (summed in FP64), so its gradient with respect
// to out is r. Tolerance per element: |numeric - analytic| <= atol + rtol * |analytic| with the
// values stated at each check (FP32 rounding of the forward pass divided by 2 eps dominates).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "ampscope/trainer/backend.h"
#include "ampscope/trainer/model.h"
#include "random_tensor.h"

namespace ampscope::trainer {
namespace {

using testing::randn;

Tensor view(std::vector<float>& v, std::initializer_list<std::int64_t> shape) {
  return Tensor(v.data(), Format::kFP32, shape);
}

double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// Checks d objective / d x[i] against analytic[i] for every i (or every stride-th).
void expect_gradient(const std::string& what, std::vector<float>& x,
                     const std::vector<float>& analytic, const std::function<double()>& objective,
                     double eps, double atol, double rtol, std::size_t stride = 1) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  int bad = 0;
  for (std::size_t i = 0; i < x.size(); i += stride) {
    const float saved = x[i];
    x[i] = static_cast<float>(saved + eps);
    const double up = objective();
    x[i] = static_cast<float>(saved - eps);
    const double down = objective();
    x[i] = saved;
    const double numeric = (up - down) / (2.0 * eps);
    const double tol = atol + rtol * std::abs(analytic[i]);
    if (std::abs(numeric - analytic[i]) > tol && bad++ < 5) {
      ADD_FAILURE() << what << "[" << i << "]: numeric " << numeric << ", analytic "
                    << analytic[i];
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

class GradCheckTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be_ = make_cpu_backend({.blas_threads = 1});
};

TEST_F(GradCheckTest, MatmulWithBias) {
  const std::int64_t N = 5, C = 7, OC = 6;
  auto x = randn(N * C, 1), w = randn(OC * C, 2), b = randn(OC, 3), r = randn(N * OC, 4);
  std::vector<float> out(N * OC), dx(N * C), dw(OC * C, 0.0f), db(OC, 0.0f);
  auto objective = [&] {
    be_->matmul_forward(view(out, {N, OC}), view(x, {N, C}), view(w, {OC, C}), view(b, {OC}),
                        Format::kFP32);
    return dot(out, r);
  };
  objective();
  be_->matmul_backward(view(dx, {N, C}), view(dw, {OC, C}), view(db, {OC}), view(r, {N, OC}),
                       view(x, {N, C}), view(w, {OC, C}), Format::kFP32);
  expect_gradient("dinp", x, dx, objective, 1e-2, 1e-4, 1e-3);
  expect_gradient("dweight", w, dw, objective, 1e-2, 1e-4, 1e-3);
  expect_gradient("dbias", b, db, objective, 1e-2, 1e-4, 1e-3);
}

TEST_F(GradCheckTest, MatmulBackwardAccumulatesWeightGrads) {
  const std::int64_t N = 3, C = 4, OC = 2;
  auto x = randn(N * C, 5), w = randn(OC * C, 6), d = randn(N * OC, 7);
  std::vector<float> dx(N * C), dw1(OC * C, 0.0f), dw2(OC * C, 0.0f);
  be_->matmul_backward(view(dx, {N, C}), view(dw1, {OC, C}), Tensor{}, view(d, {N, OC}),
                       view(x, {N, C}), view(w, {OC, C}), Format::kFP32);
  dw2 = dw1;
  be_->matmul_backward(view(dx, {N, C}), view(dw2, {OC, C}), Tensor{}, view(d, {N, OC}),
                       view(x, {N, C}), view(w, {OC, C}), Format::kFP32);
  for (std::size_t i = 0; i < dw1.size(); ++i) EXPECT_FLOAT_EQ(dw2[i], 2.0f * dw1[i]);
}

TEST_F(GradCheckTest, LayerNorm) {
  const std::int64_t N = 4, C = 9;
  auto x = randn(N * C, 11), w = randn(C, 12), b = randn(C, 13), r = randn(N * C, 14);
  std::vector<float> out(N * C), mean(N), rstd(N), dx(N * C, 0.0f), dw(C, 0.0f), db(C, 0.0f);
  auto objective = [&] {
    be_->layernorm_forward(view(out, {N, C}), view(mean, {N}), view(rstd, {N}), view(x, {N, C}),
                           view(w, {C}), view(b, {C}), Format::kFP32);
    return dot(out, r);
  };
  objective();
  be_->layernorm_backward(view(dx, {N, C}), view(dw, {C}), view(db, {C}), view(r, {N, C}),
                          view(x, {N, C}), view(w, {C}), view(mean, {N}), view(rstd, {N}),
                          Format::kFP32);
  expect_gradient("dinp", x, dx, objective, 1e-2, 1e-4, 2e-2);
  expect_gradient("dweight", w, dw, objective, 1e-2, 1e-4, 2e-2);
  expect_gradient("dbias", b, db, objective, 1e-2, 1e-4, 2e-2);
}

TEST_F(GradCheckTest, Gelu) {
  const std::int64_t n = 41;
  auto x = randn(n, 21, 2.0), r = randn(n, 22);
  std::vector<float> out(n), dx(n);
  auto objective = [&] {
    be_->gelu_forward(view(out, {n}), view(x, {n}), Format::kFP32);
    return dot(out, r);
  };
  objective();
  be_->gelu_backward(view(dx, {n}), view(r, {n}), view(x, {n}), Format::kFP32);
  expect_gradient("dinp", x, dx, objective, 1e-2, 1e-4, 1e-3);
}

TEST_F(GradCheckTest, CausalAttention) {
  const std::int64_t B = 2, T = 5, C = 6, NH = 2;
  auto qkv = randn(B * T * 3 * C, 31), r = randn(B * T * C, 32);
  std::vector<float> out(B * T * C), scores(B * NH * T * T), probs(B * NH * T * T),
      dqkv(B * T * 3 * C);
  auto objective = [&] {
    be_->attention_forward(view(out, {B, T, C}), view(scores, {B, NH, T, T}),
                           view(probs, {B, NH, T, T}), view(qkv, {B, T, 3 * C}), int(NH),
                           Format::kFP32, Format::kFP32, {});
    return dot(out, r);
  };
  objective();
  // Causality: row i of every head's probabilities is zero past i and sums to 1.
  for (std::int64_t bh = 0; bh < B * NH; ++bh) {
    for (std::int64_t i = 0; i < T; ++i) {
      double sum = 0.0;
      for (std::int64_t j = 0; j < T; ++j) {
        const float p = probs[(bh * T + i) * T + j];
        if (j > i) {
          EXPECT_EQ(p, 0.0f);
        }
        sum += p;
      }
      EXPECT_NEAR(sum, 1.0, 1e-6);
    }
  }
  be_->attention_backward(view(dqkv, {B, T, 3 * C}), view(r, {B, T, C}), view(qkv, {B, T, 3 * C}),
                          view(probs, {B, NH, T, T}), int(NH), Format::kFP32, Format::kFP32);
  expect_gradient("dqkv", qkv, dqkv, objective, 1e-2, 1e-4, 2e-2);
}

TEST_F(GradCheckTest, Embedding) {
  const std::int64_t V = 5, maxT = 4, B = 2, T = 3, C = 3;
  auto wte = randn(V * C, 41), wpe = randn(maxT * C, 42), r = randn(B * T * C, 43);
  std::vector<std::int32_t> tokens = {0, 3, 3, 4, 1, 0};
  std::vector<float> out(B * T * C), dwte(V * C, 0.0f), dwpe(maxT * C, 0.0f);
  auto objective = [&] {
    be_->embedding_forward(view(out, {B, T, C}), tokens.data(), view(wte, {V, C}),
                           view(wpe, {maxT, C}));
    return dot(out, r);
  };
  objective();
  be_->embedding_backward(view(dwte, {V, C}), view(dwpe, {maxT, C}), view(r, {B, T, C}),
                          tokens.data());
  expect_gradient("dwte", wte, dwte, objective, 1e-2, 1e-5, 1e-4);
  expect_gradient("dwpe", wpe, dwpe, objective, 1e-2, 1e-5, 1e-4);
}

TEST_F(GradCheckTest, CrossEntropy) {
  const std::int64_t N = 6, V = 7;
  auto logits = randn(N * V, 51, 2.0);
  std::vector<std::int32_t> targets = {0, 6, 3, 3, 1, 5};
  std::vector<float> losses(N), probs(N * V), dlogits(N * V);
  auto objective = [&] {
    be_->cross_entropy_forward(view(losses, {N}), view(probs, {N, V}), view(logits, {N, V}),
                               targets.data(), Format::kFP32);
    double s = 0.0;
    for (float l : losses) s += l;
    return s;
  };
  objective();
  be_->cross_entropy_backward(view(dlogits, {N, V}), view(probs, {N, V}), targets.data(), 1.0f,
                              Format::kFP32);
  expect_gradient("dlogits", logits, dlogits, objective, 1e-2, 1e-4, 2e-2);
}

TEST_F(GradCheckTest, ResidualAdd) {
  const std::int64_t n = 10;
  auto a = randn(n, 61), b = randn(n, 62);
  std::vector<float> out(n);
  be_->add(view(out, {n}), view(a, {n}), view(b, {n}), Format::kFP32);
  for (std::int64_t i = 0; i < n; ++i) EXPECT_EQ(out[i], a[i] + b[i]);
}

// The whole model, every parameter tensor: a tiny GPT with weights N(0, 0.3) so that every
// gradient is well above the FP32 noise floor. Objective: the mean loss (FP64 sum of FP32
// per-token losses); eps 1e-2, atol 1e-4, rtol 2e-2, every element.
TEST_F(GradCheckTest, WholeModelEveryParameter) {
  GptConfig cfg{.vocab_size = 7, .context = 4, .n_embd = 8, .n_head = 2, .n_layer = 2};
  Gpt model(cfg, PrecisionMode::kFP32, *be_, 2);
  model.init_weights(1);
  model.set_from_host(model.param_buffer(),
                      randn(static_cast<std::size_t>(model.num_parameters()), 71, 0.3));
  Batch batch{2, 4, {1, 2, 3, 4, 6, 5, 0, 1}, {2, 3, 4, 5, 0, 6, 1, 2}};
  StepContext ctx;
  auto values = model.host_values(model.param_buffer());
  auto objective = [&] {
    model.set_from_host(model.param_buffer(), values);
    return model.forward(batch, ctx);
  };
  objective();
  model.zero_grads();
  model.backward(1.0f, ctx);
  const auto grads = model.host_values(model.grad_buffer());
  for (const auto& p : model.params()) {
    std::vector<float> x(values.begin() + p.offset, values.begin() + p.offset + p.numel);
    std::vector<float> g(grads.begin() + p.offset, grads.begin() + p.offset + p.numel);
    auto obj = [&] {
      std::copy(x.begin(), x.end(), values.begin() + p.offset);
      return objective();
    };
    expect_gradient(p.name, x, g, obj, 1e-2, 1e-4, 2e-2);
    std::copy(x.begin(), x.end(), values.begin() + p.offset);
  }
}

}  // namespace
}  // namespace ampscope::trainer
