// ampscope-train data parallel over MPI, as real processes under mpirun with 2 ranks (the
// tests skip themselves where the build has no MPI or no launcher): the communicator's
// collectives; 2 ranks x accum 1 against 1 rank x accum 2, bit for bit; a NaN on one rank
// skipping the step on both; a checkpoint written by rank 0 and resumed under mpirun.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ampscope/testing/child_process.h"
#include "ampscope/testing/files.h"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using ampscope::testing::CommandResult;

class MultiRankTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // Open MPI: two ranks on any machine, and as root in containers (the environment forms of
    // --oversubscribe and --allow-run-as-root).
    setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 1);
    if (geteuid() == 0) {
      setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
      setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    }
  }

  void SetUp() override {
    if (std::string(AMPSCOPE_MPIEXEC).empty() || !fs::exists(AMPSCOPE_MPIEXEC)) {
      GTEST_SKIP() << "this build has no MPI launcher";
    }
  }

  static CommandResult mpirun(int ranks, std::vector<std::string> argv) {
    argv.insert(argv.begin(), {AMPSCOPE_MPIEXEC, "-np", std::to_string(ranks)});
    return ampscope::testing::run_process(argv, 120s);
  }

  // A model small enough that a step takes about a millisecond; `extra` shell-split on spaces.
  static std::vector<std::string> train(const std::string& extra, int steps = 6) {
    std::vector<std::string> argv = {AMPSCOPE_TRAIN_BIN};
    const std::string common = "--layers 1 --width 32 --heads 2 --context 16 --threads 1 "
                               "--quiet --eval-every 0 --steps " +
                               std::to_string(steps) + " " + extra;
    std::size_t at = 0;
    while (at < common.size()) {
      const std::size_t end = std::min(common.find(' ', at), common.size());
      if (end > at) argv.push_back(common.substr(at, end - at));
      at = end + 1;
    }
    return argv;
  }

  static std::vector<nlohmann::json> log_lines(const fs::path& p) {
    std::vector<nlohmann::json> v;
    std::ifstream f(p);
    for (std::string line; std::getline(f, line);) v.push_back(nlohmann::json::parse(line));
    return v;
  }

  static std::string bytes(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  const ampscope::testing::TempDir dir_;
};

