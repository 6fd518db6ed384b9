// Decisions of the policy engine on scripted report sequences.
//
// Most tests drive a small simulated run (Sim): each step it measures every tensor's unscaled
// distribution at the scale in use the way an FP16 run stores it (binades above 15 overflow to
// Inf, found_inf then backs the local scaler off by 0.5), feeds the report to the engine and
// applies the engine's decisions from their effective step on, as the agent does.
#include "ampscope/policy/policy_engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

namespace ampscope::policy {
namespace {

constexpr const char* kRun = "run-1";

double p2(int k) { return std::ldexp(1.0, k); }
int log2_of(double pow2) { return std::ilogb(pow2); }

EngineConfig headroom_config() {
  EngineConfig c;
  c.mode = PolicyMode::kHeadroom;
  c.lead_steps = 2;
  c.apply_grace_steps = 2;
  c.headroom.margin_binades = 1;
  c.headroom.window_steps = 8;
  c.headroom.update_every_steps = 1;
  c.headroom.raise_after_evaluations = 3;
  c.headroom.min_raise_binades = 1;
  c.headroom.lower_tolerance_binades = 0;
  c.headroom.min_scale = 1.0;
  c.headroom.max_scale = p2(24);
  return c;
}

ScalerConfig dynamic_scaler(double scale) {
  ScalerConfig s;
  s.kind = ScalerKind::kDynamic;
  s.scale = scale;
  return s;
}

// A tensor's unscaled values: `per_bin` values in each binade [top - span + 1, top].
struct Dist {
  std::string name = "h0.attn.qkv";
  int top = -6;
  int span = 12;
  TensorRole role = TensorRole::kActivationGrad;
  Format storage = Format::kFP16;
  std::optional<Format> target;
  std::uint64_t per_bin = 100;
  std::uint64_t extra_inf = 0;  // injected Infs (not from the distribution)
};

BinadeHistogram bins(int lo, int hi, std::uint64_t per_bin) {
  return BinadeHistogram{
      lo, std::vector<std::uint64_t>(static_cast<std::size_t>(hi - lo + 1), per_bin)};
}

// Measures `d` stored at `scale` (a power of two for scaled roles, 1 otherwise).
TensorInput measure(const Dist& d, double scale) {
  TensorInput t;
  t.name = d.name;
  t.role = d.role;
  t.storage = d.storage;
  t.target = d.target;
  t.scale = is_loss_scaled(d.role) ? scale : 1.0;
  const int shift = log2_of(t.scale);
  int lo = d.top - d.span + 1 + shift, hi = d.top + shift;
  std::uint64_t overflowed = 0;
  if (d.storage == Format::kFP16) {
    // Binades from 16 up are Inf in FP16 (bin 15 is kept finite: a simplification on the safe
    // side of the engine's rule, which treats bin 15 as at risk).
    if (hi > 15) {
      overflowed = static_cast<std::uint64_t>(hi - std::max(lo, 16) + 1) * d.per_bin;
      hi = 15;
    }
  }
  t.numel = static_cast<std::uint64_t>(d.span) * d.per_bin + d.extra_inf;
  if (lo <= hi) t.histogram = bins(lo, hi, d.per_bin);
  t.pos_inf = overflowed + d.extra_inf;
  return t;
}

struct Sim {
  PolicyEngine engine;
  double scale;
  std::int64_t step = 0;
  std::vector<PolicyDecision> pending;
  std::vector<PolicyDecision> decisions;
  std::vector<std::int64_t> decided_at;  // step of the report that produced each decision
  std::vector<StepInput> inputs;         // everything fed, in order
  int overflow_steps = 0;

  Sim(EngineConfig c, double initial_scale)
      : engine(kRun, c, dynamic_scaler(initial_scale)), scale(initial_scale) {}

  // One step; returns the decisions the report produced.
  std::vector<PolicyDecision> run(const std::vector<Dist>& dists, bool force_found_inf = false) {
    for (auto it = pending.begin(); it != pending.end();) {
      if (it->effective_from_step <= step) {
        if (it->scaler.loss_scale) scale = *it->scaler.loss_scale;
        it = pending.erase(it);
      } else {
        ++it;
      }
    }
    StepInput in;
    in.run_id = kRun;
    in.step = step;
    in.loss_scale = scale;
    for (const Dist& d : dists) in.tensors.push_back(measure(d, scale));
    in.found_inf = force_found_inf;
    for (const auto& t : in.tensors) in.found_inf = in.found_inf || t.nonfinite() > 0;
    in.skipped = in.found_inf;
    in.scale_after = in.found_inf ? scale * 0.5 : scale;
    if (in.found_inf) ++overflow_steps;
    inputs.push_back(in);
    auto out = engine.observe(in);
    for (const auto& d : out) {
      EXPECT_GT(d.effective_from_step, step);
      pending.push_back(d);
      decisions.push_back(d);
      decided_at.push_back(step);
    }
    scale = in.scale_after;
    ++step;
    return out;
  }

  std::vector<PolicyDecision> scale_decisions() const {
    std::vector<PolicyDecision> r;
    for (const auto& d : decisions) {
      if (d.scaler.loss_scale) r.push_back(d);
    }
    return r;
  }
};

StepInput report(std::int64_t step, double scale, std::vector<TensorInput> tensors = {}) {
  StepInput in;
  in.run_id = kRun;
  in.step = step;
  in.loss_scale = scale;
  in.scale_after = scale;
  in.tensors = std::move(tensors);
  return in;
}

// --- headroom: the chosen scale ------------------------------------------------------------

TEST(PolicyEngineTest, HeadroomPicksTheExpectedScaleExactly) {
  // FP16 gradients whose top binade is 2^-6: the ceiling is 14 - (-6) = 20 (values below 2^15),
  // the margin of one binade leaves 2^19. The run is at 2^20, so it is lowered at once.
  Sim sim(headroom_config(), p2(20));
  const auto out = sim.run({Dist{}});
  ASSERT_EQ(out.size(), 1u);
  ASSERT_TRUE(out[0].scaler.loss_scale);
  EXPECT_EQ(*out[0].scaler.loss_scale, p2(19));
  EXPECT_EQ(out[0].effective_from_step, 2);
  EXPECT_EQ(out[0].policy_id, 1u);
  EXPECT_NE(out[0].reason.find("ceiling 2^20"), std::string::npos) << out[0].reason;
  EXPECT_NE(out[0].reason.find("h0.attn.qkv"), std::string::npos) << out[0].reason;
  EXPECT_EQ(sim.engine.last_evaluation().ceiling_log2, 20);
  EXPECT_EQ(sim.engine.last_evaluation().target_log2, 19);

  // The definition: at the ceiling nothing can overflow, one binade above something can.
  const BinadeHistogram unscaled = bins(-17, -6, 100);
  EXPECT_EQ(predict_from_histogram(unscaled, Format::kFP16, 20).overflow.upper, 0u);
  EXPECT_GT(predict_from_histogram(unscaled, Format::kFP16, 21).overflow.upper, 0u);
}

TEST(PolicyEngineTest, HeadroomUsesEachTensorsOwnFormat) {
  struct Case {
    Format target;
    int expected_log2;
  };
  // Stored in FP32 (any scale is measurable), cast to `target`: top 2^-6, margin 1.
  for (const Case& c : {Case{Format::kFP16, 19}, Case{Format::kE5M2, 19}, Case{Format::kE4M3, 12},
                        Case{Format::kBF16, 24} /* 131, clamped to max_scale */}) {
    Sim sim(headroom_config(), p2(26));
    Dist d;
    d.storage = Format::kFP32;
    d.target = c.target;
    const auto out = sim.run({d});
    ASSERT_EQ(out.size(), 1u) << format_name(c.target);
    ASSERT_TRUE(out[0].scaler.loss_scale) << format_name(c.target);
    EXPECT_EQ(*out[0].scaler.loss_scale, p2(c.expected_log2)) << format_name(c.target);
  }
}

TEST(PolicyEngineTest, HeadroomTakesTheTightestTensorAndIgnoresUnscaledRoles) {
  Sim sim(headroom_config(), p2(24));
  Dist act_grad;     // top 2^-6 -> ceiling 20
  Dist weight_grad;  // FP32 buffer cast to FP16: top 2^-3 -> ceiling 17
  weight_grad.name = "h0.attn.qkv.weight";
  weight_grad.role = TensorRole::kWeightGrad;
  weight_grad.storage = Format::kFP32;
  weight_grad.target = Format::kFP16;
  weight_grad.top = -3;
  Dist activation;  // not multiplied by the loss scale: ignored
  activation.name = "h0.attn.scores";
  activation.role = TensorRole::kActivation;
  activation.top = 10;
  Dist fp32_grad = act_grad;  // an FP32 gradient cannot overflow at these scales
  fp32_grad.name = "lnf";
  fp32_grad.storage = Format::kFP32;
  fp32_grad.top = 2;
  const auto out = sim.run({act_grad, weight_grad, activation, fp32_grad});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].scaler.loss_scale, p2(16));
  EXPECT_NE(out[0].reason.find("h0.attn.qkv.weight"), std::string::npos) << out[0].reason;
}

