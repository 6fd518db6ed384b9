// The policy loop through the real server: agents stream scripted gradient histograms; the
// server's headroom policy picks the expected scale, pushes it to every rank of the run with
// one effective_from_step, stays within its bounds, does not flap while the histograms
// fluctuate, stores each decision with its reason and the agents' answers, and restores its
// state after a restart.
#include <gtest/gtest.h>

#include <cmath>

#include "ampscope/loss_scale.h"
#include "server_harness.h"

namespace ampscope::testing {
namespace {

constexpr const char* kRun = "run-pol";

// A gradient whose unscaled magnitudes span binades [top - 9, top], measured at `scale`.
v1::TensorStats gradient(const std::string& name, v1::TensorRole role, int top, double scale) {
  const int k = scale_exponent(scale);
  v1::TensorStats t;
  t.set_name(name);
  t.set_role(role);
  t.set_phase(v1::TENSOR_PHASE_BACKWARD);
  t.set_dtype(v1::FORMAT_FP16);
  t.set_scale(scale);
  t.set_level(v1::STATS_LEVEL_FULL);
  t.set_numel(1000);
  t.set_min_abs_nonzero(std::ldexp(1.0, top - 9 + k));
  t.set_max_abs(std::ldexp(1.5, top + k));
  t.set_sum_sq(1.0);
  t.mutable_histogram()->set_min_exponent(top - 9 + k);
  for (int i = 0; i < 10; ++i) t.mutable_histogram()->add_counts(100);
  v1::TargetCounts* c = t.add_targets();
  c->set_format(v1::FORMAT_FP16);
  return t;
}

class ServerPolicyLoopTest : public ::testing::Test {
 protected:
  std::vector<std::string> headroom_flags(const std::string& max_scale = "16777216") {
    return {"--policy",
            "headroom",
            "--headroom-every",
            "1",
            "--headroom-window",
            "8",
            "--headroom-raise-after",
            "3",
            "--headroom-margin",
            "1",
            "--policy-lead-steps",
            "2",
            "--headroom-max-scale",
            max_scale};
  }

  // Two ranks in lockstep: each sends step s at its current scale, waits for the ack, then
  // applies the updates that take effect by the next step, and reports each as applied.
  struct Rank {
    std::unique_ptr<AgentStream> stream;
    double scale = 1024.0;
    std::uint64_t seq = 0;
    std::size_t seen_updates = 0;
    std::vector<v1::PolicyUpdate> pending;
    std::vector<v1::PolicyOutcome> outcomes;
    std::vector<v1::PolicyUpdate> all;
  };

  void connect(const ServerProcess& server, Rank& rank, std::uint32_t id) {
    rank.stream = std::make_unique<AgentStream>(make_channel(server.address()));
    v1::Hello hello = make_hello(kRun, id, 2);
    hello.mutable_scaler()->set_init_scale(1024.0);  // the run's configuration, not its state
    ASSERT_TRUE(rank.stream->send_hello(hello));
    ASSERT_TRUE(rank.stream->wait_ack(0).has_value());
    rank.seen_updates = 0;
  }

  void step(std::int64_t s, std::uint32_t id, Rank& rank) {
    // Apply what takes effect at this step, exactly there.
    for (auto it = rank.pending.begin(); it != rank.pending.end();) {
      if (it->effective_from_step() <= s) {
        if (it->has_loss_scale()) rank.scale = it->loss_scale();
        v1::PolicyOutcome o;
        o.set_policy_id(it->policy_id());
        o.set_applied(true);
        rank.outcomes.push_back(o);
        it = rank.pending.erase(it);
      } else {
        ++it;
      }
    }
    // The histograms fluctuate: the top binade is -3 every third step and -4 otherwise.
    const int top = s % 3 == 0 ? -3 : -4;
    v1::StepReport r = make_report(kRun, id, ++rank.seq, s, 0, rank.scale);
    *r.add_tensors() = gradient("h0.mlp.fc.weight", v1::TENSOR_ROLE_WEIGHT_GRAD, top, rank.scale);
    if (weight_grads_held_in_fp32_) r.mutable_tensors(0)->set_held(v1::FORMAT_FP32);
    *r.add_tensors() =
        gradient("h0.mlp.fc.out.grad", v1::TENSOR_ROLE_ACTIVATION_GRAD, top - 2, rank.scale);
    for (const v1::PolicyOutcome& o : rank.outcomes) *r.add_policy_outcomes() = o;
    rank.outcomes.clear();
    ASSERT_TRUE(rank.stream->send(r));
    ASSERT_TRUE(rank.stream->wait_ack(rank.seq).has_value());
  }

