// The flight recorder on its own (flight_recorder.h): what it keeps, when it gives its history
// away, and its memory bound.
#include "flight_recorder.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace ampscope::agent {
namespace {

// A measured sample holding full statistics of `numel` values spread over `bins` binades, with
// `underflow` of them underflowing in targets[0]; reported at `level`.
TensorSample full_sample(const std::string& name, TensorRole role, Level level, int bins = 8,
                         std::uint64_t numel = 1000, std::uint64_t underflow = 0) {
  TensorSample s;
  s.name = name;
  s.role = role;
  s.phase = TensorPhase::kBackward;
  s.level = level;
  s.measured = true;
  s.full = true;
  s.numel = numel;
  s.stats.numel = numel;
  s.stats.max_abs = 1.0;
  s.stats.min_abs_nonzero = 1e-3;
  s.stats.histogram.min_exponent = -bins;
  s.stats.histogram.counts.assign(static_cast<std::size_t>(bins), 0);
  s.stats.histogram.counts[0] = numel;
  TargetCounts t;
  t.underflow = underflow;
  s.stats.targets.push_back(t);
  return s;
}

StepRecord step_of(std::int64_t step, std::vector<TensorSample> samples) {
  StepRecord r;
  r.info.step = step;
  r.info.loss_scale = 1024.0;
  r.samples = std::move(samples);
  return r;
}

std::vector<std::int64_t> steps_of(const FlightHistory& h) {
  std::vector<std::int64_t> out;
  for (const RecordedStep& s : h.steps) out.push_back(s.step);
  return out;
}

TEST(FlightRecorderTest, KeepsOnlyFullStatisticsTheReportCarriesAtLess) {
  FlightRecorder recorder(8, 1 << 20);
  FlightHistory history;
  std::vector<TensorSample> samples;
  samples.push_back(full_sample("reported_full", TensorRole::kWeight, Level::kFull));
  samples.push_back(full_sample("counted", TensorRole::kWeightGrad, Level::kCounts));
  samples.push_back(full_sample("recorded_only", TensorRole::kActivation, Level::kSkip));
  TensorSample counts_only = full_sample("counts_only", TensorRole::kActivationGrad,
                                         Level::kCounts);
  counts_only.full = false;
  samples.push_back(counts_only);
  StepRecord r = step_of(3, std::move(samples));
  recorder.on_step(r, &history);
  EXPECT_EQ(history.event, FlightEvent::kNone);
  EXPECT_TRUE(history.steps.empty());
  ASSERT_EQ(recorder.steps(), 1u);
  EXPECT_EQ(recorder.tensors(), 2u);
  // The report is unchanged outside an event.
  EXPECT_EQ(r.samples[1].level, Level::kCounts);
  EXPECT_EQ(r.samples[2].level, Level::kSkip);
}

TEST(FlightRecorderTest, ANonFiniteStepTakesTheLastKStepsOnceAndNothingBefore) {
  constexpr std::size_t kSteps = 4;
  FlightRecorder recorder(kSteps, 1 << 20);
  FlightHistory history;
  for (std::int64_t step = 0; step < 10; ++step) {
    StepRecord r = step_of(step, {full_sample("g", TensorRole::kWeightGrad, Level::kCounts)});
    recorder.on_step(r, &history);
    EXPECT_EQ(history.event, FlightEvent::kNone) << step;
    EXPECT_TRUE(history.steps.empty()) << step;
  }
  EXPECT_EQ(recorder.steps(), kSteps);

  TensorSample bad = full_sample("g", TensorRole::kWeightGrad, Level::kCounts);
  bad.stats.nan = 3;
  bad.stats.histogram.counts[0] -= 3;
  StepRecord event = step_of(10, {bad});
  recorder.on_step(event, &history);
  EXPECT_EQ(history.event, FlightEvent::kNonfinite);
  EXPECT_EQ(steps_of(history), (std::vector<std::int64_t>{6, 7, 8, 9}));
  for (const RecordedStep& s : history.steps) {
    ASSERT_EQ(s.samples.size(), 1u);
    EXPECT_EQ(s.samples[0].level, Level::kFull);
    EXPECT_EQ(s.loss_scale, 1024.0);
  }
  // The event step's report stays as the sampling made it.
  EXPECT_EQ(event.samples[0].level, Level::kCounts);
  EXPECT_EQ(recorder.steps(), 0u);
  EXPECT_EQ(recorder.bytes(), 0u);

  // A second event right after: nothing new was kept, nothing is sent again.
  StepRecord again = step_of(11, {bad});
  recorder.on_step(again, &history);
  EXPECT_EQ(history.event, FlightEvent::kNonfinite);
  EXPECT_TRUE(history.steps.empty());

  // After one more clean step, the next event sends just that step.
  StepRecord clean = step_of(12, {full_sample("g", TensorRole::kWeightGrad, Level::kCounts)});
  recorder.on_step(clean, &history);
  StepRecord skipped = step_of(13, {full_sample("g", TensorRole::kWeightGrad, Level::kCounts)});
  skipped.info.skipped = true;
  recorder.on_step(skipped, &history);
  EXPECT_EQ(history.event, FlightEvent::kSkipped);
  EXPECT_EQ(steps_of(history), (std::vector<std::int64_t>{12}));
}

TEST(FlightRecorderTest, FoundInfWithoutAMeasuredNonFiniteIsAnEvent) {
  FlightRecorder recorder(4, 1 << 20);
  FlightHistory history;
  StepRecord r = step_of(0, {full_sample("g", TensorRole::kWeightGrad, Level::kCounts)});
  recorder.on_step(r, &history);
  StepRecord e = step_of(1, {});
  e.info.found_inf = true;
  recorder.on_step(e, &history);
  EXPECT_EQ(history.event, FlightEvent::kNonfinite);
  EXPECT_EQ(steps_of(history), (std::vector<std::int64_t>{0}));
}

// Underflow is an event when a role's share rises above 5% (the alert's threshold), not on
// every step it stays there; another role's share is its own.
TEST(FlightRecorderTest, UnderflowIsAnEventWhereItRisesAboveTheAlertThreshold) {
  FlightRecorder recorder(16, 1 << 20);
  FlightHistory history;
  const auto run = [&](std::int64_t step, std::uint64_t grad_underflow,
                       std::uint64_t act_underflow) {
    StepRecord r = step_of(step, {});
    // Two tensors of 1000 values per role: the share is the role's, over both.
    for (int i = 0; i < 2; ++i) {
      r.samples.push_back(full_sample("g" + std::to_string(i), TensorRole::kWeightGrad,
                                      Level::kCounts, 8, 1000, grad_underflow));
      r.samples.push_back(full_sample("a" + std::to_string(i), TensorRole::kActivationGrad,
                                      Level::kCounts, 8, 1000, act_underflow));
    }
    recorder.on_step(r, &history);
    return history.event;
  };
  EXPECT_EQ(run(0, 50, 0), FlightEvent::kNone);        // 5.0%: at the threshold, not above
  EXPECT_EQ(run(1, 51, 0), FlightEvent::kUnderflow);   // 5.1%: rose above
  EXPECT_EQ(steps_of(history), (std::vector<std::int64_t>{0}));
  EXPECT_EQ(run(2, 80, 0), FlightEvent::kNone);        // still above: no new event
  EXPECT_EQ(run(3, 80, 200), FlightEvent::kUnderflow); // the other role rose
  EXPECT_EQ(steps_of(history), (std::vector<std::int64_t>{2}));
  EXPECT_EQ(run(4, 10, 200), FlightEvent::kNone);      // fell back
  EXPECT_EQ(run(5, 60, 200), FlightEvent::kUnderflow); // and rose again
}

// Many large tensors: the accounted bytes never exceed the cap, the oldest steps go first, and
// the accounting matches the steps held.
TEST(FlightRecorderTest, MemoryStaysUnderTheCapAndTheOldestStepsGoFirst) {
  constexpr std::uint64_t kCap = 256 << 10;
  FlightRecorder recorder(1024, kCap);
  FlightHistory history;
  const std::string long_name(200, 'w');
  std::uint64_t per_step = 0;
  for (std::int64_t step = 0; step < 200; ++step) {
    StepRecord r = step_of(step, {});
    for (int i = 0; i < 20; ++i) {
      // 277 binades: the widest histogram there is.
      r.samples.push_back(full_sample(long_name + std::to_string(i), TensorRole::kActivation,
                                      Level::kSkip, 277));
    }
    if (step == 0) {
      for (const TensorSample& s : r.samples) per_step += FlightRecorder::footprint(s);
    }
    recorder.on_step(r, &history);
    EXPECT_LE(recorder.bytes(), kCap) << "after step " << step;
    EXPECT_EQ(recorder.bytes(), recorder.steps() * per_step);
  }
  const std::size_t fit = static_cast<std::size_t>(kCap / per_step);
  ASSERT_GT(fit, 1u);
  EXPECT_EQ(recorder.steps(), fit);
  StepRecord event = step_of(200, {});
  event.info.skipped = true;
  recorder.on_step(event, &history);
  ASSERT_EQ(history.steps.size(), fit);
  // The newest steps stayed, in order.
  EXPECT_EQ(history.steps.front().step, static_cast<std::int64_t>(200 - fit));
  EXPECT_EQ(history.steps.back().step, 199);
  // What footprint() accounts is what the kept samples hold.
  const TensorSample& kept = history.steps.front().samples.front();
  EXPECT_GE(FlightRecorder::footprint(kept),
            sizeof(TensorSample) + kept.name.size() + 277 * sizeof(std::uint64_t));
}

TEST(FlightRecorderTest, AStepBeyondTheCapKeepsWhatFitsAndCountsTheRest) {
  const std::uint64_t one = FlightRecorder::footprint(
      full_sample("x", TensorRole::kActivation, Level::kSkip, 8));
  FlightRecorder recorder(4, 3 * one);
  FlightHistory history;
  StepRecord r = step_of(0, {});
  for (int i = 0; i < 5; ++i) {
    r.samples.push_back(full_sample("x", TensorRole::kActivation, Level::kSkip, 8));
  }
  recorder.on_step(r, &history);
  EXPECT_EQ(recorder.tensors(), 3u);
  EXPECT_EQ(recorder.dropped_samples(), 2u);
  EXPECT_LE(recorder.bytes(), 3 * one);
}

TEST(FlightRecorderTest, OffKeepsNothingAndSeesNoEvent) {
  FlightRecorder recorder(0, 1 << 20);
  FlightHistory history;
  StepRecord r = step_of(0, {full_sample("g", TensorRole::kWeightGrad, Level::kCounts)});
  recorder.on_step(r, &history);
  r.info.skipped = true;
  recorder.on_step(r, &history);
  EXPECT_EQ(history.event, FlightEvent::kNone);
  EXPECT_EQ(recorder.steps(), 0u);
  EXPECT_EQ(r.samples[0].level, Level::kCounts);
}

}  // namespace
}  // namespace ampscope::agent