TEST(PolicyEngineTest, HeadroomUsesMaxAbsWhenThereIsNoHistogram) {
  PolicyEngine engine(kRun, headroom_config(), dynamic_scaler(p2(24)));
  TensorInput t;
  t.name = "h0.attn.qkv";
  t.role = TensorRole::kActivationGrad;
  t.storage = Format::kFP16;
  t.scale = p2(8);
  t.numel = 1000;
  t.max_abs = 0.03 * p2(8);  // unscaled 0.03: binade 2^-6
  const auto out = engine.observe(report(0, p2(8), {t}));
  ASSERT_EQ(out.size(), 1u);
  // The run reports 2^8; the ceiling 20 leaves a target of 19: a raise, which waits for votes.
  EXPECT_FALSE(out[0].scaler.loss_scale);
  EXPECT_EQ(engine.last_evaluation().ceiling_log2, 20);
  EXPECT_EQ(engine.last_evaluation().target_log2, 19);
}

TEST(PolicyEngineTest, HeadroomStopsTheLocalScalersProbingWithItsFirstDecision) {
  Sim sim(headroom_config(), p2(19));
  const auto out = sim.run({Dist{}});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_FALSE(out[0].scaler.loss_scale);  // 2^19 is already the target
  EXPECT_EQ(out[0].scaler.growth_interval, 1000000000);
  EXPECT_NE(out[0].reason.find("probing"), std::string::npos) << out[0].reason;
  for (int i = 0; i < 20; ++i) EXPECT_TRUE(sim.run({Dist{}}).empty()) << "step " << sim.step;

  // A static run has nothing to probe with; local_growth_interval 0 leaves the interval alone.
  ScalerConfig fixed = dynamic_scaler(p2(19));
  fixed.kind = ScalerKind::kStatic;
  PolicyEngine st(kRun, headroom_config(), fixed);
  EXPECT_TRUE(st.observe(report(0, p2(19), {measure(Dist{}, p2(19))})).empty());
  EngineConfig keep = headroom_config();
  keep.headroom.local_growth_interval = 0;
  PolicyEngine kp(kRun, keep, dynamic_scaler(p2(19)));
  EXPECT_TRUE(kp.observe(report(0, p2(19), {measure(Dist{}, p2(19))})).empty());
}

// --- headroom: hysteresis ------------------------------------------------------------------

TEST(PolicyEngineTest, HeadroomRaisesOnlyAfterKConsecutiveEvaluations) {
  Sim sim(headroom_config(), p2(10));
  auto first = sim.run({Dist{}});  // growth_interval only; vote 1
  ASSERT_EQ(first.size(), 1u);
  EXPECT_FALSE(first[0].scaler.loss_scale);
  EXPECT_TRUE(sim.run({Dist{}}).empty());  // vote 2
  const auto third = sim.run({Dist{}});    // vote 3: raise
  ASSERT_EQ(third.size(), 1u);
  EXPECT_EQ(third[0].scaler.loss_scale, p2(19));
  EXPECT_EQ(third[0].effective_from_step, 4);
  EXPECT_NE(third[0].reason.find("after 3 evaluations"), std::string::npos) << third[0].reason;
}

TEST(PolicyEngineTest, HeadroomRaisesToTheLowestTargetOfItsVotes) {
  Dist a, b, c;
  a.top = -9;  // target 22
  b.top = -7;  // target 20
  c.top = -8;  // target 21
  EngineConfig cfg = headroom_config();
  cfg.headroom.window_steps = 1;  // each evaluation sees one step
  Sim s(cfg, p2(10));
  s.run({a});
  s.run({b});
  const auto out = s.run({c});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].scaler.loss_scale, p2(20));
}

TEST(PolicyEngineTest, HeadroomDoesNotFlapOnAlternatingInputs) {
  Dist hi, lo;
  hi.top = -6;  // ceiling 20
  lo.top = -8;  // ceiling 22
  // The window keeps the worst of recent steps: one scale, whatever alternates inside it.
  {
    Sim sim(headroom_config(), p2(19));
    for (int i = 0; i < 200; ++i) sim.run({i % 2 ? lo : hi});
    EXPECT_TRUE(sim.scale_decisions().empty());
    EXPECT_EQ(sim.scale, p2(19));
  }
  // Without a window, K consecutive votes are needed: alternating targets never get them.
  EngineConfig no_window = headroom_config();
  no_window.headroom.window_steps = 1;
  {
    Sim sim(no_window, p2(19));
    for (int i = 0; i < 200; ++i) sim.run({i % 2 ? lo : hi});
    EXPECT_TRUE(sim.scale_decisions().empty());
  }
  // The same inputs with neither guard do flap: the two guards are what prevents it.
  no_window.headroom.raise_after_evaluations = 1;
  no_window.apply_grace_steps = 0;
  no_window.lead_steps = 1;
  {
    Sim sim(no_window, p2(19));
    for (int i = 0; i < 200; ++i) sim.run({i % 2 ? lo : hi});
    EXPECT_GT(sim.scale_decisions().size(), 20u);
  }
}

TEST(PolicyEngineTest, HeadroomNeverChangesByLessThanTheAntiFlapThreshold) {
  EngineConfig cfg = headroom_config();
  cfg.headroom.min_raise_binades = 3;
  cfg.headroom.lower_tolerance_binades = 1;
  Sim sim(cfg, p2(17));
  Dist d;
  d.top = -6;  // target 19: two binades up, below the raise threshold of 3
  for (int i = 0; i < 30; ++i) sim.run({d});
  EXPECT_TRUE(sim.scale_decisions().empty());
  d.top = -3;  // target 16: one binade down, within the tolerance
  for (int i = 0; i < 30; ++i) sim.run({d});
  EXPECT_TRUE(sim.scale_decisions().empty());
  d.top = -2;  // target 15: two binades down, beyond it
  for (int i = 0; i < 2; ++i) sim.run({d});
  ASSERT_EQ(sim.scale_decisions().size(), 1u);
  EXPECT_EQ(sim.scale_decisions()[0].scaler.loss_scale, p2(15));
}