  void collect(Rank& rank) {
    while (std::optional<v1::PolicyUpdate> u = rank.stream->wait_policy(rank.seen_updates, 0ms)) {
      ++rank.seen_updates;
      rank.all.push_back(*u);
      rank.pending.push_back(*u);
    }
  }

  // Both ranks connect and run steps [0, steps).
  void start_run(const ServerProcess& server, Rank* ranks, std::int64_t steps) {
    connect(server, ranks[0], 0);
    connect(server, ranks[1], 1);
    run_steps(0, steps, ranks);
  }

  void run_steps(std::int64_t from, std::int64_t to, Rank* ranks) {
    for (std::int64_t s = from; s < to; ++s) {
      for (std::uint32_t id = 0; id < 2; ++id) step(s, id, ranks[id]);
      // Updates caused by reports up to an acked seq arrive before that ack.
      for (std::uint32_t id = 0; id < 2; ++id) collect(ranks[id]);
    }
  }

  static std::vector<v1::PolicyUpdate> scale_updates(const std::vector<v1::PolicyUpdate>& all) {
    std::vector<v1::PolicyUpdate> out;
    for (const auto& u : all) {
      if (u.has_loss_scale()) out.push_back(u);
    }
    return out;
  }

  TempDir dir_;
  bool weight_grads_held_in_fp32_ = false;
};

TEST_F(ServerPolicyLoopTest, HeadroomPicksTheLargestSafeScaleOnEveryRankAndDoesNotFlap) {
  ServerProcess server(dir_.path(), dir_ / "store.db", headroom_flags());
  Rank ranks[2];
  start_run(server, ranks, 40);

  // Unscaled top binade -3: FP16 keeps [2^14, 2^15) overflow-free at 2^17; margin 1 -> 2^16.
  const std::vector<v1::PolicyUpdate> scales = scale_updates(ranks[0].all);
  ASSERT_EQ(scales.size(), 1u) << "the scale must be decided once, not flap";
  EXPECT_EQ(scales[0].loss_scale(), 65536.0);
  EXPECT_GT(scales[0].effective_from_step(), scales[0].decided_at_step());
  EXPECT_FALSE(scales[0].reason().empty());
  EXPECT_EQ(scales[0].mode(), v1::POLICY_MODE_HEADROOM);
  // Every rank got the same decisions, with the same effective step.
  ASSERT_EQ(ranks[1].all.size(), ranks[0].all.size());
  for (std::size_t i = 0; i < ranks[0].all.size(); ++i) {
    EXPECT_EQ(ranks[1].all[i].policy_id(), ranks[0].all[i].policy_id());
    EXPECT_EQ(ranks[1].all[i].effective_from_step(), ranks[0].all[i].effective_from_step());
  }
  EXPECT_EQ(ranks[0].scale, 65536.0);

  auto stub = v1::Query::NewStub(make_channel(server.address()));
  v1::GetPolicyRequest q;
  q.set_run_id(kRun);
  v1::GetPolicyResponse policy;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->GetPolicy(&ctx, q, &policy).ok());
  }
  EXPECT_EQ(policy.mode(), v1::POLICY_MODE_HEADROOM);
  ASSERT_EQ(static_cast<std::size_t>(policy.history_size()), ranks[0].all.size());
  EXPECT_EQ(policy.current().policy_id(), ranks[0].all.back().policy_id());
  // The agents' answers are stored with the decision.
  const v1::PolicyDecision* scale_decision = nullptr;
  for (const auto& d : policy.history()) {
    if (d.update().policy_id() == scales[0].policy_id()) scale_decision = &d;
  }
  ASSERT_NE(scale_decision, nullptr);
  ASSERT_EQ(scale_decision->applications_size(), 2);
  EXPECT_TRUE(scale_decision->applications(0).applied());
  EXPECT_EQ(scale_decision->applications(0).step(), scales[0].effective_from_step());

  const std::vector<Sample> m = parse_samples(scrape(server.metrics_address()));
  EXPECT_EQ(sample_value(m, "ampscope_policy_loss_scale", {{"run", kRun}}), 65536.0);
  EXPECT_EQ(sample_value(m, "ampscope_policy_decisions_total",
                         {{"run", kRun}, {"kind", "scale"}, {"mode", "headroom"}}),
            1.0);
  EXPECT_EQ(find_samples(m, "ampscope_policy_last_decision_info", {{"run", kRun}}).size(), 1u);
}

