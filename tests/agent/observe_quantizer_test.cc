// Agent::observe_quantizer: a quantiser's counts travel in the step's report exactly as
// fake_quantize returned them, the amax history only on full steps, and measurements the
// server would refuse are refused here (a notice, a counted drop, nothing sent).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "ampscope/agent/agent.h"
#include "ampscope/recipe.h"
#include "ampscope/testing/files.h"
#include "fake_step.h"
#include "quantizer_wire.h"
#include "spool_reader.h"

namespace ampscope::agent {
namespace {

using ampscope::testing::TempDir;
using testing::base_config;
using testing::make_agent;

// 2 x 64 values over many binades: some underflow E4M3 under a per-tensor scale, the first
// block's amax rounds its MX scale down so that its largest values saturate.
std::vector<float> gemm_input() {
  std::vector<float> x(128);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double sign = i % 3 == 0 ? -1.0 : 1.0;
    x[i] =
        static_cast<float>(sign * std::ldexp(1.0 + (i % 7) / 8.0, static_cast<int>(i % 29) - 20));
  }
  x[5] = 511.0f;  // 511 / 2^(8 - 8) = 511 > 448: saturates under MX's rounded-down scale
  return x;
}

RecipeCounts counts_of(const std::string& recipe_text) {
  const std::optional<Recipe> recipe = parse_recipe(recipe_text);
  EXPECT_TRUE(recipe.has_value()) << recipe_text;
  const std::vector<float> x = gemm_input();
  return fake_quantize(x.data(), nullptr, 2, 64, *recipe);
}

using testing::expect_wire_equals;

QuantizerView view(const char* name, TensorRole role, const RecipeCounts& counts,
                   std::span<const float> history = {}) {
  QuantizerView v;
  v.name = name;
  v.role = role;
  v.phase = TensorPhase::kForward;
  v.counts = counts;
  v.amax_history = history;
  return v;
}

TEST(ObserveQuantizerTest, ReportsCarryTheCountsAndTheHistoryOnFullSteps) {
  TempDir dir;
  AgentConfig c = base_config(dir, "fp8");
  c.sampling.full_every = 2;  // full steps 0 and 2
  const RecipeCounts mx = counts_of("mxfp8_e4m3");
  const RecipeCounts delayed = counts_of("e4m3:scale=112");
  // The data the test relies on: MX saturates a block, the delayed scale loses small values.
  ASSERT_GT(mx.saturated, 0u);
  ASSERT_GT(mx.saturated_blocks, 0u);
  ASSERT_FALSE(mx.scale_histogram.empty());
  ASSERT_GT(delayed.underflow, 0u);
  const std::vector<float> history = {0.5f, 4.0f, 2.0f};
  {
    auto agent = make_agent(c);
    for (int step = 0; step < 3; ++step) {
      ASSERT_TRUE(agent->begin_step(step));
      ASSERT_TRUE(agent->observe_quantizer(view("h0.fc.input", TensorRole::kActivation, mx)).ok());
      const Status s =
          agent->observe_quantizer(view("h0.fc.weight", TensorRole::kWeight, delayed, history));
      ASSERT_TRUE(s.ok()) << s.message;
      StepInfo info;
      info.step = step;
      ASSERT_TRUE(agent->end_step(info).ok());
    }
    EXPECT_EQ(agent->counters().dropped_tensors, 0u);
  }
  const auto reports = testing::read_spool(dir / "spool", "fp8");
  ASSERT_EQ(reports.size(), 3u);
  for (const v1::StepReport& r : reports) {
    ASSERT_EQ(r.quantizers_size(), 2) << "step " << r.step();
    const v1::QuantizerStats& a = r.quantizers(0);
    const v1::QuantizerStats& b = r.quantizers(1);
    EXPECT_EQ(a.name(), "h0.fc.input");
    EXPECT_EQ(a.role(), v1::TENSOR_ROLE_ACTIVATION);
    EXPECT_EQ(a.phase(), v1::TENSOR_PHASE_FORWARD);
    EXPECT_EQ(a.recipe(), "mxfp8_e4m3");
    EXPECT_EQ(a.element(), v1::FORMAT_E4M3);
    expect_wire_equals(a, mx);
    EXPECT_EQ(a.amax_history_size(), 0);
    EXPECT_EQ(b.recipe(), "e4m3:scale=112");
    expect_wire_equals(b, delayed);
    EXPECT_FALSE(b.has_scale_histogram());  // a per-tensor recipe has no block scales
    const bool full = r.step() % 2 == 0;
    ASSERT_EQ(b.amax_history_size(), full ? 3 : 0) << "step " << r.step();
    if (full) {
      EXPECT_EQ(std::vector<float>(b.amax_history().begin(), b.amax_history().end()), history);
    }
  }
}

TEST(ObserveQuantizerTest, RefusesWhatTheServerWouldRefuse) {
  TempDir dir;
  AgentConfig c = base_config(dir, "bad");
  const RecipeCounts good = counts_of("e4m3:current");
  std::vector<RecipeCounts> bad(5, good);
  bad[0].underflow = good.values + 1;  // more than the values
  bad[1].underflow = good.values;      // each alone fits, together they exceed the values
  bad[1].saturated = 1;
  bad[2].amax = std::nan("");
  bad[3].recipe.element = Format::kFP16;  // no recipe rounds to FP16
  bad[4].zero_blocks = good.blocks + 1;
  const float bad_history[] = {1.0f, -2.0f};
  QuantizerView bad_cost = view("h0.fc.output_grad", TensorRole::kActivationGrad, good);
  bad_cost.loss_cost = std::numeric_limits<double>::infinity();
  {
    auto agent = make_agent(c);
    ASSERT_TRUE(agent->begin_step(0));
    for (const RecipeCounts& b : bad) {
      const Status s = agent->observe_quantizer(view("h0.fc.input", TensorRole::kActivation, b));
      EXPECT_EQ(s.code, StatusCode::kInvalidArgument) << s.message;
      EXPECT_NE(s.message.find("h0.fc.input"), std::string::npos) << s.message;
    }
    EXPECT_EQ(agent->observe_quantizer(view("w", TensorRole::kWeight, good, bad_history)).code,
              StatusCode::kInvalidArgument);
    EXPECT_EQ(agent->observe_quantizer(bad_cost).code, StatusCode::kInvalidArgument);
    ASSERT_TRUE(agent->observe_quantizer(view("ok", TensorRole::kWeight, good)).ok());
    StepInfo info;
    ASSERT_TRUE(agent->end_step(info).ok());
    bool noticed = false;
    for (const std::string& n : agent->notices()) {
      noticed = noticed || n.find("observe_quantizer") != std::string::npos;
    }
    EXPECT_TRUE(noticed);
  }
  const auto reports = testing::read_spool(dir / "spool", "bad");
  ASSERT_EQ(reports.size(), 1u);
  ASSERT_EQ(reports[0].quantizers_size(), 1);
  EXPECT_EQ(reports[0].quantizers(0).name(), "ok");
  EXPECT_EQ(reports[0].quantizers(0).recipe(), "e4m3:current");
  EXPECT_EQ(reports[0].agent().dropped_tensors(), 7u);  // the step's report counts them
}

TEST(ObserveQuantizerTest, OutsideAStepNothingIsRecorded) {
  TempDir dir;
  AgentConfig c = base_config(dir, "outside");
  const RecipeCounts good = counts_of("nvfp4");
  {
    auto agent = make_agent(c);
    EXPECT_TRUE(agent->observe_quantizer(view("early", TensorRole::kWeight, good)).ok());
    ASSERT_TRUE(agent->begin_step(0));
    StepInfo info;
    ASSERT_TRUE(agent->end_step(info).ok());
    EXPECT_TRUE(agent->observe_quantizer(view("late", TensorRole::kWeight, good)).ok());
  }
  const auto reports = testing::read_spool(dir / "spool", "outside");
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].quantizers_size(), 0);
}

