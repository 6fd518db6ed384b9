// Per-layer precision through the real server (--gemm-precision): an agent whose Hello names
// the layers it can move reports quantisers with the recipe's real counts; the layer whose
// gradient keeps underflowing comes back as a PolicyUpdate with bf16_gemms on the stream, the
// store keeps it (GetPolicy after a restart), and a quantiser naming a layer the Hello did not
// list is refused alone; a move the agent does not take is undone.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "ampscope/proto/quantizer_codec.h"
#include "ampscope/recipe.h"
#include "server_harness.h"

#ifndef AMPSCOPE_CLI_BINARY
#error "AMPSCOPE_CLI_BINARY must name the ampscope executable"
#endif

namespace ampscope::testing {
namespace {

constexpr const char* kRun = "run-gemm";

// 4 x 64 values: Gaussian (clean under NVFP4) or spread over 40 binades (NVFP4's blocks of 16
// keep about 4 of them: most values underflow).
std::vector<float> data(bool wide, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> binades(-30.0f, 10.0f);
  std::vector<float> x(256);
  for (float& v : x) {
    v = wide ? std::exp2(binades(gen)) * (normal(gen) < 0 ? -1.0f : 1.0f) : normal(gen);
  }
  return x;
}

v1::QuantizerStats quantizer(const std::string& name, const std::string& layer,
                             const RecipeCounts& c) {
  v1::QuantizerStats q;
  q.set_name(name);
  q.set_role(v1::TENSOR_ROLE_ACTIVATION_GRAD);
  q.set_phase(v1::TENSOR_PHASE_BACKWARD);
  proto::encode_quantizer(c, {}, &q);
  q.set_layer(layer);
  return q;
}

// A server deciding per-layer precision (windows of 4 reports, 2 harmful ones move a layer, half
// the layers at most, decisions effective 2 steps ahead) and one agent's stream to it, whose
// Hello names two layers it can move.
class GemmPrecisionServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    v1::Hello hello = make_hello(kRun);
    hello.add_bf16_capable_gemms("h0.mlp.fc");
    hello.add_bf16_capable_gemms("h1.mlp.fc");
    ASSERT_TRUE(agent.send_hello(hello));
  }

  TempDir dir;
  ServerProcess server{dir.path(), dir / "store.db",
                       {"--policy", "headroom", "--gemm-precision", "--gemm-window", "4",
                        "--gemm-min-reports", "2", "--gemm-max-bf16-share", "0.5",
                        "--policy-lead-steps", "2"}};
  AgentStream agent{make_channel(server.address())};
  const Recipe nvfp4 = *parse_recipe("nvfp4");
};

TEST_F(GemmPrecisionServerTest, HarmfulQuantisersMoveTheirLayerToBf16OnTheStream) {
  RecipeCounts harmful;
  for (int step = 0; step < 2; ++step) {
    const std::vector<float> gauss = data(false, 10 + step), wide = data(true, 20 + step);
    harmful = fake_quantize(wide.data(), nullptr, 4, 64, nvfp4);
    v1::StepReport r = make_report(kRun, 0, step + 1, step, 0);
    *r.add_quantizers() = quantizer("h0.mlp.fc.input", "h0.mlp.fc",
                                    fake_quantize(gauss.data(), nullptr, 4, 64, nvfp4));
    *r.add_quantizers() = quantizer("h1.mlp.fc.output_grad@wgrad", "h1.mlp.fc", harmful);
    // Refused alone: the Hello did not list the layer (its harm is not counted).
    *r.add_quantizers() = quantizer("h2.mlp.fc.input", "h2.mlp.fc", harmful);
    ASSERT_TRUE(agent.send(r));
  }
  ASSERT_TRUE(agent.wait_ack(2).has_value());
  const std::optional<v1::PolicyUpdate> u = agent.wait_policy(0);
  ASSERT_TRUE(u.has_value());
  EXPECT_TRUE(u->bf16_gemms_set());
  ASSERT_EQ(u->bf16_gemms_size(), 1);
  EXPECT_EQ(u->bf16_gemms(0), "h1.mlp.fc");
  EXPECT_EQ(u->effective_from_step(), 3);
  EXPECT_FALSE(u->has_loss_scale());
  EXPECT_FALSE(u->has_amax_history_length());
  EXPECT_FALSE(u->fp32_tensors_set());
  char share[32];
  std::snprintf(share, sizeof share, "%.1f%%",
                100.0 * static_cast<double>(harmful.underflow) /
                    static_cast<double>(harmful.values));
  EXPECT_EQ(u->reason(), std::string("bf16 h1.mlp.fc: h1.mlp.fc.output_grad@wgrad underflow ") +
                             share + " of finite values in 2/2 reports (nvfp4)");
  for (const v1::ServerMessage& m : agent.messages()) EXPECT_FALSE(m.has_reject());
  ASSERT_TRUE(agent.finish().ok());

  // /metrics: the set's size and one decision of kind gemm_precision.
  const std::vector<Sample> samples = parse_samples(scrape(server.metrics_address()));
  EXPECT_EQ(sample_value(samples, "ampscope_policy_bf16_gemms", {{"run", kRun}}), 1.0);
  EXPECT_EQ(sample_value(samples, "ampscope_policy_decisions_total",
                         {{"run", kRun}, {"mode", "headroom"}, {"kind", "gemm_precision"}}),
            1.0);

  const std::vector<v1::StepReport> stored = stored_reports(server.address(), kRun);
  ASSERT_EQ(stored.size(), 2u);
  ASSERT_EQ(stored[0].quantizers_size(), 2);  // the third refused alone

  // The decision is stored with its fields: the policy in force after a restart carries them.
  server.restart();
  const std::optional<v1::GetPolicyResponse> policy = get_policy(server.address(), kRun);
  ASSERT_TRUE(policy.has_value());
  EXPECT_TRUE(policy->current().bf16_gemms_set());
  ASSERT_EQ(policy->current().bf16_gemms_size(), 1);
  EXPECT_EQ(policy->current().bf16_gemms(0), "h1.mlp.fc");
  EXPECT_EQ(policy->current().reason(), u->reason());

  // `ampscope show`: the decision's BF16 set, in text and in --json.
  const CommandResult text =
      run_process({AMPSCOPE_CLI_BINARY, "show", kRun, "--server", server.address()}, 30s);
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_NE(text.out.find("from step 3: bf16 h1.mlp.fc\n      why: bf16 h1.mlp.fc: "),
            std::string::npos)
      << text.out;
  const CommandResult js = run_process(
      {AMPSCOPE_CLI_BINARY, "show", kRun, "--json", "--server", server.address()}, 30s);
  ASSERT_EQ(js.code, 0) << js.err;
  const nlohmann::json updates = nlohmann::json::parse(js.out).at("policy_updates");
  ASSERT_EQ(updates.size(), 1u);
  EXPECT_EQ(updates[0].at("bf16_gemms"), nlohmann::json::array({"h1.mlp.fc"}));
  EXPECT_FALSE(updates[0].contains("amax_history_length"));
}

