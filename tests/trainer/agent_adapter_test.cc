// ampscope-train's agent adapter (trainer/src/agent_adapter.h): what it hands the agent. The
// tensor views keep the model's `held`; the precision overrides map the tensors the policy
// recommends to the layers the trainer can move to FP32, with the model's own mapping.
#include "agent_adapter.h"

#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ampscope/trainer/trainer.h"

namespace ampscope::trainer {
namespace {

TrainerConfig tiny() {
  TrainerConfig c;
  c.model = {.vocab_size = 0, .context = 16, .n_embd = 16, .n_head = 2, .n_layer = 2};
  c.precision = PrecisionMode::kAmpFP16;
  c.batch = 4;
  c.steps = 1;
  c.eval_batches = 0;
  return c;
}

std::unique_ptr<Trainer> make_trainer() {
  static const Corpus corpus = Corpus::synthetic();
  return std::make_unique<Trainer>(tiny(), corpus, make_cpu_backend({.blas_threads = 1}));
}

// Every view of one step, as the agent would get it.
class AgentViews : public TensorObserver {
 public:
  struct Seen {
    std::string name;
    TensorRole role;
    TensorPhase phase;
    std::optional<Format> held;
  };
  std::vector<Seen> seen;
  bool observe_step(std::int64_t) override { return true; }
  void on_tensor(const TensorView& t) override {
    const agent::TensorView v = to_agent_view(t);
    EXPECT_EQ(v.name, t.name);
    EXPECT_EQ(v.data, t.data);
    EXPECT_EQ(v.scale, t.scale);
    EXPECT_EQ(v.order, t.order);
    seen.push_back({std::string(v.name), v.role, v.phase, v.held});
  }
  std::optional<Format> held(const std::string& name, TensorRole role) const {
    for (const auto& s : seen) {
      if (s.name == name && s.role == role && s.phase == TensorPhase::kBackward) return s.held;
    }
    ADD_FAILURE() << "no " << name;
    return std::nullopt;
  }
};

TEST(AgentAdapterTest, TheAgentSeesWhereEachGradientIsHeld) {
  auto trainer = make_trainer();
  AgentViews views;
  trainer->set_observer(&views);
  trainer->step();
  EXPECT_EQ(views.held("wte", TensorRole::kWeightGrad), Format::kFP32);
  EXPECT_EQ(views.held("lm_head", TensorRole::kWeightGrad), Format::kFP16);
  EXPECT_EQ(views.held("h0.mlp.fc.weight", TensorRole::kWeightGrad), Format::kFP16);
  EXPECT_EQ(views.held("h1.ln2.bias", TensorRole::kWeightGrad), Format::kFP32);
  EXPECT_EQ(views.held("logits", TensorRole::kActivationGrad), std::nullopt);
}

TEST(AgentAdapterTest, OverridesMapRecommendedTensorsToTheLayersThatComputeThem) {
  auto trainer = make_trainer();
  AgentAdapter::Overrides overrides(trainer->fp32_overrides(), trainer->model());
  agent::PrecisionOverrides& o = overrides;  // as the agent holds it
  EXPECT_EQ(o.capable_layers(), trainer->model().layer_names());
  for (const auto& [tensor, layer] : std::vector<std::pair<std::string, std::string>>{
           {"h1.attn.scores", "h1.attn.core"},
           {"h1.attn.probs", "h1.attn.core"},
           {"h0.attn.context", "h0.attn.core"},
           {"h1.attn.qkv", "h1.attn.qkv"},
           {"h0.mlp.fc.weight", "h0.mlp.fc"},
           {"h0.mlp.proj.bias", "h0.mlp.proj"},
           {"h1.mlp.gelu", "h1.mlp.gelu"},
           {"h0.attn.core", ""},  // a layer is no tensor
           {"logits", "lm_head"},
           {"lm_head", "lm_head"},
           {"h0.ln1", ""},
           {"h1.res2", ""},
           {"loss", ""},
           {"wte", ""},
           {"wpe", ""},
           {"h2.attn.scores", ""}}) {
    EXPECT_EQ(o.layer_of(tensor), layer) << tensor;
  }
  // What layer_of returns, replace accepts; the tensor name itself it does not.
  EXPECT_EQ(o.replace({o.layer_of("h1.attn.scores")}, 3), "");
  EXPECT_EQ(trainer->fp32_overrides().active_layers(3), std::vector<std::string>{"h1.attn.core"});
  EXPECT_NE(o.replace({"h1.attn.scores"}, 3), "");
}

// The GEMM overrides over the trainer's GemmPrecisionSet: capable layers are the linear layers,
// and replace() makes exactly the given set from its step: a layer already in BF16 keeps its
// entry, one due later enters at the step, the others ("*" too) go back to the recipe; a bad
// name changes nothing.
TEST(AgentAdapterTest, GemmsReplaceMakesExactlyTheGivenSetFromItsStep) {
  GemmPrecisionSet set({"h0.attn.qkv", "h0.attn.proj", "h0.mlp.fc", "h0.mlp.proj"});
  AgentAdapter::Gemms gemms(set);
  agent::PrecisionOverrides& g = gemms;
  EXPECT_EQ(g.capable_layers(), set.valid_layers());
  ASSERT_EQ(set.add_bf16("*", 0), "");
  ASSERT_EQ(set.add_bf16("h0.mlp.fc", 2), "");
  ASSERT_EQ(set.add_bf16("h0.attn.proj", 9), "");
  using Entries = std::vector<std::pair<std::string, std::int64_t>>;
  const Entries before = set.bf16_entries();
  EXPECT_EQ(g.replace({"h0.mlp.fc", "lm_head"}, 5), "unknown linear layer 'lm_head'");
  EXPECT_EQ(g.replace({"*"}, 5), "unknown linear layer '*'");
  EXPECT_EQ(set.bf16_entries(), before);
  EXPECT_EQ(g.replace({"h0.mlp.fc", "h0.attn.proj", "h0.attn.qkv"}, 5), "");
  EXPECT_EQ(set.bf16_entries(),
            (Entries{{"h0.attn.proj", 5}, {"h0.attn.qkv", 5}, {"h0.mlp.fc", 2}}));
  EXPECT_FALSE(set.bf16("h0.mlp.proj", 5));
  EXPECT_EQ(g.replace({}, 7), "");
  EXPECT_TRUE(set.bf16_entries().empty());
}

// Delayed scaling's settings as the agent changes them: the "*" entry from the change's step,
// the unchanged field as it is in force then; refused on a run without delayed scaling.
TEST(AgentAdapterTest, RecipeSettingsChangeEveryLayersDelayedSettingsFromTheStep) {
  GemmPrecisionSet set({"h0.mlp.fc"});
  const DelayedSettings run{.history_length = 16, .margin = 0};
  AgentAdapter::RecipeSettings delayed(set, run, true);
  agent::RecipeControl& r = delayed;
  EXPECT_TRUE(r.delayed());
  agent::RecipeChange margin;
  margin.effective_from_step = 4;
  margin.margin = 2;
  EXPECT_EQ(r.schedule(margin), "");
  EXPECT_EQ(set.delayed("h0.mlp.fc", 3), std::nullopt);
  EXPECT_EQ(set.delayed("h0.mlp.fc", 4), (DelayedSettings{.history_length = 16, .margin = 2}));
  agent::RecipeChange length;
  length.effective_from_step = 6;
  length.amax_history_length = 64;
  EXPECT_EQ(r.schedule(length), "");
  EXPECT_EQ(set.delayed("h0.mlp.fc", 6), (DelayedSettings{.history_length = 64, .margin = 2}));
  GemmPrecisionSet other({"h0.mlp.fc"});
  AgentAdapter::RecipeSettings current(other, run, false);
  EXPECT_FALSE(current.delayed());
  EXPECT_EQ(current.schedule(margin), "the run does not use delayed scaling");
  EXPECT_TRUE(other.delayed_entries().empty());
}

}  // namespace
}  // namespace ampscope::trainer
