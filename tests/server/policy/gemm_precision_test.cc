// Per-layer precision of FP8/FP4 runs: which layers the engine moves to BF16 and back, and
// delayed scaling's amax history and margin, on scripted quantiser reports and on counts the
// real recipes (ampscope/recipe.h) give for Gaussian and wide-range data.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

#include "ampscope/policy/policy_engine.h"

namespace ampscope::policy {
namespace {

constexpr const char* kRun = "run-1";
const std::vector<std::string> kLayers = {"h0.attn.qkv", "h0.mlp.fc", "h1.attn.qkv",
                                          "h1.mlp.fc"};

EngineConfig gemm_config() {
  EngineConfig c;
  c.mode = PolicyMode::kHeadroom;  // no tensors are reported: no scale decisions
  c.lead_steps = 2;
  c.gemm_precision.enabled = true;
  c.gemm_precision.window_reports = 8;
  c.gemm_precision.min_reports = 4;
  c.gemm_precision.max_bf16_share = 0.25;
  c.gemm_precision.promote_reports = 4;
  c.gemm_precision.min_dwell_steps = 10;
  return c;
}

ScalerConfig scaler() {
  ScalerConfig s;
  s.kind = ScalerKind::kDynamic;
  s.scale = 65536.0;
  return s;
}

Recipe recipe(std::string_view text) {
  std::string error;
  const std::optional<Recipe> r = parse_recipe(text, &error);
  if (!r) throw std::runtime_error(error);
  return *r;
}

// A quantiser of 1000 finite values at SQNR 30 dB (clean under every element format) with
// `underflow` of them flushed to zero.
QuantizerInput quantizer(const std::string& name, const std::string& layer,
                         std::uint64_t underflow = 0, bool what_if = false,
                         std::string_view recipe_text = "nvfp4") {
  QuantizerInput q;
  q.name = name;
  q.layer = layer;
  q.role = TensorRole::kActivation;
  q.what_if = what_if;
  q.counts.recipe = recipe(recipe_text);
  q.counts.values = 1000;
  q.counts.underflow = underflow;
  q.counts.amax = 4.0;
  q.counts.signal_sq = 1000.0;
  q.counts.error_sq = 1.0;
  return q;
}

StepInput step_input(std::int64_t step, std::vector<QuantizerInput> quantizers, int rank = 0) {
  StepInput in;
  in.run_id = kRun;
  in.rank = rank;
  in.step = step;
  in.loss_scale = in.scale_after = 65536.0;
  in.quantizers = std::move(quantizers);
  return in;
}

// Every layer's input quantiser, clean, plus `extra`.
StepInput clean_step(std::int64_t step, std::vector<QuantizerInput> extra = {}) {
  std::vector<QuantizerInput> qs;
  for (const std::string& l : kLayers) qs.push_back(quantizer(l + ".input", l));
  for (QuantizerInput& q : extra) qs.push_back(std::move(q));
  return step_input(step, std::move(qs));
}

QuantizerInput h1_fc_grad(std::uint64_t underflow, bool what_if = false) {
  return quantizer("h1.mlp.fc.output_grad@wgrad", "h1.mlp.fc", underflow, what_if);
}

TEST(GemmPrecisionTest, MovesALayerWhoseQuantiserKeepsUnderflowing) {
  PolicyEngine engine(kRun, gemm_config(), scaler());
  for (std::int64_t step = 0; step < 3; ++step) {
    EXPECT_TRUE(engine.observe(clean_step(step, {h1_fc_grad(412)})).empty()) << step;
  }
  const auto out = engine.observe(clean_step(3, {h1_fc_grad(412)}));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].bf16_gemms, std::vector<std::string>{"h1.mlp.fc"});
  EXPECT_EQ(out[0].effective_from_step, 5);
  EXPECT_TRUE(out[0].scaler.empty());
  EXPECT_FALSE(out[0].amax_history_length);
  EXPECT_EQ(out[0].reason,
            "bf16 h1.mlp.fc: h1.mlp.fc.output_grad@wgrad underflow 41.2% of finite values in 4/4 "
            "reports (nvfp4)");
  // Once moved, the recipe's reports until the move takes effect are not counted again.
  EXPECT_TRUE(engine.observe(clean_step(4, {h1_fc_grad(412)})).empty());
  EXPECT_EQ(engine.current_policy()->bf16_gemms, std::vector<std::string>{"h1.mlp.fc"});
}

// A trainer that reports one layer's quantiser (ampscope.torch on some layers only): counted
// over the layers seen, the cap (a quarter) is 0 of 1 and nothing can move; counted over the
// capable layers the Hello names (add_gemm_layers), it is 1 of 4. The state keeps them.
TEST(GemmPrecisionTest, TheCapCountsTheCapableLayersNotOnlyThoseThatReported) {
  const auto run = [](bool declared) {
    PolicyEngine engine(kRun, gemm_config(), scaler());
    if (declared) {
      EXPECT_TRUE(engine.add_gemm_layers(kLayers));
      EXPECT_FALSE(engine.add_gemm_layers(kLayers)) << "the same layers again change nothing";
      engine = PolicyEngine::restore(engine.save_state());
    }
    std::vector<PolicyDecision> all;
    for (std::int64_t step = 0; step < 6; ++step) {
      for (PolicyDecision& d : engine.observe(step_input(step, {h1_fc_grad(412)}))) {
        all.push_back(std::move(d));
      }
    }
    return all;
  };
  EXPECT_TRUE(run(false).empty());
  const std::vector<PolicyDecision> moved = run(true);
  ASSERT_EQ(moved.size(), 1u);
  EXPECT_EQ(moved[0].bf16_gemms, std::vector<std::string>{"h1.mlp.fc"});
}