TEST(PolicyEngineTest, HeadroomLowersAtOnceOnASpikeAndRecoversAfterTheWindow) {
  Sim sim(headroom_config(), p2(19));
  for (int i = 0; i < 10; ++i) sim.run({Dist{}});
  Dist spike;
  spike.top = -4;  // stored at 2^19: top binade 2^15, no Inf yet, but inside the margin
  const auto out = sim.run({spike});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].scaler.loss_scale, p2(17));
  EXPECT_EQ(out[0].effective_from_step, 12);
  EXPECT_EQ(sim.overflow_steps, 0);
  // It stays low while the spike is in the window (8 steps), then needs 3 votes to go back.
  std::int64_t raised_at = -1;
  for (int i = 0; i < 30 && raised_at < 0; ++i) {
    const auto o = sim.run({Dist{}});
    if (!o.empty() && o[0].scaler.loss_scale) {
      EXPECT_EQ(o[0].scaler.loss_scale, p2(19));
      raised_at = sim.step - 1;
    }
  }
  EXPECT_EQ(raised_at, 10 + 8 + 2);
}

// --- headroom: overflow as evidence --------------------------------------------------------

TEST(PolicyEngineTest, FoundInfTriggersAnImmediateReevaluation) {
  EngineConfig cfg = headroom_config();
  cfg.headroom.update_every_steps = 100;  // no regular evaluation in this test after step 0
  Sim sim(cfg, p2(19));
  for (int i = 0; i < 6; ++i) sim.run({Dist{}});
  Dist spike;
  spike.top = -1;  // at 2^19 binades 16..18 overflow
  const auto out = sim.run({spike});
  ASSERT_EQ(sim.overflow_steps, 1);
  ASSERT_EQ(out.size(), 1u);
  // Evidence alone caps the ceiling at 2^18 (target 2^17). 300 of 1,200 values overflowed: an
  // exponential tail puts the top ln(1200) / ln(4) = 5.1 times above the threshold, 1 + 2
  // binades above FP16's top at 2^19 (2^-4 unscaled): 2^-1, the true top; ceiling 15, margin 1.
  // The last clean top (2^-6, plus one binade) is lower and does not count.
  EXPECT_EQ(out[0].scaler.loss_scale, p2(14));
  EXPECT_NE(out[0].reason.find("300 of 1200 overflowed, exponential tail)"), std::string::npos)
      << out[0].reason;
  EXPECT_NE(out[0].reason.find("found_inf at step 6"), std::string::npos) << out[0].reason;
  for (int i = 0; i < 5; ++i) sim.run({spike});
  EXPECT_EQ(sim.overflow_steps, 1 + 1);  // only the next step, already running at 2^18
}

TEST(PolicyEngineTest, FarTooHighInitialScaleSkipsOnlyUntilTheFirstDecisionApplies) {
  // The "initial scale 2^24" scenario: GradScaler needs one skipped step per binade.
  Sim sim(headroom_config(), p2(24));
  Dist g;
  g.top = -3;
  g.span = 20;
  for (int i = 0; i < 40; ++i) sim.run({g});
  EXPECT_LE(sim.overflow_steps, 2);  // the lead: steps 0 and 1 ran before the decision applied
  EXPECT_EQ(sim.scale, p2(16));      // 14 - (-3) = 17, margin 1
  for (int i = 0; i < 200; ++i) sim.run({g});
  EXPECT_LE(sim.overflow_steps, 2);
}

TEST(PolicyEngineTest, AnIsolatedInfIsNotScaleEvidence) {
  Sim sim(headroom_config(), p2(19));
  for (int i = 0; i < 6; ++i) sim.run({Dist{}});
  Dist injected;
  injected.extra_inf = 1;  // finite top 2^13 as stored: two binades below FP16's top
  const auto out = sim.run({injected});
  EXPECT_EQ(sim.scale, p2(18));  // the local scaler backed off
  // The engine does not lower, and undoes the backoff at once: the scale was not the cause.
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].scaler.loss_scale, p2(19));
  EXPECT_EQ(out[0].effective_from_step, sim.step - 1 + 2);
  EXPECT_EQ(out[0].reason.rfind("headroom: restore 2^18 -> 2^19: the overflow at step 6 was not "
                                "the scale's, its non-finite values lie far above",
                                0),
            0u)
      << out[0].reason;
  for (int i = 0; i < 6; ++i) EXPECT_TRUE(sim.run({Dist{}}).empty());
  EXPECT_EQ(sim.scale, p2(19));
}

TEST(PolicyEngineTest, AnOverflowSeenOnlyAfterUnscalingIsStillScaleEvidence) {
  // Only the unscaled copy of a weight gradient is reported (scale 1, FP32 buffer, FP16 cast).
  // Its finite top 2^-3 was 2^14 at the step's loss scale 2^17: the Infs came from the tail.
  EngineConfig cfg = headroom_config();
  cfg.headroom.update_every_steps = 100;
  PolicyEngine engine(kRun, cfg, dynamic_scaler(p2(17)));
  TensorInput t;
  t.name = "h0.mlp.fc.weight";
  t.role = TensorRole::kWeightGrad;
  t.storage = Format::kFP32;
  t.target = Format::kFP16;
  t.histogram = bins(-14, -3, 100);
  t.numel = 1200 + 40;
  t.pos_inf = 40;
  StepInput in = report(0, p2(17), {t});
  in.found_inf = true;
  in.scale_after = p2(16);
  const auto out = engine.observe(in);
  ASSERT_EQ(out.size(), 1u);
  ASSERT_TRUE(out[0].scaler.loss_scale);
  EXPECT_LE(*out[0].scaler.loss_scale, p2(15));  // evidence: ceiling 16, margin 1
  // The same tensor with its finite values far below the top is an outlier: no decision.
  PolicyEngine quiet(kRun, cfg, dynamic_scaler(p2(10)));
  in.loss_scale = p2(10);
  const auto none = quiet.observe(in);
  ASSERT_EQ(none.size(), 1u);  // only the growth_interval push
  EXPECT_FALSE(none[0].scaler.loss_scale);
}

TEST(PolicyEngineTest, FoundInfWithoutATensorShowingItCapsBelowTheScaleUsed) {
  EngineConfig cfg = headroom_config();
  cfg.headroom.update_every_steps = 100;
  Sim sim(cfg, p2(19));
  for (int i = 0; i < 3; ++i) sim.run({Dist{}});
  const auto out = sim.run({}, /*force_found_inf=*/true);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].scaler.loss_scale, p2(17));  // overflowed at 2^19: ceiling 18, margin 1
  EXPECT_NE(out[0].reason.find("no reported tensor"), std::string::npos) << out[0].reason;
}

TEST(PolicyEngineTest, AnUnappliedLoweringIsDecidedAgainOnceItsStepShowsTheOldScale) {
  PolicyEngine engine(kRun, headroom_config(), dynamic_scaler(p2(20)));
  std::vector<PolicyDecision> all;
  for (int s = 0; s < 8; ++s) {
    // The run ignores the engine and stays at 2^20.
    for (auto& d : engine.observe(report(s, p2(20), {measure(Dist{}, p2(20))}))) {
      all.push_back(d);
    }
  }
  std::vector<PolicyDecision> lowers;
  for (const auto& d : all) {
    if (d.scaler.loss_scale) lowers.push_back(d);
  }
  // The report of step 2 still shows 2^20: the lowering did not arrive; it is sent again at
  // once (not after the grace period), and again each time the run shows the old scale.
  ASSERT_GE(lowers.size(), 2u);
  EXPECT_EQ(lowers[0].effective_from_step, 2);
  EXPECT_EQ(lowers[1].effective_from_step, 2 + 2);
  EXPECT_EQ(lowers[1].scaler.loss_scale, p2(19));
}

