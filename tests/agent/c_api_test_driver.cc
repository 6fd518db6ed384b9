// The C API as an ABI: what libampscope_agent.so exports, and a C trainer (c_api_test.c, a
// process that links only the library) checked by what reached its spool, ampscope-server, or
// a recording stand-in for the server.
//
// The C trainer runs as a process of its own because this test links ampscope's C++ libraries:
// the shared library registers the same ampscope.v1 protos with the same libprotobuf, so one
// process must not hold both.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "ampscope/testing/child_process.h"
#include "ampscope/testing/files.h"
#include "ampscope/testing/server_process.h"
#include "ampscope/v1/telemetry.grpc.pb.h"
#include "ampscope/recipe.h"
#include "loopback_server.h"
#include "quantizer_wire.h"
#include "server_harness.h"
#include "spool_reader.h"

#ifndef AMPSCOPE_C_API_PROGRAM
#error "AMPSCOPE_C_API_PROGRAM must name the C trainer built from c_api_test.c"
#endif

namespace ampscope::agent {
namespace {

using namespace std::chrono_literals;
using testing::LoopbackServer;
using ampscope::testing::CommandResult;
using ampscope::testing::TempDir;

// Runs the C trainer; fails the test with its output when a check failed.
void run_c_trainer(const std::vector<std::string>& args, std::string* out = nullptr) {
  std::vector<std::string> argv = {AMPSCOPE_C_API_PROGRAM};
  argv.insert(argv.end(), args.begin(), args.end());
  const CommandResult r = ampscope::testing::run_process(argv, 120s);
  EXPECT_EQ(r.code, 0) << "c_api_test.c " << args.at(0) << ": " << r.err << r.out;
  if (out != nullptr) *out = r.out;
}

// Stands in for ampscope-server where the real one cannot show what a test needs: the Hello
// (the server keeps it but no query serves its scaler) and every report as the agent sent it.
// It acknowledges each report at once, and sends `policy` (when given) after the first.
class RecordingServer final : public v1::Telemetry::Service {
 public:
  RecordingServer() = default;
  explicit RecordingServer(v1::PolicyUpdate policy) : policy_(std::move(policy)) {}
  std::string address() const { return server_.address(); }
  std::vector<v1::Hello> hellos() const {
    std::lock_guard lock(mu_);
    return hellos_;
  }
  std::vector<v1::StepReport> reports() const {
    std::lock_guard lock(mu_);
    return reports_;
  }

  grpc::Status Attach(grpc::ServerContext*,
                      grpc::ServerReaderWriter<v1::ServerMessage, v1::AgentMessage>* stream)
      override {
    v1::AgentMessage in;
    while (stream->Read(&in)) {
      v1::ServerMessage ack;
      std::optional<v1::ServerMessage> policy;
      {
        std::lock_guard lock(mu_);
        if (in.has_hello()) {
          hellos_.push_back(in.hello());
          ack.mutable_ack()->set_persisted_seq(0);
        } else {
          reports_.push_back(in.report());
          ack.mutable_ack()->set_persisted_seq(in.report().seq());
          if (policy_ && reports_.size() == 1) {
            policy.emplace();
            *policy->mutable_policy() = *policy_;
            policy->mutable_policy()->set_run_id(in.report().run_id());
          }
        }
      }
      // The update before the Ack: the agent's flush returns once it has both.
      if (policy && !stream->Write(*policy)) break;
      if (!stream->Write(ack)) break;
    }
    return grpc::Status::OK;
  }