TEST(GemmPrecisionTest, HarmBelowTheThresholdOrInTooFewReportsMovesNothing) {
  PolicyEngine engine(kRun, gemm_config(), scaler());
  for (std::int64_t step = 0; step < 24; ++step) {
    // 25.0% is at the limit (not above); 26% in every third step is 3 of any 8.
    const std::uint64_t underflow = step % 3 == 0 ? 260 : 250;
    EXPECT_TRUE(engine.observe(clean_step(step, {h1_fc_grad(underflow)})).empty()) << step;
  }
  EXPECT_FALSE(engine.current_policy());
}

TEST(GemmPrecisionTest, WorstFirstUnderTheCap) {
  EngineConfig cfg = gemm_config();
  cfg.gemm_precision.max_bf16_share = 0.5;  // 2 of the 4 layers
  PolicyEngine engine(kRun, cfg, scaler());
  std::vector<PolicyDecision> out;
  for (std::int64_t step = 0; step < 4; ++step) {
    QuantizerInput sat = quantizer("h0.attn.qkv.weight", "h0.attn.qkv", 0, false, "mxfp8_e4m3");
    sat.counts.saturated = 35;
    sat.counts.overflow = 5;  // 4.0% against 3%: 1.33 times the limit
    // E4M3's floor 22.84 dB; 20 dB is 10^0.284 = 1.92 times the noise allowed.
    QuantizerInput noisy = quantizer("h0.mlp.fc.input", "h0.mlp.fc", 0, false, "e4m3:current");
    noisy.counts.error_sq = 10.0;
    // 30% against 25%: 1.2 times.
    out = engine.observe(clean_step(step, {sat, noisy, h1_fc_grad(300)}));
    if (step < 3) {
      EXPECT_TRUE(out.empty()) << step;
    }
  }
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].bf16_gemms, (std::vector<std::string>{"h0.attn.qkv", "h0.mlp.fc"}));
  EXPECT_EQ(out[0].reason,
            "bf16 h0.mlp.fc: h0.mlp.fc.input SQNR 20.0 dB below the 22.8 dB floor in 4/4 reports "
            "(e4m3:current); bf16 h0.attn.qkv: h0.attn.qkv.weight saturated 4.0% of finite values "
            "in 4/4 reports (mxfp8_e4m3); bf16 cap 2 of 4 layers (max_bf16_share 0.5) reached: "
            "h1.mlp.fc stays in the recipe");
  // The cap holds while h1.mlp.fc keeps underflowing.
  for (std::int64_t step = 4; step < 12; ++step) {
    EXPECT_TRUE(engine.observe(clean_step(step, {h1_fc_grad(300)})).empty()) << step;
  }
}

TEST(GemmPrecisionTest, RoomLeftByAReturnGoesToTheLayerHarmedMostOften) {
  PolicyEngine engine(kRun, gemm_config(), scaler());  // cap 1 of 4
  std::vector<PolicyDecision> decisions;
  for (std::int64_t step = 0; step < 16; ++step) {
    std::vector<QuantizerInput> extra;
    // h0.attn.qkv moves at step 3 (effective 5), reports clean what-if counts from 5 on and
    // returns at 15 (the dwell); meanwhile h1.mlp.fc is harmed in every step from 2 on (8 of
    // the last 8 at 15) and h0.mlp.fc far worse, in every other step from 8 on (4 of 8).
    extra.push_back(quantizer("h0.attn.qkv.weight", "h0.attn.qkv", step < 4 ? 400 : 0, step >= 5));
    if (step >= 2) extra.push_back(h1_fc_grad(300));
    if (step >= 8 && step % 2 == 0) extra.push_back(quantizer("h0.mlp.fc.input", "h0.mlp.fc", 900));
    for (auto& d : engine.observe(clean_step(step, extra))) decisions.push_back(d);
  }
  ASSERT_EQ(decisions.size(), 2u);
  EXPECT_EQ(decisions[0].bf16_gemms, std::vector<std::string>{"h0.attn.qkv"});
  EXPECT_EQ(decisions[1].bf16_gemms, std::vector<std::string>{"h1.mlp.fc"});
  EXPECT_EQ(decisions[1].effective_from_step, 17);
  EXPECT_EQ(decisions[1].reason,
            "recipe h0.attn.qkv: what-if nvfp4 within the limits x0.5 (underflow 12.5%, saturated "
            "1.5%, SQNR margin 3.0 dB) in 4/4 reports after 10 steps in BF16; bf16 h1.mlp.fc: "
            "h1.mlp.fc.output_grad@wgrad underflow 30.0% of finite values in 8/8 reports (nvfp4); "
            "bf16 cap 1 of 4 layers (max_bf16_share 0.25) reached: h0.mlp.fc stays in the recipe");
}

