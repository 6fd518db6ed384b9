// One step of a multi-rank run as the policy engine sees it: the reports of every rank of the
// step merged into one (docs/server.md, "Multi-rank runs"). The engine observes each step once
// per run, whatever the number of ranks; the ranks' disagreements are kept as divergences.
//
// How fields merge: found_inf and skipped OR; tokens sum; loss the mean over the ranks, NaN when
// any rank's loss is not finite (one rank's non-finite loss is a fact the merged step must not
// hide); loss_scale and scale_after the smallest (the engine's own rule for a step); tensors
// of one name, role and scale summed (histograms, counts), except weight gradients of a
// replicated run (every rank holds the same after the all-reduce): the lowest rank's, the others
// compared. Quantisers: every rank's, side by side (the engine counts each layer once per
// step). First offender: the earliest in execution order (order), then the lowest rank.
//
// Ownership: a run's RankMerger lives in its RunState (run_registry.h) and is used by the ingest
// thread only. merge_ranks() is pure; restore replays stored merges through it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ampscope/policy/policy_engine.h"
#include "ampscope/v1/query.pb.h"
#include "ampscope/v1/telemetry.pb.h"

namespace ampscope::server {

// One rank's report of a step, as the merge needs it.
struct RankStep {
  std::uint32_t rank = 0;
  std::int64_t report_id = 0;
  double loss = 0.0;
  std::uint64_t tokens = 0;
  std::uint64_t policy_seq = 0;
  std::string policy_outcomes;  // "12:applied 13:refused", compared across ranks
  std::optional<v1::FirstOffender> first_offender;
  // The report as the engine reads it: loss_scale, scale_after, found_inf, skipped, tensors.
  policy::StepInput input;
};

RankStep rank_step(const v1::StepReport& report, std::int64_t report_id, policy::StepInput input);

struct MergedStep {
  std::int64_t step = 0;
  bool partial = false;                  // some rank of the run did not report it in time
  std::vector<std::uint32_t> ranks;      // the ranks merged, ascending
  std::vector<std::int64_t> report_ids;  // their reports, same order
  double loss = 0.0;
  std::uint64_t tokens = 0;
  std::optional<std::uint32_t> offender_rank;
  std::optional<v1::FirstOffender> first_offender;
  std::vector<v1::RankDivergence> divergences;  // one per field the ranks disagreed on
  // What the policy engine observes: found_inf and skipped of any rank, the smallest scales.
  policy::StepInput input;
};

// Merges the reports of one step (at least one, any order, one per rank).
MergedStep merge_ranks(std::vector<RankStep> ranks, bool gradients_sharded, bool partial);

struct MergeOptions {
  // A step waits this long for its missing ranks, then is merged as partial.
  std::chrono::milliseconds deadline{3000};
  // Steps waiting per run at most; beyond it the oldest is merged as partial. 0: as many as
  // hold kAutoPendingReports reports of the run's world, at least kMinAutoPendingSteps. A rank
  // that reconnects (a restarted or moved server) replays its spool in a burst while the
  // others come back: a run of two ranks may then have thousands of steps waiting, which must
  // not be merged without the ranks still on their way.
  std::size_t max_pending_steps = 0;
  static constexpr std::size_t kAutoPendingReports = 16384;
  static constexpr std::size_t kMinAutoPendingSteps = 64;
};

class RankMerger {
 public:
  using Clock = std::chrono::steady_clock;
  using ConnectedRanks = std::function<std::set<std::uint32_t>()>;

  explicit RankMerger(MergeOptions options = {}) : options_(options) {}

  // From the run's Hellos. A world of one merges every report at once.
  void set_layout(std::uint32_t world_size, bool gradients_sharded);
  std::uint32_t world_size() const { return world_size_; }
  bool gradients_sharded() const { return sharded_; }

  // A stored report of the run: the steps it completes, and any it pushes out (partial).
  // `connected` (asked when a step starts waiting) names the ranks with a stream open then; a
  // step also stops waiting for a rank whose stream has ended since (flush). A late report of a
  // step already merged without its rank is dropped (*late set when given).
  std::vector<MergedStep> add(RankStep rank, Clock::time_point now, const ConnectedRanks& connected,
                              bool* late = nullptr);
  // Steps past their deadline, or waiting only on ranks whose stream ended (not in
  // `connected`), merged as partial.
  std::vector<MergedStep> flush(Clock::time_point now, const std::set<std::uint32_t>& connected);
  std::optional<Clock::time_point> next_deadline() const;
  bool waiting() const { return !pending_.empty(); }
  // The lowest report id waiting to be merged.
  std::optional<std::int64_t> first_waiting_report() const;
  // A step merged earlier (restore), so that a late report of it is not merged again.
  void remember(std::int64_t step, std::vector<std::uint32_t> ranks);

 private:
  struct Pending {
    Clock::time_point since{};
    std::set<std::uint32_t> connected;  // ranks with a stream open when it started waiting
    std::map<std::uint32_t, RankStep> ranks;
  };
  using PendingMap = std::map<std::int64_t, Pending>;
  MergedStep finish(PendingMap::iterator it, bool partial);
  std::size_t max_pending_steps() const;

  MergeOptions options_;
  std::uint32_t world_size_ = 1;
  bool sharded_ = false;
  PendingMap pending_;
  // Recently merged steps and their ranks (bounded), to tell a late report from a re-run step.
  std::map<std::int64_t, std::vector<std::uint32_t>> merged_;
};

}  // namespace ampscope::server
