// The Hello names this process (pid and start), so that the server can tell two agents
// claiming one (run, rank) apart.
#include "report_codec.h"

#include <gtest/gtest.h>
#include <unistd.h>


#include "ampscope/proto/wire_time.h"

namespace ampscope::agent {
namespace {

TEST(HelloTest, CarriesThisProcessPidAndStartTime) {
  AgentConfig config;
  config.run_id = "hello";
  RunInfo run;
  v1::Hello h;
  encode_hello(config, run, ScalerSettings{}, {}, 1, 0, "test", &h);
  EXPECT_EQ(h.pid(), static_cast<std::uint64_t>(::getpid()));
  const std::int64_t now = proto::unix_now_ns();
  // The process started before this test ran (btime has whole seconds: allow one), and less
  // than a year ago.
  EXPECT_LE(h.process_start_unix_ns(), now + 1'000'000'000LL);
  EXPECT_GT(h.process_start_unix_ns(), now - 365LL * 24 * 3600 * 1'000'000'000LL);
  v1::Hello again;
  encode_hello(config, run, ScalerSettings{}, {}, 1, 0, "test", &again);
  EXPECT_EQ(again.process_start_unix_ns(), h.process_start_unix_ns()) << "fixed per process";
}

TEST(HelloTest, CarriesTheCapableLayersOfBothOverrideSets) {
  AgentConfig config;
  config.run_id = "hello";
  RunInfo run;
  run.precision = "nvfp4";
  v1::Hello h;
  CapableLayers capable;
  capable.fp32 = {"h0.attn.core", "lm_head"};
  capable.bf16_gemms = {"h0.attn.qkv", std::string("h0.mlp\x7f"
                                                   "fc",
                                                   9)};
  encode_hello(config, run, ScalerSettings{}, capable, 1, 0, "test", &h);
  EXPECT_EQ(
      std::vector<std::string>(h.fp32_capable_layers().begin(), h.fp32_capable_layers().end()),
      capable.fp32);
  EXPECT_EQ(std::vector<std::string>(h.bf16_capable_gemms().begin(), h.bf16_capable_gemms().end()),
            (std::vector<std::string>{"h0.attn.qkv", "h0.mlp\\x7ffc"}));
}

}  // namespace
}  // namespace ampscope::agent