TEST(GemmPrecisionTest, ReturnsOnlyAfterCleanWhatIfReportsAndTheDwell) {
  PolicyEngine engine(kRun, gemm_config(), scaler());
  for (std::int64_t step = 0; step < 4; ++step) engine.observe(clean_step(step, {h1_fc_grad(412)}));
  ASSERT_EQ(engine.current_policy()->bf16_gemms, std::vector<std::string>{"h1.mlp.fc"});
  // From the effective step 5 on the layer runs BF16 and reports what-if counts. 15% is inside
  // the limit to move (25%) but outside the stricter one to return (12.5%): hysteresis.
  EXPECT_TRUE(engine.observe(clean_step(4, {h1_fc_grad(412)})).empty());
  for (std::int64_t step = 5; step < 16; ++step) {
    const std::uint64_t underflow = step == 12 ? 150 : 100;
    EXPECT_TRUE(engine.observe(clean_step(step, {h1_fc_grad(underflow, true)})).empty()) << step;
  }
  // Steps 13..16 are the last 4 what-if reports, all clean, and 16 - 5 >= 10 steps in BF16.
  const auto out = engine.observe(clean_step(16, {h1_fc_grad(100, true)}));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].bf16_gemms.empty());
  EXPECT_EQ(out[0].reason,
            "recipe h1.mlp.fc: what-if nvfp4 within the limits x0.5 (underflow 12.5%, saturated "
            "1.5%, SQNR margin 3.0 dB) in 4/4 reports after 11 steps in BF16");
  // Back in the recipe it needs fresh evidence to move again.
  for (std::int64_t step = 17; step < 20; ++step) {
    EXPECT_TRUE(engine.observe(clean_step(step, {h1_fc_grad(412)})).empty()) << step;
  }
  const auto again = engine.observe(clean_step(20, {h1_fc_grad(412)}));
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].bf16_gemms, std::vector<std::string>{"h1.mlp.fc"});
}

TEST(GemmPrecisionTest, WithoutTheDwellCleanWhatIfReportsWait) {
  EngineConfig cfg = gemm_config();
  cfg.gemm_precision.min_dwell_steps = 20;
  PolicyEngine engine(kRun, cfg, scaler());
  for (std::int64_t step = 0; step < 5; ++step) engine.observe(clean_step(step, {h1_fc_grad(412)}));
  for (std::int64_t step = 5; step < 25; ++step) {
    EXPECT_TRUE(engine.observe(clean_step(step, {h1_fc_grad(0, true)})).empty()) << step;
  }
  const auto out = engine.observe(clean_step(25, {h1_fc_grad(0, true)}));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].bf16_gemms.empty());
}

// An agent that refuses the update (or a trainer that cannot move the layer) keeps reporting
// the recipe applied: after apply_grace_steps (8) reported steps of it from the move's
// effective step on, with no what-if report, the engine takes the layer out of its BF16 set
// and does not move it again for min_dwell_steps (10), then 20: the set stays what the run does.
TEST(GemmPrecisionTest, AMoveThatDoesNotTakeEffectIsUndoneAndHeldEverLonger) {
  PolicyEngine engine(kRun, gemm_config(), scaler());
  std::vector<std::pair<std::int64_t, PolicyDecision>> decisions;
  for (std::int64_t step = 0; step < 60; ++step) {
    for (PolicyDecision& d : engine.observe(clean_step(step, {h1_fc_grad(412)}))) {
      decisions.emplace_back(step, std::move(d));
    }
  }
  ASSERT_EQ(decisions.size(), 5u);
  const std::vector<std::int64_t> at = {3, 12, 22, 31, 51};
  for (std::size_t i = 0; i < at.size(); ++i) {
    EXPECT_EQ(decisions[i].first, at[i]) << i;
    const bool moved = i % 2 == 0;
    EXPECT_EQ(decisions[i].second.bf16_gemms,
              moved ? std::vector<std::string>{"h1.mlp.fc"} : std::vector<std::string>{})
        << i;
  }
  EXPECT_EQ(decisions[1].second.reason,
            "recipe h1.mlp.fc: its move to BF16 from step 5 did not take effect (the recipe "
            "applied in 8 reported steps since, none in BF16: the agent refused the update or "
            "the trainer cannot move this layer); not moved again before step 22");
  EXPECT_NE(decisions[3].second.reason.find("from step 24 did not take effect"),
            std::string::npos)
      << decisions[3].second.reason;
  EXPECT_NE(decisions[3].second.reason.find("not moved again before step 51"), std::string::npos)
      << decisions[3].second.reason;
  // What-if reports say the move took effect, whatever else the layer reports applied (here its
  // input, as clean_step reports every layer's): it stays.
  PolicyEngine honoured(kRun, gemm_config(), scaler());
  for (std::int64_t step = 0; step < 40; ++step) {
    honoured.observe(clean_step(step, {h1_fc_grad(412, step >= 5)}));
  }
  EXPECT_EQ(honoured.current_policy()->bf16_gemms, std::vector<std::string>{"h1.mlp.fc"});
  // The refusal count and the hold survive save and restore.
  PolicyEngine restored = PolicyEngine::restore(engine.save_state());
  EXPECT_EQ(restored.save_state(), engine.save_state());
}

TEST(GemmPrecisionTest, RanksOfOneStepCountOnce) {
  PolicyEngine engine(kRun, gemm_config(), scaler());
  // Two ranks and two micro-steps each, every one harmful, over three steps: 3 reports, not 12.
  for (std::int64_t step = 0; step < 3; ++step) {
    for (int rank = 0; rank < 2; ++rank) {
      StepInput in = clean_step(step, {h1_fc_grad(412), h1_fc_grad(500)});
      in.rank = rank;
      EXPECT_TRUE(engine.observe(in).empty()) << step << " " << rank;
    }
  }
  const auto out = engine.observe(clean_step(3, {h1_fc_grad(412)}));
  ASSERT_EQ(out.size(), 1u);
  // The worst report of the latest harmful step names the numbers.
  EXPECT_EQ(out[0].reason,
            "bf16 h1.mlp.fc: h1.mlp.fc.output_grad@wgrad underflow 41.2% of finite values in 4/4 "
            "reports (nvfp4)");
}

