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
// Threads: every run belongs to one ingest shard (shard_of: a hash of its id), and that shard's
// thread alone creates, changes and forgets it; ingest, policy and per-run metrics code for the
// run all run on it. The map of runs is shared by the shards and guarded by mu_ (find, get,
// forget and the iterations take it; a RunState itself is never touched under it). The exported
// set is shared too: making one shard's run active may take another shard's run off /metrics,
// so the exported list and every run's `series` and `exported` are guarded by the series lock
// (lock_series()), which a shard holds while it calls Metrics' per-run methods. Other threads
// (the Query handlers) only read a run's duplicate count through duplicates(), under mu_; the
// count itself is atomic.
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

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
  RunState(std::string run_id, MergeOptions merge_options, std::size_t shard = 0);
  ~RunState();
  RunState(const RunState&) = delete;
  RunState& operator=(const RunState&) = delete;

  const std::string id;
  const std::size_t shard;  // the ingest shard that owns it (RunRegistry::shard_of)

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
  // otherwise. Both under RunRegistry::lock_series().
  std::unique_ptr<RunSeries, RemoveSeries> series;
  bool exported = false;  // among the most recently active runs (RunRegistry::mark_active)

 private:
  friend class RunRegistry;
  std::list<RunState*>::iterator exported_at_;  // in RunRegistry::exported_
};

class RunRegistry {
 public:
  // `max_exported_runs` >= 1; `merge_options` for every run's RankMerger; `shards` >= 1 ingest
  // shards share the runs.
  explicit RunRegistry(std::size_t max_exported_runs, MergeOptions merge_options = {},
                       std::size_t shards = 1);
  ~RunRegistry();
  RunRegistry(const RunRegistry&) = delete;
  RunRegistry& operator=(const RunRegistry&) = delete;

  std::size_t shards() const { return shards_; }
  // The shard that owns the run: the same for every server and every start.
  std::size_t shard_of(std::string_view run_id) const;

  // The owning shard's thread (and any thread before the shards start or after they stop).
  RunState* find(const std::string& run_id);
  RunState& get(const std::string& run_id);  // creates it when unknown
  // Drops everything the server holds about the run; false when it was not known.
  bool forget(const std::string& run_id);
  // Every run of `shard` (kAllShards: every run, when no shard runs, or with one shard).
  static constexpr std::size_t kAllShards = static_cast<std::size_t>(-1);
  template <typename F>
  void for_each(F&& f, std::size_t shard = kAllShards) {
    for (RunState* run : runs_of(shard)) f(*run);
  }
  std::size_t size() const;

  // The run did something: it becomes the most recently active exported run; beyond
  // max_exported_runs the least recently active one (of any shard) loses its series. Takes
  // the series lock.
  void mark_active(RunState& run);
  // Held while a run's `series` or `exported` is read or changed (Metrics' per-run methods).
  std::unique_lock<std::mutex> lock_series() { return std::unique_lock(series_mu_); }
  // The exported runs, most recently active first; the caller holds lock_series().
  const std::list<RunState*>& exported() const { return exported_; }

  // Any thread: 0 for an unknown run.
  std::uint64_t duplicates(const std::string& run_id) const;

 private:
  std::vector<RunState*> runs_of(std::size_t shard) const;

  std::size_t max_exported_;
  MergeOptions merge_options_;
  std::size_t shards_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::unique_ptr<RunState>> runs_;
  std::mutex series_mu_;
  std::list<RunState*> exported_;
};

}  // namespace ampscope::server