// A trainer that keeps its weight gradients in FP32 says so (TensorStats.held): their FP16
// what-if no longer limits the scale; the FP16 activation gradient (top binade -5) does.
TEST_F(ServerPolicyLoopTest, HeadroomSizesTheScaleAgainstTheFormatAGradientIsHeldIn) {
  weight_grads_held_in_fp32_ = true;
  ServerProcess server(dir_.path(), dir_ / "store.db", headroom_flags());
  Rank ranks[2];
  start_run(server, ranks, 40);
  const std::vector<v1::PolicyUpdate> scales = scale_updates(ranks[0].all);
  ASSERT_EQ(scales.size(), 1u);
  // Top binade -5: FP16 is overflow-free at 2^19; margin 1 -> 2^18 (2^16 when the weight
  // gradient counted as FP16, as in the test above).
  EXPECT_EQ(scales[0].loss_scale(), 262144.0) << scales[0].reason();
  EXPECT_NE(scales[0].reason().find("h0.mlp.fc.out.grad"), std::string::npos)
      << scales[0].reason();
}

TEST_F(ServerPolicyLoopTest, HeadroomNeverExceedsItsBounds) {
  ServerProcess server(dir_.path(), dir_ / "store.db", headroom_flags("4096"));
  Rank ranks[2];
  start_run(server, ranks, 20);
  const std::vector<v1::PolicyUpdate> scales = scale_updates(ranks[0].all);
  ASSERT_EQ(scales.size(), 1u);
  EXPECT_EQ(scales[0].loss_scale(), 4096.0);
  for (const auto& u : ranks[0].all) {
    if (u.has_loss_scale()) {
      EXPECT_LE(u.loss_scale(), 4096.0);
    }
  }
}

// Decisions carry the run's contiguous seq; an agent whose Hello says it holds the latest one is
// not sent the policy in force again, one that lags behind gets the fold with the latest seq.
TEST_F(ServerPolicyLoopTest, UpdatesCarryAContiguousSeqAndTheFoldGoesOnlyToAnAgentBehindIt) {
  ServerProcess server(dir_.path(), dir_ / "store.db", headroom_flags());
  Rank ranks[2];
  start_run(server, ranks, 20);
  const std::vector<v1::PolicyUpdate>& all = ranks[0].all;
  ASSERT_GE(all.size(), 2u);
  for (std::size_t i = 0; i < all.size(); ++i) EXPECT_EQ(all[i].seq(), i + 1);
  ranks[0].stream.reset();
  ranks[1].stream.reset();

  const std::uint64_t latest = all.back().seq();
  const auto attach = [&](std::uint64_t held) {
    auto stream = std::make_unique<AgentStream>(make_channel(server.address()));
    v1::Hello hello = make_hello(kRun, 0, 2);
    hello.set_last_policy_seq(held);
    EXPECT_TRUE(stream->send_hello(hello));
    EXPECT_TRUE(stream->wait_ack(0).has_value());
    return stream;
  };
  EXPECT_FALSE(attach(latest)->wait_policy(0, 500ms).has_value());
  const std::optional<v1::PolicyUpdate> fold = attach(latest - 1)->wait_policy(0);
  ASSERT_TRUE(fold.has_value());
  EXPECT_EQ(fold->seq(), latest);
  EXPECT_EQ(fold->policy_id(), all.back().policy_id());
}

TEST_F(ServerPolicyLoopTest, StateIsRestoredAfterARestart) {
  Rank ranks[2];
  std::string last_policy;
  std::size_t decisions = 0;
  {
    ServerProcess server(dir_.path(), dir_ / "store.db", headroom_flags());
    start_run(server, ranks, 20);
    decisions = ranks[0].all.size();
    ASSERT_GE(decisions, 1u);
    last_policy = ranks[0].all.back().policy_id();
    ranks[0].stream.reset();
    ranks[1].stream.reset();
    server.kill9();  // no shutdown snapshot: the saved state plus replay must be enough
  }
  ServerProcess server(dir_.path(), dir_ / "store.db", headroom_flags());
  for (std::uint32_t id = 0; id < 2; ++id) {
    ranks[id].all.clear();
    ranks[id].pending.clear();
    connect(server, ranks[id], id);
    // Right after the first Ack: the policy in force.
    const std::optional<v1::PolicyUpdate> current = ranks[id].stream->wait_policy(0);
    ASSERT_TRUE(current.has_value());
    EXPECT_EQ(current->policy_id(), last_policy);
    EXPECT_EQ(current->seq(), decisions);
    ranks[id].seen_updates = 1;
  }
  run_steps(20, 40, ranks);
  EXPECT_TRUE(ranks[0].all.empty()) << "a restored engine decides nothing new on the same data; "
                                    << "got: " << ranks[0].all.front().reason();
  EXPECT_EQ(ranks[0].scale, 65536.0);
}

}  // namespace
}  // namespace ampscope::testing
