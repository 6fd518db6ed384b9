// Multi-rank runs through the real server: two agent streams of one run (world_size 2). A step
// that only one rank reports within the deadline is merged as partial (stored, counted, shown);
// ranks that disagree on a step are counted once per field and named by `ampscope show`; a step
// waiting for a rank when the server restarts still waits for it afterwards; a skipped step is
// explained by the first offender merged over the ranks, with its rank.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "ampscope/testing/net.h"
#include "server_harness.h"

#ifndef AMPSCOPE_CLI_BINARY
#error "AMPSCOPE_CLI_BINARY must name the ampscope executable"
#endif

namespace ampscope::testing {
namespace {

constexpr const char* kRun = "run-ranks";

class ServerMultiRankTest : public ::testing::Test {
 protected:
  void start(const std::string& deadline_ms) {
    server_ = std::make_unique<ServerProcess>(
        dir_.path(), dir_ / "store.db",
        std::vector<std::string>{"--rank-merge-deadline-ms", deadline_ms});
  }

  void connect(std::uint32_t rank) {
    streams_[rank] = std::make_unique<AgentStream>(make_channel(server_->address()));
    ASSERT_TRUE(streams_[rank]->send_hello(make_hello(kRun, rank, 2)));
    ASSERT_TRUE(streams_[rank]->wait_ack(0).has_value());
  }

  // Rank `rank` reports `step` (seq = step + 1), scale_after as given, and waits for its Ack:
  // acknowledgements never wait for the other rank.
  void report(std::uint32_t rank, std::int64_t step, double scale_after = 65536.0) {
    v1::StepReport r = make_report(kRun, rank, static_cast<std::uint64_t>(step) + 1, step, 1);
    r.set_scale_after(scale_after);
    r.set_step_time_s(rank == 0 ? 0.05 : 0.25);
    ASSERT_TRUE(streams_[rank]->send(r));
    ASSERT_TRUE(streams_[rank]->wait_ack(r.seq(), 5s).has_value());
  }

  // Sends a report built by the test and waits for its Ack.
  void send(const v1::StepReport& r) {
    ASSERT_TRUE(streams_[r.rank()]->send(r));
    ASSERT_TRUE(streams_[r.rank()]->wait_ack(r.seq(), 5s).has_value());
  }

  // Polls GetRun until `done` holds (5 s at most).
  v1::GetRunResponse run_when(const std::function<bool(const v1::GetRunResponse&)>& done) {
    std::optional<v1::GetRunResponse> run;
    for (int i = 0; i < 100; ++i) {
      run = get_run(server_->address(), kRun);
      if (run && done(*run)) break;
      std::this_thread::sleep_for(50ms);
    }
    EXPECT_TRUE(run.has_value());
    return run.value_or(v1::GetRunResponse());
  }

  CommandResult show(bool json) {
    std::vector<std::string> args{AMPSCOPE_CLI_BINARY, "show", kRun, "--server",
                                  server_->address()};
    if (json) args.push_back("--json");
    return run_process(args, 30s);
  }