// Per-layer precision: each quantiser names its layer, whether it was a what-if count and its
// loss cost when measured, and the step lists the layers that ran BF16. The spool holds them (a replay sends these bytes),
// and a layer name that is not clean text is sent escaped as the Hello's names are.
TEST(ObserveQuantizerTest, TheLayerWhatIfAndTheBf16GemmsTravelInTheReport) {
  TempDir dir;
  AgentConfig c = base_config(dir, "layers");
  const RecipeCounts applied = counts_of("mxfp8_e4m3");
  const RecipeCounts would = counts_of("nvfp4");
  const std::string odd_layer("h1.mlp\x01proj", 11);
  {
    auto agent = make_agent(c);
    ASSERT_TRUE(agent->begin_step(0));
    QuantizerView a = view("h0.mlp.fc.input", TensorRole::kActivation, applied);
    a.layer = "h0.mlp.fc";
    ASSERT_TRUE(agent->observe_quantizer(a).ok());
    QuantizerView b = view("h0.attn.qkv.output_grad", TensorRole::kActivationGrad, would);
    b.layer = "h0.attn.qkv";
    b.what_if = true;
    b.loss_cost = -1.25e-3;
    ASSERT_TRUE(agent->observe_quantizer(b).ok());
    QuantizerView d = view("h1.mlp.proj.input", TensorRole::kActivation, applied);
    d.layer = odd_layer;
    ASSERT_TRUE(agent->observe_quantizer(d).ok());
    ASSERT_TRUE(agent->observe_quantizer(view("x [nvfp4]", TensorRole::kWeight, would)).ok());
    StepInfo info;
    info.bf16_gemms = {"h0.attn.qkv", "h1.mlp.proj"};
    ASSERT_TRUE(agent->end_step(info).ok());
  }
  const auto reports = testing::read_spool(dir / "spool", "layers");
  ASSERT_EQ(reports.size(), 1u);
  const v1::StepReport& r = reports[0];
  EXPECT_EQ(std::vector<std::string>(r.bf16_gemms().begin(), r.bf16_gemms().end()),
            (std::vector<std::string>{"h0.attn.qkv", "h1.mlp.proj"}));
  ASSERT_EQ(r.quantizers_size(), 4);
  EXPECT_EQ(r.quantizers(0).layer(), "h0.mlp.fc");
  EXPECT_FALSE(r.quantizers(0).what_if());
  EXPECT_FALSE(r.quantizers(0).has_loss_cost());
  expect_wire_equals(r.quantizers(0), applied);
  EXPECT_EQ(r.quantizers(1).layer(), "h0.attn.qkv");
  EXPECT_TRUE(r.quantizers(1).what_if());
  EXPECT_EQ(r.quantizers(1).recipe(), "nvfp4");
  ASSERT_TRUE(r.quantizers(1).has_loss_cost());
  EXPECT_EQ(r.quantizers(1).loss_cost(), -1.25e-3);
  expect_wire_equals(r.quantizers(1), would);
  EXPECT_EQ(r.quantizers(2).layer(), "h1.mlp\\x01proj");
  EXPECT_EQ(r.quantizers(3).layer(), "");
  EXPECT_FALSE(r.quantizers(3).what_if());
}

}  // namespace
}  // namespace ampscope::agent