TEST(PolicyEngineTest, AnUnappliedRaiseWaitsForTheGracePeriod) {
  // A report from the effective step on that is below the decided scale may be a backoff after
  // the decision applied: the decided scale is trusted for the grace period.
  EngineConfig cfg = headroom_config();
  PolicyEngine engine(kRun, cfg, dynamic_scaler(p2(10)));
  std::vector<std::int64_t> raised_from;
  for (int s = 0; s < 12; ++s) {
    for (auto& d : engine.observe(report(s, p2(10), {measure(Dist{}, p2(10))}))) {
      if (d.scaler.loss_scale) raised_from.push_back(d.effective_from_step);
    }
  }
  ASSERT_GE(raised_from.size(), 2u);
  EXPECT_GE(raised_from[1] - raised_from[0], cfg.apply_grace_steps);
}

TEST(PolicyEngineTest, InfPropagatedFromAnInjectedOutlierIsNotScaleEvidence) {
  // An Inf injected into one logits gradient spreads through the backward pass: a LayerNorm
  // weight gradient (a sum over all tokens) becomes non-finite everywhere, nothing finite left.
  // No tensor reached the format's top, so none of it says anything about the scale.
  Sim sim(headroom_config(), p2(19));
  for (int i = 0; i < 6; ++i) sim.run({Dist{}});
  Dist logits;
  logits.name = "logits";
  logits.extra_inf = 1;
  TensorInput norm;
  norm.name = "lnf.weight";
  norm.role = TensorRole::kWeightGrad;
  norm.storage = Format::kFP32;
  norm.target = Format::kFP16;
  norm.scale = p2(19);
  norm.numel = 64;
  norm.nan = 64;
  StepInput in = report(sim.step, p2(19), {measure(logits, p2(19)), norm});
  in.found_inf = true;
  in.skipped = true;
  in.scale_after = p2(18);
  PolicyEngine& engine = sim.engine;
  // Not lowered; the local backoff is undone (restored to the step's own scale).
  for (const auto& d : engine.observe(in)) {
    EXPECT_EQ(d.scaler.loss_scale.value_or(p2(19)), p2(19)) << d.reason;
  }
  // The same blind tensor next to a tensor whose finite values ran into the top is evidence.
  Dist tail;
  tail.top = -3;  // stored at 2^19: 2^16, overflows
  StepInput hot = report(sim.step + 1, p2(19), {measure(tail, p2(19)), norm});
  hot.found_inf = true;
  hot.scale_after = p2(18);
  bool lowered = false;
  for (const auto& d : engine.observe(hot)) lowered = lowered || d.scaler.loss_scale.has_value();
  EXPECT_TRUE(lowered);
}

TEST(PolicyEngineTest, ActivationAndWeightGradientsBothBoundTheScale) {
  // Whichever of the two roles reaches higher sets the ceiling (the weight gradient's turn is
  // HeadroomTakesTheTightestTensorAndIgnoresUnscaledRoles).
  Sim sim(headroom_config(), p2(24));
  Dist act_grad;
  act_grad.top = -2;  // ceiling 16
  Dist weight_grad;   // FP32 buffer cast to FP16: top 2^-6 -> ceiling 20
  weight_grad.name = "h0.attn.qkv.weight";
  weight_grad.role = TensorRole::kWeightGrad;
  weight_grad.storage = Format::kFP32;
  weight_grad.target = Format::kFP16;
  for (int i = 0; i < 8; ++i) sim.run({act_grad, weight_grad});
  ASSERT_FALSE(sim.scale_decisions().empty());
  EXPECT_EQ(sim.scale, p2(15));
  EXPECT_EQ(sim.engine.last_evaluation().limiting_tensor.rfind("h0.attn.qkv (activation_grad", 0),
            0u)
      << sim.engine.last_evaluation().limiting_tensor;
}

// The |x| of n values drawn from N(0, 2^sigma_log2), stored at `scale` in FP16 (expected counts
// per binade, rounded; binades from 16 up are Inf). A gradient's real shape: a long lower tail,
// a top about 2.2 binades above sigma for n = 100,000.
TensorInput gaussian_gradient(std::string name, int sigma_log2, double n, double scale) {
  TensorInput t;
  t.name = std::move(name);
  t.role = TensorRole::kActivationGrad;
  t.storage = Format::kFP16;
  t.scale = scale;
  const double sigma = std::ldexp(1.0, sigma_log2) * scale;
  auto below = [&](double x) { return std::erf(x / (sigma * std::sqrt(2.0))); };
  BinadeHistogram h{kHistogramMinExponent, {}};
  std::uint64_t finite = 0;
  for (int e = kHistogramMinExponent; e <= 15; ++e) {
    const auto c = static_cast<std::uint64_t>(
        std::llround(n * (below(std::ldexp(1.0, e + 1)) - below(std::ldexp(1.0, e)))));
    h.counts.push_back(c);
    finite += c;
  }
  while (!h.counts.empty() && h.counts.front() == 0) {
    h.counts.erase(h.counts.begin());
    ++h.min_exponent;
  }
  while (!h.counts.empty() && h.counts.back() == 0) h.counts.pop_back();
  t.pos_inf = static_cast<std::uint64_t>(std::llround(n * (1.0 - below(65504.0))));
  t.numel = finite + t.pos_inf;
  t.histogram = std::move(h);
  return t;
}

TEST(PolicyEngineTest, AnOverflowedGaussianGradientDropsNearItsTrueTop) {
  // 2^23 on a gradient of sigma 2^-8 (top binade 2^-6: the true ceiling is 2^20, target 2^19):
  // 4.6% of the values overflow. The estimate from that share (no clean report yet: one binade
  // more) lands one binade under the target; mirroring the bottom of the distribution about
  // its median, as this engine once did, put the top at 2^0 and the scale at 2^13.
  PolicyEngine engine(kRun, headroom_config(), dynamic_scaler(p2(23)));
  StepInput in = report(0, p2(23), {gaussian_gradient("h0.mlp.fc", -8, 1e5, p2(23))});
  in.found_inf = true;
  in.skipped = true;
  in.scale_after = p2(22);
  const auto out = engine.observe(in);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].scaler.loss_scale, p2(18)) << out[0].reason;
  EXPECT_NE(out[0].reason.find("overflowed, exponential tail plus one binade"), std::string::npos)
      << out[0].reason;
  // At 2^18 nothing overflows, and the clean histograms raise it to the target.
  std::optional<double> raised;
  for (std::int64_t s = 1; s < 40 && !raised; ++s) {
    const double scale = s < 2 ? p2(22) : p2(18);
    for (const auto& d :
         engine.observe(report(s, scale, {gaussian_gradient("h0.mlp.fc", -8, 1e5, scale)}))) {
      if (d.scaler.loss_scale && *d.scaler.loss_scale > p2(18)) raised = d.scaler.loss_scale;
    }
  }
  EXPECT_EQ(raised, p2(19));

  // A clean history and then gradients 16 times larger: the share alone is the estimate (the
  // clean top is lower), no extra binade. Sigma 2^-4 has its top at 2^-2: ceiling 16, target 15.
  PolicyEngine grown(kRun, headroom_config(), dynamic_scaler(p2(19)));
  for (std::int64_t s = 0; s < 3; ++s) {
    grown.observe(report(s, p2(19), {gaussian_gradient("h0.mlp.fc", -8, 1e5, p2(19))}));
  }
  StepInput spike = report(3, p2(19), {gaussian_gradient("h0.mlp.fc", -4, 1e5, p2(19))});
  spike.found_inf = true;
  spike.scale_after = p2(18);
  const auto reaction = grown.observe(spike);
  ASSERT_EQ(reaction.size(), 1u);
  EXPECT_EQ(reaction[0].scaler.loss_scale, p2(15)) << reaction[0].reason;
}

