// The merge of a step's ranks (server/src/rank_merge.h) as a unit: how fields combine, the first
// offender's tie-breaking, divergences, and when a step stops waiting for its ranks.
#include "rank_merge.h"

#include <gtest/gtest.h>

#include <cmath>

namespace ampscope::server {
namespace {

using Clock = RankMerger::Clock;
using namespace std::chrono_literals;

policy::TensorInput tensor(const std::string& name, TensorRole role, int min_exponent,
                           std::vector<std::uint64_t> counts) {
  policy::TensorInput t;
  t.name = name;
  t.role = role;
  t.storage = Format::kFP16;
  t.scale = 1024.0;
  std::uint64_t n = 0;
  for (std::uint64_t c : counts) n += c;
  t.numel = n;
  t.histogram = BinadeHistogram{min_exponent, std::move(counts)};
  t.max_abs = std::ldexp(1.0, t.histogram->max_exponent());
  return t;
}

RankStep report(std::uint32_t rank, std::int64_t step, std::int64_t id) {
  RankStep r;
  r.rank = rank;
  r.report_id = id;
  r.loss = 2.0 + rank;
  r.tokens = 100;
  r.input.run_id = "run";
  r.input.rank = static_cast<int>(rank);
  r.input.step = step;
  r.input.loss_scale = 1024.0;
  r.input.scale_after = 1024.0;
  return r;
}

v1::FirstOffender offender(const std::string& tensor, std::uint32_t order) {
  v1::FirstOffender f;
  f.set_tensor(tensor);
  f.set_order(order);
  return f;
}

TEST(RankMergeTest, CombinesTheFieldsOfEveryRank) {
  RankStep a = report(0, 7, 10);
  RankStep b = report(1, 7, 11);
  b.input.found_inf = true;
  b.input.skipped = true;
  a.input.tensors.push_back(tensor("x.grad", TensorRole::kActivationGrad, -10, {1, 2}));
  b.input.tensors.push_back(tensor("x.grad", TensorRole::kActivationGrad, -9, {3, 4}));
  const MergedStep m = merge_ranks({b, a}, false, false);
  EXPECT_EQ(m.step, 7);
  EXPECT_EQ(m.ranks, (std::vector<std::uint32_t>{0, 1}));
  EXPECT_EQ(m.report_ids, (std::vector<std::int64_t>{10, 11}));
  EXPECT_TRUE(m.input.found_inf);
  EXPECT_TRUE(m.input.skipped);
  EXPECT_EQ(m.tokens, 200u);
  EXPECT_DOUBLE_EQ(m.loss, 2.5);
  // Activation gradients of one tensor are summed binade by binade.
  ASSERT_EQ(m.input.tensors.size(), 1u);
  EXPECT_EQ(m.input.tensors[0].histogram->min_exponent, -10);
  EXPECT_EQ(m.input.tensors[0].histogram->counts, (std::vector<std::uint64_t>{1, 5, 4}));
  EXPECT_EQ(m.input.tensors[0].numel, 10u);
  EXPECT_TRUE(m.input.found_inf);
}

TEST(RankMergeTest, LossIsNanWhenAnyRanksLossIsNotFinite) {
  RankStep a = report(0, 1, 1);
  RankStep b = report(1, 1, 2);
  b.loss = std::numeric_limits<double>::infinity();
  EXPECT_TRUE(std::isnan(merge_ranks({a, b}, false, false).loss));
}

TEST(RankMergeTest, ShardedWeightGradientsAreSummedReplicatedOnesCompared) {
  RankStep a = report(0, 3, 1);
  RankStep b = report(1, 3, 2);
  a.input.tensors.push_back(tensor("w.grad", TensorRole::kWeightGrad, -5, {2}));
  b.input.tensors.push_back(tensor("w.grad", TensorRole::kWeightGrad, -5, {3}));
  a.input.tensors.back().phase = TensorPhase::kAfterUnscale;
  b.input.tensors.back().phase = TensorPhase::kAfterUnscale;
  const MergedStep sharded = merge_ranks({a, b}, true, false);
  EXPECT_EQ(sharded.input.tensors.at(0).histogram->counts, (std::vector<std::uint64_t>{5}));
  EXPECT_TRUE(sharded.divergences.empty());

  const MergedStep replicated = merge_ranks({a, b}, false, false);
  EXPECT_EQ(replicated.input.tensors.at(0).histogram->counts, (std::vector<std::uint64_t>{2}));
  ASSERT_EQ(replicated.divergences.size(), 1u);
  EXPECT_EQ(replicated.divergences[0].field(), "weight_grads");
}

TEST(RankMergeTest, CopiesOfAWeightGradientKeepTheOneReachingHighest) {
  // One rank shows a tied LM head's gradient once per micro-batch (each piece rounded to FP16
  // on its own), two ranks their own backward-phase gradients: the engine must see the piece
  // whose values went highest, not the first one shown.
  RankStep a = report(0, 3, 1);
  a.input.tensors.push_back(tensor("lm_head", TensorRole::kWeightGrad, -5, {4}));
  a.input.tensors.push_back(tensor("lm_head", TensorRole::kWeightGrad, -5, {1, 3}));
  MergedStep one = merge_ranks({a}, false, false);
  ASSERT_EQ(one.input.tensors.size(), 1u);
  EXPECT_EQ(one.input.tensors[0].histogram->max_exponent(), -4);
  RankStep b = report(1, 3, 2);
  b.input.tensors.push_back(tensor("lm_head", TensorRole::kWeightGrad, -5, {1, 0, 0, 1}));
  b.input.tensors.back().pos_inf = 1;
  b.input.tensors.back().numel = 3;
  const MergedStep two = merge_ranks({a, b}, false, false);
  ASSERT_EQ(two.input.tensors.size(), 1u);
  EXPECT_EQ(two.input.tensors[0].pos_inf, 1u);  // non-finite values first
  EXPECT_EQ(two.input.tensors[0].histogram->max_exponent(), -2);
}

TEST(RankMergeTest, BackwardPhaseWeightGradientsAreEachRanksOwnAndNotCompared) {
  // ampscope-train measures weight gradients in the backward pass before the all-reduce (each
  // rank's share of the batch) and again after unscaling (the reduced sum, the same on all).
  RankStep a = report(0, 3, 1);
  RankStep b = report(1, 3, 2);
  a.input.tensors.push_back(tensor("w.grad", TensorRole::kWeightGrad, -5, {2}));
  b.input.tensors.push_back(tensor("w.grad", TensorRole::kWeightGrad, -5, {3}));
  a.input.tensors.back().phase = TensorPhase::kBackward;
  b.input.tensors.back().phase = TensorPhase::kBackward;
  EXPECT_TRUE(merge_ranks({a, b}, false, false).divergences.empty());
}

TEST(RankMergeTest, ReplicatedGradientsAreComparedWhereEveryRankMeasuredThem) {
  // Rank 1 measured its step in full (a non-finite value of its own escalated it), rank 0 only
  // counted: the tensor only rank 1 measured, and rank 1's histogram, are not compared.
  RankStep a = report(0, 3, 1);
  RankStep b = report(1, 3, 2);
  a.input.tensors.push_back(tensor("w.grad", TensorRole::kWeightGrad, -5, {2}));
  a.input.tensors.back().histogram.reset();
  b.input.tensors.push_back(tensor("w.grad", TensorRole::kWeightGrad, -5, {2}));
  b.input.tensors.push_back(tensor("v.grad", TensorRole::kWeightGrad, -5, {7}));
  for (RankStep* r : {&a, &b}) {
    for (auto& t : r->input.tensors) t.phase = TensorPhase::kAfterUnscale;
  }
  EXPECT_TRUE(merge_ranks({a, b}, false, false).divergences.empty());
  b.input.tensors[b.input.tensors.size() - 2].max_abs = 1.0;  // w.grad now differs
  const MergedStep m = merge_ranks({a, b}, false, false);
  ASSERT_EQ(m.divergences.size(), 1u);
  EXPECT_NE(m.divergences[0].values(1).value().find("w.grad: max|x| 1"), std::string::npos);
  EXPECT_EQ(m.divergences[0].values(1).value().find("v.grad"), std::string::npos);
}

TEST(RankMergeTest, ARankWithoutPolicyOutcomesIsShownAsNone) {
  RankStep a = report(0, 4, 1);
  RankStep b = report(1, 4, 2);
  a.policy_outcomes = "3:applied";
  const MergedStep m = merge_ranks({a, b}, false, false);
  ASSERT_EQ(m.divergences.size(), 1u);
  EXPECT_EQ(m.divergences[0].field(), "policy_outcomes");
  ASSERT_EQ(m.divergences[0].values_size(), 2);
  EXPECT_EQ(m.divergences[0].values(0).value(), "3:applied");
  EXPECT_EQ(m.divergences[0].values(1).value(), "none");
}

TEST(RankMergeTest, FirstOffenderIsTheEarliestInOrderThenTheLowestRank) {
  RankStep r0 = report(0, 5, 1);
  RankStep r1 = report(1, 5, 2);
  RankStep r2 = report(2, 5, 3);
  r0.first_offender = offender("late", 9);
  r1.first_offender = offender("early-1", 2);
  r2.first_offender = offender("early-2", 2);
  MergedStep m = merge_ranks({r2, r0, r1}, false, false);
  ASSERT_TRUE(m.first_offender.has_value());
  EXPECT_EQ(m.first_offender->tensor(), "early-1");
  EXPECT_EQ(m.offender_rank, 1u);
  // The policy engine sees the same offender (the lowest rank's header would name "late").
  ASSERT_TRUE(m.input.first_offender.has_value());
  EXPECT_EQ(m.input.first_offender->name, "early-1");

  r2.first_offender = offender("earliest", 1);
  m = merge_ranks({r0, r1, r2}, false, false);
  EXPECT_EQ(m.first_offender->tensor(), "earliest");
  EXPECT_EQ(m.offender_rank, 2u);
}

TEST(RankMergeTest, EachDisagreeingFieldIsOneDivergenceNamingEveryRank) {
  RankStep a = report(0, 4, 1);
  RankStep b = report(1, 4, 2);
  b.input.scale_after = 512.0;
  b.policy_seq = 3;
  const MergedStep m = merge_ranks({a, b}, false, false);
  ASSERT_EQ(m.divergences.size(), 2u);
  EXPECT_EQ(m.divergences[0].field(), "scale_after");
  EXPECT_EQ(m.divergences[0].step(), 4);
  ASSERT_EQ(m.divergences[0].values_size(), 2);
  EXPECT_EQ(m.divergences[0].values(0).value(), "1024");
  EXPECT_EQ(m.divergences[0].values(1).rank(), 1u);
  EXPECT_EQ(m.divergences[0].values(1).value(), "512");
  EXPECT_EQ(m.divergences[1].field(), "policy_seq");
  // The engine takes the smallest scale of the step.
  EXPECT_EQ(m.input.scale_after, 512.0);
}

TEST(RankMergeTest, SingleRankRunsMergeAtOnce) {
  RankMerger merger;
  merger.set_layout(1, false);
  const std::vector<MergedStep> out = merger.add(report(0, 0, 1), Clock::now(), nullptr);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_FALSE(out[0].partial);
  EXPECT_FALSE(merger.waiting());
}

TEST(RankMergeTest, AStepWaitsForEveryRankThenMergesOnce) {
  RankMerger merger;
  merger.set_layout(2, false);
  const Clock::time_point t0 = Clock::now();
  EXPECT_TRUE(merger.add(report(0, 0, 1), t0, nullptr).empty());
  EXPECT_TRUE(merger.add(report(0, 1, 2), t0, nullptr).empty());
  EXPECT_EQ(merger.first_waiting_report(), 1);
  const std::vector<MergedStep> out = merger.add(report(1, 0, 3), t0, nullptr);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].step, 0);
  EXPECT_FALSE(out[0].partial);
  EXPECT_EQ(merger.first_waiting_report(), 2);
}

