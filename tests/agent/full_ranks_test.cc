// Which ranks send full statistics (sample_full_ranks, local_rank; config.h SamplingConfig):
// the option, the selection rules, the local rank from the launcher, and what a rank that is
// left out still reports, read back from its spool.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <map>
#include <optional>
#include <string>

#include "ampscope/agent/agent.h"
#include "ampscope/agent/config.h"
#include "ampscope/testing/files.h"
#include "fake_step.h"
#include "spool_reader.h"

namespace ampscope::agent {
namespace {

using ampscope::testing::TempDir;
using testing::base_config;
using testing::make_agent;
using testing::make_step_tensors;
using testing::view_of;

// The launchers' variables local_rank_of() reads, cleared (and restored on destruction) so
// that the machine the tests run on does not choose for them.
class LauncherEnvironment {
 public:
  LauncherEnvironment() {
    for (const char* var : kVars) {
      if (const char* v = std::getenv(var)) saved_[var] = v;
      unsetenv(var);
    }
  }
  ~LauncherEnvironment() {
    for (const char* var : kVars) {
      if (auto it = saved_.find(var); it != saved_.end()) {
        setenv(var, it->second.c_str(), 1);
      } else {
        unsetenv(var);
      }
    }
  }
  void set(const char* var, const char* value) { setenv(var, value, 1); }
  void unset(const char* var) { unsetenv(var); }

  static constexpr const char* kVars[] = {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                                          "MPI_LOCALRANKID", "SLURM_LOCALID"};