TEST(PolicyEngineTest, AnEntirelyOverflowedTensorFallsBackOnItsLastCleanTop) {
  // A LayerNorm weight gradient turns Inf everywhere; its last clean report (top 2^-6 at 2^19)
  // says where it was. Without history the drop is blind_drop binades.
  auto norm = [](double scale, bool overflowed) {
    TensorInput t;
    t.name = "lnf.weight";
    t.role = TensorRole::kWeightGrad;
    t.storage = Format::kFP16;
    t.scale = scale;
    t.numel = 64;
    if (overflowed) {
      t.pos_inf = 64;
    } else {
      t.histogram = bins(-8 + scale_exponent(scale), -6 + scale_exponent(scale), 20);
      t.numel = 60;
    }
    return t;
  };
  EngineConfig cfg = headroom_config();
  cfg.headroom.update_every_steps = 100;
  PolicyEngine engine(kRun, cfg, dynamic_scaler(p2(19)));
  for (std::int64_t s = 0; s < 3; ++s) engine.observe(report(s, p2(19), {norm(p2(19), false)}));
  StepInput in = report(3, p2(19), {norm(p2(19), true)});
  in.found_inf = true;
  in.scale_after = p2(18);
  const auto out = engine.observe(in);
  ASSERT_EQ(out.size(), 1u);
  // The clean top + 1 (2^-5) is below the evidence (an overflowed value reached 2^-3 unscaled at
  // least), so the top is taken at 2^-3: ceiling 17, margin 1.
  EXPECT_EQ(out[0].scaler.loss_scale, p2(16)) << out[0].reason;
  EXPECT_NE(out[0].reason.find("last clean top 2^-6 plus one binade"), std::string::npos)
      << out[0].reason;

  PolicyEngine fresh(kRun, cfg, dynamic_scaler(p2(19)));
  StepInput first = in;
  first.step = 0;
  const auto blind = fresh.observe(first);
  ASSERT_EQ(blind.size(), 1u);
  EXPECT_EQ(blind[0].scaler.loss_scale, p2(19 - 1 - cfg.headroom.blind_drop_binades - 1))
      << blind[0].reason;
}

TEST(PolicyEngineTest, NonFiniteGradientsFromAForwardOverflowAreNotScaleEvidence) {
  // An activation overflowed in the forward pass (the step's first offender): the loss and every
  // gradient turn NaN. No scale avoids that; the engine must not lower. The same step without
  // the offender named is read as an overflow caused by the scale.
  auto step_of = [](std::int64_t s, bool name_offender) {
    TensorInput grad;
    grad.name = "h1.attn.qkv";
    grad.role = TensorRole::kActivationGrad;
    grad.storage = Format::kFP16;
    grad.scale = p2(16);
    grad.numel = 1000;
    grad.pos_inf = 1000;
    StepInput in = report(s, p2(16), {grad});
    in.found_inf = true;
    in.skipped = true;
    in.scale_after = p2(15);
    if (name_offender) in.first_offender = StepInput::Offender{"h1.attn.scores",
                                                               TensorRole::kActivation};
    return in;
  };
  EngineConfig cfg = headroom_config();
  PolicyEngine engine(kRun, cfg, dynamic_scaler(p2(16)));
  for (std::int64_t s = 0; s < 3; ++s) {
    engine.observe(report(s, p2(16), {gaussian_gradient("h1.attn.qkv", -8, 1e5, p2(16))}));
  }
  const auto forward = engine.observe(step_of(3, true));
  ASSERT_EQ(forward.size(), 1u);
  EXPECT_EQ(forward[0].scaler.loss_scale, p2(16)) << forward[0].reason;  // the backoff undone
  EXPECT_NE(forward[0].reason.find("first offender h1.attn.scores (activation) is in the forward"),
            std::string::npos)
      << forward[0].reason;
  PolicyEngine unnamed(kRun, cfg, dynamic_scaler(p2(16)));
  for (std::int64_t s = 0; s < 3; ++s) {
    unnamed.observe(report(s, p2(16), {gaussian_gradient("h1.attn.qkv", -8, 1e5, p2(16))}));
  }
  bool lowered = false;
  for (const auto& d : unnamed.observe(step_of(3, false))) {
    lowered = lowered || (d.scaler.loss_scale && *d.scaler.loss_scale < p2(16));
  }
  EXPECT_TRUE(lowered);
}

TEST(PolicyEngineTest, Fp32FallbackCountsNonFiniteValuesOnlyForTheFirstOffender) {
  // Attention scores overflow FP16 every step; the Inf spreads to the probabilities, the
  // context and everything after. Only the scores are recommended.
  EngineConfig cfg;
  cfg.mode = PolicyMode::kObserve;
  cfg.fp32_fallback.enabled = true;
  cfg.mode = PolicyMode::kStaticParams;
  cfg.static_params.loss_scale = p2(10);
  cfg.fp32_fallback.min_reports = 4;
  PolicyEngine engine(kRun, cfg, dynamic_scaler(p2(10)));
  auto activation = [](std::string name, std::uint64_t nan, std::uint64_t inf) {
    TensorInput t;
    t.name = std::move(name);
    t.role = TensorRole::kActivation;
    t.storage = Format::kFP16;
    t.numel = 100;
    t.histogram = bins(-4, 12, 5);
    t.numel = 85 + nan + inf;
    t.nan = nan;
    t.pos_inf = inf;
    return t;
  };
  std::vector<std::string> recommended;
  for (std::int64_t s = 0; s < 8; ++s) {
    StepInput in = report(s, p2(10), {activation("h1.attn.scores", 0, 1),
                                      activation("h1.attn.context", 15, 0),
                                      activation("h1.mlp.fc", 15, 0)});
    in.found_inf = true;
    in.first_offender = StepInput::Offender{"h1.attn.scores", TensorRole::kActivation};
    for (const auto& d : engine.observe(in)) {
      if (!d.fp32_tensors.empty()) recommended = d.fp32_tensors;
    }
  }
  EXPECT_EQ(recommended, (std::vector<std::string>{"h1.attn.scores"}));
}

TEST(PolicyEngineTest, AnOverflowAtAScaleAlreadyReplacedDoesNotLowerAgain) {
  // Started at 2^24: step 0 overflows and the engine lowers from step 2. Step 1 still ran at the
  // old (halved) scale and overflows too; that is explained by the old scale and must not
  // compound a second estimate on the first.
  EngineConfig cfg = headroom_config();
  cfg.headroom.update_every_steps = 100;
  PolicyEngine engine(kRun, cfg, dynamic_scaler(p2(24)));
  Dist g;
  g.top = -3;
  g.span = 20;
  StepInput s0 = report(0, p2(24), {measure(g, p2(24))});
  s0.found_inf = true;
  s0.scale_after = p2(23);
  std::optional<double> first;
  for (const auto& d : engine.observe(s0)) {
    if (d.scaler.loss_scale) first = d.scaler.loss_scale;
  }
  ASSERT_TRUE(first);
  Dist small = g;
  small.name = "h0.attn.qkv.bias";
  small.span = 30;  // a long lower tail: a poor estimate of the top
  StepInput s1 = report(1, p2(23), {measure(small, p2(23))});
  s1.found_inf = true;
  s1.scale_after = p2(22);
  for (const auto& d : engine.observe(s1)) EXPECT_FALSE(d.scaler.loss_scale) << d.reason;
}

// --- bounds and timing ---------------------------------------------------------------------