TEST(RankMergeTest, PastTheDeadlineAStepMergesPartialAndALateRankIsDropped) {
  RankMerger merger(MergeOptions{100ms, 64});
  merger.set_layout(2, false);
  const Clock::time_point t0 = Clock::now();
  EXPECT_TRUE(merger.add(report(0, 0, 1), t0, nullptr).empty());
  EXPECT_TRUE(merger.flush(t0 + 50ms, {0, 1}).empty());
  const std::vector<MergedStep> out = merger.flush(t0 + 100ms, {0, 1});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].partial);
  EXPECT_EQ(out[0].ranks, (std::vector<std::uint32_t>{0}));
  bool late = false;
  EXPECT_TRUE(merger.add(report(1, 0, 2), t0 + 200ms, nullptr, &late).empty());
  EXPECT_TRUE(late);
  EXPECT_FALSE(merger.waiting());
}

TEST(RankMergeTest, AStepStopsWaitingForARankWhoseStreamEnded) {
  RankMerger merger;
  merger.set_layout(2, false);
  const Clock::time_point t0 = Clock::now();
  const auto both = [] { return std::set<std::uint32_t>{0, 1}; };
  EXPECT_TRUE(merger.add(report(0, 0, 1), t0, both).empty());
  EXPECT_TRUE(merger.flush(t0, {0, 1}).empty());
  const std::vector<MergedStep> out = merger.flush(t0, {0});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].partial);
}