TEST(GemmPrecisionTest, ObserveModeAndTheDefaultDecideNothing) {
  EngineConfig observe = gemm_config();
  observe.mode = PolicyMode::kObserve;
  EngineConfig off = gemm_config();
  off.gemm_precision.enabled = false;
  for (const EngineConfig& cfg : {observe, off}) {
    PolicyEngine engine(kRun, cfg, scaler());
    for (std::int64_t step = 0; step < 16; ++step) {
      EXPECT_TRUE(engine.observe(clean_step(step, {h1_fc_grad(900)})).empty()) << step;
    }
  }
  EXPECT_FALSE(EngineConfig{}.gemm_precision.enabled);
}

// Counts of the real recipe on `x` (rows x cols), as a quantiser of `layer`.
QuantizerInput counted(const std::string& name, const std::string& layer,
                       const std::vector<float>& x, std::size_t rows, std::size_t cols,
                       std::string_view recipe_text) {
  QuantizerInput q;
  q.name = name;
  q.layer = layer;
  q.counts = fake_quantize(x.data(), nullptr, rows, cols, recipe(recipe_text));
  return q;
}

TEST(GemmPrecisionTest, GaussianDataStaysInEveryRecipeAndWideDataMoves) {
  constexpr std::size_t kRows = 64, kCols = 256;
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> binades(-30.0f, 10.0f);
  const std::vector<std::string> recipes = {"e4m3:current", "e5m2:current", "mxfp8_e4m3",
                                            "mxfp8_e5m2",   "mxfp6_e3m2",   "mxfp6_e2m3",
                                            "mxfp4",        "mxfp4:ceil",   "nvfp4",
                                            "e4m3:tile=1x128"};
  EngineConfig cfg = gemm_config();
  cfg.gemm_precision.max_bf16_share = 1.0;
  PolicyEngine engine(kRun, cfg, scaler());
  std::vector<PolicyDecision> out;
  for (std::int64_t step = 0; step < 8; ++step) {
    std::vector<QuantizerInput> qs;
    for (const std::string& r : recipes) {
      std::vector<float> x(kRows * kCols);
      for (float& v : x) v = normal(gen);
      qs.push_back(counted("gauss." + r + ".input", "gauss." + r, x, kRows, kCols, r));
    }
    // 40 binades of magnitudes: NVFP4's 16-element blocks keep about 4 of them.
    std::vector<float> wide(kRows * kCols);
    for (float& v : wide) v = std::exp2(binades(gen)) * (normal(gen) < 0 ? -1.0f : 1.0f);
    qs.push_back(counted("wide.output_grad", "wide", wide, kRows, kCols, "nvfp4"));
    const RecipeCounts w = qs.back().counts;  // qs is moved into the step below
    out = engine.observe(step_input(step, std::move(qs)));
    if (step < 3) {
      EXPECT_TRUE(out.empty()) << step;
    } else if (step == 3) {
      ASSERT_EQ(out.size(), 1u);
      EXPECT_EQ(out[0].bf16_gemms, std::vector<std::string>{"wide"});
      char share[32];
      std::snprintf(share, sizeof share, "%.1f%%",
                    100.0 * static_cast<double>(w.underflow) / static_cast<double>(w.values));
      EXPECT_EQ(out[0].reason, std::string("bf16 wide: wide.output_grad underflow ") + share +
                                   " of finite values in 4/4 reports (nvfp4)");
    } else {
      EXPECT_TRUE(out.empty()) << step;
    }
  }
}

QuantizerInput delayed(double amax, std::uint64_t saturated, std::size_t history) {
  QuantizerInput q = quantizer("h0.mlp.fc.input", "h0.mlp.fc", 0, false, "e4m3:scale=0.5");
  q.counts.tensor_scale = 0.5;  // reach 448 / 0.5 = 896
  q.counts.amax = amax;
  q.counts.saturated = saturated;
  q.amax_history.assign(history, 800.0f);  // 448 / 800 / 0.5 = 1.12: margin 0
  return q;
}