// An agent that cannot take the move (no GEMM precision attached: its outcome says so) goes on
// reporting the layer's recipe applied. Eight reported steps from the move's effective step on
// (apply_grace_steps), the server takes the layer back out of its set: a second update on the
// stream with an empty BF16 set and the reason, and the gauge back to 0.
TEST_F(GemmPrecisionServerTest, AMoveTheAgentDidNotTakeIsUndoneOnTheStream) {
  std::optional<v1::PolicyUpdate> moved;
  constexpr int kSteps = 11;  // the move at step 1 (effective 3), steps 3..10 unheeded
  for (int step = 0; step < kSteps; ++step) {
    const std::vector<float> wide = data(true, 20 + step);
    v1::StepReport r = make_report(kRun, 0, step + 1, step, 0);
    *r.add_quantizers() = quantizer("h1.mlp.fc.output_grad@wgrad", "h1.mlp.fc",
                                    fake_quantize(wide.data(), nullptr, 4, 64, nvfp4));
    if (moved && step == moved->effective_from_step()) {
      v1::PolicyOutcome* o = r.add_policy_outcomes();
      o->set_policy_id(moved->policy_id());
      o->set_applied(false);
      o->set_reason("bf16_gemms: no GEMM precision set is attached to the agent");
    }
    ASSERT_TRUE(agent.send(r));
    ASSERT_TRUE(agent.wait_ack(step + 1).has_value()) << step;
    if (step == 1) {
      moved = agent.wait_policy(0);
      ASSERT_TRUE(moved.has_value());
      ASSERT_EQ(moved->bf16_gemms_size(), 1);
      EXPECT_EQ(moved->effective_from_step(), 3);
    }
  }
  const std::optional<v1::PolicyUpdate> undone = agent.wait_policy(1);
  ASSERT_TRUE(undone.has_value());
  EXPECT_TRUE(undone->bf16_gemms_set());
  EXPECT_EQ(undone->bf16_gemms_size(), 0);
  EXPECT_EQ(undone->effective_from_step(), kSteps - 1 + 2);
  EXPECT_TRUE(undone->reason().starts_with(
      "recipe h1.mlp.fc: its move to BF16 from step 3 did not take effect (the recipe applied in "
      "8 reported steps since, none in BF16"))
      << undone->reason();
  ASSERT_TRUE(agent.finish().ok());
  const std::vector<Sample> samples = parse_samples(scrape(server.metrics_address()));
  EXPECT_EQ(sample_value(samples, "ampscope_policy_bf16_gemms", {{"run", kRun}}), 0.0);
  EXPECT_EQ(sample_value(samples, "ampscope_policy_decisions_total",
                         {{"run", kRun}, {"mode", "headroom"}, {"kind", "gemm_precision"}}),
            2.0);
}

}  // namespace
}  // namespace ampscope::testing
