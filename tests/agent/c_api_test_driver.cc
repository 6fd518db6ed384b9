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
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "ampscope/testing/child_process.h"
#include "ampscope/testing/files.h"
#include "ampscope/testing/server_process.h"
#include "ampscope/v1/telemetry.grpc.pb.h"
#include "loopback_server.h"
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
// It acknowledges each report at once.
class RecordingServer final : public v1::Telemetry::Service {
 public:
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
      {
        std::lock_guard lock(mu_);
        if (in.has_hello()) {
          hellos_.push_back(in.hello());
          ack.mutable_ack()->set_persisted_seq(0);
        } else {
          reports_.push_back(in.report());
          ack.mutable_ack()->set_persisted_seq(in.report().seq());
        }
      }
      if (!stream->Write(ack)) break;
    }
    return grpc::Status::OK;
  }

 private:
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
                               "ampscope_scale_and_compute_stats"}) {
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

}  // namespace
}  // namespace ampscope::agent