TEST(GemmPrecisionTest, DelayedSpikesHalveTheHistoryThenRaiseTheMargin) {
  EngineConfig cfg = gemm_config();
  cfg.gemm_precision.spike_reports = 3;
  cfg.gemm_precision.max_amax_margin = 1;
  cfg.gemm_precision.max_bf16_share = 0.0;  // only the recipe settings move
  PolicyEngine engine(kRun, cfg, scaler());
  std::vector<PolicyDecision> decisions;
  for (std::int64_t step = 0; step < 40; ++step) {
    // A spike every other step: amax 1000 past the reach 896, 3 values saturated.
    const bool spike = step % 2 == 0;
    for (auto& d : engine.observe(step_input(step, {delayed(spike ? 1000.0 : 500.0,
                                                            spike ? 3 : 0, 4)}))) {
      decisions.push_back(d);
    }
  }
  // Steps 0, 2, 4: 4 -> 2 at step 4 (effective 6); 6, 8, 10: 2 -> 1; 12, 14, 16: margin 0 -> 1;
  // then both are at their bounds.
  ASSERT_EQ(decisions.size(), 3u);
  EXPECT_EQ(decisions[0].amax_history_length, 2);
  EXPECT_FALSE(decisions[0].amax_margin);
  EXPECT_EQ(decisions[0].effective_from_step, 6);
  EXPECT_EQ(decisions[0].reason,
            "delayed: amax history 4 -> 2 steps: h0.mlp.fc.input amax 1000 past the delayed "
            "scale's reach 896 (448 / 0.5), 3 values saturated in 3/5 reports (e4m3:scale=0.5)");
  EXPECT_EQ(decisions[1].amax_history_length, 1);
  EXPECT_EQ(decisions[1].effective_from_step, 12);
  EXPECT_FALSE(decisions[2].amax_history_length);
  EXPECT_EQ(decisions[2].amax_margin, 1);
  EXPECT_EQ(decisions[2].reason.substr(0, 62),
            "delayed: amax margin 0 -> 1 binades (history already 1 step): ");
  const auto current = engine.current_policy();
  EXPECT_EQ(current->amax_history_length, 1);
  EXPECT_EQ(current->amax_margin, 1);
}

TEST(GemmPrecisionTest, SaveAndRestoreDecideTheSame) {
  EngineConfig cfg = gemm_config();
  cfg.gemm_precision.max_bf16_share = 0.5;
  PolicyEngine engine(kRun, cfg, scaler());
  auto script = [](std::int64_t step) {
    std::vector<QuantizerInput> extra;
    if (step < 6) extra.push_back(h1_fc_grad(412));
    if (step >= 8) extra.push_back(h1_fc_grad(50, true));
    if (step % 2 == 0) extra.push_back(delayed(1000.0, 3, 4));
    return clean_step(step, extra);
  };
  for (std::int64_t step = 0; step < 3; ++step) engine.observe(script(step));
  const std::string saved = engine.save_state();
  PolicyEngine twin = PolicyEngine::restore(saved);
  EXPECT_EQ(twin.save_state(), saved);
  std::vector<PolicyDecision> a, b;
  for (std::int64_t step = 3; step < 30; ++step) {
    for (auto& d : engine.observe(script(step))) a.push_back(d);
    for (auto& d : twin.observe(script(step))) b.push_back(d);
  }
  // h1.mlp.fc to BF16 at 3 and back at 15; the history 4 -> 2 at 4, 2 -> 1 at 10; the margin
  // 0 -> 1 at 16, 1 -> 2 at 22, 2 -> 3 at 28.
  ASSERT_EQ(a.size(), 7u);
  ASSERT_EQ(b.size(), a.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(b[i].policy_id, a[i].policy_id);
    EXPECT_EQ(b[i].effective_from_step, a[i].effective_from_step);
    EXPECT_EQ(b[i].bf16_gemms, a[i].bf16_gemms);
    EXPECT_EQ(b[i].amax_history_length, a[i].amax_history_length);
    EXPECT_EQ(b[i].amax_margin, a[i].amax_margin);
    EXPECT_EQ(b[i].reason, a[i].reason);
  }
  EXPECT_EQ(twin.save_state(), engine.save_state());
}

TEST(GemmPrecisionTest, RestoresAVersion1Document) {
  PolicyEngine engine(kRun, gemm_config(), scaler());
  for (std::int64_t step = 0; step < 4; ++step) engine.observe(clean_step(step, {h1_fc_grad(412)}));
  nlohmann::json doc = nlohmann::json::parse(engine.save_state());
  doc["version"] = 1;
  doc.erase("gemm_precision");
  doc["config"].erase("gemm_precision");
  for (const char* key : {"bf16_gemms", "amax_history_length", "amax_margin"}) {
    doc["last_decision"].erase(key);
  }
  const PolicyEngine old = PolicyEngine::restore(doc.dump());
  EXPECT_FALSE(old.config().gemm_precision.enabled);
  EXPECT_TRUE(old.current_policy()->bf16_gemms.empty());
  doc["version"] = 3;
  EXPECT_THROW(PolicyEngine::restore(doc.dump()), PolicyError);
}

TEST(GemmPrecisionTest, ValidatesItsConfigurationAndQuantisers) {
  const std::pair<void (*)(GemmPrecisionParams&), const char*> bad[] = {
      {[](GemmPrecisionParams& g) { g.min_reports = 9; },
       "gemm_precision.min_reports must be in [1, 8], got 9"},
      {[](GemmPrecisionParams& g) { g.max_bf16_share = 1.5; },
       "gemm_precision.max_bf16_share must be in [0, 1], got 1.5"},
      {[](GemmPrecisionParams& g) { g.promote_factor = 0.0; },
       "gemm_precision.promote_factor must be in (0, 1], got 0"},
      {[](GemmPrecisionParams& g) { g.min_loss_cost = 0.0; },
       "gemm_precision.min_loss_cost must be in (0, 1e6], got 0"},
      {[](GemmPrecisionParams& g) { g.loss_cost_reports = 1; },
       "gemm_precision.loss_cost_reports must be in [2, 1024], got 1"},
  };
  for (const auto& [breaks, message] : bad) {
    EngineConfig cfg = gemm_config();
    breaks(cfg.gemm_precision);
    EXPECT_EQ(validate(cfg), message);
  }

  PolicyEngine engine(kRun, gemm_config(), scaler());
  QuantizerInput q = h1_fc_grad(900);
  q.counts.saturated = 200;
  try {
    engine.observe(step_input(0, {q}));
    ADD_FAILURE() << "accepted";
  } catch (const PolicyError& e) {
    EXPECT_STREQ(e.what(), "quantizers[0].underflow + saturated + overflow must be <= values 1000");
  }
  q = h1_fc_grad(0);
  q.counts.error_sq = std::nan("");
  EXPECT_THROW(engine.observe(step_input(0, {q})), PolicyError);
  q = h1_fc_grad(0);
  q.loss_cost = std::nan("");
  try {
    engine.observe(step_input(0, {q}));
    ADD_FAILURE() << "accepted";
  } catch (const PolicyError& e) {
    EXPECT_STREQ(e.what(), "quantizers[0].loss_cost must be finite");
  }
  EXPECT_EQ(engine.latest_step(), -1);  // unchanged
}

