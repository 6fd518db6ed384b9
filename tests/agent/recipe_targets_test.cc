// The recipe_targets option: host tensors measured at the full level are also counted against
// each recipe, and the counts travel as quantiser entries "TENSOR [RECIPE]" equal to
// recipe_counts of the same data (rows of the view's last dimension); counted-only steps carry
// none.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "ampscope/agent/agent.h"
#include "ampscope/agent/config.h"
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

const char* const kRecipes = "mxfp8_e4m3,nvfp4, e4m3:current";

TEST(RecipeTargetsOptionTest, ParsesCommaSeparatedRecipes) {
  AgentConfig c;
  ASSERT_EQ(set_option(c, "recipe_targets", kRecipes), "");
  ASSERT_EQ(c.recipe_targets.size(), 3u);
  EXPECT_EQ(c.recipe_targets[0], *parse_recipe("mxfp8_e4m3"));
  EXPECT_EQ(c.recipe_targets[1], *parse_recipe("nvfp4"));
  EXPECT_EQ(c.recipe_targets[2], *parse_recipe("e4m3:current"));
  EXPECT_EQ(validate(c).find("recipe_targets"), std::string::npos);
  ASSERT_EQ(set_option(c, "recipe-targets", ""), "");  // empty: none
  EXPECT_TRUE(c.recipe_targets.empty());
}

TEST(RecipeTargetsOptionTest, RefusesABadRecipeNamingIt) {
  AgentConfig c;
  ASSERT_EQ(set_option(c, "recipe_targets", "nvfp4"), "");
  const std::string bad = set_option(c, "recipe_targets", "mxfp8_e4m3,mxfp9");
  EXPECT_EQ(bad.rfind("recipe_targets: ", 0), 0u) << bad;
  EXPECT_NE(bad.find("'mxfp9'"), std::string::npos) << bad;
  const std::string twice = set_option(c, "recipe_targets", "nvfp4,mxfp4,nvfp4");
  EXPECT_NE(twice.find("'nvfp4' is given twice"), std::string::npos) << twice;
  const std::string empty = set_option(c, "recipe_targets", "nvfp4,,mxfp4");
  EXPECT_NE(empty.find("empty recipe"), std::string::npos) << empty;
  // Eight at most.
  const std::string nine =
      "mxfp8_e4m3,mxfp8_e5m2,mxfp6_e3m2,mxfp6_e2m3,mxfp4,nvfp4,e4m3:current,e5m2:current,"
      "e4m3:tile=1x128";
  const std::string too_many = set_option(c, "recipe_targets", nine);
  EXPECT_NE(too_many.find("at most 8"), std::string::npos) << too_many;
  ASSERT_EQ(set_option(c, "recipe_targets", nine.substr(0, nine.rfind(','))), "");
  EXPECT_EQ(c.recipe_targets.size(), 8u);
  // A refused value leaves the configuration as it was.
  ASSERT_EQ(set_option(c, "recipe_targets", "nvfp4"), "");
  EXPECT_NE(set_option(c, "recipe_targets", "e4m3:nonsense"), "");
  ASSERT_EQ(c.recipe_targets.size(), 1u);
  EXPECT_EQ(c.recipe_targets[0], *parse_recipe("nvfp4"));
  // Set in code past what set_option takes: validate names the field.
  c.run_id = "ok";
  c.recipe_targets.assign(9, *parse_recipe("nvfp4"));
  EXPECT_NE(validate(c).find("recipe_targets"), std::string::npos);
  c.recipe_targets.assign(1, *parse_recipe("nvfp4"));
  c.recipe_targets[0].element = Format::kFP16;  // no recipe rounds to FP16
  EXPECT_NE(validate(c).find("recipe_targets"), std::string::npos);
}

// A host tensor shown to the agent: its storage, shape and where it belongs.
struct HostTensor {
  std::string name;
  TensorRole role;
  TensorPhase phase;
  Format dtype;
  std::vector<std::int64_t> shape;
  std::vector<float> fp32;          // kFP32 storage
  std::vector<std::uint16_t> fp16;  // kFP16 storage
  int micro_step = 0;

  const void* data() const {
    return dtype == Format::kFP32 ? static_cast<const void*>(fp32.data()) : fp16.data();
  }
  std::size_t numel() const { return dtype == Format::kFP32 ? fp32.size() : fp16.size(); }
};

// Values over many binades (some lost below a block's range), one block whose amax rounds
// its MX scale down into saturation, and rows of 48 so that blocks of 32 are cut at the row's
// end: counted as one row of 192 the blocks would differ.
std::vector<HostTensor> host_tensors() {
  std::vector<HostTensor> t;
  HostTensor w{"h0.fc.weight", TensorRole::kWeight, TensorPhase::kStepStart, Format::kFP32,
               {4, 48}, {}, {}};
  for (int i = 0; i < 192; ++i) {
    const double sign = i % 3 == 0 ? -1.0 : 1.0;
    w.fp32.push_back(static_cast<float>(sign * std::ldexp(1.0 + (i % 7) / 8.0, i % 29 - 20)));
  }
  w.fp32[5] = 511.0f;  // 511 / 2^(8 - 8) > 448: saturates E4M3 under MX's rounded-down scale
  t.push_back(w);
  HostTensor a{"h0.fc", TensorRole::kActivation, TensorPhase::kForward, Format::kFP16, {3, 40},
               {}, {}};
  for (int i = 0; i < 120; ++i) {
    a.fp16.push_back(fp32_to_fp16(static_cast<float>(std::ldexp(1.0 + i % 5 / 4.0, i % 23 - 12))));
  }
  a.micro_step = 1;
  t.push_back(a);
  HostTensor b{"h0.fc.bias", TensorRole::kWeight, TensorPhase::kStepStart, Format::kFP32, {70},
               {}, {}};
  for (int i = 0; i < 70; ++i) b.fp32.push_back(static_cast<float>(0.01 * (i - 35)));
  t.push_back(b);
  return t;
}

