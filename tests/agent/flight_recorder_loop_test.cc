// The flight recorder end to end: ampscope-train with a NaN injected into an activation at step
// 60 streams to ampscope-server, and `ampscope show RUN --step 60` shows, for the tensors that
// went non-finite there, their binade histograms over the steps before it. With the default
// options: the trainer's fused unscale hands the unscaled weight gradients' statistics over on
// every step, which the recorder keeps. Real processes on loopback.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "ampscope/testing/child_process.h"
#include "ampscope/testing/files.h"
#include "ampscope/testing/server_process.h"
#include "trainer_run.h"

#ifndef AMPSCOPE_CLI_BINARY
#error "AMPSCOPE_CLI_BINARY must name the ampscope executable"
#endif

namespace ampscope::testing {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

TEST(FlightRecorderLoopTest, ShowStepSixtyHasTheHistoryBeforeTheInjectedNaN) {
  TempDir dir;
  ServerProcess server(trainer_server(dir.path(), {"--sync", "normal"}));
  TrainerRun run{dir.path(), "flight-loop", server.address(), 64,
                 {"--inject-nan", "h0.mlp.fc@60", "--agent", "flight_recorder_steps=8"}};
  ChildProcess trainer(run.argv(), dir / "train.log");
  ASSERT_EQ(trainer.wait(120s), 0) << trainer.log();

  const auto show = [&](std::vector<std::string> extra) {
    std::vector<std::string> argv = {AMPSCOPE_CLI_BINARY, "show", "flight-loop", "--step", "60",
                                     "--server", server.address()};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return run_process(argv, 30s);
  };
  const CommandResult j = show({"--json"});
  ASSERT_EQ(j.code, 0) << j.err;
  const json parsed = json::parse(j.out);
  ASSERT_EQ(parsed.at("reports").size(), 1u);
  EXPECT_EQ(parsed["reports"][0].at("flight_event"), "non-finite");
  EXPECT_EQ(parsed["reports"][0].at("found_inf"), true);
  // Every weight gradient went non-finite at 60, and each unscaled one has the 8 steps before
  // it, handed over by the fused unscale while the reports carried nothing of it; those come
  // first.
  int weight_grads = 0;
  for (const json& t : parsed.at("tensors")) {
    if (t.at("role") != "weight_grad" || t.at("phase") != "after_unscale") continue;
    ++weight_grads;
    EXPECT_NE(t.at("why").get<std::string>().find("nan"), std::string::npos) << t.dump();
    const json& history = t.at("history");
    ASSERT_EQ(history.size(), 8u) << t.at("name");
    for (std::size_t i = 0; i < history.size(); ++i) {
      EXPECT_EQ(history[i].at("step"), 52 + static_cast<int>(i));
      EXPECT_EQ(history[i].at("from_flight_recorder"), true);
      EXPECT_EQ(history[i].at("level"), "full");
      EXPECT_EQ(history[i].at("nan"), 0);
      EXPECT_FALSE(history[i].at("counts").empty());
    }
  }
  EXPECT_GT(weight_grads, 20) << j.out;  // every parameter of the 2-layer model
  EXPECT_EQ(parsed["tensors"][0].at("role"), "weight_grad");

  const CommandResult text = show({});
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_NE(text.out.find("run flight-loop, step 60"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("flight recorder sent its history (non-finite)"), std::string::npos)
      << text.out;
  EXPECT_NE(text.out.find("recorder\n"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("  60 <-"), std::string::npos) << text.out;
}

}  // namespace
}  // namespace ampscope::testing