// ---- Loss cost (QuantizerInput::loss_cost) ----------------------------------------------

EngineConfig cost_config() {
  EngineConfig c = gemm_config();
  c.gemm_precision.loss_cost_reports = 4;
  c.gemm_precision.min_loss_cost = 1e-3;
  c.gemm_precision.max_bf16_share = 0.5;  // 2 of the 4 layers
  return c;
}

// A layer's output-gradient quantiser carrying a loss cost (clean counts unless `underflow`).
QuantizerInput costed(const std::string& layer, double cost, bool what_if = false,
                      std::uint64_t underflow = 0) {
  QuantizerInput q = quantizer(layer + ".output_grad", layer, underflow, what_if);
  q.loss_cost = cost;
  return q;
}

// Every layer's input and output gradient, the latter with the layer's cost of `costs`.
StepInput cost_step(std::int64_t step, const std::vector<double>& costs, bool what_if = false) {
  std::vector<QuantizerInput> qs;
  for (std::size_t i = 0; i < kLayers.size(); ++i) {
    qs.push_back(quantizer(kLayers[i] + ".input", kLayers[i], 0, what_if));
    qs.push_back(costed(kLayers[i], costs[i], what_if));
  }
  return step_input(step, std::move(qs));
}

// A trainer that takes the engine's moves: from a decision's effective step on, the quantisers
// of its BF16 layers report what-if counts (measured, not applied), the others the recipe
// applied.
class Trainer {
 public:
  explicit Trainer(std::vector<std::string> bf16 = {}) : bf16_(std::move(bf16)) {}
  std::vector<PolicyDecision> step(PolicyEngine& engine, StepInput in) {
    while (!pending_.empty() && pending_.front().effective_from_step <= in.step) {
      bf16_ = pending_.front().bf16_gemms;
      pending_.erase(pending_.begin());
    }
    for (QuantizerInput& q : in.quantizers) {
      q.what_if = std::find(bf16_.begin(), bf16_.end(), q.layer) != bf16_.end();
    }
    std::vector<PolicyDecision> out = engine.observe(in);
    pending_.insert(pending_.end(), out.begin(), out.end());
    return out;
  }

 private:
  std::vector<std::string> bf16_;
  std::vector<PolicyDecision> pending_;
};

TEST(GemmPrecisionTest, LossCostMovesTheCostliestLayersUnderTheCap) {
  PolicyEngine engine(kRun, cost_config(), scaler());
  // Means over steps 0..3: h0.attn.qkv 3e-3, h0.mlp.fc 1.5e-3 alternating 0 and 3e-3 (standard
  // error 8.7e-4: 1.5e-3 - 2 x 8.7e-4 is below 1e-3, not shown to cost that much), h1.attn.qkv
  // 1.2e-3, h1.mlp.fc 2e-3. Three are past 1e-3; the cap takes the two costliest. A step counts
  // once a later one is reported: the window is full at step 4.
  for (std::int64_t step = 0; step < 4; ++step) {
    const std::vector<double> costs = {3e-3, step % 2 ? 3e-3 : 0.0, 1.2e-3, 2e-3};
    EXPECT_TRUE(engine.observe(cost_step(step, costs)).empty()) << step;
  }
  const auto out = engine.observe(cost_step(4, {0.0, 0.0, 0.0, 0.0}));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].bf16_gemms, (std::vector<std::string>{"h0.attn.qkv", "h1.mlp.fc"}));
  EXPECT_EQ(out[0].reason,
            "bf16 h0.attn.qkv: nvfp4 costs +0.003 +- 0 nats of loss per step (first order, mean "
            "of 4 measured steps +- 2 standard errors), at least 0.001 (min_loss_cost), rank 1 "
            "of 3 (its inputs' nearest limit: h0.attn.qkv.input SQNR 30.0 dB above the 10.8 dB "
            "floor, 1.2% of it); "
            "bf16 h1.mlp.fc: nvfp4 costs +0.002 +- 0 nats of loss per step (first order, mean "
            "of 4 measured steps +- 2 standard errors), at least 0.001 (min_loss_cost), rank 2 "
            "of 3 (its inputs' nearest limit: h1.mlp.fc.input SQNR 30.0 dB above the 10.8 dB "
            "floor, 1.2% of it); "
            "bf16 cap 2 of 4 layers (max_bf16_share 0.5) reached: h1.attn.qkv stays in the "
            "recipe");
}