 private:
  std::optional<v1::PolicyUpdate> policy_;
  mutable std::mutex mu_;
  std::vector<v1::Hello> hellos_;
  std::vector<v1::StepReport> reports_;
  LoopbackServer server_{this};  // last: shuts down first
};

TEST(CApiAbiTest, TheLibraryExportsOnlyTheCApi) {
  const CommandResult r =
      ampscope::testing::run_process({AMPSCOPE_NM, "-D", "--defined-only", AMPSCOPE_AGENT_SO});
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<std::string> names;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty()) continue;
    names.push_back(line.substr(line.rfind(' ') + 1));  // "address type name"
  }
  for (const std::string& n : names) {
    EXPECT_EQ(n.rfind("ampscope_", 0), 0u) << "exported: " << n;
  }
  for (const char* expected : {"ampscope_agent_abi_version", "ampscope_agent_create",
                               "ampscope_agent_observe", "ampscope_agent_attach_overrides",
                               "ampscope_agent_add_notice", "ampscope_loss_scale_update",
                               "ampscope_loss_scale_apply_change", "ampscope_agent_policy_vote",
                               "ampscope_agent_policy_agreed", "ampscope_agent_observe_stats",
                               "ampscope_agent_stats_target", "ampscope_compute_stats",
                               "ampscope_scale_and_compute_stats",
                               "ampscope_agent_observe_quantizer",
                               "ampscope_agent_observe_quantizer_counts", "ampscope_count_recipe",
                               "ampscope_agent_attach_gemm_precision"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), expected), names.end()) << expected;
  }
  std::cout << names.size() << " symbols exported\n";
}

TEST(CApiTest, LossScaleRulesFromC) { run_c_trainer({"rules"}); }

TEST(CApiTest, FusedStatisticsFromC) {
  TempDir dir;
  run_c_trainer({"fused", (dir / "spool").string()});
  const auto reports = testing::read_spool(dir / "spool", "c-fused");
  ASSERT_EQ(reports.size(), 1u);
  ASSERT_EQ(reports[0].tensors_size(), 3) << "the refused statistics are not reported";
  v1::TensorStats fused = reports[0].tensors(1), measured = reports[0].tensors(2);
  EXPECT_EQ(fused.name(), "fc.weight.grad");
  EXPECT_EQ(fused.level(), v1::STATS_LEVEL_FULL);
  ASSERT_EQ(fused.targets_size(), 1);
  EXPECT_EQ(fused.targets(0).scale_log2(), 10);
  // What the agent measured from the same values, field for field.
  measured.set_name(fused.name());
  measured.set_order(fused.order());
  EXPECT_EQ(fused.SerializeAsString(), measured.SerializeAsString());
}

TEST(CApiTest, ExercisedFromC) {
  TempDir dir;
  run_c_trainer({"exercise", (dir / "spool").string()});
  const auto reports = testing::read_spool(dir / "spool", "c-api");
  ASSERT_EQ(reports.size(), 3u);
  EXPECT_NE(std::find(reports[0].notices().begin(), reports[0].notices().end(),
                      "c trainer: hello from C"),
            reports[0].notices().end())
      << "a caller's notice goes out with the first report";
  EXPECT_FALSE(reports[0].has_first_offender());
  ASSERT_TRUE(reports[1].has_first_offender());
  EXPECT_EQ(reports[1].first_offender().tensor(), "fc.weight.grad");
  EXPECT_EQ(reports[1].tensors(0).nan(), 1u);
  EXPECT_EQ(reports[1].tensors(0).level(), v1::STATS_LEVEL_FULL);
  EXPECT_TRUE(reports[1].found_inf());
  EXPECT_EQ(reports[2].tensors(0).level(), v1::STATS_LEVEL_FULL) << "the step after";
  for (const auto& r : reports) {
    ASSERT_EQ(r.tensors_size(), 1) << "the refused views are not reported";
    EXPECT_TRUE(r.tensors(0).has_held());
    EXPECT_EQ(r.tensors(0).held(), v1::FORMAT_FP32);
  }
  EXPECT_TRUE(reports[0].fp32_layers().empty());
  ASSERT_EQ(reports[2].fp32_layers_size(), 1);
  EXPECT_EQ(reports[2].fp32_layers(0), "fc");
}

TEST(CApiTest, ACallerOfTheFirstLayoutsGetsTheDefaultsOfTheFieldsAddedSince) {
  TempDir dir;
  RecordingServer server;
  run_c_trainer({"old-layouts", (dir / "spool").string(), server.address()});
  const auto hellos = server.hellos();
  ASSERT_FALSE(hellos.empty());
  const v1::ScalerConfig& s = hellos[0].scaler();
  EXPECT_EQ(hellos[0].trainer(), "c_api_test v1");
  EXPECT_EQ(s.kind(), v1::SCALER_KIND_HYSTERESIS);
  EXPECT_EQ(s.init_scale(), 4096);
  EXPECT_EQ(s.hysteresis(), 0u);
  EXPECT_EQ(s.min_scale(), 0);
  EXPECT_EQ(s.max_scale(), 0);
  EXPECT_TRUE(hellos[0].fp32_capable_layers().empty());
  const auto reports = server.reports();
  ASSERT_EQ(reports.size(), 2u);
  for (const auto& r : reports) {
    ASSERT_EQ(r.tensors_size(), 1);
    EXPECT_FALSE(r.tensors(0).has_held());
    EXPECT_EQ(r.tensors(0).scale(), 4096);
    EXPECT_TRUE(r.fp32_layers().empty());
  }
}