TEST_F(MultiRankTest, CollectivesAgreeOnTwoRanks) {
  const CommandResult r = mpirun(2, {AMPSCOPE_COMM_CHECK_BIN});
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("rank 0 of 2: collectives ok"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 1 of 2: collectives ok"), std::string::npos) << r.out;
}

// The tied embedding's two contributions per backward are what would break this (model.cc);
// under fp8-delayed, amax histories that were not max-reduced over ranks (the checkpoint holds
// them).
TEST_F(MultiRankTest, TwoRanksEqualOneRankAccumulatingTwiceBitForBit) {
  for (const char* precision : {"fp32", "amp-fp16", "fp16", "fp8-delayed"}) {
    SCOPED_TRACE(precision);
    const std::string p = std::string("--precision ") + precision + " --batch 2 ";
    const CommandResult one = ampscope::testing::run_process(
        train(p + "--accum 2 --checkpoint-dir " + path(std::string("one_") + precision) +
              " --log-json " + path("one.jsonl")),
        120s);
    ASSERT_EQ(one.code, 0) << one.err;
    const CommandResult two =
        mpirun(2, train(p + "--accum 1 --checkpoint-dir " + path(std::string("two_") + precision) +
                        " --log-json " + path("two.jsonl")));
    ASSERT_EQ(two.code, 0) << two.err;
    // Only rank 0 prints the summary, and it is the same line.
    const auto before_throughput = [](const std::string& s) { return s.substr(0, s.rfind(" | ")); };
    EXPECT_EQ(before_throughput(two.out), before_throughput(one.out));
    const auto a = log_lines(path("one.jsonl")), b = log_lines(path("two.jsonl")),
               c = log_lines(path("two.jsonl.rank1"));
    ASSERT_EQ(a.size(), 6u);
    ASSERT_EQ(b.size(), a.size());
    ASSERT_EQ(c.size(), a.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      for (const char* key : {"loss", "grad_norm", "tokens", "skipped", "scale_after"}) {
        EXPECT_EQ(a[i][key], b[i][key]) << key << " at step " << i;
        EXPECT_EQ(b[i][key], c[i][key]) << key << " at step " << i << " (rank 1)";
      }
    }
    // Weights, moments, scaler and data position: the same file.
    const std::string ca = bytes(path(std::string("one_") + precision) + "/checkpoint.bin");
    ASSERT_FALSE(ca.empty());
    EXPECT_TRUE(ca == bytes(path(std::string("two_") + precision) + "/checkpoint.bin"));
  }
}

TEST_F(MultiRankTest, ANanOnOneRankSkipsTheStepOnEveryRank) {
  const CommandResult r =
      mpirun(2, train("--precision amp-fp16 --batch 2 --inject-nan h0.mlp.fc@2 --inject-rank 1 "
                      "--log-json " + path("nan.jsonl")));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("skipped 1 |"), std::string::npos) << r.out;
  for (const char* file : {"nan.jsonl", "nan.jsonl.rank1"}) {
    const auto lines = log_lines(path(file));
    ASSERT_EQ(lines.size(), 6u) << file;
    for (std::size_t i = 0; i < lines.size(); ++i) {
      EXPECT_EQ(lines[i]["skipped"], i == 2) << file << " step " << i;
      EXPECT_EQ(lines[i]["found_inf"], i == 2) << file << " step " << i;
    }
  }
  // Rank 0 alone injects nothing: without the reduction it would not have skipped.
  const CommandResult bad = mpirun(2, train("--inject-nan h0.mlp.fc@2 --inject-rank 2"));
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("inject_rank 2 is not a rank of 2"), std::string::npos) << bad.err;
}

TEST_F(MultiRankTest, ResumeUnderMpirunContinuesTheUninterruptedRun) {
  const std::string common = "--precision amp-fp16 --batch 2 --accum 2 --checkpoint-every 2 ";
  const CommandResult straight =
      mpirun(2, train(common + "--checkpoint-dir " + path("straight") + " --log-json " +
                      path("straight.jsonl")));
  ASSERT_EQ(straight.code, 0) << straight.err;
  const CommandResult first =
      mpirun(2, train(common + "--stop-at 3 --checkpoint-dir " + path("split")));
  ASSERT_EQ(first.code, 0) << first.err;
  const CommandResult second =
      mpirun(2, train(common + "--resume --checkpoint-dir " + path("split") + " --log-json " +
                      path("resumed.jsonl")));
  ASSERT_EQ(second.code, 0) << second.err;
  const auto a = log_lines(path("straight.jsonl")), b = log_lines(path("resumed.jsonl"));
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 3u);
  for (std::size_t i = 0; i < b.size(); ++i) {
    EXPECT_EQ(b[i]["step"], a[i + 3]["step"]);
    EXPECT_EQ(b[i]["loss"], a[i + 3]["loss"]) << "step " << i + 3;
    EXPECT_EQ(b[i]["grad_norm"], a[i + 3]["grad_norm"]) << "step " << i + 3;
  }
  EXPECT_TRUE(bytes(path("straight") + "/checkpoint.bin") ==
              bytes(path("split") + "/checkpoint.bin"));
  EXPECT_FALSE(fs::exists(path("split") + "/checkpoint.bin.tmp"));
}

TEST_F(MultiRankTest, AnErrorOnOneRankEndsTheJob) {
  // Rank 1 cannot write its log (a directory of that name): it must not leave rank 0 waiting.
  fs::create_directories(path("log.jsonl.rank1"));
  const CommandResult r = mpirun(2, train("--log-json " + path("log.jsonl"), 1000000));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, -1) << "still running at the timeout";
  EXPECT_NE(r.err.find("ampscope-train: error: rank 1: --log-json: cannot write"),
            std::string::npos)
      << r.err;
}

}  // namespace
