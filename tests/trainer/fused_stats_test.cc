// Fused statistics end to end: ampscope-train's unscale pass measures the weight gradients and
// the agent adapter hands the results over (Agent::observe_stats). The reports equal those of
// the agent measuring the same gradients itself, and training is bit-exact with and without
// the agent, fused or not.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent_adapter.h"
#include "ampscope/testing/files.h"
#include "ampscope/trainer/trainer.h"
#include "spool_reader.h"

namespace ampscope::trainer {
namespace {

using ampscope::testing::TempDir;

enum class Mode { kNoAgent, kPlain, kFused };

// Forwards the trainer's hooks to the adapter; kPlain leaves out the fused-statistics calls
// (the trainer then unscales with the plain pass and the agent measures the gradients).
class Forwarder final : public TensorObserver, public StepListener {
 public:
  Forwarder(AgentAdapter& adapter, bool fused) : adapter_(adapter), fused_(fused) {}
  bool observe_step(std::int64_t step) override { return adapter_.observe_step(step); }
  void on_tensor(const TensorView& t) override { adapter_.on_tensor(t); }
  std::optional<std::vector<TargetSpec>> stats_targets(const TensorView& meta) override {
    return fused_ ? adapter_.stats_targets(meta) : std::nullopt;
  }
  void on_tensor_stats(const TensorView& t, const TensorStats& stats) override {
    ++fused_tensors;
    adapter_.on_tensor_stats(t, stats);
  }
  void on_step(const StepEvent& e) override { adapter_.on_step(e); }
  int fused_tensors = 0;

 private:
  AgentAdapter& adapter_;
  bool fused_;
};

struct TrainingRun {
  std::vector<StepEvent> events;
  std::vector<v1::StepReport> reports;
  int fused_tensors = 0;
};

TrainingRun train(Mode mode, Format precision_compute, const TempDir& dir, const std::string& run_id) {
  static const Corpus corpus = Corpus::synthetic();
  TrainerConfig c;
  c.model = {.vocab_size = 0, .context = 16, .n_embd = 16, .n_head = 2, .n_layer = 2};
  c.precision = precision_compute == Format::kBF16 ? PrecisionMode::kAmpBF16
                                                   : PrecisionMode::kAmpFP16;
  c.batch = 4;
  c.steps = 4;
  c.eval_batches = 0;
  // A NaN in one weight gradient at step 2: found_inf, a skipped step, a non-finite report.
  c.injections = {{Injection::Kind::kNaN, "h0.mlp.fc.weight.grad", 2}};
  Trainer trainer(c, corpus, make_cpu_backend({.blas_threads = 1}));
  TrainingRun run;
  std::unique_ptr<AgentAdapter> adapter;
  std::unique_ptr<Forwarder> forwarder;
  if (mode != Mode::kNoAgent) {
    agent::AgentConfig config;
    config.run_id = run_id;
    config.spool_dir = (dir / "spool").string();
    config.sampling.full_every = 1;  // every gradient in full, every step
    config.flush_timeout = std::chrono::milliseconds(0);
    std::unique_ptr<agent::Agent> a;
    const agent::Status s = agent::Agent::create(config, run_info(trainer), &a);
    EXPECT_TRUE(s.ok()) << s.message;
    adapter = std::make_unique<AgentAdapter>(trainer, std::move(a), /*install_hooks=*/false);
    forwarder = std::make_unique<Forwarder>(*adapter, mode == Mode::kFused);
    trainer.set_observer(forwarder.get());
    trainer.add_step_listener(forwarder.get());
  }
  for (int i = 0; i < c.steps; ++i) run.events.push_back(trainer.step());
  trainer.set_observer(nullptr);
  if (forwarder) run.fused_tensors = forwarder->fused_tensors;
  adapter.reset();  // shuts the agent down: every report is in the spool
  if (mode != Mode::kNoAgent) run.reports = agent::testing::read_spool(dir / "spool", run_id);
  return run;
}

void expect_same_training(const TrainingRun& a, const TrainingRun& b) {
  ASSERT_EQ(a.events.size(), b.events.size());
  for (std::size_t i = 0; i < a.events.size(); ++i) {
    EXPECT_EQ(a.events[i].loss, b.events[i].loss) << "step " << i;
    // Bit for bit (the NaN step's norm is NaN in both).
    EXPECT_EQ(std::bit_cast<std::uint64_t>(a.events[i].grad_norm),
              std::bit_cast<std::uint64_t>(b.events[i].grad_norm))
        << "step " << i;
    EXPECT_EQ(a.events[i].found_inf, b.events[i].found_inf) << "step " << i;
    EXPECT_EQ(a.events[i].scale_after, b.events[i].scale_after) << "step " << i;
  }
}

TEST(FusedStatsTest, ReportsAndTrainingEqualThoseWithoutFusion) {
  for (Format compute : {Format::kFP16, Format::kBF16}) {
    TempDir dir;
    const TrainingRun none = train(Mode::kNoAgent, compute, dir, "none");
    const TrainingRun plain = train(Mode::kPlain, compute, dir, "plain");
    const TrainingRun fused = train(Mode::kFused, compute, dir, "fused");
    expect_same_training(none, plain);
    expect_same_training(none, fused);
    EXPECT_TRUE(none.events[2].found_inf);
    EXPECT_EQ(plain.fused_tensors, 0);
    ASSERT_EQ(plain.reports.size(), 4u);
    ASSERT_EQ(fused.reports.size(), 4u);
    int unscaled = 0;
    for (std::size_t r = 0; r < plain.reports.size(); ++r) {
      const v1::StepReport& p = plain.reports[r];
      const v1::StepReport& f = fused.reports[r];
      ASSERT_EQ(p.tensors_size(), f.tensors_size()) << "step " << r;
      EXPECT_EQ(p.found_inf(), f.found_inf());
      EXPECT_EQ(p.first_offender().SerializeAsString(), f.first_offender().SerializeAsString());
      for (int k = 0; k < p.tensors_size(); ++k) {
        v1::TensorStats x = p.tensors(k), y = f.tensors(k);
        if (x.phase() == v1::TENSOR_PHASE_AFTER_UNSCALE) {
          ++unscaled;
          EXPECT_EQ(x.level(), v1::STATS_LEVEL_FULL);
          // Counts, histogram and targets bit for bit (compared below); sums within rounding.
          EXPECT_NEAR(x.sum(), y.sum(), 1e-12 * std::sqrt(x.numel() * x.sum_sq())) << x.name();
          EXPECT_NEAR(x.sum_sq(), y.sum_sq(), 1e-12 * x.sum_sq()) << x.name();
          x.clear_sum();
          x.clear_sum_sq();
          y.clear_sum();
          y.clear_sum_sq();
        }
        EXPECT_EQ(x.SerializeAsString(), y.SerializeAsString()) << "step " << r << " " << x.name();
      }
    }
    // Every weight gradient of every step went through the fused pass.
    EXPECT_EQ(fused.fused_tensors, unscaled);
    EXPECT_GT(unscaled, 0);
    EXPECT_EQ(fused.reports[2].first_offender().tensor(), "h0.mlp.fc.weight");
  }
}

}  // namespace
}  // namespace ampscope::trainer