TEST(CApiTest, TheHelloCarriesTheScalerAndTheCapableLayers) {
  TempDir dir;
  RecordingServer server;
  run_c_trainer({"hello", (dir / "spool").string(), server.address()});
  const auto hellos = server.hellos();
  ASSERT_FALSE(hellos.empty());
  const v1::ScalerConfig& s = hellos[0].scaler();
  EXPECT_EQ(s.kind(), v1::SCALER_KIND_HYSTERESIS);
  EXPECT_EQ(s.init_scale(), 32768) << "from the scaler's scale callback";
  EXPECT_EQ(s.growth_interval(), 1000u);
  EXPECT_EQ(s.hysteresis(), 3u);
  EXPECT_EQ(s.min_scale(), 1);
  EXPECT_EQ(s.max_scale(), 16777216);
  EXPECT_EQ(std::vector<std::string>(hellos[0].fp32_capable_layers().begin(),
                                     hellos[0].fp32_capable_layers().end()),
            (std::vector<std::string>{"fc", "lm_head"}));
}

TEST(CApiTest, TheServersFp32FallbackReachesTheReplaceCallback) {
  TempDir dir;
  ampscope::testing::ServerProcess server(
      dir.path(), dir / "store.db",
      {"--policy", "static-params", "--static-growth-interval", "1000", "--fp32-fallback",
       "--fp32-window", "1", "--fp32-min-reports", "1"});
  std::string out;
  run_c_trainer({"overrides", (dir / "spool").string(), server.address()}, &out);
  const auto reports = ampscope::testing::stored_reports(server.address(), "c-api-overrides");
  ASSERT_EQ(reports.size(), 8u);
  std::int64_t applied_at = -1;
  for (const auto& r : reports) {
    for (const auto& o : r.policy_outcomes()) {
      EXPECT_TRUE(o.applied()) << o.reason();
      applied_at = r.step();
    }
  }
  ASSERT_GT(applied_at, 0) << "no policy outcome reported; " << out;
  EXPECT_NE(out.find("replaced from step " + std::to_string(applied_at)), std::string::npos)
      << out;
  for (const auto& r : reports) {
    const bool fp32 = r.step() >= applied_at;
    EXPECT_EQ(r.fp32_layers_size(), fp32 ? 1 : 0) << "step " << r.step();
  }
}

// The activation c_api_test.c's quantizer_data() writes, (8, 64) FP32.
std::vector<float> quantizer_data() {
  std::vector<float> x(8 * 64);
  for (int i = 0; i < 8 * 64; ++i) {
    x[i] = std::ldexp(1.0f + static_cast<float>(i % 7) / 8.0f, i % 40 - 30) *
           (i % 3 == 0 ? -1.0f : 1.0f);
  }
  return x;
}

RecipeCounts expected_counts(const std::vector<float>& x, std::size_t n, std::size_t row_length,
                             const char* recipe) {
  return recipe_counts(x.data(), n, Format::kFP32, row_length, *parse_recipe(recipe));
}