  TempDir dir_;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<AgentStream> streams_[2];
};

TEST_F(ServerMultiRankTest, AStepOnlyOneRankReportsInTimeIsStoredCountedAndShownAsPartial) {
  start("300");
  connect(0);
  connect(1);
  report(0, 0);
  report(1, 0);
  report(0, 1);  // rank 1 never reports step 1
  const v1::GetRunResponse run =
      run_when([](const v1::GetRunResponse& r) { return r.summary().partial_steps() > 0; });
  EXPECT_EQ(run.summary().partial_steps(), 1u);
  ASSERT_EQ(run.partial_steps_size(), 1);
  EXPECT_EQ(run.partial_steps(0).step(), 1);
  ASSERT_EQ(run.partial_steps(0).ranks_size(), 1);
  EXPECT_EQ(run.partial_steps(0).ranks(0), 0u);
  EXPECT_EQ(run.summary().divergent_steps(), 0u);

  const std::vector<Sample> m = parse_samples(scrape(server_->metrics_address()));
  EXPECT_EQ(sample_value(m, "ampscope_partial_steps_total", {{"run", kRun}}), 1.0);
  // The straggler is visible per rank.
  ASSERT_EQ(run.agents_size(), 2);
  EXPECT_NEAR(run.agents(0).mean_step_time_s(), 0.05, 1e-9);
  EXPECT_NEAR(run.agents(1).mean_step_time_s(), 0.25, 1e-9);

  const CommandResult text = show(false);
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_NE(text.out.find("partial steps (1)"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("step time per rank"), std::string::npos) << text.out;
}

TEST_F(ServerMultiRankTest, RanksDisagreeingOnScaleAfterAreCountedOnceAndNamedByShow) {
  start("3000");
  connect(0);
  connect(1);
  for (std::int64_t s = 0; s < 3; ++s) {
    report(0, s);
    report(1, s, s == 2 ? 32768.0 : 65536.0);
  }
  const v1::GetRunResponse run =
      run_when([](const v1::GetRunResponse& r) { return r.summary().divergent_steps() > 0; });
  ASSERT_EQ(run.rank_divergences_size(), 1);
  const v1::RankDivergence& d = run.rank_divergences(0);
  EXPECT_EQ(d.step(), 2);
  EXPECT_EQ(d.field(), "scale_after");
  ASSERT_EQ(d.values_size(), 2);
  EXPECT_EQ(d.values(0).value(), "65536");
  EXPECT_EQ(d.values(1).value(), "32768");

  const std::vector<Sample> m = parse_samples(scrape(server_->metrics_address()));
  EXPECT_EQ(sample_value(m, "ampscope_rank_divergence_total",
                         {{"run", kRun}, {"field", "scale_after"}}),
            1.0);
  EXPECT_TRUE(find_samples(m, "ampscope_rank_divergence_total", {{"field", "loss_scale"}}).empty());
  EXPECT_EQ(sample_value(m, "ampscope_partial_steps_total", {{"run", kRun}}), 0.0);

  const CommandResult text = show(false);
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_NE(text.out.find("Rank divergence (1 steps)"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("rank 0 65536, rank 1 32768"), std::string::npos) << text.out;
  const CommandResult js = show(true);
  ASSERT_EQ(js.code, 0) << js.err;
  const nlohmann::json j = nlohmann::json::parse(js.out);
  ASSERT_EQ(j.at("rank_divergence").size(), 1u);
  EXPECT_EQ(j["rank_divergence"][0].at("step"), 2);
  EXPECT_EQ(j["rank_divergence"][0].at("field"), "scale_after");
  EXPECT_EQ(j["rank_divergence"][0].at("values").size(), 2u);
}

// A NaN born on rank 1: its loss (execution order 40) is its first non-finite tensor, while rank 0
// sees the NaN only in the all-reduced gradient of wte (order 69). The skipped step is explained
// by the merged first offender, rank 1's loss, as the policy engine saw it: in `show`, `show
// --json`, the web UI's API and ampscope_first_offenders_total alike, each naming the rank. The
// same run's agents hold the policy seq their reports say they applied, and a rank that handled
// no policy update at a step where another did is shown as "none".
TEST_F(ServerMultiRankTest, ASkippedStepNamesTheMergedFirstOffenderAndItsRank) {
  start("3000");
  connect(0);
  connect(1);
  report(0, 0);
  report(1, 0);
  for (std::uint32_t rank : {0u, 1u}) {
    v1::StepReport r = make_report(kRun, rank, 2, 1, 1);
    r.set_found_inf(true);
    r.set_skipped(true);
    r.set_scale_after(32768.0);
    v1::FirstOffender* f = r.mutable_first_offender();
    if (rank == 0) {
      f->set_tensor("wte");
      f->set_role(v1::TENSOR_ROLE_WEIGHT_GRAD);
      f->set_phase(v1::TENSOR_PHASE_BACKWARD);
      f->set_order(69);
    } else {
      r.set_loss(std::nan(""));
      f->set_tensor("loss");
      f->set_role(v1::TENSOR_ROLE_LOSS);
      f->set_phase(v1::TENSOR_PHASE_FORWARD);
      f->set_order(40);
    }
    send(r);
  }
  for (std::uint32_t rank : {0u, 1u}) {
    v1::StepReport r = make_report(kRun, rank, 3, 2, 1, 32768.0);
    r.set_policy_seq(3);
    if (rank == 0) {
      v1::PolicyOutcome* o = r.add_policy_outcomes();
      o->set_policy_id("external-7");
      o->set_applied(true);
    }
    send(r);
  }

  const v1::GetRunResponse run = run_when([](const v1::GetRunResponse& r) {
    return r.skipped_steps_size() == 1 && r.skipped_steps(0).first_offender().tensor() == "loss" &&
           r.summary().divergent_steps() > 0;
  });
  ASSERT_EQ(run.skipped_steps_size(), 1);
  const v1::SkippedStep& skip = run.skipped_steps(0);
  EXPECT_EQ(skip.step(), 1);
  EXPECT_EQ(skip.first_offender().tensor(), "loss");
  EXPECT_EQ(skip.first_offender().order(), 40u);
  EXPECT_EQ(skip.offender_rank(), 1u);
  // Both ranks' own first offenders are still listed.
  ASSERT_EQ(run.first_offenders_size(), 2);
  EXPECT_EQ(run.first_offenders(0).offender().tensor(), "wte");
  EXPECT_EQ(run.first_offenders(1).offender().tensor(), "loss");
  ASSERT_EQ(run.agents_size(), 2);
  EXPECT_EQ(run.agents(0).last_policy_seq(), 3u);
  EXPECT_EQ(run.agents(1).last_policy_seq(), 3u);

  // Counted once for the step, under the rank and role of the merged first offender.
  const std::vector<Sample> m = parse_samples(scrape(server_->metrics_address()));
  EXPECT_EQ(sample_value(m, "ampscope_first_offenders_total",
                         {{"run", kRun}, {"rank", "1"}, {"role", "loss"}}),
            1.0);
  for (const Sample& s : find_samples(m, "ampscope_first_offenders_total", {{"run", kRun}})) {
    if (s.labels.at("role") != "loss") EXPECT_EQ(s.value, 0.0) << s.labels.at("role");
  }

  const std::string why = "first offender loss (loss, order 40, micro-step 0) on rank 1";
  const CommandResult text = show(false);
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_NE(text.out.find("step 1        rank 0   found_inf at scale 65536; " + why),
            std::string::npos)
      << text.out;
  EXPECT_EQ(text.out.find("found_inf at scale 65536; first offender wte"), std::string::npos)
      << text.out;
  EXPECT_NE(text.out.find("holds policy seq 3"), std::string::npos) << text.out;
  EXPECT_EQ(text.out.find("holds policy seq 0"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("policy_outcomes rank 0 external-7:applied, rank 1 none"),
            std::string::npos)
      << text.out;

  const CommandResult js = show(true);
  ASSERT_EQ(js.code, 0) << js.err;
  const nlohmann::json j = nlohmann::json::parse(js.out);
  ASSERT_EQ(j.at("skipped_steps").size(), 1u);
  const nlohmann::json& offender = j["skipped_steps"][0].at("first_offender");
  EXPECT_EQ(offender.at("tensor"), "loss");
  EXPECT_EQ(offender.at("role"), "loss");
  EXPECT_EQ(offender.at("order"), 40);
  EXPECT_EQ(offender.at("rank"), 1);
  EXPECT_NE(j["skipped_steps"][0].at("why").get<std::string>().find(why), std::string::npos);

  std::string body;
  ASSERT_EQ(http_get("http://" + server_->http_address() + "/api/runs/" + kRun, &body), 200)
      << body;
  const nlohmann::json web = nlohmann::json::parse(body);
  ASSERT_EQ(web.at("skips").size(), 1u);
  EXPECT_EQ(web["skips"][0].at("offender"), "loss");
  EXPECT_EQ(web["skips"][0].at("offender_rank"), 1);
  EXPECT_NE(web["skips"][0].at("why").get<std::string>().find(why), std::string::npos);
}

TEST_F(ServerMultiRankTest, AStepWaitingForARankAtARestartStillWaitsForItAfterwards) {
  start("60000");
  connect(0);
  connect(1);
  report(0, 0);
  report(1, 0);
  report(0, 1);
  // Killed with its streams open: a rank whose stream ended would not be waited for.
  server_->kill9();
  streams_[0].reset();
  streams_[1].reset();
  server_.reset();

  start("60000");
  connect(0);
  connect(1);
  report(1, 1, 32768.0);  // merged with rank 0's step 1 from before the restart
  const v1::GetRunResponse run =
      run_when([](const v1::GetRunResponse& r) { return r.summary().divergent_steps() > 0; });
  ASSERT_EQ(run.rank_divergences_size(), 1);
  EXPECT_EQ(run.rank_divergences(0).step(), 1);
  EXPECT_EQ(run.summary().partial_steps(), 0u);
}

}  // namespace
}  // namespace ampscope::testing
