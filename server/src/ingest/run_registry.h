// Everything the server keeps in memory about a run, in one place: its agents' settled seq, its
// tensor totals, the steps waiting for the rest of their ranks, its policy engine and its cached
// Prometheus series. The registry owns them;
// Ingest, PolicyHost and Metrics keep no per-run map of their own, they are handed a RunState.
// Forgetting a run (deleted by an operator or by retention) therefore drops all of it at once:
// its engine is destroyed and its series leave /metrics (RunSeries' deleter removes them).
//
// /metrics stays bounded however many runs the server knows: only the `max_exported_runs` most
// recently active runs (a Hello or a report: mark_active) are exported. A run that falls out
// of that set loses its series; they come back, from zero, at its next event.
//
// Threads: the ingest thread owns the registry and every RunState. It alone creates, changes
// and forgets runs; ingest, policy and per-run metrics code all run on it. Other threads (the
// Query handlers) only read a run's duplicate count through duplicates(): runs_ is changed by
// the ingest thread under mu_ and read by the others under mu_ (the ingest thread reads it
// without the lock, as its only writer); the count itself is atomic.
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "rank_merge.h"
#include "store.h"

namespace ampscope::server {

// A run's cached series (metrics.cc). Its deleter takes them off /metrics before freeing them.
struct RunSeries;
struct RemoveSeries {
  void operator()(RunSeries* series) const;
};
// A run's policy engine and what it needs (policy_host.h).
struct RunPolicy;

struct RunState {
  RunState(std::string run_id, MergeOptions merge_options);
  ~RunState();
  RunState(const RunState&) = delete;
  RunState& operator=(const RunState&) = delete;

  const std::string id;

  // Ingest: the highest settled seq per rank, and the tensor totals over the run.
  std::map<std::uint32_t, std::uint64_t> last_seq;
  std::map<std::pair<std::string, int>, TensorTotals> totals;  // by (name, role)
  // The top-K series must be recomputed: the totals changed, or the series are new.
  bool top_stale = false;
  // Replays dropped since the server started; read by the Query handlers.
  std::atomic<std::uint64_t> duplicates{0};

  // Ingest: the run's steps waiting for the reports of all its ranks, merged for the policy
  // engine (rank_merge.h).
  RankMerger merge;

  // PolicyHost: null until the run's first Hello (or its restore).
  std::unique_ptr<RunPolicy> policy;

  // Metrics: the run's series, created at its first event while it is exported; null
  // otherwise.
  std::unique_ptr<RunSeries, RemoveSeries> series;
  bool exported = false;  // among the most recently active runs (RunRegistry::mark_active)

 private:
  friend class RunRegistry;
  std::list<RunState*>::iterator exported_at_;  // in RunRegistry::exported_
};

class RunRegistry {
 public:
  // `max_exported_runs` >= 1; `merge_options` for every run's RankMerger.
  explicit RunRegistry(std::size_t max_exported_runs, MergeOptions merge_options = {});
  ~RunRegistry();
  RunRegistry(const RunRegistry&) = delete;
  RunRegistry& operator=(const RunRegistry&) = delete;

  // Ingest thread.
  RunState* find(const std::string& run_id);
  RunState& get(const std::string& run_id);  // creates it when unknown
  // Drops everything the server holds about the run; false when it was not known.
  bool forget(const std::string& run_id);
  template <typename F>
  void for_each(F&& f) {
    for (auto& [id, run] : runs_) f(*run);
  }
  std::size_t size() const { return runs_.size(); }

  // The run did something: it becomes the most recently active exported run; beyond
  // max_exported_runs the least recently active one loses its series.
  void mark_active(RunState& run);
  // The exported runs, most recently active first.
  const std::list<RunState*>& exported() const { return exported_; }

  // Any thread: 0 for an unknown run.
  std::uint64_t duplicates(const std::string& run_id) const;

 private:
  std::size_t max_exported_;
  MergeOptions merge_options_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::unique_ptr<RunState>> runs_;
  std::list<RunState*> exported_;
};

}  // namespace ampscope::server