RecipeCounts expected_counts(const HostTensor& t, const Recipe& r) {
  const std::size_t row_length = t.shape.size() >= 2 ? static_cast<std::size_t>(t.shape.back()) : 0;
  return recipe_counts(t.data(), t.numel(), t.dtype, row_length, r);
}

// As the agent sends it, and without an amax history (a recipe target has none).
void expect_recipe_target(const v1::QuantizerStats& q, const RecipeCounts& c) {
  testing::expect_wire_equals(q, c);
  EXPECT_EQ(q.amax_history_size(), 0);
}

// Runs `steps` steps showing host_tensors() and returns the spooled reports.
std::vector<v1::StepReport> run_steps(AgentConfig c, const TempDir& dir, int steps) {
  const std::vector<HostTensor> tensors = host_tensors();
  {
    auto agent = make_agent(c);
    for (int step = 0; step < steps; ++step) {
      EXPECT_TRUE(agent->begin_step(step));
      int order = 0;
      for (const HostTensor& t : tensors) {
        TensorView v;
        v.name = t.name;
        v.role = t.role;
        v.phase = t.phase;
        v.dtype = t.dtype;
        v.data = t.data();
        v.shape = t.shape;
        v.micro_step = t.micro_step;
        v.order = order++;
        EXPECT_TRUE(agent->observe(v).ok());
      }
      StepInfo info;
      info.step = step;
      EXPECT_TRUE(agent->end_step(info).ok());
    }
    EXPECT_EQ(agent->counters().dropped_tensors, 0u);
  }
  return testing::read_spool(dir / "spool", c.run_id);
}

class RecipeTargetsTest : public ::testing::TestWithParam<StatsThread> {};

TEST_P(RecipeTargetsTest, FullLevelHostTensorsCarryRecipeCounts) {
  TempDir dir;
  AgentConfig c = base_config(dir, "recipes");
  c.stats_thread = GetParam();
  c.sampling.full_every = 2;  // full steps 0 and 2; step 1 counts only
  c.sampling.count_roles = {TensorRole::kWeight, TensorRole::kActivation};
  ASSERT_EQ(set_option(c, "recipe_targets", kRecipes), "");
  const std::vector<HostTensor> tensors = host_tensors();
  // What the data makes the test exercise: MX saturates a block of the weight, and the weight
  // counted as one row would have other blocks.
  const Recipe mx = *parse_recipe("mxfp8_e4m3");
  ASSERT_GT(expected_counts(tensors[0], mx).saturated, 0u);
  EXPECT_EQ(expected_counts(tensors[0], mx).blocks, 8u);  // 4 rows of 32 + 16
  EXPECT_EQ(recipe_counts(tensors[0].data(), 192, Format::kFP32, 0, mx).blocks, 6u);

  const auto reports = run_steps(c, dir, 3);
  ASSERT_EQ(reports.size(), 3u);
  for (const v1::StepReport& r : reports) {
    if (r.step() == 1) {
      EXPECT_EQ(r.quantizers_size(), 0) << "a counts-level step carries no recipe counts";
      continue;
    }
    ASSERT_EQ(r.quantizers_size(), 9) << "step " << r.step();
    int i = 0;
    for (const HostTensor& t : tensors) {
      for (const Recipe& recipe : c.recipe_targets) {
        const v1::QuantizerStats& q = r.quantizers(i++);
        SCOPED_TRACE(t.name + " " + to_string(recipe));
        EXPECT_EQ(q.name(), t.name + " [" + to_string(recipe) + "]");
        EXPECT_EQ(q.role(), t.role == TensorRole::kWeight ? v1::TENSOR_ROLE_WEIGHT
                                                          : v1::TENSOR_ROLE_ACTIVATION);
        EXPECT_EQ(q.phase(), t.phase == TensorPhase::kForward ? v1::TENSOR_PHASE_FORWARD
                                                              : v1::TENSOR_PHASE_STEP_START);
        EXPECT_EQ(q.micro_step(), static_cast<std::uint32_t>(t.micro_step));
        expect_recipe_target(q, expected_counts(t, recipe));
      }
    }
  }
}

TEST_P(RecipeTargetsTest, WithoutTheOptionNoQuantizers) {
  TempDir dir;
  AgentConfig c = base_config(dir, "none");
  c.stats_thread = GetParam();
  c.sampling.full_every = 1;
  const auto reports = run_steps(c, dir, 2);
  ASSERT_EQ(reports.size(), 2u);
  for (const v1::StepReport& r : reports) {
    EXPECT_EQ(r.tensors_size(), 3);
    EXPECT_EQ(r.quantizers_size(), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(StatsThreads, RecipeTargetsTest,
                         ::testing::Values(StatsThread::kCaller, StatsThread::kWorker),
                         [](const auto& info) {
                           return info.param == StatsThread::kCaller ? std::string("Caller")
                                                                     : std::string("Worker");
                         });

}  // namespace
}  // namespace ampscope::agent