TEST(RankMergeTest, PendingStepsAreBoundedOldestFlushedPartial) {
  RankMerger merger(MergeOptions{10s, 2});
  merger.set_layout(2, false);
  const Clock::time_point t0 = Clock::now();
  EXPECT_TRUE(merger.add(report(0, 0, 1), t0, nullptr).empty());
  EXPECT_TRUE(merger.add(report(0, 1, 2), t0, nullptr).empty());
  const std::vector<MergedStep> out = merger.add(report(0, 2, 3), t0, nullptr);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].step, 0);
  EXPECT_TRUE(out[0].partial);
}

// By default the bound is 16,384 waiting reports: a rank of two replaying a long spool after a
// failover keeps thousands of steps waiting for the other; a world of 1,024 keeps 64 steps.
TEST(RankMergeTest, TheDefaultBoundScalesWithTheWorld) {
  const Clock::time_point t0 = Clock::now();
  RankMerger pair;
  pair.set_layout(2, false);
  for (std::int64_t step = 0; step < 8192; ++step) {
    ASSERT_TRUE(pair.add(report(0, step, step + 1), t0, nullptr).empty()) << step;
  }
  std::vector<MergedStep> out = pair.add(report(0, 8192, 8193), t0, nullptr);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].step, 0);
  EXPECT_TRUE(out[0].partial);
  // Rank 1 then completes every step still waiting, none of them partial.
  for (std::int64_t step = 1; step <= 8192; ++step) {
    out = pair.add(report(1, step, 10000 + step), t0, nullptr);
    ASSERT_EQ(out.size(), 1u) << step;
    EXPECT_FALSE(out[0].partial) << step;
  }

  RankMerger wide;
  wide.set_layout(1024, false);
  for (std::int64_t step = 0; step < 64; ++step) {
    ASSERT_TRUE(wide.add(report(0, step, step + 1), t0, nullptr).empty()) << step;
  }
  out = wide.add(report(0, 64, 65), t0, nullptr);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].step, 0);
}

}  // namespace
}  // namespace ampscope::server
