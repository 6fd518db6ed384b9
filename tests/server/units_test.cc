// Small pieces of the server: token comparison and token files, duration and size flags, and
// the conversions between the wire and the policy engine.
#include <gtest/gtest.h>

#include "auth.h"
#include "flags.h"
#include "policy_host.h"
#include "server_harness.h"

namespace ampscope::server {
namespace {

TEST(ServerAuthTest, ConstantTimeEqualComparesWholeStrings) {
  EXPECT_TRUE(constant_time_equal("secret-token", "secret-token"));
  EXPECT_FALSE(constant_time_equal("secret-token", "secret-tokeN"));
  EXPECT_FALSE(constant_time_equal("Secret-token", "secret-token"));
  EXPECT_FALSE(constant_time_equal("secret", "secret-token"));
  EXPECT_TRUE(constant_time_equal("", ""));
}

TEST(ServerAuthTest, TokenFileFirstLineTrimmed) {
  testing::TempDir dir;
  testing::write_text(dir / "token", "  abc123 \nsecond line\n");
  EXPECT_EQ(read_token_file((dir / "token").string()), "abc123");
  testing::write_text(dir / "empty", "\n");
  EXPECT_THROW(read_token_file((dir / "empty").string()), Error);
  EXPECT_THROW(read_token_file((dir / "missing").string()), Error);
}

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

TEST(ServerPolicyConversionTest, DecisionBecomesUpdate) {
  policy::PolicyDecision d;
  d.policy_id = 3;
  d.effective_from_step = 42;
  d.scaler.loss_scale = 4096.0;
  d.scaler.growth_interval = 1000000000;
  d.fp32_tensors = {"h0.attn.qkv"};
  d.reason = "headroom: lower";
  v1::PolicyUpdate u = to_policy_update(d, "run-c", v1::POLICY_MODE_HEADROOM, true, 40, 123);
  EXPECT_EQ(u.effective_from_step(), 42);
  EXPECT_EQ(u.loss_scale(), 4096.0);
  EXPECT_EQ(u.growth_interval(), 1000000000u);
  EXPECT_FALSE(u.has_backoff_factor());
  EXPECT_TRUE(u.fp32_tensors_set());
  ASSERT_EQ(u.fp32_tensors_size(), 1);
  EXPECT_EQ(decision_kind(u), "scale");
  // Without FP32 fallback the server never touches the agent's override set.
  u = to_policy_update(d, "run-c", v1::POLICY_MODE_HEADROOM, false, 40, 123);
  EXPECT_FALSE(u.fp32_tensors_set());
  EXPECT_EQ(u.fp32_tensors_size(), 0);
}

}  // namespace
}  // namespace ampscope::server