TEST(GemmPrecisionTest, ALayerWithALossCostIsNotMovedByItsCounts) {
  PolicyEngine engine(kRun, cost_config(), scaler());
  for (std::int64_t step = 0; step < 12; ++step) {
    // h1.mlp.fc underflows 41% of its values (past the 25% limit) at no cost to the loss.
    StepInput in = cost_step(step, {1e-4, 1e-4, 1e-4, -2e-4});
    in.quantizers.push_back(costed("h1.mlp.fc", -2e-4, false, 412));
    EXPECT_TRUE(engine.observe(in).empty()) << step;
  }
  EXPECT_FALSE(engine.current_policy());
}

TEST(GemmPrecisionTest, LossCostsOfOneStepAverageOverRanksAndMicroSteps) {
  PolicyEngine engine(kRun, cost_config(), scaler());
  for (std::int64_t step = 0; step < 6; ++step) {
    // h0.attn.qkv: 1.8e-3 and 0 from two ranks average 9e-4, below the limit; a sum (1.8e-3)
    // would move it.
    StepInput a = cost_step(step, {1.8e-3, 0.0, 0.0, 0.0});
    StepInput b = cost_step(step, {0.0, 0.0, 0.0, 0.0});
    b.rank = 1;
    EXPECT_TRUE(engine.observe(a).empty()) << step;
    EXPECT_TRUE(engine.observe(b).empty()) << step;
  }
  EXPECT_FALSE(engine.current_policy());
}

TEST(GemmPrecisionTest, ReturnsWhenTheWhatIfLossCostFallsAfterTheDwell) {
  PolicyEngine engine(kRun, cost_config(), scaler());
  for (std::int64_t step = 0; step < 5; ++step) engine.observe(cost_step(step, {3e-3, 0, 0, 0}));
  ASSERT_EQ(engine.current_policy()->bf16_gemms, std::vector<std::string>{"h0.attn.qkv"});
  // Effective from step 6: what-if costs. 6e-4 is below the 1e-3 to move but above the 5e-4
  // (1e-3 x promote_factor 0.5) to return: it stays.
  engine.observe(cost_step(5, {3e-3, 0, 0, 0}));
  auto what_if_step = [](std::int64_t step, double cost) {
    StepInput in = cost_step(step, {0, 0, 0, 0});
    in.quantizers[0].what_if = in.quantizers[1].what_if = true;
    in.quantizers[1].loss_cost = cost;
    return in;
  };
  for (std::int64_t step = 6; step < 21; ++step) {
    EXPECT_TRUE(engine.observe(what_if_step(step, 6e-4)).empty()) << step;
  }
  // Then 1e-4. At step 22 the mean of steps 18..21 (6, 6, 6, 1 x 1e-4) is 4.75e-4 but its
  // standard error 1.25e-4: 4.75e-4 + 2 x 1.25e-4 is above 5e-4. At step 24, steps 20..23
  // (6, 1, 1, 1): 2.25e-4 + 2 x 1.25e-4 = 4.75e-4, 18 steps after the move: back.
  for (std::int64_t step = 21; step < 24; ++step) {
    EXPECT_TRUE(engine.observe(what_if_step(step, 1e-4)).empty()) << step;
  }
  const auto out = engine.observe(what_if_step(24, 1e-4));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].bf16_gemms.empty());
  EXPECT_EQ(out[0].reason,
            "recipe h0.attn.qkv: what-if nvfp4 would cost +0.000225 +- 0.00025 nats of loss per "
            "step (first order, mean of 4 measured steps +- 2 standard errors), within "
            "+-0.0005 (min_loss_cost x0.5) after 18 steps in BF16");
}

// In BF16 the what-if cost reads D - K/2 where the recipe applied reads D + K/2: a negative
// what-if cost is curvature, not a gain, and keeps the layer in BF16 like a positive one.
TEST(GemmPrecisionTest, ANegativeWhatIfCostKeepsTheLayerInBf16) {
  PolicyEngine engine(kRun, cost_config(), scaler());
  for (std::int64_t step = 0; step < 6; ++step) engine.observe(cost_step(step, {3e-3, 0, 0, 0}));
  ASSERT_EQ(engine.current_policy()->bf16_gemms, std::vector<std::string>{"h0.attn.qkv"});
  for (std::int64_t step = 6; step < 60; ++step) {
    StepInput in = cost_step(step, {-8e-4, 0, 0, 0});
    in.quantizers[0].what_if = in.quantizers[1].what_if = true;
    EXPECT_TRUE(engine.observe(in).empty()) << step;
  }
}