TEST(PolicyEngineTest, HeadroomNeverLeavesItsBounds) {
  {
    Sim sim(headroom_config(), p2(16));
    Dist tiny;
    tiny.storage = Format::kFP32;
    tiny.target = Format::kFP16;
    tiny.top = -40;  // ceiling 54
    for (int i = 0; i < 5; ++i) sim.run({tiny});
    EXPECT_EQ(sim.scale, p2(24));
  }
  {
    Sim sim(headroom_config(), p2(16));
    Dist huge;
    huge.storage = Format::kFP32;
    huge.target = Format::kFP16;
    huge.top = 20;  // ceiling -6
    sim.run({huge});
    ASSERT_EQ(sim.scale_decisions().size(), 1u);
    EXPECT_EQ(sim.scale_decisions()[0].scaler.loss_scale, 1.0);
  }
  {
    // The run's own max_scale is respected too, so that its scaler accepts the update.
    ScalerConfig run = dynamic_scaler(p2(10));
    run.max_scale = p2(12);
    PolicyEngine engine(kRun, headroom_config(), run);
    Dist tiny;
    tiny.top = -40;
    tiny.storage = Format::kFP32;
    std::optional<double> decided;
    for (int s = 0; s < 5; ++s) {
      for (auto& d : engine.observe(report(s, p2(10), {measure(tiny, p2(10))}))) {
        if (d.scaler.loss_scale) decided = d.scaler.loss_scale;
      }
    }
    EXPECT_EQ(decided, p2(12));
  }
  // Random histories: every decided scale is a power of two inside [min, max].
  std::mt19937 rng(7);
  EngineConfig cfg = headroom_config();
  cfg.headroom.min_scale = p2(4);
  cfg.headroom.max_scale = p2(20);
  Sim sim(cfg, p2(16));
  for (int i = 0; i < 600; ++i) {
    Dist d;
    d.top = std::uniform_int_distribution<int>(-30, 8)(rng);
    d.span = std::uniform_int_distribution<int>(1, 25)(rng);
    d.extra_inf = rng() % 17 == 0 ? 1 : 0;
    sim.run({d}, rng() % 31 == 0);
  }
  ASSERT_FALSE(sim.scale_decisions().empty());
  for (const auto& d : sim.scale_decisions()) {
    const double s = *d.scaler.loss_scale;
    EXPECT_EQ(std::ldexp(1.0, std::ilogb(s)), s);
    EXPECT_GE(s, p2(4));
    EXPECT_LE(s, p2(20));
  }
}

TEST(PolicyEngineTest, EffectiveFromStepIsAlwaysAfterEveryStepSeen) {
  EngineConfig cfg = headroom_config();
  cfg.lead_steps = 3;
  cfg.fp32_fallback.enabled = true;
  PolicyEngine engine(kRun, cfg, dynamic_scaler(p2(24)));
  std::mt19937 rng(11);
  std::int64_t max_seen = -1;
  int decisions = 0;
  std::uint64_t last_id = 0;
  for (int s = 0; s < 300; ++s) {
    // Three ranks, delivered in a shuffled order, some of them a few steps late.
    std::vector<std::pair<std::int64_t, int>> batch;
    for (int r = 0; r < 3; ++r) batch.push_back({std::max(0, s - static_cast<int>(rng() % 4)), r});
    std::shuffle(batch.begin(), batch.end(), rng);
    for (auto [step, rank] : batch) {
      Dist d;
      d.top = std::uniform_int_distribution<int>(-12, -2)(rng);
      const double scale = p2(std::uniform_int_distribution<int>(8, 20)(rng));
      StepInput in = report(step, scale, {measure(d, scale)});
      in.rank = rank;
      in.found_inf = in.tensors[0].nonfinite() > 0;
      max_seen = std::max(max_seen, step);
      for (const auto& dec : engine.observe(in)) {
        ++decisions;
        EXPECT_EQ(dec.effective_from_step, max_seen + 3);
        EXPECT_GT(dec.policy_id, last_id);
        last_id = dec.policy_id;
      }
    }
  }
  EXPECT_GT(decisions, 3);
}

// --- non-power-of-two scales ---------------------------------------------------------------

TEST(PolicyEngineTest, NonPowerOfTwoScalesShiftByTheirFloorAndDecidePowersOfTwo) {
  // Measured at 1000 (log2 = 9.97): binade 9 holds [512, 1024) / 1000 = [0.512, 1.024), true
  // binades -1 and 0. The floor shift (9) puts it at 0, the top side: ceiling 14, target 13.
  PolicyEngine engine(kRun, headroom_config(), dynamic_scaler(1000.0));
  TensorInput t;
  t.name = "h0.attn.qkv";
  t.role = TensorRole::kActivationGrad;
  t.storage = Format::kFP16;
  t.scale = 1000.0;
  t.histogram = bins(0, 9, 10);
  t.numel = 100;
  std::vector<PolicyDecision> out;
  for (int s = 0; s < 3; ++s) {
    for (auto& d : engine.observe(report(s, 1000.0, {t}))) out.push_back(d);
  }
  EXPECT_EQ(engine.last_evaluation().ceiling_log2, 14);
  ASSERT_EQ(out.size(), 2u);  // growth_interval, then the raise after 3 votes
  EXPECT_EQ(out[1].scaler.loss_scale, p2(13));
  // Safe: the largest true value 1.024 at 2^13 is 8389, inside the margin (below 2^14).
  EXPECT_LT(1.024 * p2(13), p2(14));

  // A run at 1000 whose target is 2^10: less than a binade either way, so nothing changes.
  PolicyEngine near(kRun, headroom_config(), dynamic_scaler(1000.0));
  t.histogram = bins(0, 12, 10);  // top binade 12 - 9 = 3: ceiling 11, target 10
  t.numel = 130;
  int scale_decisions = 0;
  for (int s = 0; s < 20; ++s) {
    for (auto& d : near.observe(report(s, 1000.0, {t})))
      scale_decisions += d.scaler.loss_scale ? 1 : 0;
  }
  EXPECT_EQ(near.last_evaluation().target_log2, 10);
  EXPECT_EQ(scale_decisions, 0);
}

// --- observe and static-params -------------------------------------------------------------

TEST(PolicyEngineTest, ObserveNeverDecides) {
  EngineConfig cfg = headroom_config();
  cfg.mode = PolicyMode::kObserve;
  cfg.fp32_fallback.enabled = true;
  cfg.fp32_fallback.min_reports = 1;
  Sim sim(cfg, p2(24));
  Dist spike;
  spike.top = 2;
  Dist outlier;
  outlier.name = "h1.attn.scores";
  outlier.role = TensorRole::kActivation;
  outlier.extra_inf = 3;
  for (int i = 0; i < 100; ++i) sim.run({i % 7 ? Dist{} : spike, outlier}, i % 13 == 0);
  EXPECT_TRUE(sim.decisions.empty());
  EXPECT_FALSE(sim.engine.last_decision());
  EXPECT_FALSE(sim.engine.current_policy());
  // It still evaluates, for metrics: what headroom would choose.
  EXPECT_TRUE(sim.engine.last_evaluation().target_log2.has_value());
}

TEST(PolicyEngineTest, StaticParamsPushesItsConfigurationOnce) {
  EngineConfig cfg;
  cfg.mode = PolicyMode::kStaticParams;
  cfg.lead_steps = 4;
  cfg.static_params.loss_scale = p2(12);
  cfg.static_params.growth_interval = 500;
  cfg.static_params.hysteresis = 3;
  Sim sim(cfg, p2(16));
  sim.step = 7;
  Dist spike;
  spike.top = 6;
  for (int i = 0; i < 50; ++i) sim.run({i % 5 ? Dist{} : spike});
  ASSERT_EQ(sim.decisions.size(), 1u);
  const PolicyDecision& d = sim.decisions[0];
  EXPECT_EQ(sim.decided_at[0], 7);
  EXPECT_EQ(d.effective_from_step, 11);
  EXPECT_EQ(d.scaler, cfg.static_params);
  EXPECT_TRUE(d.fp32_tensors.empty());
  EXPECT_NE(d.reason.find("static-params"), std::string::npos);

  // After a restart the push is not repeated.
  PolicyEngine restored = PolicyEngine::restore(sim.engine.save_state());
  EXPECT_TRUE(restored.observe(report(100, p2(12))).empty());
}

