// Per-layer precision end to end: ampscope-train (a real process, fp8-delayed) against a
// scripted stand-in for ampscope-server on loopback, which answers the report of step 1 with a
// PolicyUpdate moving two linear layers to BF16 and shortening delayed scaling's amax history
// from step 3. policy_lockstep makes the timing exact: begin_step(2) waits for step 1's Ack,
// which the stand-in sends after the update. The trainer's Hello names its linear layers; from
// step 3 its reports list the BF16 layers, and those layers' quantisers are what-if counts.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "ampscope/testing/child_process.h"
#include "ampscope/testing/files.h"
#include "ampscope/v1/telemetry.grpc.pb.h"
#include "loopback_server.h"
#include "trainer_run.h"

namespace ampscope::testing {
namespace {

using namespace std::chrono_literals;

constexpr int kSteps = 6;
constexpr std::int64_t kEffective = 3;
const std::vector<std::string> kLayers = {"h0.attn.qkv", "h0.attn.proj", "h0.mlp.fc",
                                          "h0.mlp.proj", "h1.attn.qkv",  "h1.attn.proj",
                                          "h1.mlp.fc",   "h1.mlp.proj"};
const std::vector<std::string> kBf16 = {"h0.mlp.fc", "h1.attn.qkv"};

// Acknowledges everything; the report of step 1 first gets the update.
class PolicyServer final : public v1::Telemetry::Service {
 public:
  std::string address() const { return server_.address(); }
  std::vector<v1::Hello> hellos() const {
    std::lock_guard lock(mu_);
    return hellos_;
  }
  std::map<std::int64_t, v1::StepReport> reports() const {
    std::lock_guard lock(mu_);
    return reports_;
  }

  grpc::Status Attach(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<v1::ServerMessage, v1::AgentMessage>* stream) override {
    v1::AgentMessage in;
    while (stream->Read(&in)) {
      bool send_update = false;
      std::uint64_t seq = 0;
      {
        std::lock_guard lock(mu_);
        if (in.has_hello()) {
          hellos_.push_back(in.hello());
        } else {
          const v1::StepReport& r = in.report();
          reports_[r.step()] = r;
          acked_ = std::max(acked_, r.seq());
          send_update = r.step() == 1 && !sent_;
          sent_ = sent_ || send_update;
        }
        seq = acked_;
      }
      if (send_update) {
        v1::ServerMessage m;
        v1::PolicyUpdate& u = *m.mutable_policy();
        u.set_policy_id("gemms-1");
        u.set_run_id("gemm-loop");
        u.set_effective_from_step(kEffective);
        u.set_seq(1);
        u.set_bf16_gemms_set(true);
        for (const std::string& l : kBf16) u.add_bf16_gemms(l);
        u.set_amax_history_length(2);
        if (!stream->Write(m)) break;
      }
      v1::ServerMessage ack;
      ack.mutable_ack()->set_persisted_seq(seq);
      if (!stream->Write(ack)) break;
    }
    return grpc::Status::OK;
  }

 private:
  mutable std::mutex mu_;
  std::vector<v1::Hello> hellos_;
  std::map<std::int64_t, v1::StepReport> reports_;
  std::uint64_t acked_ = 0;
  bool sent_ = false;
  agent::testing::LoopbackServer server_{this, std::chrono::seconds(2)};  // last
};

std::string layer_of(const std::string& quantizer) {
  return quantizer.substr(0, quantizer.rfind('.'));
}

TEST(GemmPolicyLoopTest, TheTrainersNextReportsCarryTheBf16SetAndWhatIfQuantisers) {
  TempDir dir;
  PolicyServer server;
  TrainerRun run{dir.path(),
                 "gemm-loop",
                 server.address(),
                 kSteps,
                 {"--precision", "fp8-delayed", "--agent", "sample_full_every=1", "--agent",
                  "policy_lockstep=on", "--agent", "policy_lockstep_timeout_ms=60000"}};
  ChildProcess trainer(run.argv(), dir / "train.log");
  ASSERT_EQ(trainer.wait(120s), 0) << trainer.log();

  const std::vector<v1::Hello> hellos = server.hellos();
  ASSERT_FALSE(hellos.empty());
  EXPECT_EQ(std::vector<std::string>(hellos[0].bf16_capable_gemms().begin(),
                                     hellos[0].bf16_capable_gemms().end()),
            kLayers);
  EXPECT_EQ(hellos[0].precision(), "fp8-delayed");

  const auto reports = server.reports();
  ASSERT_EQ(reports.size(), static_cast<std::size_t>(kSteps));
  for (const auto& [step, r] : reports) {
    const bool moved = step >= kEffective;
    EXPECT_EQ(std::vector<std::string>(r.bf16_gemms().begin(), r.bf16_gemms().end()),
              moved ? kBf16 : std::vector<std::string>{})
        << "step " << step;
    if (step == kEffective) {
      ASSERT_EQ(r.policy_outcomes_size(), 1);
      EXPECT_EQ(r.policy_outcomes(0).policy_id(), "gemms-1");
      EXPECT_TRUE(r.policy_outcomes(0).applied()) << r.policy_outcomes(0).reason();
    } else {
      EXPECT_EQ(r.policy_outcomes_size(), 0) << "step " << step;
    }
    // Per-tensor recipes: input and weight forward, output_grad in dgrad, for 8 layers.
    ASSERT_EQ(r.quantizers_size(), 24) << "step " << step;
    int what_if = 0;
    for (const v1::QuantizerStats& q : r.quantizers()) {
      EXPECT_EQ(q.layer(), layer_of(q.name())) << q.name();
      const bool bf16 = moved && std::find(kBf16.begin(), kBf16.end(), q.layer()) != kBf16.end();
      EXPECT_EQ(q.what_if(), bf16) << q.name() << " at step " << step;
      what_if += q.what_if() ? 1 : 0;
      EXPECT_GT(q.values(), 0u) << q.name();
      // History length 16, then 2 from step 3: the history holds the amaxes pushed before this
      // step's quantisation. A BF16 layer's history records nothing, but is cut to 2 as well.
      const int entries = moved ? 2 : static_cast<int>(step);
      EXPECT_EQ(q.amax_history_size(), entries) << q.name() << " at step " << step;
    }
    EXPECT_EQ(what_if, moved ? 6 : 0) << "step " << step;
  }
}

}  // namespace
}  // namespace ampscope::testing