 private:
  std::map<std::string, std::string> saved_;
};

AgentConfig with_ranks(const std::string& full_ranks, std::uint32_t world_size) {
  AgentConfig c;
  EXPECT_EQ(set_option(c, "sample_full_ranks", full_ranks), "");
  c.world_size = world_size;
  return c;
}

// The ranks of `c`'s world that send full statistics, each rank's local rank being
// rank % ranks_per_node.
std::vector<std::uint32_t> chosen(AgentConfig c, std::uint32_t ranks_per_node) {
  std::vector<std::uint32_t> out;
  for (std::uint32_t r = 0; r < c.world_size; ++r) {
    c.rank = r;
    if (sends_full_stats(c, r % ranks_per_node)) out.push_back(r);
  }
  return out;
}

TEST(FullRanksTest, TheOptionReadsEveryFormAndWritesItBack) {
  AgentConfig c;
  EXPECT_EQ(c.sampling.full_ranks.kind, FullRanks::Kind::kAuto);
  for (const auto& [given, read] :
       std::vector<std::pair<std::string, std::string>>{{"auto", "auto"},
                                                        {"ALL", "all"},
                                                        {" node ", "node"},
                                                        {"every:8", "every:8"},
                                                        {"Every: 4", "every:4"},
                                                        {"16, 0,8,8", "0,8,16"},
                                                        {"5", "5"}}) {
    EXPECT_EQ(set_option(c, "sample-full-ranks", given), "") << given;
    EXPECT_EQ(full_ranks_text(c.sampling.full_ranks), read) << given;
  }
  EXPECT_EQ(c.local_rank, -1);
  EXPECT_EQ(set_option(c, "local_rank", "3"), "");
  EXPECT_EQ(c.local_rank, 3);
  EXPECT_EQ(set_option(c, "local-rank", "auto"), "");
  EXPECT_EQ(c.local_rank, -1);
  const auto& keys = option_keys();
  EXPECT_NE(std::find(keys.begin(), keys.end(), "sample_full_ranks"), keys.end());
  EXPECT_NE(std::find(keys.begin(), keys.end(), "local_rank"), keys.end());
}

TEST(FullRanksTest, BadValuesAreRefusedNamingTheOption) {
  AgentConfig c;
  ASSERT_EQ(set_option(c, "sample_full_ranks", "every:8"), "");
  for (const char* bad : {"", "nodes", "every:", "every:0", "every:x", "every:65537", "1,,2", "1,",
                          "-1", "65536", "0,node"}) {
    const std::string err = set_option(c, "sample_full_ranks", bad);
    EXPECT_EQ(err.rfind("sample_full_ranks: expected auto, all, node, every:K", 0), 0u)
        << bad << ": " << err;
  }
  EXPECT_EQ(full_ranks_text(c.sampling.full_ranks), "every:8") << "unchanged by a refusal";
  for (const char* bad : {"-1", "x", "65536", "1.5"}) {
    EXPECT_NE(set_option(c, "local_rank", bad).find("local_rank"), std::string::npos) << bad;
  }
  EXPECT_EQ(c.local_rank, -1);

  // What code may set and the parser never gives.
  c.run_id = "r";
  c.world_size = 8;
  c.local_rank = 8;
  EXPECT_EQ(validate(c), "local_rank: 8 must be below world_size 8");
  c.local_rank = 7;
  EXPECT_EQ(validate(c), "");
  c.sampling.full_ranks = FullRanks{FullRanks::Kind::kEvery, 0, {}};
  EXPECT_NE(validate(c).find("sample_full_ranks"), std::string::npos);
  c.sampling.full_ranks = FullRanks{FullRanks::Kind::kList, 1, {}};
  EXPECT_NE(validate(c).find("sample_full_ranks"), std::string::npos);
}

TEST(FullRanksTest, SelectionRules) {
  EXPECT_EQ(chosen(with_ranks("all", 16), 8).size(), 16u);
  EXPECT_EQ(chosen(with_ranks("node", 32), 8), (std::vector<std::uint32_t>{0, 8, 16, 24}));
  EXPECT_EQ(chosen(with_ranks("every:4", 10), 8), (std::vector<std::uint32_t>{0, 4, 8}));
  EXPECT_EQ(chosen(with_ranks("every:1", 3), 8), (std::vector<std::uint32_t>{0, 1, 2}));
  EXPECT_EQ(chosen(with_ranks("3,0,9", 8), 8), (std::vector<std::uint32_t>{0, 3}));
  // A rank that cannot tell its local rank sends them (nothing is lost).
  AgentConfig node = with_ranks("node", 16);
  node.rank = 5;
  EXPECT_FALSE(sends_full_stats(node, 5));
  EXPECT_TRUE(sends_full_stats(node, std::nullopt));
}

TEST(FullRanksTest, AutoIsEveryRankUpTo64AndOnePerNodeBeyond) {
  EXPECT_EQ(kFullRanksAllUpTo, 64u);
  EXPECT_EQ(chosen(with_ranks("auto", 1), 8).size(), 1u);
  EXPECT_EQ(chosen(with_ranks("auto", 64), 8).size(), 64u);
  const std::vector<std::uint32_t> at65 = chosen(with_ranks("auto", 65), 8);
  EXPECT_EQ(at65, (std::vector<std::uint32_t>{0, 8, 16, 24, 32, 40, 48, 56, 64}));
  EXPECT_EQ(chosen(with_ranks("auto", 4096), 8).size(), 512u);
  EXPECT_EQ(chosen(with_ranks("auto", 1024), 4).size(), 256u);
}

TEST(FullRanksTest, TheLocalRankComesFromTheConfigThenTheLaunchers) {
  LauncherEnvironment env;
  AgentConfig c;
  EXPECT_EQ(local_rank_of(c), std::nullopt);
  env.set("SLURM_LOCALID", "6");
  EXPECT_EQ(local_rank_of(c), 6u);
  env.set("MPI_LOCALRANKID", "5");
  EXPECT_EQ(local_rank_of(c), 5u);
  env.set("OMPI_COMM_WORLD_LOCAL_RANK", "4");
  EXPECT_EQ(local_rank_of(c), 4u);
  env.set("LOCAL_RANK", "3");
  EXPECT_EQ(local_rank_of(c), 3u);
  c.local_rank = 1;
  EXPECT_EQ(local_rank_of(c), 1u) << "the option wins over the environment";
  c.local_rank = -1;
  env.set("LOCAL_RANK", "three");
  EXPECT_EQ(local_rank_of(c), std::nullopt) << "the first set variable decides";
}

// Runs steps 0..4 of the fake model; step 2 holds a NaN in h0.mlp.fc.grad (order 5), which
// the trainer reports as found_inf and a skipped step.
void run_five_steps(Agent& agent) {
  for (int step = 0; step < 5; ++step) {
    auto tensors = make_step_tensors();
    if (step == 2) {
      for (auto& t : tensors) {
        if (t.name == "h0.mlp.fc.grad") t.fp16[9] = 0x7e00;
      }
    }
    if (agent.begin_step(step)) {
      int order = 0;
      for (const auto& t : tensors) agent.observe(view_of(t, order++, 1024.0));
    }
    StepInfo info;
    info.step = step;
    info.found_inf = info.skipped = step == 2;
    info.loss = 2.0 + step;
    info.loss_scale = 1024.0;
    info.scale_after = step == 2 ? 512.0 : 1024.0;
    info.lr = 1e-3;
    info.tokens = 256;
    agent.end_step(info);
  }
}

// Rank `rank` of 128 (auto: one rank per node of 8) with a full step every 2 steps.
std::vector<v1::StepReport> run_rank(const TempDir& dir, std::uint32_t rank, Counters* counters,
                                     AgentConfig* in_force) {
  AgentConfig c = base_config(dir, "ranks");
  c.world_size = 128;
  c.rank = rank;
  c.local_rank = static_cast<std::int32_t>(rank % 8);
  c.sampling.full_every = 2;
  {
    auto agent = make_agent(c);
    run_five_steps(*agent);
    *in_force = agent->config();
    EXPECT_TRUE(agent->shutdown(std::chrono::milliseconds(0)).ok());
    *counters = agent->counters();
  }
  return testing::read_spool(dir / "spool", "ranks", static_cast<int>(rank));
}

TEST(FullRanksTest, ARankLeftOutReportsCountsItsFirstOffenderAndItsSkip) {
  TempDir dir;
  Counters counters;
  AgentConfig in_force;
  const auto r = run_rank(dir, 3, &counters, &in_force);
  ASSERT_EQ(r.size(), 5u);
  EXPECT_EQ(counters.dropped_tensors, 0u);
  EXPECT_EQ(in_force.flight_recorder_steps, 0u) << "no flight recorder where nothing is full";
  for (int step : {0, 1, 3, 4}) {  // 0 and 4: full_every; 3: after the NaN and the scale change
    const auto& report = r[static_cast<std::size_t>(step)];
    EXPECT_EQ(report.step(), step);
    EXPECT_EQ(report.loss(), 2.0 + step);
    EXPECT_FALSE(report.has_first_offender());
    EXPECT_EQ(report.history_size(), 0);
    ASSERT_EQ(report.tensors_size(), 3) << "the counted gradients, step " << step;
    for (const auto& t : report.tensors()) {
      EXPECT_EQ(t.level(), v1::STATS_LEVEL_COUNTS) << t.name() << ", step " << step;
      EXPECT_FALSE(t.has_histogram());
      EXPECT_EQ(t.numel(), 256u);
      EXPECT_GT(t.max_abs(), 0.0);
    }
  }
  // The step that went wrong: its skip and scales, its first offender, the NaN counted, and in
  // full from the offender on (the birthplace is never lost).
  const auto& bad = r[2];
  EXPECT_TRUE(bad.found_inf());
  EXPECT_TRUE(bad.skipped());
  EXPECT_EQ(bad.loss_scale(), 1024.0);
  EXPECT_EQ(bad.scale_after(), 512.0);
  ASSERT_TRUE(bad.has_first_offender());
  EXPECT_EQ(bad.first_offender().tensor(), "h0.mlp.fc.grad");
  EXPECT_EQ(bad.first_offender().order(), 5u);
  ASSERT_EQ(bad.tensors_size(), 3);
  for (const auto& t : bad.tensors()) {
    const bool from_offender = t.order() >= 5;
    EXPECT_EQ(t.level(), from_offender ? v1::STATS_LEVEL_FULL : v1::STATS_LEVEL_COUNTS) << t.name();
    EXPECT_EQ(t.has_histogram(), from_offender) << t.name();
    EXPECT_EQ(t.nan(), t.name() == "h0.mlp.fc.grad" ? 1u : 0u) << t.name();
  }
}

TEST(FullRanksTest, AChosenRankSendsItsFullSteps) {
  TempDir dir;
  Counters counters;
  AgentConfig in_force;
  const auto r = run_rank(dir, 8, &counters, &in_force);  // local rank 0 of the second node
  ASSERT_EQ(r.size(), 5u);
  EXPECT_EQ(in_force.flight_recorder_steps, AgentConfig{}.flight_recorder_steps);
  for (int step : {0, 3, 4}) {
    const auto& report = r[static_cast<std::size_t>(step)];
    ASSERT_EQ(report.tensors_size(), 7) << "every tensor in full, step " << step;
    for (const auto& t : report.tensors()) {
      EXPECT_EQ(t.level(), v1::STATS_LEVEL_FULL) << t.name() << ", step " << step;
      EXPECT_TRUE(t.has_histogram());
      EXPECT_EQ(t.targets_size(), 1);
    }
  }
  ASSERT_EQ(r[1].tensors_size(), 3);
  EXPECT_EQ(r[1].tensors(0).level(), v1::STATS_LEVEL_COUNTS);
  ASSERT_TRUE(r[2].has_first_offender());
  EXPECT_EQ(r[2].first_offender().tensor(), "h0.mlp.fc.grad");
}

TEST(FullRanksTest, ARankThatCannotTellItsNodeSendsFullStatisticsAndSaysWhy) {
  LauncherEnvironment env;
  TempDir dir;
  AgentConfig c = base_config(dir, "unknown-node");
  c.world_size = 128;
  c.rank = 3;
  c.sampling.full_every = 2;
  auto agent = make_agent(c);
  EXPECT_EQ(agent->config().local_rank, -1);
  EXPECT_EQ(agent->config().flight_recorder_steps, AgentConfig{}.flight_recorder_steps);
  const auto notices = agent->notices();
  EXPECT_TRUE(
      std::any_of(notices.begin(), notices.end(),
                  [](const std::string& n) {
                    return n.find("sample_full_ranks=auto: this rank's local rank is unknown") !=
                           std::string::npos;
                  }))
      << "notices: " << notices.size();

  // Told by the launcher: the config in force says which local rank it used, and this rank,
  // not the first of its node, keeps no flight recorder.
  env.set("OMPI_COMM_WORLD_LOCAL_RANK", "3");
  c.run_id = "told";
  auto told = make_agent(c);
  EXPECT_EQ(told->config().local_rank, 3);
  EXPECT_EQ(told->config().flight_recorder_steps, 0u);
}

}  // namespace
}  // namespace ampscope::agent