// --- FP32 fallback -------------------------------------------------------------------------

TEST(PolicyEngineTest, Fp32FallbackRecommendsPersistentOffendersOnly) {
  EngineConfig cfg;
  cfg.mode = PolicyMode::kStaticParams;
  cfg.lead_steps = 1;
  cfg.static_params.loss_scale = p2(10);
  cfg.fp32_fallback.enabled = true;
  cfg.fp32_fallback.window_reports = 16;
  cfg.fp32_fallback.min_reports = 4;
  PolicyEngine engine(kRun, cfg, dynamic_scaler(p2(10)));

  auto tensor = [](std::string name, TensorRole role, Format storage, std::optional<Format> target,
                   double scale, BinadeHistogram h, std::uint64_t infs) {
    TensorInput t;
    t.name = std::move(name);
    t.role = role;
    t.storage = storage;
    t.target = target;
    t.scale = scale;
    t.numel = h.total() + infs;
    t.histogram = std::move(h);
    t.pos_inf = infs;
    return t;
  };
  std::vector<std::pair<std::int64_t, PolicyDecision>> fp32_decisions;
  for (std::int64_t s = 0; s < 16; ++s) {
    const bool even = s % 2 == 0;
    std::vector<TensorInput> ts = {
        // overflows every other step (8 of 16): recommended at its 4th, step 6
        tensor("h0.attn.scores", TensorRole::kActivation, Format::kFP16, {}, 1.0, bins(-4, 12, 5),
               even ? 1 : 0),
        // overflows once: not recommended
        tensor("h1.attn.scores", TensorRole::kActivation, Format::kFP16, {}, 1.0, bins(-4, 12, 5),
               s == 3 ? 1 : 0),
        // FP32 values spanning 50 binades cast to FP16 (range 39): recommended at step 3
        tensor("h2.mlp.fc", TensorRole::kActivation, Format::kFP32, Format::kFP16, 1.0,
               bins(-30, 19, 5), 0),
        // already FP32: never
        tensor("h3.mlp.fc", TensorRole::kActivation, Format::kFP32, {}, 1.0, bins(-4, 12, 5), 1),
        // overflows only at 2^16, above the scale the engine set (2^10): the scale's fault
        tensor("h4.mlp.proj", TensorRole::kActivationGrad, Format::kFP16, {}, p2(16),
               bins(4, 15, 5), 2),
        // overflows at the engine's own scale, five times: recommended at step 4
        tensor("h5.mlp.proj", TensorRole::kActivationGrad, Format::kFP16, {}, p2(10),
               bins(4, 15, 5), s < 5 ? 2 : 0),
    };
    StepInput in = report(s, p2(10), ts);
    in.found_inf = true;
    for (const auto& d : engine.observe(in)) {
      if (!d.fp32_tensors.empty()) fp32_decisions.push_back({s, d});
    }
  }
  ASSERT_EQ(fp32_decisions.size(), 3u);
  EXPECT_EQ(fp32_decisions[0].first, 3);
  EXPECT_EQ(fp32_decisions[0].second.fp32_tensors, (std::vector<std::string>{"h2.mlp.fc"}));
  EXPECT_NE(fp32_decisions[0].second.reason.find("49 binades"), std::string::npos)
      << fp32_decisions[0].second.reason;
  // h5's overflow at step 0 came before the engine had set a scale, so it is not counted.
  EXPECT_EQ(fp32_decisions[1].first, 4);
  EXPECT_EQ(fp32_decisions[1].second.fp32_tensors,
            (std::vector<std::string>{"h2.mlp.fc", "h5.mlp.proj"}));
  EXPECT_EQ(fp32_decisions[2].first, 6);
  // Every decision carries the complete set.
  EXPECT_EQ(fp32_decisions[2].second.fp32_tensors,
            (std::vector<std::string>{"h0.attn.scores", "h2.mlp.fc", "h5.mlp.proj"}));
  EXPECT_NE(fp32_decisions[2].second.reason.find("h0.attn.scores (fp16) overflowed in 4 of"),
            std::string::npos)
      << fp32_decisions[2].second.reason;
  EXPECT_EQ(engine.current_policy()->fp32_tensors.size(), 3u);
}

TEST(PolicyEngineTest, Fp32FallbackIsBoundedByMaxTensorsWorstFirst) {
  EngineConfig cfg = headroom_config();
  cfg.fp32_fallback.enabled = true;
  cfg.fp32_fallback.min_reports = 2;
  cfg.fp32_fallback.max_tensors = 2;
  PolicyEngine engine(kRun, cfg, dynamic_scaler(p2(10)));
  std::vector<std::string> set;
  for (std::int64_t s = 0; s < 10; ++s) {
    std::vector<TensorInput> ts;
    for (int i = 0; i < 5; ++i) {
      TensorInput t;
      t.name = "t" + std::to_string(i);
      t.role = TensorRole::kActivation;
      t.storage = Format::kFP16;
      t.numel = 10;
      t.nan = (i == 3 || (i == 1 && s % 2 == 0) || (s == 4 || s == 5)) ? 1 : 0;
      ts.push_back(t);
    }
    for (const auto& d : engine.observe(report(s, p2(10), ts))) set = d.fp32_tensors;
  }
  // At step 1 only t3 has two; at step 2 t1 joins (2 of 3) and fills the last slot.
  EXPECT_EQ(set, (std::vector<std::string>{"t1", "t3"}));
}

// --- state ---------------------------------------------------------------------------------

TEST(PolicyEngineTest, SaveAndRestoreGiveIdenticalDecisions) {
  EngineConfig cfg = headroom_config();
  cfg.fp32_fallback.enabled = true;
  cfg.fp32_fallback.min_reports = 3;
  cfg.fp32_fallback.window_reports = 8;
  Sim sim(cfg, p2(24));
  std::mt19937 rng(3);
  std::optional<PolicyEngine> twin;
  std::vector<PolicyDecision> twin_decisions;
  std::size_t decisions_at_restore = 0;
  for (int i = 0; i < 160; ++i) {
    Dist g;
    g.top = std::uniform_int_distribution<int>(-9, -3)(rng);
    if (i % 37 == 20) g.top = 1;  // a real overflow
    Dist scores;
    scores.name = "h1.attn.scores";
    scores.role = TensorRole::kActivation;
    scores.top = 8;
    scores.extra_inf = i % 3 == 0 ? 1 : 0;
    if (i == 70) {
      twin.emplace(PolicyEngine::restore(sim.engine.save_state()));
      decisions_at_restore = sim.decisions.size();
    }
    sim.run({g, scores});
    if (twin) {
      for (auto& d : twin->observe(sim.inputs.back())) twin_decisions.push_back(d);
    }
  }
  ASSERT_TRUE(twin);
  const std::vector<PolicyDecision> after(sim.decisions.begin() + decisions_at_restore,
                                          sim.decisions.end());
  ASSERT_GE(after.size(), 3u);  // the comparison below has something to compare
  ASSERT_EQ(twin_decisions.size(), after.size());
  for (std::size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(twin_decisions[i].policy_id, after[i].policy_id);
    EXPECT_EQ(twin_decisions[i].effective_from_step, after[i].effective_from_step);
    EXPECT_EQ(twin_decisions[i].scaler, after[i].scaler);
    EXPECT_EQ(twin_decisions[i].fp32_tensors, after[i].fp32_tensors);
    EXPECT_EQ(twin_decisions[i].reason, after[i].reason);
  }
  EXPECT_EQ(twin->save_state(), sim.engine.save_state());
  // A restored engine saves the same document it was restored from.
  const std::string doc = sim.engine.save_state();
  EXPECT_EQ(PolicyEngine::restore(doc).save_state(), doc);
}

