// The closed loop end to end: ampscope-server decides a policy, the agent in ampscope-train
// applies it at exactly its effective step (or refuses it and says why), and the first
// offender of injected faults reaches the server. Real processes on loopback.
#include <gtest/gtest.h>

#include <map>
#include <tuple>
#include <vector>

#include "ampscope/testing/child_process.h"
#include "ampscope/testing/files.h"
#include "ampscope/testing/server_process.h"
#include "server_harness.h"
#include "trainer_run.h"

namespace ampscope::testing {
namespace {

std::map<std::int64_t, v1::StepReport> by_step(const std::vector<v1::StepReport>& reports) {
  std::map<std::int64_t, v1::StepReport> m;
  for (const auto& r : reports) m[r.step()] = r;
  return m;
}

// Runs the trainer against a server with `server_flags`; returns the stored reports and the
// policy state.
struct LoopResult {
  std::map<std::int64_t, v1::StepReport> reports;
  std::optional<v1::GetPolicyResponse> policy;
  std::string trainer_log;
};

LoopResult run_loop(const TempDir& dir, const std::string& run_id,
                    std::vector<std::string> server_flags, std::vector<std::string> trainer_flags,
                    int steps) {
  LoopResult out;
  // The update has to arrive before its effective step: commits without fsync keep the
  // server's answer quick on a loaded machine.
  server_flags.insert(server_flags.end(), {"--sync", "normal"});
  ServerProcess server(trainer_server(dir.path(), std::move(server_flags)));
  TrainerRun run{dir.path(), run_id, server.address(), steps, std::move(trainer_flags)};
  ChildProcess trainer(run.argv(), dir / "train.log");
  const int code = trainer.wait(120s);
  out.trainer_log = trainer.log();
  EXPECT_EQ(code, 0) << out.trainer_log;
  out.reports = by_step(stored_reports(server.address(), run_id));
  out.policy = get_policy(server.address(), run_id);
  return out;
}

TEST(PolicyLoopTest, UpdateIsAppliedAtExactlyTheRequestedStep) {
  TempDir dir;
  const LoopResult r =
      run_loop(dir, "policy-apply",
               {"--policy", "static-params", "--static-loss-scale", "1024",
                "--static-growth-interval", "1000000", "--policy-lead-steps", "80"},
               {"--precision", "amp-fp16"}, 200);
  ASSERT_TRUE(r.policy);
  ASSERT_GE(r.policy->history_size(), 1);
  const auto& decision = r.policy->history(0);
  const std::int64_t at = decision.update().effective_from_step();
  ASSERT_EQ(decision.applications_size(), 1) << r.trainer_log;
  EXPECT_TRUE(decision.applications(0).applied()) << decision.applications(0).reason();
  EXPECT_EQ(decision.applications(0).step(), at);
  ASSERT_TRUE(r.reports.count(at) && r.reports.count(at - 1));
  EXPECT_EQ(r.reports.at(at).loss_scale(), 1024.0) << "the new scale governs step " << at;
  EXPECT_NE(r.reports.at(at - 1).loss_scale(), 1024.0) << "and not the step before";
  ASSERT_EQ(r.reports.at(at).policy_outcomes_size(), 1);
  EXPECT_EQ(r.reports.at(at).policy_outcomes(0).policy_id(), decision.update().policy_id());
  EXPECT_TRUE(r.reports.at(at).policy_outcomes(0).applied());
  // With growth frozen by the policy, the scale stays (no overflow in this run).
  EXPECT_EQ(r.reports.rbegin()->second.scale_after(), 1024.0);
}

// policy_lockstep: the headroom policy's closed loop, run twice, takes the same decisions at the
// same steps, so the per-step loss scale and loss repeat exactly (without lockstep the
// decisions land on steps that depend on how late they arrive).
TEST(PolicyLoopTest, LockstepRunsRepeatExactly) {
  std::vector<std::vector<std::tuple<std::int64_t, double, double>>> runs;
  for (int i = 0; i < 2; ++i) {
    TempDir dir;
    const LoopResult r = run_loop(dir, "lockstep", {"--policy", "headroom"},
                                  {"--precision", "amp-fp16", "--scaler", "dynamic",
                                   "--init-scale", "16777216", "--agent", "policy_lockstep=on"},
                                  60);
    ASSERT_EQ(r.reports.size(), 60u) << r.trainer_log;
    ASSERT_TRUE(r.policy);
    int applied = 0;
    for (const auto& d : r.policy->history()) {
      for (const auto& a : d.applications()) applied += a.applied() ? 1 : 0;
    }
    EXPECT_GT(applied, 0) << "the loop must have acted for the comparison to mean anything";
    runs.emplace_back();
    for (const auto& [step, report] : r.reports) {
      runs.back().emplace_back(step, report.loss_scale(), report.loss());
      for (const auto& n : report.notices()) {
        EXPECT_EQ(n.find("lockstep gave up"), std::string::npos) << n;
      }
    }
  }
  EXPECT_EQ(runs[0], runs[1]);
}

TEST(PolicyLoopTest, MalformedUpdateIsRefusedAndReported) {
  TempDir dir;
  // The server accepts any finite static scale; the agent applies powers of two only.
  const LoopResult r = run_loop(
      dir, "policy-malformed",
      {"--policy", "static-params", "--static-loss-scale", "1000", "--policy-lead-steps", "80"},
      {}, 200);
  ASSERT_TRUE(r.policy);
  ASSERT_GE(r.policy->history_size(), 1);
  const auto& d = r.policy->history(0);
  ASSERT_EQ(d.applications_size(), 1) << r.trainer_log;
  EXPECT_FALSE(d.applications(0).applied());
  EXPECT_NE(d.applications(0).reason().find("power of two"), std::string::npos)
      << d.applications(0).reason();
  for (const auto& [step, report] : r.reports) {
    EXPECT_NE(report.loss_scale(), 1000.0) << "step " << step;
  }
  EXPECT_NE(r.trainer_log.find("0 policy updates applied, 1 refused"), std::string::npos)
      << r.trainer_log;
}

TEST(PolicyLoopTest, OutOfBoundsUpdateIsRefusedAndReported) {
  TempDir dir;
  // A power of two, but below the trainer's min_scale.
  const LoopResult r = run_loop(
      dir, "policy-bounds",
      {"--policy", "static-params", "--static-loss-scale", "1024", "--policy-lead-steps", "80"},
      {"--min-scale", "4096"}, 200);
  ASSERT_TRUE(r.policy);
  ASSERT_GE(r.policy->history_size(), 1);
  const auto& d = r.policy->history(0);
  ASSERT_EQ(d.applications_size(), 1) << r.trainer_log;
  EXPECT_FALSE(d.applications(0).applied());
  EXPECT_NE(d.applications(0).reason().find("outside [4096"), std::string::npos)
      << d.applications(0).reason();
}

TEST(FirstOffenderTest, InjectedFaultsInSeveralTensors) {
  TempDir dir;
  // Activations counted every step too, so that faults born in the forward pass are found
  // where they are born.
  const LoopResult r = run_loop(dir, "offender", {},
                                {"--sample-count-roles", "activation,activation_grad,weight_grad,loss",
                                 "--inject-nan", "h0.mlp.fc@5", "--inject-inf",
                                 "h1.attn.qkv.grad@9", "--inject-nan", "logits.grad@13",
                                 "--inject-nan", "h0.ln1@17", "--inject-inf", "h0.ln1.grad@17"},
                                24);
  ASSERT_EQ(r.reports.size(), 24u);
  struct Expect {
    std::int64_t step;
    const char* tensor;
    v1::TensorRole role;
  };
  for (const Expect& e : {Expect{5, "h0.mlp.fc", v1::TENSOR_ROLE_ACTIVATION},
                          Expect{9, "h1.attn.qkv", v1::TENSOR_ROLE_ACTIVATION_GRAD},
                          Expect{13, "logits", v1::TENSOR_ROLE_ACTIVATION_GRAD},
                          Expect{17, "h0.ln1", v1::TENSOR_ROLE_ACTIVATION}}) {
    const auto& rep = r.reports.at(e.step);
    ASSERT_TRUE(rep.has_first_offender()) << "step " << e.step;
    EXPECT_EQ(rep.first_offender().tensor(), e.tensor) << "step " << e.step;
    EXPECT_EQ(rep.first_offender().role(), e.role) << "step " << e.step;
    EXPECT_TRUE(rep.found_inf() && rep.skipped()) << "step " << e.step;
    // The order index is the offender's own sample's.
    bool found = false;
    for (const auto& t : rep.tensors()) {
      if (t.order() == rep.first_offender().order()) {
        found = true;
        EXPECT_EQ(t.name(), e.tensor);
        EXPECT_GT(t.nan() + t.pos_inf() + t.neg_inf(), 0u);
        EXPECT_EQ(t.level(), v1::STATS_LEVEL_FULL);
      } else if (t.order() < rep.first_offender().order()) {
        EXPECT_EQ(t.nan() + t.pos_inf() + t.neg_inf(), 0u) << t.name();
      }
    }
    EXPECT_TRUE(found);
  }
  for (const auto& [step, rep] : r.reports) {
    if (step != 5 && step != 9 && step != 13 && step != 17) {
      EXPECT_FALSE(rep.has_first_offender()) << "step " << step;
    }
  }
}

TEST(FirstOffenderTest, WithDefaultSamplingAForwardFaultShowsAtTheLoss) {
  TempDir dir;
  const LoopResult r = run_loop(dir, "offender-default", {},
                                {"--inject-nan", "h0.mlp.fc@5", "--inject-inf", "h1.attn.qkv.grad@9"},
                                12);
  ASSERT_EQ(r.reports.size(), 12u);
  const auto& five = r.reports.at(5);
  ASSERT_TRUE(five.has_first_offender());
  EXPECT_EQ(five.first_offender().tensor(), "loss");
  EXPECT_EQ(five.first_offender().role(), v1::TENSOR_ROLE_LOSS);
  // Gradients are counted every step: a fault born in the backward pass is found where it is.
  ASSERT_TRUE(r.reports.at(9).has_first_offender());
  EXPECT_EQ(r.reports.at(9).first_offender().tensor(), "h1.attn.qkv");
  // The step after a non-finite step measures everything, activations included.
  bool activation = false;
  for (const auto& t : r.reports.at(6).tensors()) {
    activation = activation || t.role() == v1::TENSOR_ROLE_ACTIVATION;
  }
  EXPECT_TRUE(activation);
}

}  // namespace
}  // namespace ampscope::testing
