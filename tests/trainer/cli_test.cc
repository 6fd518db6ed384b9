// ampscope-train as a real process: bad input gives one line on stderr and a non-zero exit;
// --help works; --log-json writes the documented fields; fault injection and checkpoint/resume
// work through the command line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ampscope/testing/child_process.h"
#include "ampscope/testing/files.h"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

using Result = ampscope::testing::CommandResult;

class CliTest : public ::testing::Test {
 protected:
  // `args` is a shell command line (paths in it are quoted).
  Result run(const std::string& args) {
    return ampscope::testing::run_process(
        {"/bin/sh", "-c", std::string("exec '") + AMPSCOPE_TRAIN_BIN + "' " + args}, 120s);
  }

  // A model small enough that a step takes about a millisecond.
  static std::string tiny() {
    return "--context 16 --width 16 --heads 2 --layers 1 --batch 4 --threads 1 --quiet ";
  }

  std::vector<nlohmann::json> log_lines(const fs::path& p) {
    std::vector<nlohmann::json> v;
    std::ifstream f(p);
    for (std::string line; std::getline(f, line);) v.push_back(nlohmann::json::parse(line));
    return v;
  }

  const ampscope::testing::TempDir temp_dir_;
  const fs::path dir_ = temp_dir_.path();
};

TEST_F(CliTest, BadInputGivesOneLineErrorAndNonZeroExit) {
  std::ofstream(dir_ / "empty.txt").close();
  std::ofstream(dir_ / "one_char.txt") << "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
  std::ofstream(dir_ / "short.txt") << "abcdefgh";
  const std::vector<std::string> bad = {
      "--bogus",
      "--steps 0",
      "--steps abc",
      "--batch 0",
      "--lr -1",
      "--precision fp64",
      "--scaler sometimes",
      "--width 30 --heads 4",
      "--data " + (dir_ / "missing.txt").string(),
      "--data " + (dir_ / "empty.txt").string(),
      "--data " + (dir_ / "one_char.txt").string(),
      "--data " + (dir_ / "short.txt").string(),
      "--inject-nan no.such.tensor@1",
      "--inject-nan h0.mlp.fc",
      "--inject-nan h0.mlp.fc@-2",
      "--fp32-layer h9.mlp.fc",
      "--resume",
      "--resume --checkpoint-dir " + (dir_ / "nothing").string(),
      "--init-scale 0",
      "--precision amp-fp16 --scaler hysteresis --init-scale 0.5",  // below min_scale 1
      "--inject-overflow 1 --inject-overflow-tensor logits.grad",   // a gradient
      "--inject-overflow-tensor h0.mlp.fc.weight",                  // a weight
      "--inject-overflow-tensor loss",                              // not an activation
      "--inject-overflow-tensor h1.attn.scores",                    // no block h1
      "extra_positional",
      "--fp8-margin 1",                                   // not fp8-delayed
      "--precision fp8-current --fp8-amax-history 4",     // not fp8-delayed
      "--precision fp8-delayed --fp8-amax-history 0",
      "--precision fp8-delayed --fp8-margin 65",
      "--precision amp-bf16 --bf16-gemm h0.mlp.fc",       // no quantised GEMMs
      "--precision mxfp8 --bf16-gemm h9.mlp.fc",          // no block h9
      "--precision nvfp4 --bf16-gemm lm_head",            // never quantised
      "--precision fp8-delayed --fp8-gemm fast",          // auto or emulate
  };
  for (const auto& args : bad) {
    const Result r = run(tiny() + args);
    EXPECT_NE(r.code, 0) << args;
    EXPECT_TRUE(r.out.empty()) << args << ": " << r.out;
    ASSERT_FALSE(r.err.empty()) << args;
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << args << ": " << r.err;
    EXPECT_EQ(r.err.rfind("ampscope-train: error: ", 0), 0u) << args << ": " << r.err;
  }
}

TEST_F(CliTest, HelpListsTheFlags) {
  const Result r = run("--help");
  EXPECT_EQ(r.code, 0);
  for (const char* flag :
       {"--precision", "--steps", "--seed", "--batch", "--accum", "--lr", "--data",
        "--checkpoint-dir", "--resume", "--log-json", "--context", "--width", "--heads", "--layers",
        "--inject-nan", "--grad-shrink", "--grad-shrink-end", "--inject-overflow-every",
        "--inject-overflow-tensor", "--bf16-gemm", "--fp8-amax-history", "--fp8-margin",
        "--fp8-gemm", "--loss-cost-every"}) {
    EXPECT_NE(r.out.find(flag), std::string::npos) << flag;
  }
}

TEST_F(CliTest, Fp8ModesTrainAndLogTheLayersInBf16) {
  for (const char* mode : {"fp8-delayed", "fp8-current", "mxfp8", "nvfp4"}) {
    const fs::path log = dir_ / (std::string(mode) + ".jsonl");
    const Result r = run(tiny() + "--steps 4 --precision " + mode +
                         " --bf16-gemm h0.mlp.fc@2 --log-json '" + log.string() + "'");
    ASSERT_EQ(r.code, 0) << mode << ": " << r.err;
    const auto lines = log_lines(log);
    ASSERT_EQ(lines.size(), 4u) << mode;
    EXPECT_FALSE(lines[1].contains("bf16_gemms")) << mode;
    EXPECT_EQ(lines[2].at("bf16_gemms"), nlohmann::json::array({"h0.mlp.fc"})) << mode;
    EXPECT_TRUE(lines[3].at("loss").is_number()) << mode;
  }
}

