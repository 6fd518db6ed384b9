// FP8/FP4 quantisers end to end: ampscope-train in an FP8/FP4 mode streams each GEMM input's
// quantiser counts to ampscope-server, and `ampscope show RUN` has its FP8/FP4 section. Real
// processes on loopback.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "ampscope/testing/child_process.h"
#include "ampscope/testing/files.h"
#include "ampscope/testing/server_process.h"
#include "server_harness.h"
#include "trainer_run.h"

#ifndef AMPSCOPE_CLI_BINARY
#error "AMPSCOPE_CLI_BINARY must name the ampscope executable"
#endif

namespace ampscope::testing {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

constexpr int kSteps = 6;
// The 2-layer model's quantised linear layers, each with three GEMM inputs.
constexpr const char* kLayers[] = {"h0.attn.qkv", "h0.attn.proj", "h0.mlp.fc", "h0.mlp.proj",
                                   "h1.attn.qkv", "h1.attn.proj", "h1.mlp.fc", "h1.mlp.proj"};

json show_json(const ServerProcess& server, const std::string& run) {
  const CommandResult r =
      run_process({AMPSCOPE_CLI_BINARY, "show", run, "--json", "--server", server.address()}, 30s);
  EXPECT_EQ(r.code, 0) << r.err;
  return json::parse(r.out);
}

TEST(QuantizerLoopTest, Fp8DelayedReportsEveryGemmInputWithItsScaleAndHistory) {
  TempDir dir;
  ServerProcess server(trainer_server(dir.path(), {"--sync", "normal"}));
  TrainerRun run{dir.path(),
                 "fp8-loop",
                 server.address(),
                 kSteps,
                 {"--precision", "fp8-delayed", "--agent", "sample_full_every=2"}};
  ChildProcess trainer(run.argv(), dir / "train.log");
  ASSERT_EQ(trainer.wait(120s), 0) << trainer.log();

  const json j = show_json(server, "fp8-loop");
  std::map<std::string, json> by_name;
  for (const json& q : j.at("quantizers")) by_name[q.at("name")] = q;
  ASSERT_EQ(by_name.size(), 3 * std::size(kLayers)) << j.at("quantizers").dump();
  for (const char* layer : kLayers) {
    const std::string l(layer);
    for (const char* operand : {"input", "weight", "output_grad"}) {
      const std::string name = l + "." + operand;
      ASSERT_TRUE(by_name.contains(name)) << name;
      const json& q = by_name[name];
      // The recipe as applied: E4M3 forward, E5M2 gradients (Transformer Engine's HYBRID), a
      // delayed scale that moved from its starting 1 as the history filled.
      const bool grad = std::string(operand) == "output_grad";
      EXPECT_EQ(q.at("element"), grad ? "e5m2" : "e4m3") << name;
      EXPECT_EQ(q.at("recipe").get<std::string>().rfind(grad ? "e5m2:scale=" : "e4m3:scale=", 0),
                0u)
          << q.dump();
      EXPECT_EQ(q.at("role"),
                grad ? "activation_grad" : (operand[0] == 'i' ? "activation" : "weight"));
      EXPECT_EQ(q.at("samples"), kSteps) << name;  // one micro-batch per step
      EXPECT_GT(q.at("values").get<std::uint64_t>(), 0u);
      EXPECT_EQ(q.at("tensor_scale_min"), 1.0) << name;  // step 0's scale
      EXPECT_GT(q.at("tensor_scale_max").get<double>(), 1.0) << name;
      EXPECT_GT(q.at("sqnr_db").get<double>(), 15.0) << name;  // E4M3/E5M2 keep 3/2 bits
      EXPECT_GT(q.at("amax").get<double>(), 0.0);
      EXPECT_EQ(q.at("last_step"), kSteps - 1);
    }
  }
  // The amax history travels on full steps (every 2nd here): at step k it is the k amaxes
  // pushed before step k's quantisation, the scale's source.
  const std::vector<v1::StepReport> reports = stored_reports(server.address(), "fp8-loop");
  ASSERT_EQ(reports.size(), static_cast<std::size_t>(kSteps));
  for (const v1::StepReport& r : reports) {
    ASSERT_EQ(r.quantizers_size(), 3 * static_cast<int>(std::size(kLayers)));
    for (const v1::QuantizerStats& q : r.quantizers()) {
      const int expected = r.step() % 2 == 0 ? static_cast<int>(r.step()) : 0;
      EXPECT_EQ(q.amax_history_size(), expected) << q.name() << " at step " << r.step();
      for (float a : q.amax_history()) EXPECT_GT(a, 0.0f) << q.name();
    }
  }

  const CommandResult text =
      run_process({AMPSCOPE_CLI_BINARY, "show", "fp8-loop", "--server", server.address()}, 30s);
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_NE(text.out.find("FP8/FP4 quantisers (24):"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("h1.mlp.proj.output_grad"), std::string::npos) << text.out;
}

// A block recipe quantises an operand again along each GEMM's reduction axis: those uses are
// quantisers of their own, with the block shape in the recipe and E8M0 scale binades.
TEST(QuantizerLoopTest, MxFp8ReportsEachGemmUseWithItsBlockScales) {
  TempDir dir;
  ServerProcess server(trainer_server(dir.path(), {"--sync", "normal"}));
  TrainerRun run{dir.path(), "mx-loop", server.address(), 3, {"--precision", "mxfp8"}};
  ChildProcess trainer(run.argv(), dir / "train.log");
  ASSERT_EQ(trainer.wait(120s), 0) << trainer.log();

  const json j = show_json(server, "mx-loop");
  std::set<std::string> names;
  for (const json& q : j.at("quantizers")) {
    const std::string name = q.at("name");
    names.insert(name);
    const bool later_use = name.find('@') != std::string::npos;
    EXPECT_EQ(q.at("recipe"), later_use ? "mxfp8_e4m3:block=32x1" : "mxfp8_e4m3") << name;
    EXPECT_TRUE(q.contains("scale_min_exponent")) << name;
    EXPECT_GT(q.at("blocks").get<std::uint64_t>(), 0u);
    EXPECT_FALSE(q.contains("tensor_scale_min")) << name;
  }
  EXPECT_EQ(names.size(), 6 * std::size(kLayers));
  EXPECT_TRUE(names.contains("h0.mlp.fc.weight@dgrad"));
  EXPECT_TRUE(names.contains("h0.mlp.fc.input@wgrad"));
  EXPECT_TRUE(names.contains("h0.mlp.fc.output_grad@wgrad"));
}

}  // namespace
}  // namespace ampscope::testing
