// The FP8/FP4 modes of the trainer (precision.h): the recipes each GEMM operand gets, the linear
// layer's quantised forward and backward against fake_quantize followed by the plain reference,
// delayed scaling's amax histories across steps, the per-layer BF16 set, a short training run
// per mode, bit-exact resume and the hook that reports what the quantiser measured.
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ampscope/check.h"
#include "ampscope/convert.h"
#include "ampscope/testing/files.h"
#include "ampscope/trainer/trainer.h"
#include "counting_backend.h"
#include "layers/cpu_exec.h"
#include "layers/matmul/matmul.h"
#include "random_tensor.h"
#include "tiny_trainer.h"

namespace ampscope::trainer {
namespace {

using testing::randn;

constexpr PrecisionMode kScaledModes[] = {PrecisionMode::kFP8Delayed, PrecisionMode::kFP8Current,
                                          PrecisionMode::kMXFP8, PrecisionMode::kNVFP4};

// ---- Recipes ---------------------------------------------------------------------------------

TEST(GemmRecipeTest, BlocksRunAlongEachGemmsReductionAxis) {
  using O = GemmOperand;
  using U = GemmUse;
  for (auto mode : {PrecisionMode::kMXFP8, PrecisionMode::kNVFP4}) {
    const int k = mode == PrecisionMode::kMXFP8 ? 32 : 16;
    const Format element = mode == PrecisionMode::kMXFP8 ? Format::kE4M3 : Format::kE2M1;
    struct Case {
      O operand;
      U use;
      int rows, cols;
    };
    for (const Case& c :
         {Case{O::kInput, U::kForward, 1, k}, Case{O::kWeight, U::kForward, 1, k},
          Case{O::kOutputGrad, U::kDgrad, 1, k}, Case{O::kWeight, U::kDgrad, k, 1},
          Case{O::kOutputGrad, U::kWgrad, k, 1}, Case{O::kInput, U::kWgrad, k, 1}}) {
      const auto r = gemm_recipe(mode, c.operand, c.use);
      ASSERT_TRUE(r.has_value());
      EXPECT_EQ(r->element, element);
      EXPECT_EQ(r->block_rows, c.rows) << operand_name(c.operand) << " " << gemm_use_name(c.use);
      EXPECT_EQ(r->block_cols, c.cols) << operand_name(c.operand) << " " << gemm_use_name(c.use);
    }
  }
  // Per-tensor FP8: E4M3 forward operands, E5M2 gradients (HYBRID), the same in every GEMM.
  for (auto mode : {PrecisionMode::kFP8Delayed, PrecisionMode::kFP8Current}) {
    EXPECT_EQ(gemm_recipe(mode, O::kInput, U::kForward)->element, Format::kE4M3);
    EXPECT_EQ(gemm_recipe(mode, O::kWeight, U::kDgrad)->element, Format::kE4M3);
    EXPECT_EQ(gemm_recipe(mode, O::kOutputGrad, U::kDgrad)->element, Format::kE5M2);
    EXPECT_EQ(gemm_recipe(mode, O::kOutputGrad, U::kWgrad),
              gemm_recipe(mode, O::kOutputGrad, U::kDgrad));
  }
  EXPECT_EQ(gemm_recipe(PrecisionMode::kFP8Delayed, O::kInput, U::kForward)->scaling,
            Scaling::kDelayed);
  EXPECT_EQ(gemm_recipe(PrecisionMode::kFP8Current, O::kInput, U::kForward)->scaling,
            Scaling::kCurrent);
  // Operands a GEMM does not read, and modes without scaled GEMMs.
  EXPECT_FALSE(gemm_recipe(PrecisionMode::kMXFP8, O::kOutputGrad, U::kForward));
  EXPECT_FALSE(gemm_recipe(PrecisionMode::kMXFP8, O::kInput, U::kDgrad));
  EXPECT_FALSE(gemm_recipe(PrecisionMode::kMXFP8, O::kWeight, U::kWgrad));
  EXPECT_FALSE(gemm_recipe(PrecisionMode::kAmpBF16, O::kInput, U::kForward));
  for (auto mode : kScaledModes) {
    EXPECT_EQ(parse_precision(precision_name(mode)), mode);
    EXPECT_TRUE(PrecisionPolicy::for_mode(mode).scaled_gemms);
    EXPECT_EQ(PrecisionPolicy::for_mode(mode).compute, Format::kBF16);
  }
}

// ---- The linear layer ------------------------------------------------------------------------

// |got - want| <= tol * max|want| for every element: FP32 sums of at most 80 products of
// quantised values of order 1 against FP64 ones.
void expect_close(const std::vector<float>& got, const std::vector<float>& want,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0.0;
  for (float w : want) scale = std::max(scale, static_cast<double>(std::abs(w)));
  int bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!(std::abs(static_cast<double>(got[i]) - want[i]) <= 1e-5 * scale) && bad++ < 5) {
      ADD_FAILURE() << what << "[" << i << "]: " << got[i] << ", reference " << want[i];
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

std::vector<float> quantized(const std::vector<float>& x, std::size_t rows, std::size_t cols,
                             const Recipe& r, RecipeCounts* counts = nullptr) {
  std::vector<float> out(x.size());
  RecipeCounts c = fake_quantize(x.data(), out.data(), rows, cols, r);
  if (counts != nullptr) *counts = c;
  return out;
}

Recipe recipe(PrecisionMode mode, GemmOperand operand, GemmUse use) {
  Recipe r = *gemm_recipe(mode, operand, use);
  if (r.scaling == Scaling::kDelayed) r.scale = operand == GemmOperand::kOutputGrad ? 2048 : 37.5f;
  return r;
}

class QuantizedMatmulTest : public ::testing::TestWithParam<PrecisionMode> {
 protected:
  layers::ScratchPool pool_;
  layers::Workers workers_{2};
  layers::CpuExec ex_{pool_, workers_, active_simd_level()};
};

TEST_P(QuantizedMatmulTest, ForwardAndBackwardAreFakeQuantizeThenTheReference) {
  using O = GemmOperand;
  using U = GemmUse;
  const PrecisionMode mode = GetParam();
  struct Shape {
    std::size_t N, C, OC;
  };
  // Multiples of the blocks, and ragged edges in every axis.
  for (const Shape& s :
       {Shape{64, 64, 32}, Shape{13, 40, 19}, Shape{1, 17, 5}, Shape{50, 80, 48}}) {
    const std::string at =
        " " + std::to_string(s.N) + "x" + std::to_string(s.C) + "x" + std::to_string(s.OC);
    const auto x = randn(s.N * s.C, 51), w = randn(s.OC * s.C, 52, 0.05), b = randn(s.OC, 53);
    const auto d = randn(s.N * s.OC, 54, 1e-3);
    const Recipe rx = recipe(mode, O::kInput, U::kForward),
                 rw = recipe(mode, O::kWeight, U::kForward);
    RecipeCounts cx, cw, cx_ref, cw_ref;
    std::vector<float> out(s.N * s.OC), out_r(s.N * s.OC), plain(s.N * s.OC);
    layers::matmul_forward_quantized_cpu(ex_, out.data(), x.data(), w.data(), b.data(), s.N, s.C,
                                         s.OC, {&rx, &cx}, {&rw, &cw});
    layers::matmul_forward_reference(out_r.data(), quantized(x, s.N, s.C, rx, &cx_ref).data(),
                                     quantized(w, s.OC, s.C, rw, &cw_ref).data(), b.data(), s.N,
                                     s.C, s.OC);
    expect_close(out, out_r, "out" + at);
    EXPECT_EQ(cx, cx_ref) << at;
    EXPECT_EQ(cw, cw_ref) << at;
    // The quantisation is not a no-op: the plain product differs.
    layers::matmul_forward_cpu(ex_, plain.data(), x.data(), w.data(), b.data(), s.N, s.C, s.OC);
    EXPECT_NE(plain, out) << at;

    const Recipe rdd = recipe(mode, O::kOutputGrad, U::kDgrad),
                 rdw = recipe(mode, O::kWeight, U::kDgrad),
                 rwd = recipe(mode, O::kOutputGrad, U::kWgrad),
                 rwx = recipe(mode, O::kInput, U::kWgrad);
    RecipeCounts c_dd, c_dw, c_wd, c_wx, c_dd_ref, c_dw_ref, c_wd_ref, c_wx_ref;
    std::vector<float> di(s.N * s.C), dw(s.OC * s.C), db(s.OC);
    layers::matmul_backward_quantized_cpu(
        ex_, di.data(), dw.data(), db.data(), d.data(), x.data(), w.data(), s.N, s.C, s.OC,
        {{&rdd, &c_dd}, {&rdw, &c_dw}, {&rwd, &c_wd}, {&rwx, &c_wx}});
    std::vector<float> di_r(s.N * s.C), dw_r(s.OC * s.C), db_r(s.OC), unused(s.OC * s.C);
    layers::matmul_backward_reference(
        di_r.data(), unused.data(), nullptr, quantized(d, s.N, s.OC, rdd, &c_dd_ref).data(),
        x.data(), quantized(w, s.OC, s.C, rdw, &c_dw_ref).data(), s.N, s.C, s.OC);
    layers::matmul_backward_reference(
        nullptr, dw_r.data(), nullptr, quantized(d, s.N, s.OC, rwd, &c_wd_ref).data(),
        quantized(x, s.N, s.C, rwx, &c_wx_ref).data(), w.data(), s.N, s.C, s.OC);
    // The bias gradient from dout as read.
    layers::matmul_backward_reference(nullptr, unused.data(), db_r.data(), d.data(), x.data(),
                                      w.data(), s.N, s.C, s.OC);
    expect_close(di, di_r, "dinp" + at);
    expect_close(dw, dw_r, "dweight" + at);
    expect_close(db, db_r, "dbias" + at);
    EXPECT_EQ(c_dd, c_dd_ref) << at;
    EXPECT_EQ(c_dw, c_dw_ref) << at;
    EXPECT_EQ(c_wd, c_wd_ref) << at;
    EXPECT_EQ(c_wx, c_wx_ref) << at;
  }
}

TEST_P(QuantizedMatmulTest, WithoutRecipesItIsThePlainLayerBitForBit) {
  const std::size_t N = 37, C = 40, OC = 19;
  const auto x = randn(N * C, 61), w = randn(OC * C, 62), b = randn(OC, 63), d = randn(N * OC, 64);
  std::vector<float> out(N * OC), out_q(N * OC);
  layers::matmul_forward_cpu(ex_, out.data(), x.data(), w.data(), b.data(), N, C, OC);
  layers::matmul_forward_quantized_cpu(ex_, out_q.data(), x.data(), w.data(), b.data(), N, C, OC,
                                       {}, {});
  EXPECT_EQ(out, out_q);
  std::vector<float> di(N * C), dw(OC * C), db(OC), di_q(N * C), dw_q(OC * C), db_q(OC);
  layers::matmul_backward_cpu(ex_, di.data(), dw.data(), db.data(), d.data(), x.data(), w.data(), N,
                              C, OC);
  layers::matmul_backward_quantized_cpu(ex_, di_q.data(), dw_q.data(), db_q.data(), d.data(),
                                        x.data(), w.data(), N, C, OC, {});
  EXPECT_EQ(di, di_q);
  EXPECT_EQ(dw, dw_q);
  EXPECT_EQ(db, db_q);
}

INSTANTIATE_TEST_SUITE_P(Modes, QuantizedMatmulTest, ::testing::ValuesIn(kScaledModes),
                         [](const auto& info) {
                           std::string n(precision_name(info.param));
                           for (char& ch : n) ch = ch == '-' ? '_' : ch;
                           return n;
                         });

// ---- Delayed scaling -------------------------------------------------------------------------

TEST(DelayedScalingTest, TheScaleComesFromTheLastStepsAmaxesPushedAfterUse) {
  DelayedScaling ds({"h0.mlp.fc"}, {.history_length = 3, .margin = 0});
  ASSERT_EQ(ds.inputs().size(), 3u);
  const int in = ds.index("h0.mlp.fc", GemmOperand::kInput);
  const int dy = ds.index("h0.mlp.fc", GemmOperand::kOutputGrad);
  ASSERT_GE(in, 0);
  ASSERT_GE(dy, 0);
  EXPECT_EQ(ds.inputs()[std::size_t(in)].name, "h0.mlp.fc.input");
  EXPECT_EQ(ds.index("h9.mlp.fc", GemmOperand::kInput), -1);
  const auto i = std::size_t(in), g = std::size_t(dy);
  EXPECT_EQ(ds.scale(i), 1.0f);  // no history yet
  // Step 0: two micro-batches; the step's amax is their max, pushed at the end.
  ds.record(i, 2.0);
  ds.record(i, 4.0);
  EXPECT_EQ(ds.scale(i), 1.0f);  // not before the step ends
  ds.end_step(ds.step_amaxes());
  EXPECT_EQ(ds.scale(i), 448.0f / 4.0f);
  EXPECT_EQ(ds.scale(g), 1.0f);  // not quantised in step 0: nothing pushed
  EXPECT_TRUE(ds.history(g).history().empty());
  for (double a : {1.0, 0.5, 0.25}) {
    ds.record(i, a);
    ds.end_step(ds.step_amaxes());
  }
  // The history holds 1, 0.5, 0.25: 4 has left the window.
  EXPECT_EQ(std::vector<float>(ds.history(i).history().begin(), ds.history(i).history().end()),
            (std::vector<float>{1.0f, 0.5f, 0.25f}));
  EXPECT_EQ(ds.scale(i), 448.0f);
  // Margin 2 divides by 4 at once; length 1 keeps the newest.
  ds.apply(i, {.history_length = 1, .margin = 2});
  EXPECT_EQ(ds.scale(i), 448.0f / 0.25f / 4.0f);
  EXPECT_EQ(ds.history(i).history().size(), 1u);
  // Gradients: E5M2.
  ds.record(g, 8.0);
  ds.end_step(ds.step_amaxes());
  EXPECT_EQ(ds.scale(g), 57344.0f / 8.0f);
  // restore() puts back the history and the scale as saved (a scale may outlive the amaxes that
  // gave it: AmaxHistoryTest.RestoreTakesTheScaleTheAmaxesCannotSay), and goes on from there.
  DelayedScaling copy({"h0.mlp.fc"}, {});
  const auto h = ds.history(i).history();
  copy.restore(i, ds.settings(i), std::vector<float>(h.begin(), h.end()), ds.scale(i));
  EXPECT_EQ(copy.scale(i), ds.scale(i));
  copy.restore(i, ds.settings(i), std::vector<float>(h.begin(), h.end()), 3.0f);
  EXPECT_EQ(copy.scale(i), 3.0f);
  EXPECT_THROW(copy.restore(i, ds.settings(i), std::vector<float>(h.begin(), h.end()), 0.0f),
               Error);
}

TEST(GemmPrecisionSetTest, LayersMoveToBf16AndBackAndDelayedSettingsApplyFromTheirStep) {
  GemmPrecisionSet set({"h0.mlp.fc", "h0.attn.qkv"});
  EXPECT_EQ(set.add_bf16("h0.mlp.fc", 3), "");
  EXPECT_NE(set.add_bf16("h9.mlp.fc", 3), "");
  EXPECT_NE(set.add_bf16("h0.mlp.fc", -1), "");
  EXPECT_FALSE(set.bf16("h0.mlp.fc", 2));
  EXPECT_TRUE(set.bf16("h0.mlp.fc", 3));
  EXPECT_FALSE(set.bf16("h0.attn.qkv", 3));
  EXPECT_EQ(set.bf16_layers(3), std::vector<std::string>{"h0.mlp.fc"});
  EXPECT_TRUE(set.remove_bf16("h0.mlp.fc"));
  EXPECT_FALSE(set.bf16("h0.mlp.fc", 3));
  EXPECT_EQ(set.add_bf16("*", 0), "");
  EXPECT_TRUE(set.bf16("h0.attn.qkv", 0));

  EXPECT_EQ(set.set_delayed("*", {.history_length = 4, .margin = 1}, 2), "");
  EXPECT_EQ(set.set_delayed("h0.mlp.fc", {.history_length = 8, .margin = 0}, 5), "");
  EXPECT_NE(set.set_delayed("h0.mlp.fc", {.history_length = 0, .margin = 0}, 5), "");
  EXPECT_NE(set.set_delayed("h0.mlp.fc", {.history_length = 4, .margin = 65}, 5), "");
  EXPECT_FALSE(set.delayed("h0.mlp.fc", 1).has_value());
  EXPECT_EQ(set.delayed("h0.mlp.fc", 2)->history_length, 4);  // "*" until its own entry is due
  EXPECT_EQ(set.delayed("h0.mlp.fc", 5)->history_length, 8);
  EXPECT_EQ(set.delayed("h0.attn.qkv", 5)->margin, 1);
  EXPECT_EQ(set.delayed_entries().size(), 2u);
}

// ---- Training --------------------------------------------------------------------------------

using testing::corpus;
using testing::make;
using testing::tiny;

void expect_same_state(Trainer& a, Trainer& b) {
  for (auto buf : {&Gpt::param_buffer, &Gpt::m_buffer, &Gpt::v_buffer}) {
    const Tensor x = (a.model().*buf)(), y = (b.model().*buf)();
    ASSERT_EQ(x.bytes(), y.bytes());
    EXPECT_EQ(std::memcmp(x.data, y.data, x.bytes()), 0);
  }
  // Two fp8-delayed runs: the same scales, amax histories and settings.
  const DelayedScaling *x = a.delayed_scaling(), *y = b.delayed_scaling();
  if (x == nullptr || y == nullptr) return;
  for (std::size_t i = 0; i < x->inputs().size(); ++i) {
    EXPECT_EQ(x->scale(i), y->scale(i)) << x->inputs()[i].name;
    EXPECT_TRUE(std::ranges::equal(x->history(i).history(), y->history(i).history()))
        << x->inputs()[i].name;
    EXPECT_EQ(x->settings(i), y->settings(i)) << x->inputs()[i].name;
  }
}

// Every on_quantized call of the chosen steps.
class QuantRecorder : public TensorObserver {
 public:
  struct Seen {
    std::string name, layer;
    GemmOperand operand;
    TensorRole role;
    GemmUse use;
    Recipe recipe;
    RecipeCounts counts;
    std::vector<float> history;
    std::int64_t step;
    int micro_step;
    bool what_if;
  };
  std::vector<std::int64_t> steps;  // empty: every step
  std::vector<Seen> seen;
  bool observe_step(std::int64_t step) override {
    return steps.empty() || std::find(steps.begin(), steps.end(), step) != steps.end();
  }
  void on_quantized(const QuantizedGemmInput& q) override {
    seen.push_back({std::string(q.name), std::string(q.layer), q.operand, q.role, q.use, q.recipe,
                    q.counts, std::vector<float>(q.amax_history.begin(), q.amax_history.end()),
                    q.step, q.micro_step, q.what_if});
  }
  // The FP32 views of the tensors named in `keep` (their first showing).
  std::vector<std::string> keep;
  std::map<std::string, std::vector<float>> kept;
  void on_tensor(const TensorView& t) override {
    if (std::find(keep.begin(), keep.end(), t.name) == keep.end() ||
        kept.count(std::string(t.name)) > 0) {
      return;
    }
    ASSERT_EQ(t.dtype, Format::kFP32) << t.name;
    std::int64_t n = 1;
    for (std::int64_t d : t.shape) n *= d;
    const auto* d = static_cast<const float*>(t.data);
    kept[std::string(t.name)].assign(d, d + n);
  }
};

TEST(Fp8TrainingTest, EveryModeTrainsWithItsLossFallingAndFinite) {
  for (auto mode : kScaledModes) {
    auto t = make(tiny(mode, 60));
    std::vector<StepEvent> ev;
    while (t->next_step() < 60) ev.push_back(t->step());
    const double val = t->evaluate(4);
    for (const auto& e : ev) {
      ASSERT_TRUE(std::isfinite(e.loss)) << precision_name(mode) << " step " << e.step;
      EXPECT_FALSE(e.skipped) << precision_name(mode) << " step " << e.step;
    }
    // The synthetic corpus starts near ln(47) = 3.85.
    EXPECT_GT(ev.front().loss, 3.5) << precision_name(mode);
    EXPECT_LT(ev.back().loss, ev.front().loss - 1.0) << precision_name(mode);
    EXPECT_TRUE(std::isfinite(val)) << precision_name(mode);
    EXPECT_LT(val, ev.front().loss - 1.0) << precision_name(mode);
  }
}

// Observed on every step, so the what-if measurement runs on every GEMM: it changes nothing.
TEST(Fp8TrainingTest, EveryLayerInBf16IsAmpBf16BitForBit) {
  const auto reference = make(tiny(PrecisionMode::kAmpBF16, 4));
  std::vector<StepEvent> want;
  for (int i = 0; i < 4; ++i) want.push_back(reference->step());
  for (auto mode : kScaledModes) {
    auto t = make(tiny(mode, 4));
    ASSERT_EQ(t->gemm_precision().add_bf16("*", 0), "");
    QuantRecorder rec;
    t->set_observer(&rec);
    for (int i = 0; i < 4; ++i) {
      const StepEvent e = t->step();
      EXPECT_EQ(e.loss, want[std::size_t(i)].loss) << precision_name(mode) << " step " << i;
      EXPECT_EQ(e.bf16_gemms, t->model().gemm_layers()) << "'*' is every linear layer";
    }
    const bool blocks = gemm_block_length(mode) > 0;
    EXPECT_EQ(rec.seen.size(), std::size_t(4 * 8 * (blocks ? 6 : 3))) << precision_name(mode);
    for (const auto& s : rec.seen) EXPECT_TRUE(s.what_if) << s.name;
    expect_same_state(*t, *reference);
  }
}

TEST(Fp8TrainingTest, ALayerInBf16IsNotQuantisedFromItsStepUntilItIsRemoved) {
  auto t = make(tiny(PrecisionMode::kMXFP8, 6));
  ASSERT_EQ(t->gemm_precision().add_bf16("h1.mlp.fc", 2), "");
  EXPECT_NE(t->gemm_precision().add_bf16("lm_head", 2), "");  // the head is never quantised
  QuantRecorder rec;
  t->set_observer(&rec);
  std::vector<StepEvent> ev;
  for (int i = 0; i < 6; ++i) {
    if (i == 4) {
      EXPECT_TRUE(t->gemm_precision().remove_bf16("h1.mlp.fc"));
    }
    ev.push_back(t->step());
  }
  std::map<std::int64_t, int> fc_seen, fc_what_if, other_seen;
  for (const auto& s : rec.seen) {
    if (s.layer != "h1.mlp.fc") {
      EXPECT_FALSE(s.what_if) << s.name;
      ++other_seen[s.step];
    } else {
      ++(s.what_if ? fc_what_if : fc_seen)[s.step];
    }
  }
  // Block recipes: input and weight forward, output_grad and weight in dgrad, output_grad and
  // input in wgrad; in BF16 the same six are what-if counts.
  for (std::int64_t s = 0; s < 6; ++s) {
    const bool bf16 = s == 2 || s == 3;
    EXPECT_EQ(fc_seen[s], bf16 ? 0 : 6) << "step " << s;
    EXPECT_EQ(fc_what_if[s], bf16 ? 6 : 0) << "step " << s;
    EXPECT_EQ(other_seen[s], 7 * 6) << "step " << s;
  }
  EXPECT_TRUE(ev[1].bf16_gemms.empty());
  EXPECT_EQ(ev[2].bf16_gemms, std::vector<std::string>{"h1.mlp.fc"});
  EXPECT_TRUE(ev[4].bf16_gemms.empty());
}

TEST(Fp8TrainingTest, TheHookReportsEachQuantisationWithItsRecipeAndCounts) {
  for (auto mode : kScaledModes) {
    auto t = make(tiny(mode, 2));
    QuantRecorder rec;
    rec.steps = {1};
    t->set_observer(&rec);
    t->step();
    t->step();
    const bool blocks = gemm_block_length(mode) > 0;
    // 2 blocks x 4 linear layers, 3 reports each per micro-batch (per-tensor), 6 (blocks).
    EXPECT_EQ(rec.seen.size(), std::size_t(8 * (blocks ? 6 : 3))) << precision_name(mode);
    for (const auto& s : rec.seen) {
      EXPECT_EQ(s.step, 1);
      EXPECT_EQ(s.name, s.layer + "." + std::string(operand_name(s.operand)));
      EXPECT_EQ(s.counts.recipe, s.recipe) << s.name;
      const auto want = gemm_recipe(mode, s.operand, s.use);
      ASSERT_TRUE(want.has_value()) << s.name;
      EXPECT_EQ(s.recipe.element, want->element) << s.name;
      EXPECT_EQ(s.recipe.block_rows, want->block_rows) << s.name;
      EXPECT_EQ(s.recipe.block_cols, want->block_cols) << s.name;
      EXPECT_GT(s.counts.values, 0u) << s.name;
      EXPECT_GT(s.counts.amax, 0.0) << s.name;
      EXPECT_EQ(s.role, s.operand == GemmOperand::kInput    ? TensorRole::kActivation
                        : s.operand == GemmOperand::kWeight ? TensorRole::kWeight
                                                            : TensorRole::kActivationGrad);
      EXPECT_EQ(s.history.empty(), mode != PrecisionMode::kFP8Delayed) << s.name;
    }
  }
}

// What-if measurement: h0.attn.qkv runs BF16 and its inputs are counted against the recipe,
// the same reports (names, GEMM uses, micro-batches) as when the layer is quantised. It is the
// run's first linear layer, so at step 0 its forward inputs are those of a run that quantises
// it: the counts must be equal, and equal to recipe_counts of h0.ln1 rounded to BF16 (the input
// as the GEMM reads it). Under fp8-delayed its histories record nothing while it runs BF16.
TEST(Fp8TrainingTest, WhatIfCountsAreTheRecipesCountsOfTheInputsTheBf16GemmRead) {
  for (auto mode : kScaledModes) {
    auto bf16 = make(tiny(mode, 3));
    auto quantised = make(tiny(mode, 3));
    ASSERT_EQ(bf16->gemm_precision().add_bf16("h0.attn.qkv", 0), "");
    QuantRecorder what_if, applied;
    what_if.keep = {"h0.ln1"};
    bf16->set_observer(&what_if);
    quantised->set_observer(&applied);
    for (int i = 0; i < 3; ++i) {
      bf16->step();
      quantised->step();
    }
    std::vector<const QuantRecorder::Seen*> w, a;
    for (const auto& s : what_if.seen) {
      EXPECT_EQ(s.what_if, s.layer == "h0.attn.qkv") << s.name;
      if (s.layer == "h0.attn.qkv") w.push_back(&s);
    }
    for (const auto& s : applied.seen) {
      EXPECT_FALSE(s.what_if);
      if (s.layer == "h0.attn.qkv") a.push_back(&s);
    }
    ASSERT_EQ(w.size(), a.size()) << precision_name(mode);
    ASSERT_EQ(w.size(), std::size_t(3 * (gemm_block_length(mode) > 0 ? 6 : 3)));
    for (std::size_t i = 0; i < w.size(); ++i) {
      EXPECT_EQ(w[i]->name, a[i]->name);
      EXPECT_EQ(w[i]->use, a[i]->use) << w[i]->name;
      EXPECT_EQ(w[i]->step, a[i]->step) << w[i]->name;
      EXPECT_EQ(w[i]->counts.recipe, w[i]->recipe) << w[i]->name;
      if (w[i]->step == 0 && w[i]->use == GemmUse::kForward) {
        EXPECT_EQ(w[i]->counts, a[i]->counts) << precision_name(mode) << " " << w[i]->name;
      }
      if (mode == PrecisionMode::kFP8Delayed) {
        EXPECT_TRUE(w[i]->history.empty()) << w[i]->name << " step " << w[i]->step;
        EXPECT_EQ(w[i]->recipe.scale, 1.0f) << w[i]->name << " step " << w[i]->step;
        EXPECT_EQ(a[i]->history.size(), std::size_t(a[i]->step)) << a[i]->name;
      }
    }
    ASSERT_EQ(w[0]->name, "h0.attn.qkv.input");
    ASSERT_EQ(w[0]->step, 0);
    std::vector<float> ln1 = what_if.kept.at("h0.ln1");
    round_through(ln1.data(), ln1.size(), Format::kBF16);
    const std::size_t C = 32;
    const RecipeCounts want =
        recipe_counts(ln1.data(), ln1.size(), Format::kFP32, C,
                      *gemm_recipe(mode, GemmOperand::kInput, GemmUse::kForward));
    EXPECT_EQ(w[0]->counts, want) << precision_name(mode);
    EXPECT_GT(want.values, 0u);
  }
}

// Loss cost (Gpt::set_loss_cost_every): the tensors of one step as FP32 (by name and role), and
// every quantiser report's loss cost.
class CostRecorder : public TensorObserver {
 public:
  std::int64_t keep_step = 2;
  std::map<std::pair<std::string, TensorRole>, std::vector<float>> kept;
  struct Cost {
    std::string name, layer;
    GemmOperand operand;
    GemmUse use;
    std::int64_t step;
    bool what_if;
    std::optional<double> cost;
  };
  std::vector<Cost> seen;
  bool observe_step(std::int64_t) override { return true; }
  void on_tensor(const TensorView& t) override {
    const auto key = std::pair{std::string(t.name), t.role};
    if (t.step != keep_step || kept.count(key) > 0) return;
    std::int64_t n = 1;
    for (std::int64_t d : t.shape) n *= d;
    std::vector<float> v(static_cast<std::size_t>(n));
    convert_to_fp32(t.data, v.data(), v.size(), t.dtype);
    kept[key] = std::move(v);
  }
  void on_quantized(const QuantizedGemmInput& q) override {
    seen.push_back({std::string(q.name), std::string(q.layer), q.operand, q.use, q.step,
                    q.what_if, q.loss_cost});
  }
};

// h0.attn.qkv's output (N, OC) from its input, weight and bias as the step read them (BF16),
// each operand first through `r_in` / `r_w` when given; FP64 sums, stored as BF16.
std::vector<float> qkv_output(const CostRecorder& rec, const Recipe* r_in, const Recipe* r_w) {
  std::vector<float> x = rec.kept.at({"h0.ln1", TensorRole::kActivation});
  std::vector<float> w = rec.kept.at({"h0.attn.qkv.weight", TensorRole::kWeight});
  std::vector<float> b = rec.kept.at({"h0.attn.qkv.bias", TensorRole::kWeight});
  for (auto* v : {&x, &w, &b}) round_through(v->data(), v->size(), Format::kBF16);
  const std::size_t C = 32, N = x.size() / C, OC = w.size() / C;
  if (r_in != nullptr) fake_quantize(x.data(), x.data(), N, C, *r_in);
  if (r_w != nullptr) fake_quantize(w.data(), w.data(), OC, C, *r_w);
  std::vector<float> y(N * OC);
  for (std::size_t i = 0; i < N; ++i) {
    for (std::size_t o = 0; o < OC; ++o) {
      double sum = b[o];
      for (std::size_t k = 0; k < C; ++k) sum += double(x[i * C + k]) * w[o * C + k];
      y[i * OC + o] = static_cast<float>(sum);
    }
  }
  round_through(y.data(), y.size(), Format::kBF16);
  return y;
}

// The reported cost is sum(dout x (Y_recipe - Y)) / dloss (dloss 1 here: static scale 1, one
// micro-batch), whichever of the two outputs the layer ran: recomputed from the tensors the step
// showed, to within the GEMMs' summation order (a part in 10^4 of sum |dout x E|).
TEST(Fp8TrainingTest, LossCostIsTheOutputErrorDottedWithTheLossGradient) {
  for (auto mode : {PrecisionMode::kFP8Current, PrecisionMode::kMXFP8, PrecisionMode::kNVFP4}) {
    for (const bool in_bf16 : {false, true}) {
      TrainerConfig c = tiny(mode, 4);
      c.loss_cost_every = 2;
      auto t = make(c);
      if (in_bf16) {
        ASSERT_EQ(t->gemm_precision().add_bf16("h0.attn.qkv", 0), "");
      }
      CostRecorder rec;
      t->set_observer(&rec);
      for (int i = 0; i < 4; ++i) t->step();
      const std::string what = std::string(precision_name(mode)) + (in_bf16 ? " bf16" : "");
      // Costs only on the output gradient's dgrad report of steps 0 and 2, every layer.
      std::map<std::int64_t, int> per_step;
      std::optional<double> cost;
      for (const auto& s : rec.seen) {
        const bool carrier = s.operand == GemmOperand::kOutputGrad && s.use == GemmUse::kDgrad;
        EXPECT_EQ(s.cost.has_value(), carrier && s.step % 2 == 0) << what << " " << s.name;
        if (!s.cost) continue;
        ++per_step[s.step];
        EXPECT_EQ(s.what_if, in_bf16 && s.layer == "h0.attn.qkv") << what << " " << s.name;
        if (s.layer == "h0.attn.qkv" && s.step == 2) cost = s.cost;
      }
      EXPECT_EQ(per_step, (std::map<std::int64_t, int>{{0, 8}, {2, 8}})) << what;
      ASSERT_TRUE(cost) << what;
      const Recipe r_in = *gemm_recipe(mode, GemmOperand::kInput, GemmUse::kForward);
      const Recipe r_w = *gemm_recipe(mode, GemmOperand::kWeight, GemmUse::kForward);
      const std::vector<float> shown = rec.kept.at({"h0.attn.qkv", TensorRole::kActivation});
      const std::vector<float> other =
          in_bf16 ? qkv_output(rec, &r_in, &r_w) : qkv_output(rec, nullptr, nullptr);
      const std::vector<float> d = rec.kept.at({"h0.attn.qkv", TensorRole::kActivationGrad});
      ASSERT_EQ(shown.size(), other.size());
      ASSERT_EQ(d.size(), shown.size());
      double want = 0.0, scale = 0.0;
      for (std::size_t i = 0; i < d.size(); ++i) {
        const double e = in_bf16 ? double(other[i]) - shown[i] : double(shown[i]) - other[i];
        want += d[i] * e;
        scale += std::abs(d[i] * e);
      }
      EXPECT_GT(scale, 0.0) << what;
      EXPECT_NEAR(*cost, want, 1e-4 * scale) << what;
    }
  }
}

// Only the steps the observer takes are measured: there, every GEMM input of the BF16 layer is
// reported once per micro-batch (block recipe: six), elsewhere nothing is.
TEST(Fp8TrainingTest, WhatIfCountsComeOnlyOnObservedSteps) {
  TrainerConfig c = tiny(PrecisionMode::kNVFP4, 4);
  c.accum = 2;
  c.batch = 4;
  auto t = make(c);
  ASSERT_EQ(t->gemm_precision().add_bf16("h1.attn.proj", 0), "");
  QuantRecorder rec;
  rec.steps = {2};
  t->set_observer(&rec);
  for (int i = 0; i < 4; ++i) t->step();
  std::map<std::pair<std::int64_t, int>, int> what_if;
  for (const auto& s : rec.seen) {
    EXPECT_EQ(s.step, 2) << s.name;
    if (s.what_if) ++what_if[{s.step, s.micro_step}];
    EXPECT_EQ(s.what_if, s.layer == "h1.attn.proj") << s.name;
  }
  EXPECT_EQ(what_if, (std::map<std::pair<std::int64_t, int>, int>{{{2, 0}, 6}, {{2, 1}, 6}}));
}

// Backend::gemm_operand_counts' host-copy default (the CUDA back end's) and the CPU's in-place
// override count the same: the operand read and rounded to the compute format, rows of its last
// dimension.
TEST(Fp8TrainingTest, GemmOperandCountsAreTheSameThroughTheHostCopy) {
  auto backend = make_cpu_backend({.blas_threads = 1});
  std::vector<float> x = randn(3 * 5 * 48, 7);
  for (std::size_t i = 0; i < x.size(); i += 11) x[i] *= 1e-6f;  // some underflow
  x[3] = 3e4f;                                                   // and one outlier
  const Tensor t(x.data(), Format::kFP32, {3, 5, 48}, Device::kCpu);
  for (auto mode : kScaledModes) {
    const Recipe r = *gemm_recipe(mode, GemmOperand::kInput, GemmUse::kForward);
    const RecipeCounts own = backend->gemm_operand_counts(t, Format::kBF16, r);
    EXPECT_EQ(backend->Backend::gemm_operand_counts(t, Format::kBF16, r), own)
        << precision_name(mode);
    std::vector<float> rounded = x;
    round_through(rounded.data(), rounded.size(), Format::kBF16);
    EXPECT_EQ(own, recipe_counts(rounded.data(), rounded.size(), Format::kFP32, 48, r))
        << precision_name(mode);
    EXPECT_GT(own.underflow, 0u) << precision_name(mode);
  }
}

// The what-if measurement reads and changes nothing the step computes: a run observed on every
// step (measuring its BF16 layers against the recipe) ends bit for bit where an unobserved one
// does, delayed histories included.
TEST(Fp8TrainingTest, WhatIfMeasurementLeavesTheRunUnchanged) {
  for (auto mode : kScaledModes) {
    TrainerConfig c = tiny(mode, 4);
    c.loss_cost_every = 1;  // and the loss cost, every step
    auto watched = make(c);
    auto quiet = make(c);
    for (Trainer* t : {watched.get(), quiet.get()}) {
      ASSERT_EQ(t->gemm_precision().add_bf16("h0.attn.qkv", 0), "");
      ASSERT_EQ(t->gemm_precision().add_bf16("h1.mlp.fc", 2), "");
    }
    QuantRecorder rec;
    watched->set_observer(&rec);
    for (int i = 0; i < 4; ++i) {
      const StepEvent a = watched->step(), b = quiet->step();
      EXPECT_EQ(a.loss, b.loss) << precision_name(mode) << " step " << i;
      EXPECT_EQ(a.bf16_gemms, b.bf16_gemms);
    }
    expect_same_state(*watched, *quiet);  // delayed histories included
  }
}

// Under fp8-delayed every quantisation of step s uses 448 (E4M3) or 57344 (E5M2) over the max
// of the amaxes of steps s-3 .. s-1 (history length 3), each the max over the micro-batches of
// its step, as the hook reported them.
TEST(Fp8TrainingTest, DelayedScalingUsesTheAmaxesOfThePreviousSteps) {
  TrainerConfig c = tiny(PrecisionMode::kFP8Delayed, 7);
  c.accum = 2;
  c.batch = 4;
  c.fp8_delayed = {.history_length = 3, .margin = 1};
  auto t = make(c);
  QuantRecorder rec;
  t->set_observer(&rec);
  for (int i = 0; i < 7; ++i) t->step();
  for (const std::string name :
       {"h0.attn.qkv.input", "h1.mlp.proj.weight", "h0.mlp.fc.output_grad"}) {
    std::map<std::int64_t, double> step_amax;
    std::map<std::int64_t, std::vector<const QuantRecorder::Seen*>> at;
    for (const auto& s : rec.seen) {
      if (s.name != name) continue;
      step_amax[s.step] = std::max(step_amax[s.step], s.counts.amax);
      at[s.step].push_back(&s);
    }
    ASSERT_EQ(at.size(), 7u) << name;
    const float max_elem = name.ends_with("output_grad") ? 57344.0f : 448.0f;
    for (std::int64_t step = 0; step < 7; ++step) {
      ASSERT_EQ(at[step].size(), 2u) << name << " step " << step;  // two micro-batches
      std::vector<float> window;
      for (std::int64_t k = std::max<std::int64_t>(0, step - 3); k < step; ++k) {
        window.push_back(static_cast<float>(step_amax[k]));
      }
      float want = 1.0f;
      if (!window.empty()) {
        want = max_elem / *std::max_element(window.begin(), window.end()) / 2.0f;  // margin 1
      }
      for (const auto* s : at[step]) {
        EXPECT_EQ(s->history, window) << name << " step " << step;
        EXPECT_EQ(s->recipe.scale, want) << name << " step " << step;
        EXPECT_EQ(s->counts.tensor_scale, want) << name << " step " << step;
      }
    }
  }
  // The trainer's histories end with the last step's amax.
  const DelayedScaling* ds = t->delayed_scaling();
  ASSERT_NE(ds, nullptr);
  const int i = ds->index("h0.attn.qkv", GemmOperand::kInput);
  EXPECT_EQ(ds->history(std::size_t(i)).history().size(), 3u);
}

TEST(Fp8TrainingTest, DelayedSettingsChangeAtTheirStep) {
  auto t = make(tiny(PrecisionMode::kFP8Delayed, 5));
  ASSERT_EQ(t->gemm_precision().set_delayed("h0.mlp.fc", {.history_length = 2, .margin = 3}, 3),
            "");
  QuantRecorder rec;
  t->set_observer(&rec);
  for (int i = 0; i < 5; ++i) t->step();
  // The margin is in the scale (a delayed recipe's own margin stays 0, so the recipe reads back
  // from its canonical text): max_elem / max(window) / 2^margin, margin 3 from step 3.
  for (const auto& s : rec.seen) {
    EXPECT_EQ(s.recipe.margin, 0) << s.name;
    const bool changed = s.layer == "h0.mlp.fc";
    EXPECT_EQ(s.history.size(), std::size_t(changed && s.step >= 3 ? 2 : s.step)) << s.name;
    if (s.history.empty()) continue;
    const float amax = *std::max_element(s.history.begin(), s.history.end());
    const float max_elem = s.recipe.element == Format::kE5M2 ? 57344.0f : 448.0f;
    const float margin = changed && s.step >= 3 ? 8.0f : 1.0f;
    EXPECT_EQ(s.recipe.scale, max_elem / amax / margin) << s.name << " step " << s.step;
  }
}

TEST(Fp8TrainingTest, ResumeReproducesTheUninterruptedRunBitForBit) {
  for (auto mode : {PrecisionMode::kFP8Delayed, PrecisionMode::kNVFP4}) {
    TrainerConfig c = tiny(mode, 9);
    c.accum = 2;
    c.batch = 4;
    c.fp8_delayed.history_length = 4;
    const ampscope::testing::TempDir dir;
    const std::string path = (dir / "fp8.ckpt").string();
    // The per-layer choices are part of the checkpoint.
    auto setup = [&](Trainer& t) {
      ASSERT_EQ(t.gemm_precision().add_bf16("h1.mlp.fc", 3), "");
      ASSERT_EQ(t.gemm_precision().set_delayed("*", {.history_length = 2, .margin = 1}, 4), "");
    };
    auto straight = make(c);
    setup(*straight);
    for (int i = 0; i < 5; ++i) straight->step();
    auto first = make(c);
    setup(*first);
    for (int i = 0; i < 5; ++i) first->step();
    first->save_checkpoint(path);
    first.reset();
    auto resumed = make(c);
    resumed->load_checkpoint(path);
    EXPECT_EQ(resumed->gemm_precision().bf16_entries(), straight->gemm_precision().bf16_entries());
    EXPECT_EQ(resumed->gemm_precision().delayed_entries().size(), 1u);
    for (int i = 5; i < 9; ++i) {
      const StepEvent a = straight->step(), b = resumed->step();
      EXPECT_EQ(a.loss, b.loss) << precision_name(mode) << " step " << i;
      EXPECT_EQ(a.grad_norm, b.grad_norm) << precision_name(mode) << " step " << i;
      EXPECT_EQ(a.bf16_gemms, b.bf16_gemms);
    }
    expect_same_state(*straight, *resumed);  // delayed histories included
  }
}

// A checkpoint written before the FP8/FP4 modes has no gemm_bf16 / gemm_delayed fields.
TEST(Fp8TrainingTest, ACheckpointWithoutTheGemmFieldsStillLoads) {
  const TrainerConfig c = tiny(PrecisionMode::kAmpBF16, 3);
  const ampscope::testing::TempDir dir;
  const std::string path = (dir / "old.ckpt").string();
  auto t = make(c);
  t->step();
  t->save_checkpoint(path);
  std::string bytes;
  {
    std::ifstream f(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  std::uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data() + 12, 8);
  nlohmann::json h = nlohmann::json::parse(bytes.substr(20, header_len));
  ASSERT_TRUE(h.contains("gemm_bf16"));
  h.erase("gemm_bf16");
  h.erase("gemm_delayed");
  const std::string header = h.dump();
  const std::uint64_t len = header.size();
  std::string old = bytes.substr(0, 12);
  old.append(reinterpret_cast<const char*>(&len), 8);
  old += header;
  old += bytes.substr(20 + header_len, bytes.size() - 4 - 20 - header_len);
  const auto crc = static_cast<std::uint32_t>(
      crc32(0L, reinterpret_cast<const Bytef*>(old.data()), static_cast<uInt>(old.size())));
  old.append(reinterpret_cast<const char*>(&crc), 4);
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(old.data(), static_cast<std::streamsize>(old.size()));
  }
  auto resumed = make(c);
  resumed->load_checkpoint(path);
  EXPECT_EQ(resumed->next_step(), 1);
  EXPECT_TRUE(resumed->gemm_precision().bf16_entries().empty());
  EXPECT_EQ(resumed->step().loss, t->step().loss);
}

TEST(Fp8TrainingTest, ABackEndWithoutRecipesIsRefusedAtStart) {
  for (auto mode : kScaledModes) {
    try {
      Trainer t(tiny(mode, 1), corpus(),
                std::make_unique<testing::CountingBackend>(make_cpu_backend({.blas_threads = 1})));
      ADD_FAILURE() << precision_name(mode) << ": expected an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(precision_name(mode)), std::string::npos) << e.what();
    }
  }
  // The other modes do not need them.
  EXPECT_NO_THROW(
      Trainer(tiny(PrecisionMode::kAmpBF16, 1), corpus(),
              std::make_unique<testing::CountingBackend>(make_cpu_backend({.blas_threads = 1}))));
}

TEST(Fp8TrainingTest, BadDelayedSettingsAreRejected) {
  TrainerConfig c = tiny(PrecisionMode::kFP8Delayed, 1);
  c.fp8_delayed.history_length = 0;
  EXPECT_NE(validate(c), "");
  c.fp8_delayed = {.history_length = 16, .margin = -1};
  EXPECT_NE(validate(c), "");
}

}  // namespace
}  // namespace ampscope::trainer