TEST_F(CliTest, LogJsonHasEveryFieldAndInjectedOverflowIsSkipped) {
  const fs::path log = dir_ / "log.jsonl";
  const Result r = run(tiny() + "--precision amp-fp16 --steps 6 --eval-every 3 --inject-overflow 2 "
                       "--log-json '" + log.string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto lines = log_lines(log);
  ASSERT_EQ(lines.size(), 6u);
  for (const auto& j : lines) {
    for (const char* key : {"step", "loss", "loss_scale", "scale_after", "found_inf", "skipped",
                            "grad_norm", "lr", "tokens", "step_time_s"}) {
      EXPECT_TRUE(j.contains(key)) << key << " in " << j.dump();
    }
    EXPECT_EQ(j["tokens"], 64);
  }
  EXPECT_TRUE(lines[2]["skipped"].get<bool>());
  EXPECT_EQ(lines[2]["scale_after"].get<double>(), 32768.0);
  EXPECT_FALSE(lines[3]["skipped"].get<bool>());
  EXPECT_TRUE(lines[2].contains("val_loss"));
  EXPECT_FALSE(lines[3].contains("val_loss"));
  EXPECT_TRUE(lines[5].contains("val_loss"));
  EXPECT_NE(r.out.find("skipped 1"), std::string::npos) << r.out;
}

TEST_F(CliTest, PeriodicOverflowSpikesSkipExactlyTheirSteps) {
  const fs::path log = dir_ / "log.jsonl";
  const Result r = run(tiny() + "--precision amp-fp16 --steps 7 --inject-overflow-every 3 "
                       "--grad-shrink 0.5 --grad-shrink-end 0.01 --log-json '" + log.string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto lines = log_lines(log);
  ASSERT_EQ(lines.size(), 7u);
  for (std::size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(lines[i]["skipped"].get<bool>(), i == 3 || i == 6) << lines[i].dump();
  }
  EXPECT_NE(r.out.find("skipped 2"), std::string::npos) << r.out;
}

// --inject-overflow-tensor moves the periodic overflow into an activation: skipped where its
// layer stores FP16, harmless where --fp32-layer moved that layer to FP32.
TEST_F(CliTest, ActivationOverflowSkipsItsStepsUnlessItsLayerRunsInFp32) {
  const std::string spikes = tiny() +
                             "--precision amp-fp16 --steps 7 --inject-overflow-every 3 "
                             "--inject-overflow-tensor h0.attn.scores ";
  const fs::path fp16_log = dir_ / "fp16.jsonl", fp32_log = dir_ / "fp32.jsonl";
  const Result fp16 = run(spikes + "--log-json '" + fp16_log.string() + "'");
  ASSERT_EQ(fp16.code, 0) << fp16.err;
  const Result fp32 =
      run(spikes + "--fp32-layer h0.attn.core@0 --log-json '" + fp32_log.string() + "'");
  ASSERT_EQ(fp32.code, 0) << fp32.err;
  const auto a = log_lines(fp16_log), b = log_lines(fp32_log);
  ASSERT_EQ(a.size(), 7u);
  ASSERT_EQ(b.size(), 7u);
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i]["skipped"].get<bool>(), i == 3 || i == 6) << a[i].dump();
    EXPECT_FALSE(b[i]["skipped"].get<bool>()) << b[i].dump();
    EXPECT_TRUE(b[i]["loss"].is_number()) << b[i].dump();  // null when not finite
  }
  EXPECT_NE(fp16.out.find("skipped 2"), std::string::npos) << fp16.out;
  EXPECT_NE(fp32.out.find("skipped 0"), std::string::npos) << fp32.out;
}

TEST_F(CliTest, ResumeContinuesTheRunBitForBit) {
  const std::string ck = "--checkpoint-dir '" + (dir_ / "ck").string() + "' ";
  const std::string common = tiny() + "--precision amp-bf16 --steps 6 --accum 2 ";
  ASSERT_EQ(run(common + "--log-json '" + (dir_ / "straight.jsonl").string() + "'").code, 0);
  // Interrupted after 3 steps (the checkpoint at exit), then resumed to 6.
  ASSERT_EQ(run(common + ck + "--stop-at 3").code, 0);
  const Result r = run(common + ck + "--resume --log-json '" + (dir_ / "b.jsonl").string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto straight = log_lines(dir_ / "straight.jsonl");
  const auto resumed = log_lines(dir_ / "b.jsonl");
  ASSERT_EQ(resumed.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(resumed[i]["step"], straight[i + 3]["step"]);
    EXPECT_EQ(resumed[i]["loss"], straight[i + 3]["loss"]) << i;
    EXPECT_EQ(resumed[i]["grad_norm"], straight[i + 3]["grad_norm"]) << i;
  }
}

TEST_F(CliTest, TrainsOnATextFile) {
  std::ofstream f(dir_ / "text.txt");
  for (int i = 0; i < 200; ++i) f << "hello world, this is line " << i % 10 << ".\n";
  f.close();
  const Result r =
      run(tiny() + "--precision fp32 --steps 3 --data '" + (dir_ / "text.txt").string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("text.txt"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("steps 3"), std::string::npos) << r.out;
}

}  // namespace