TEST(CApiTest, QuantizersFromC) {
  TempDir dir;
  run_c_trainer({"quantizers", (dir / "spool").string()});
  const auto reports = testing::read_spool(dir / "spool", "c-quantizers");
  ASSERT_EQ(reports.size(), 2u);
  const v1::StepReport& r = reports[0];
  ASSERT_EQ(r.quantizers_size(), 3) << "the refused ones are not reported";
  const std::vector<float> x = quantizer_data();

  const v1::QuantizerStats& mx = r.quantizers(0);
  EXPECT_EQ(mx.name(), "fc.input");
  EXPECT_EQ(mx.role(), v1::TENSOR_ROLE_ACTIVATION);
  EXPECT_EQ(mx.phase(), v1::TENSOR_PHASE_FORWARD);
  EXPECT_EQ(mx.layer(), "fc");
  EXPECT_FALSE(mx.what_if());
  EXPECT_TRUE(mx.amax_history().empty());
  // Counted by the agent as recipe_counts counts the tensor in rows of its last dimension.
  testing::expect_wire_equals(mx, expected_counts(x, x.size(), 64, "mxfp4"));
  EXPECT_GT(mx.underflow(), 0u);

  const v1::QuantizerStats& tile = r.quantizers(1);
  EXPECT_EQ(tile.name(), "fc.input.head");
  testing::expect_wire_equals(tile, expected_counts(x, 500, 0, "e4m3:tile=1x128"));
  EXPECT_FALSE(tile.has_loss_cost()) << "an ABI 7 quantizer has none";
  EXPECT_EQ(tile.blocks(), 4u) << "one row of 500: blocks of 128, the last cut short";

  const v1::QuantizerStats& delayed = r.quantizers(2);
  EXPECT_EQ(delayed.name(), "fc.input.delayed");
  EXPECT_EQ(delayed.layer(), "fc");
  EXPECT_TRUE(delayed.what_if());
  EXPECT_EQ(std::vector<float>(delayed.amax_history().begin(), delayed.amax_history().end()),
            (std::vector<float>{1.0f, 896.0f, 2.0f}));
  // ampscope_count_recipe's counts, handed over as they were, and the loss cost given (ABI 8).
  testing::expect_wire_equals(delayed, expected_counts(x, x.size(), 64, "e4m3:scale=0.5"));
  EXPECT_EQ(delayed.loss_cost(), -0.0025);
  EXPECT_FALSE(mx.has_loss_cost());

  EXPECT_EQ(std::vector<std::string>(r.bf16_gemms().begin(), r.bf16_gemms().end()),
            std::vector<std::string>{"fc"});
  EXPECT_TRUE(reports[1].bf16_gemms().empty()) << "an ABI 2 step info has none";
  EXPECT_EQ(reports[1].quantizers_size(), 0);
}

// The stand-in's PolicyUpdate: fc to BF16 and delayed scaling's history 4, margin 1, from
// step 3.
v1::PolicyUpdate gemm_policy() {
  v1::PolicyUpdate p;
  p.set_policy_id("1");
  p.set_seq(1);
  p.set_effective_from_step(3);
  p.set_mode(v1::POLICY_MODE_HEADROOM);
  p.add_bf16_gemms("fc");
  p.set_bf16_gemms_set(true);
  p.set_amax_history_length(4);
  p.set_amax_margin(1);
  p.set_reason("test: fc underflows");
  return p;
}

TEST(CApiTest, PerLayerPrecisionReachesTheCallbacks) {
  TempDir dir;
  RecordingServer server(gemm_policy());
  std::string out;
  run_c_trainer({"gemm-precision", (dir / "spool").string(), server.address(), "1"}, &out);
  const auto hellos = server.hellos();
  ASSERT_FALSE(hellos.empty());
  EXPECT_EQ(std::vector<std::string>(hellos[0].bf16_capable_gemms().begin(),
                                     hellos[0].bf16_capable_gemms().end()),
            (std::vector<std::string>{"fc", "proj"}));
  const auto reports = server.reports();
  ASSERT_EQ(reports.size(), 6u) << out;
  int outcomes = 0;
  for (const auto& r : reports) {
    EXPECT_EQ(r.bf16_gemms_size(), r.step() >= 3 ? 1 : 0) << "step " << r.step();
    for (const auto& o : r.policy_outcomes()) {
      EXPECT_TRUE(o.applied()) << o.reason();
      EXPECT_EQ(r.step(), 3) << "applied at its effective step";
      ++outcomes;
    }
  }
  EXPECT_EQ(outcomes, 1);
}

TEST(CApiTest, ADelayedSettingForARunNotDelayedIsRefused) {
  TempDir dir;
  RecordingServer server(gemm_policy());
  std::string out;
  run_c_trainer({"gemm-precision", (dir / "spool").string(), server.address(), "0"}, &out);
  EXPECT_NE(out.find("replaced 0, scheduled 0"), std::string::npos) << out;
}

}  // namespace
}  // namespace ampscope::agent
