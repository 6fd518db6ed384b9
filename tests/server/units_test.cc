// Small pieces of the server: duration and size flags, the conversions between the wire and the
// policy engine, and the one digest of a report.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "ampscope/proto/quantizer_codec.h"
#include "ampscope/recipe.h"
#include "flags.h"
#include "policy_host.h"
#include "report_digest.h"
#include "server_harness.h"

namespace ampscope::server {
namespace {

TEST(ServerFlagsTest, DurationsWithUnits) {
  EXPECT_EQ(parse_duration("30d", "--x").count(), 30LL * 86400 * 1000);
  EXPECT_EQ(parse_duration("12h", "--x").count(), 12LL * 3600 * 1000);
  EXPECT_EQ(parse_duration("1.5m", "--x").count(), 90'000);
  EXPECT_EQ(parse_duration("45", "--x").count(), 45'000);
  EXPECT_EQ(parse_duration("250ms", "--x").count(), 250);
  EXPECT_THROW(parse_duration("soon", "--x"), Error);
  EXPECT_THROW(parse_duration("5y", "--x"), Error);
  EXPECT_THROW(parse_duration("-5s", "--x"), Error);
}

TEST(ServerFlagsTest, SizesInBinaryUnits) {
  EXPECT_EQ(parse_bytes("1048576", "--x"), 1048576u);
  EXPECT_EQ(parse_bytes("512M", "--x"), 512ull << 20);
  EXPECT_EQ(parse_bytes("2G", "--x"), 2ull << 30);
  EXPECT_EQ(parse_bytes("4KiB", "--x"), 4096u);
  EXPECT_THROW(parse_bytes("lots", "--x"), Error);
  EXPECT_THROW(parse_bytes("3Q", "--x"), Error);
}

TEST(ServerPolicyConversionTest, ReportBecomesEngineInput) {
  v1::StepReport r = testing::make_report("run-c", 2, 7, 6, 2, 1024.0);
  r.mutable_tensors(1)->set_level(v1::STATS_LEVEL_COUNTS);
  r.mutable_tensors(1)->clear_histogram();
  const policy::StepInput in = to_step_input(r);
  EXPECT_EQ(in.run_id, "run-c");
  EXPECT_EQ(in.rank, 2);
  EXPECT_EQ(in.step, 6);
  EXPECT_EQ(in.loss_scale, 1024.0);
  ASSERT_EQ(in.tensors.size(), 2u);
  EXPECT_EQ(in.tensors[0].role, ampscope::TensorRole::kWeightGrad);
  EXPECT_EQ(in.tensors[1].role, ampscope::TensorRole::kActivationGrad);
  EXPECT_EQ(in.tensors[0].storage, Format::kFP32);
  EXPECT_EQ(in.tensors[0].format(), Format::kFP16);
  EXPECT_EQ(in.tensors[0].scale, 1024.0);
  ASSERT_TRUE(in.tensors[0].histogram.has_value());
  EXPECT_EQ(in.tensors[0].histogram->min_exponent, r.tensors(0).histogram().min_exponent());
  EXPECT_FALSE(in.tensors[1].histogram.has_value());
  ASSERT_TRUE(in.tensors[0].underflow.has_value());
  EXPECT_EQ(*in.tensors[0].underflow, r.tensors(0).targets(0).underflow());
}

TEST(ServerPolicyConversionTest, QuantisersReachTheEngineAsTheAgentEncodedThem) {
  // 2 x 64 values over 26 binades: an MX recipe's counts with blocks and a scale histogram.
  std::vector<float> x(128);
  for (std::size_t i = 0; i < x.size(); ++i) {
    x[i] = std::ldexp(1.0f + static_cast<float>(i % 7) / 8.0f, static_cast<int>(i % 26) - 18);
  }
  const RecipeCounts c = fake_quantize(x.data(), nullptr, 2, 64, *parse_recipe("mxfp8_e4m3"));
  ASSERT_FALSE(c.scale_histogram.empty());
  const float history[] = {3.0f, 5.0f};
  v1::StepReport r = testing::make_report("run-c", 0, 1, 0, 0);
  v1::QuantizerStats* q = r.add_quantizers();
  q->set_name("h0.mlp.fc.input");
  q->set_role(v1::TENSOR_ROLE_ACTIVATION);
  proto::encode_quantizer(c, history, q);
  q->set_layer("h0.mlp.fc");
  q->set_what_if(true);
  const std::optional<RecipeCounts> decoded = proto::decode_quantizer(*q);
  ASSERT_TRUE(decoded.has_value());
  EXPECT_EQ(*decoded, c);

  const policy::StepInput in = to_step_input(r, false, true);
  ASSERT_EQ(in.quantizers.size(), 1u);
  EXPECT_EQ(in.quantizers[0].name, "h0.mlp.fc.input");
  EXPECT_EQ(in.quantizers[0].layer, "h0.mlp.fc");
  EXPECT_EQ(in.quantizers[0].role, TensorRole::kActivation);
  EXPECT_TRUE(in.quantizers[0].what_if);
  EXPECT_EQ(in.quantizers[0].counts, c);
  EXPECT_EQ(in.quantizers[0].amax_history, (std::vector<float>{3.0f, 5.0f}));
  // Only a policy that reads quantisers gets them.
  EXPECT_TRUE(to_step_input(r, false, false).quantizers.empty());
  EXPECT_TRUE(digest_report(r, false).step_input.quantizers.empty());
  EXPECT_EQ(digest_report(r, false, true).step_input.quantizers.size(), 1u);
  // A recipe parse_recipe does not read (validation refuses it first) is no engine input.
  q->set_recipe("fp8");
  EXPECT_FALSE(proto::decode_quantizer(*q).has_value());
  EXPECT_TRUE(to_step_input(r, false, true).quantizers.empty());
}

TEST(ServerPolicyConversionTest, DecisionBecomesUpdate) {
  policy::PolicyDecision d;
  d.policy_id = 3;
  d.effective_from_step = 42;
  d.scaler.loss_scale = 4096.0;
  d.scaler.growth_interval = 1000000000;
  d.fp32_tensors = {"h0.attn.qkv"};
  d.reason = "headroom: lower";
  v1::PolicyUpdate u =
      to_policy_update(d, "run-c", v1::POLICY_MODE_HEADROOM, {true, false}, 40, 123);
  EXPECT_EQ(u.effective_from_step(), 42);
  EXPECT_EQ(u.loss_scale(), 4096.0);
  EXPECT_EQ(u.growth_interval(), 1000000000u);
  EXPECT_FALSE(u.has_backoff_factor());
  EXPECT_TRUE(u.fp32_tensors_set());
  ASSERT_EQ(u.fp32_tensors_size(), 1);
  EXPECT_FALSE(u.bf16_gemms_set());
  EXPECT_EQ(decision_kind(u, nullptr), "scale");
  // Without FP32 fallback the server never touches the agent's override set.
  u = to_policy_update(d, "run-c", v1::POLICY_MODE_HEADROOM, {false, false}, 40, 123);
  EXPECT_FALSE(u.fp32_tensors_set());
  EXPECT_EQ(u.fp32_tensors_size(), 0);
}

TEST(ServerPolicyConversionTest, PerLayerPrecisionBecomesUpdate) {
  policy::PolicyDecision d;
  d.policy_id = 4;
  d.effective_from_step = 12;
  d.bf16_gemms = {"h1.mlp.fc"};
  d.reason = "bf16 h1.mlp.fc: ...";
  const v1::PolicyUpdate moved =
      to_policy_update(d, "run-c", v1::POLICY_MODE_HEADROOM, {true, true}, 10, 1);
  EXPECT_TRUE(moved.bf16_gemms_set());
  ASSERT_EQ(moved.bf16_gemms_size(), 1);
  EXPECT_EQ(moved.bf16_gemms(0), "h1.mlp.fc");
  EXPECT_FALSE(moved.has_amax_history_length());
  EXPECT_FALSE(moved.has_amax_margin());
  EXPECT_EQ(decision_kind(moved, nullptr), "gemm_precision");
  // The same set carried along with an FP32 fallback change is not a precision decision.
  d.fp32_tensors = {"h0.ln"};
  const v1::PolicyUpdate fp32 =
      to_policy_update(d, "run-c", v1::POLICY_MODE_HEADROOM, {true, true}, 11, 2);
  EXPECT_EQ(decision_kind(fp32, &moved), "fp32_fallback");
  d.amax_history_length = 8;
  d.amax_margin = 1;
  const v1::PolicyUpdate recipe =
      to_policy_update(d, "run-c", v1::POLICY_MODE_HEADROOM, {true, true}, 12, 3);
  EXPECT_EQ(recipe.amax_history_length(), 8u);
  EXPECT_EQ(recipe.amax_margin(), 1u);
  EXPECT_EQ(decision_kind(recipe, &fp32), "gemm_precision");
  // Without per-layer precision the server never touches the agent's BF16 set.
  EXPECT_FALSE(to_policy_update(d, "run-c", v1::POLICY_MODE_HEADROOM, {true, false}, 12, 3)
                   .bf16_gemms_set());
}

double bucket(const GradientDigest& g, int le_log2) {
  return g.buckets.at(static_cast<std::size_t>(le_log2 - kGradBucketMinLog2));
}

TEST(ServerReportDigestTest, OnePassGivesTheTotalsTheSeriesAndThePolicyInput) {
  constexpr double kScale = 1024.0;  // 2^10
  v1::StepReport r = testing::make_report("run-d", 1, 5, 4, 0, kScale);
  // Measured binades -20..-18 are unscaled -30..-28; 2 NaN and 1 +Inf.
  v1::TensorStats grad = testing::crafted_tensor("h0.out.grad", v1::TENSOR_ROLE_ACTIVATION_GRAD,
                                                 -20, {10, 20, 30}, kScale, 2, 1, 10, 1);
  grad.mutable_targets(0)->set_subnormal(4);
  v1::TensorStats weight =
      testing::crafted_tensor("h0.w", v1::TENSOR_ROLE_WEIGHT_GRAD, -5, {100}, kScale, 0, 0, 7);
  // The same weight gradient after unscaling: in the totals, not twice in the histogram.
  v1::TensorStats unscaled =
      testing::crafted_tensor("h0.w", v1::TENSOR_ROLE_WEIGHT_GRAD, -15, {100}, 1.0);
  unscaled.set_phase(v1::TENSOR_PHASE_AFTER_UNSCALE);
  unscaled.clear_targets();
  // Not loss-scaled: in the totals and the series, not in the headroom mode's input.
  v1::TensorStats act = testing::crafted_tensor("h0.act", v1::TENSOR_ROLE_ACTIVATION, 0, {50}, 1.0);
  act.set_neg_inf(5);
  act.set_numel(act.numel() + 5);
  act.clear_targets();
  for (const v1::TensorStats* t : {&grad, &weight, &unscaled, &act}) *r.add_tensors() = *t;
  r.mutable_first_offender()->set_tensor("h0.out.grad");
  r.mutable_first_offender()->set_role(v1::TENSOR_ROLE_ACTIVATION_GRAD);

  const ReportDigest d = digest_report(r, /*policy_all_tensors=*/false);

  // The tensor totals: one sample per tensor, unscaled max_abs, targets[0]'s counts.
  ASSERT_EQ(d.tensors.size(), 4u);
  const TensorDigest& g = d.tensors[0];
  EXPECT_EQ(g.name, "h0.out.grad");
  EXPECT_EQ(g.role, v1::TENSOR_ROLE_ACTIVATION_GRAD);
  EXPECT_EQ(g.format, v1::FORMAT_FP16);
  EXPECT_EQ(g.nonfinite, 3u);
  EXPECT_EQ(g.values, 60u);
  EXPECT_EQ(g.overflow, 1u);
  EXPECT_EQ(g.underflow, 10u);
  EXPECT_EQ(g.max_abs, std::ldexp(1.5, -28));
  EXPECT_EQ(d.tensors[2].format, 0);  // no targets
  EXPECT_EQ(d.tensors[2].values, 0u);
  EXPECT_EQ(d.tensors[3].nonfinite, 5u);

  // The series: per role and target format.
  const RoleDigest& ag = d.roles[v1::TENSOR_ROLE_ACTIVATION_GRAD];
  EXPECT_TRUE(ag.seen);
  EXPECT_EQ(ag.nonfinite, (std::array<std::uint64_t, 3>{2, 1, 0}));
  const RoleDigest::Target& fp16 = ag.targets[v1::FORMAT_FP16];
  EXPECT_TRUE(fp16.seen);
  EXPECT_EQ(fp16.checked, 60u);
  EXPECT_EQ(fp16.overflow, 1u);
  EXPECT_EQ(fp16.underflow, 10u);
  EXPECT_EQ(fp16.subnormal, 4u);
  const RoleDigest& wg = d.roles[v1::TENSOR_ROLE_WEIGHT_GRAD];
  EXPECT_EQ(wg.targets[v1::FORMAT_FP16].checked, 100u);
  EXPECT_EQ(wg.targets[v1::FORMAT_FP16].underflow, 7u);
  EXPECT_EQ(d.roles[v1::TENSOR_ROLE_ACTIVATION].nonfinite[2], 5u);
  EXPECT_FALSE(d.roles[v1::TENSOR_ROLE_ACTIVATION].targets[v1::FORMAT_FP16].seen);
  EXPECT_FALSE(d.roles[v1::TENSOR_ROLE_WEIGHT].seen);
  EXPECT_EQ(d.first_offender_role, v1::TENSOR_ROLE_ACTIVATION_GRAD);

  // The gradient histogram, unscaled: binade e goes to the bucket le = 2^(e+1).
  ASSERT_EQ(d.gradient[0].buckets.size(), static_cast<std::size_t>(kGradBuckets + 1));
  EXPECT_EQ(bucket(d.gradient[0], -29), 10);
  EXPECT_EQ(bucket(d.gradient[0], -28), 20);
  EXPECT_EQ(bucket(d.gradient[0], -27), 30);
  EXPECT_EQ(std::accumulate(d.gradient[0].buckets.begin(), d.gradient[0].buckets.end(), 0.0), 60);
  EXPECT_DOUBLE_EQ(d.gradient[0].sum, 1.5 * (10 * std::ldexp(1.0, -30) + 20 * std::ldexp(1.0, -29) +
                                             30 * std::ldexp(1.0, -28)));
  EXPECT_EQ(bucket(d.gradient[1], -14), 100);
  EXPECT_EQ(std::accumulate(d.gradient[1].buckets.begin(), d.gradient[1].buckets.end(), 0.0), 100);

  // The policy input: the loss-scaled tensors only, as the restore path converts them.
  const policy::StepInput replayed = to_step_input(r, false);
  ASSERT_EQ(d.step_input.tensors.size(), 3u);
  ASSERT_EQ(replayed.tensors.size(), 3u);
  EXPECT_EQ(d.step_input.run_id, "run-d");
  EXPECT_EQ(d.step_input.rank, 1);
  EXPECT_EQ(d.step_input.step, 4);
  EXPECT_EQ(d.step_input.loss_scale, kScale);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(d.step_input.tensors[i].name, replayed.tensors[i].name);
    EXPECT_EQ(d.step_input.tensors[i].role, replayed.tensors[i].role);
    EXPECT_EQ(d.step_input.tensors[i].scale, replayed.tensors[i].scale);
    EXPECT_EQ(d.step_input.tensors[i].overflow, replayed.tensors[i].overflow);
  }
  EXPECT_EQ(d.step_input.tensors[0].nan, 2u);
  ASSERT_TRUE(d.step_input.tensors[1].underflow.has_value());
  EXPECT_EQ(*d.step_input.tensors[1].underflow, 7u);
  // With FP32 fallback the engine sees every tensor.
  EXPECT_EQ(digest_report(r, true).step_input.tensors.size(), 4u);
}

}  // namespace
}  // namespace ampscope::server
