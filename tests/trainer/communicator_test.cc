// The single-process side of data parallelism, in every build: the single communicator is the
// identity, --comm resolves by launch and device, and a Trainer votes once per step through
// PolicyAgreement (identity reduction) with unchanged results.
#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "ampscope/check.h"
#include "ampscope/trainer/communicator.h"
#include "ampscope/trainer/trainer.h"

namespace {

using namespace ampscope::trainer;
using ampscope::Device;

TEST(CommunicatorTest, SingleIsTheIdentity) {
  auto comm = make_single_communicator();
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  EXPECT_TRUE(comm->supports(Device::kCpu) && comm->supports(Device::kCuda));
  std::vector<float> x = {1.5f, -2.0f, 3.0f};
  auto backend = make_cpu_backend();
  comm->all_reduce_sum(Tensor(x.data(), ampscope::Format::kFP32, {3}), backend->stream());
  EXPECT_EQ(x, (std::vector<float>{1.5f, -2.0f, 3.0f}));
  std::vector<double> v = {1.0, -7.0};
  comm->all_reduce_max(v);
  EXPECT_EQ(v, (std::vector<double>{1.0, -7.0}));
  comm->barrier();
}

TEST(CommunicatorTest, AutoPicksByLaunchAndDevice) {
  EXPECT_EQ(resolve_comm_kind(CommKind::kAuto, Device::kCpu, false), CommKind::kSingle);
  EXPECT_EQ(resolve_comm_kind(CommKind::kAuto, Device::kCuda, false), CommKind::kSingle);
  EXPECT_EQ(resolve_comm_kind(CommKind::kAuto, Device::kCpu, true), CommKind::kMpi);
  EXPECT_EQ(resolve_comm_kind(CommKind::kAuto, Device::kCuda, true), CommKind::kNccl);
  EXPECT_EQ(resolve_comm_kind(CommKind::kSingle, Device::kCpu, true), CommKind::kSingle);
  for (CommKind k : {CommKind::kAuto, CommKind::kSingle, CommKind::kMpi, CommKind::kNccl}) {
    EXPECT_EQ(parse_comm_kind(comm_kind_name(k)), k);
  }
  EXPECT_FALSE(parse_comm_kind("gloo").has_value());
}

TEST(CommunicatorTest, LaunchIsDetectedFromTheLauncherEnvironment) {
  unsetenv("OMPI_COMM_WORLD_SIZE");
  unsetenv("PMIX_RANK");
  unsetenv("PMI_RANK");
  EXPECT_FALSE(launched_by_mpi());
  setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  EXPECT_TRUE(launched_by_mpi());
  unsetenv("OMPI_COMM_WORLD_SIZE");
}

class RecordingAgreement : public PolicyAgreement {
 public:
  PolicyVote vote() override {
    ++votes;
    return {41, true};
  }
  void agreed(const PolicyVote& v) override { agreed_votes.push_back(v); }
  int votes = 0;
  std::vector<PolicyVote> agreed_votes;
};

TrainerConfig tiny() {
  TrainerConfig c;
  c.model.context = 16;
  c.model.n_embd = 16;
  c.model.n_head = 2;
  c.model.n_layer = 1;
  c.batch = 2;
  c.steps = 3;
  c.eval_batches = 0;
  return c;
}

TEST(CommunicatorTest, ATrainerVotesOncePerStepAndAgreesWithItselfAlone) {
  const Corpus corpus = Corpus::synthetic(20000);
  Trainer plain(tiny(), corpus, make_cpu_backend({.blas_threads = 1}));
  Trainer voting(tiny(), corpus, make_cpu_backend({.blas_threads = 1}),
                 make_single_communicator());
  RecordingAgreement agreement;
  voting.set_policy_agreement(&agreement);
  EXPECT_EQ(voting.rank(), 0);
  EXPECT_EQ(voting.world_size(), 1);
  for (int i = 0; i < 3; ++i) {
    const StepEvent a = plain.step(), b = voting.step();
    EXPECT_EQ(a.loss, b.loss);
    EXPECT_EQ(a.grad_norm, b.grad_norm);
    EXPECT_EQ(a.tokens, b.tokens);
  }
  EXPECT_EQ(agreement.votes, 3);
  ASSERT_EQ(agreement.agreed_votes.size(), 3u);
  EXPECT_EQ(agreement.agreed_votes[2].received_seq, 41u);
  EXPECT_TRUE(agreement.agreed_votes[2].fallback);
}

TEST(CommunicatorTest, InjectRankOutsideTheRunIsRejected) {
  TrainerConfig c = tiny();
  c.injections = {{Injection::Kind::kNaN, "logits.grad", 1}};
  c.inject_rank = 1;
  EXPECT_THROW(Trainer(c, Corpus::synthetic(20000), make_cpu_backend()), ampscope::Error);
  c.inject_rank = -1;
  EXPECT_NE(validate(c).find("inject_rank"), std::string::npos);
}

}  // namespace