TEST(PolicyEngineTest, RestoreRejectsDocumentsItCannotRead) {
  PolicyEngine engine(kRun, headroom_config(), dynamic_scaler(p2(16)));
  const std::string doc = engine.save_state();
  EXPECT_THROW(PolicyEngine::restore("not json"), PolicyError);
  EXPECT_THROW(PolicyEngine::restore("{}"), PolicyError);
  std::string v3 = doc;
  v3.replace(v3.find("\"version\":2"), 11, "\"version\":3");
  try {
    PolicyEngine::restore(v3);
    ADD_FAILURE() << "version 3 accepted";
  } catch (const PolicyError& e) {
    EXPECT_NE(std::string(e.what()).find("version 3"), std::string::npos) << e.what();
  }
  std::string bad_margin = doc;
  bad_margin.replace(bad_margin.find("\"margin_binades\":1"), 18, "\"margin_binades\":-1");
  EXPECT_THROW(PolicyEngine::restore(bad_margin), PolicyError);
}

TEST(PolicyEngineTest, CurrentPolicyMergesEverythingDecided) {
  Sim sim(headroom_config(), p2(20));
  sim.run({Dist{}});  // lower to 2^19 and push growth_interval
  Dist spike;
  spike.top = -4;
  for (int i = 0; i < 3; ++i) sim.run({Dist{}});
  sim.run({spike});  // lower to 2^17
  ASSERT_EQ(sim.decisions.size(), 2u);
  const auto cur = sim.engine.current_policy();
  ASSERT_TRUE(cur);
  EXPECT_EQ(cur->policy_id, 2u);
  EXPECT_EQ(cur->scaler.loss_scale, p2(17));
  EXPECT_EQ(cur->scaler.growth_interval, 1000000000);
  EXPECT_EQ(cur->effective_from_step, sim.engine.latest_step() + 2);
  EXPECT_EQ(sim.engine.run_scaler().growth_interval, 1000000000);
}

// --- rejection -----------------------------------------------------------------------------

TEST(PolicyEngineTest, InvalidConfigurationIsRejectedWithAClearError) {
  struct Case {
    const char* field;
    void (*mutate)(EngineConfig&);
  };
  const Case cases[] = {
      {"headroom.margin_binades", [](EngineConfig& c) { c.headroom.margin_binades = -1; }},
      {"headroom.window_steps", [](EngineConfig& c) { c.headroom.window_steps = 0; }},
      {"headroom.update_every_steps", [](EngineConfig& c) { c.headroom.update_every_steps = 0; }},
      {"headroom.raise_after_evaluations",
       [](EngineConfig& c) { c.headroom.raise_after_evaluations = 0; }},
      {"headroom.min_scale", [](EngineConfig& c) { c.headroom.min_scale = 3.0; }},
      {"headroom.max_scale", [](EngineConfig& c) { c.headroom.max_scale = -1.0; }},
      {"headroom.min_scale", [](EngineConfig& c) { c.headroom.min_scale = p2(25); }},
      {"lead_steps", [](EngineConfig& c) { c.lead_steps = 0; }},
      {"fp32_fallback.min_reports", [](EngineConfig& c) { c.fp32_fallback.min_reports = 17; }},
      {"fp32_fallback.window_reports",
       [](EngineConfig& c) { c.fp32_fallback.window_reports = 65; }},
      {"fp32_fallback.range_trim_fraction",
       [](EngineConfig& c) { c.fp32_fallback.range_trim_fraction = 0.5; }},
      {"static_params", [](EngineConfig& c) { c.mode = PolicyMode::kStaticParams; }},
      {"static_params.backoff_factor",
       [](EngineConfig& c) { c.static_params.backoff_factor = 1.5; }},
      {"static_params.loss_scale",
       [](EngineConfig& c) {
         c.static_params.loss_scale = p2(20);
         c.static_params.max_scale = p2(10);
       }},
  };
  EXPECT_EQ(validate(headroom_config()), "");
  for (const Case& c : cases) {
    EngineConfig cfg = headroom_config();
    c.mutate(cfg);
    const std::string err = validate(cfg);
    EXPECT_NE(err.find(c.field), std::string::npos) << c.field << ": '" << err << "'";
    try {
      PolicyEngine engine(kRun, cfg, dynamic_scaler(p2(16)));
      ADD_FAILURE() << c.field << " accepted";
    } catch (const PolicyError& e) {
      EXPECT_EQ(std::string(e.what()), err);
    }
  }
  ScalerConfig bad = dynamic_scaler(p2(16));
  bad.growth_factor = 0.5;
  EXPECT_NE(validate(bad).find("scaler.growth_factor"), std::string::npos);
  EXPECT_THROW(PolicyEngine(kRun, headroom_config(), bad), PolicyError);
  bad = dynamic_scaler(p2(16));
  bad.kind = ScalerKind::kHysteresis;
  bad.hysteresis = 0;
  EXPECT_NE(validate(bad).find("scaler.hysteresis"), std::string::npos);
  // Fields the kind does not use are not checked (a Hello may leave them at 0).
  ScalerConfig fixed = dynamic_scaler(p2(16));
  fixed.kind = ScalerKind::kStatic;
  fixed.growth_factor = 0.0;
  fixed.backoff_factor = 0.0;
  fixed.growth_interval = 0;
  fixed.hysteresis = 0;
  EXPECT_EQ(validate(fixed), "");
  ScalerConfig dynamic = dynamic_scaler(p2(16));
  dynamic.hysteresis = 0;
  EXPECT_EQ(validate(dynamic), "");
  EXPECT_THROW(PolicyEngine("", headroom_config(), dynamic_scaler(p2(16))), PolicyError);
  EXPECT_EQ(parse_mode("static_params"), PolicyMode::kStaticParams);
  EXPECT_EQ(parse_mode("headroom"), PolicyMode::kHeadroom);
  EXPECT_EQ(parse_mode("auto"), std::nullopt);
}

TEST(PolicyEngineTest, InvalidReportIsRejectedNamingTheFieldAndChangesNothing) {
  PolicyEngine engine(kRun, headroom_config(), dynamic_scaler(p2(16)));
  engine.observe(report(0, p2(16), {measure(Dist{}, p2(16))}));
  const std::string before = engine.save_state();
  struct Case {
    const char* field;
    void (*mutate)(StepInput&);
  };
  const Case cases[] = {
      {"run_id", [](StepInput& in) { in.run_id = "other"; }},
      {"step", [](StepInput& in) { in.step = -1; }},
      {"loss_scale", [](StepInput& in) { in.loss_scale = std::nan(""); }},
      {"scale_after", [](StepInput& in) { in.scale_after = 0.0; }},
      {"tensors[0].scale", [](StepInput& in) { in.tensors[0].scale = -1.0; }},
      {"tensors[0].name", [](StepInput& in) { in.tensors[0].name.clear(); }},
      {"tensors[0].histogram", [](StepInput& in) { in.tensors[0].histogram->min_exponent = -150; }},
      {"tensors[0].histogram", [](StepInput& in) { in.tensors[0].numel = 5; }},
      {"tensors[0].nan", [](StepInput& in) { in.tensors[0].nan = in.tensors[0].numel + 1; }},
      {"tensors[0].max_abs", [](StepInput& in) { in.tensors[0].max_abs = INFINITY; }},
  };
  for (const Case& c : cases) {
    StepInput in = report(5, p2(14), {measure(Dist{}, p2(14))});
    in.found_inf = true;
    c.mutate(in);
    try {
      engine.observe(in);
      ADD_FAILURE() << c.field << " accepted";
    } catch (const PolicyError& e) {
      EXPECT_NE(std::string(e.what()).find(c.field), std::string::npos) << e.what();
    }
    EXPECT_EQ(engine.save_state(), before) << c.field;
  }
}

}  // namespace
}  // namespace ampscope::policy