// The cap full (one of four layers), a waiting layer whose cost's lower bound is over twice the
// BF16 layer's bound takes its room. That bound is |what-if cost| + 2 se (8e-4) and at least
// the lower bound the layer moved with (1.2e-3): 2e-3 waits (over 2 x 8e-4, not 2 x 1.2e-3),
// 4e-3 takes the room.
TEST(GemmPrecisionTest, ACostlierLayerTakesTheRoomOfACheaperOne) {
  EngineConfig cfg = cost_config();
  cfg.gemm_precision.max_bf16_share = 0.25;
  for (const double waiting : {1.5e-3, 2e-3, 4e-3}) {
    PolicyEngine engine(kRun, cfg, scaler());
    for (std::int64_t step = 0; step < 5; ++step) {
      engine.observe(cost_step(step, {1.2e-3, 0, 0, 0}));
    }
    ASSERT_EQ(engine.current_policy()->bf16_gemms, std::vector<std::string>{"h0.attn.qkv"});
    engine.observe(cost_step(5, {1.2e-3, 0, 0, 0}));
    std::vector<std::pair<std::int64_t, PolicyDecision>> decided;
    Trainer trainer({"h0.attn.qkv"});
    for (std::int64_t step = 6; step < 30; ++step) {
      for (auto& d : trainer.step(engine, cost_step(step, {-8e-4, 0, 0, waiting}))) {
        decided.emplace_back(step, std::move(d));
      }
    }
    if (waiting < 2.4e-3) {
      EXPECT_TRUE(decided.empty()) << waiting << ": " << decided.front().second.reason;
      continue;
    }
    // Its dwell (10 steps from 6) is over at 16.
    ASSERT_EQ(decided.size(), 1u);
    EXPECT_EQ(decided[0].first, 16);
    EXPECT_EQ(decided[0].second.bf16_gemms, std::vector<std::string>{"h1.mlp.fc"});
    EXPECT_TRUE(decided[0].second.reason.starts_with(
        "recipe h0.attn.qkv: what-if nvfp4 would cost -0.0008 +- 0 nats of loss per step (first "
        "order, mean of 4 measured steps +- 2 standard errors), at most 0.0012 either way (and "
        "at its move), under 1/2 of h1.mlp.fc's 0.004: its room goes to that layer after 10 "
        "steps in BF16; bf16 h1.mlp.fc: nvfp4 costs +0.004"))
        << decided[0].second.reason;
  }
}

// A layer whose recipe keeps costing comes back after its dwell, is measured again, and moves
// again; each return doubles its next dwell (10, then 20 steps), so that it flaps ever less.
TEST(GemmPrecisionTest, DwellDoublesEachTimeALayerComesBack) {
  PolicyEngine engine(kRun, cost_config(), scaler());
  std::vector<std::pair<std::int64_t, PolicyDecision>> decided;
  for (std::int64_t step = 0; step < 45; ++step) {
    // The trainer's side: the BF16 set of the latest decision in effect at this step.
    bool in_bf16 = false;
    for (const auto& [at, d] : decided) {
      if (step >= d.effective_from_step) in_bf16 = !d.bf16_gemms.empty();
    }
    StepInput in = cost_step(step, {in_bf16 ? 0.0 : 3e-3, 0, 0, 0});
    in.quantizers[0].what_if = in.quantizers[1].what_if = in_bf16;
    for (auto& d : engine.observe(in)) decided.emplace_back(step, std::move(d));
  }
  // Moved at 4 (from 6), back at 16 (10 steps; from 18), moved at 22 (steps 18..21 measured
  // afresh; from 24), back at 44 (20 steps).
  ASSERT_EQ(decided.size(), 4u);
  EXPECT_EQ(decided[0].first, 4);
  EXPECT_EQ(decided[1].first, 16);
  EXPECT_EQ(decided[2].first, 22);
  EXPECT_EQ(decided[3].first, 44);
  EXPECT_EQ(decided[2].second.bf16_gemms, std::vector<std::string>{"h0.attn.qkv"});
  EXPECT_TRUE(decided[3].second.bf16_gemms.empty());
  EXPECT_TRUE(decided[3].second.reason.ends_with(" after 20 steps in BF16 (dwell 20, return 2)"))
      << decided[3].second.reason;
}

TEST(GemmPrecisionTest, LossCostsSurviveSaveAndRestore) {
  PolicyEngine engine(kRun, cost_config(), scaler());
  for (std::int64_t step = 0; step < 2; ++step) engine.observe(cost_step(step, {3e-3, 0, 2e-3, 0}));
  PolicyEngine twin = PolicyEngine::restore(engine.save_state());
  EXPECT_EQ(twin.save_state(), engine.save_state());
  for (std::int64_t step = 2; step < 5; ++step) {
    engine.observe(cost_step(step, {3e-3, 0, 2e-3, 0}));
    twin.observe(cost_step(step, {3e-3, 0, 2e-3, 0}));
  }
  ASSERT_TRUE(twin.current_policy());
  EXPECT_EQ(twin.current_policy()->bf16_gemms,
            (std::vector<std::string>{"h0.attn.qkv", "h1.attn.qkv"}));
  EXPECT_EQ(twin.current_policy()->reason, engine.current_policy()->reason);
  // A version-2 document written before loss costs existed restores with none.
  nlohmann::json doc = nlohmann::json::parse(engine.save_state());
  for (auto& t : doc["gemm_precision"]["tracks"]) {
    for (const char* key : {"costed", "cost", "what_if_cost", "cause"}) t.erase(key);
  }
  doc["config"]["gemm_precision"].erase("min_loss_cost");
  const PolicyEngine old = PolicyEngine::restore(doc.dump());
  EXPECT_EQ(old.config().gemm_precision.min_loss_cost, GemmPrecisionParams{}.min_loss_cost);
  doc["gemm_precision"]["tracks"][0]["costed"] = true;
  doc["gemm_precision"]["tracks"][0]["cost"] = {{"steps", {1, 2}}, {"sums", {0.1}},
                                                {"counts", {1, 1}}};
  doc["gemm_precision"]["tracks"][0]["what_if_cost"] = doc["gemm_precision"]["tracks"][0]["cost"];
  doc["gemm_precision"]["tracks"][0]["cause"] = {
      {"text", ""}, {"recipe", ""}, {"severity", 0.0}, {"step", -1}};
  EXPECT_THROW(PolicyEngine::restore(doc.dump()), PolicyError);
}

}  // namespace
}  // namespace ampscope::policy
