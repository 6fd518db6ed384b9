// Ingest: the writer of the store, in shards. Runs are spread over the shards (threads) by a
// hash of their id (RunRegistry::shard_of), each run on exactly one, so the order of a run's
// items holds; streams submit validated Hellos, reports and rejections to their run's shard.
// A shard takes everything queued, writes it in one transaction (group commit: the batch grows
// with the load, no timer), commits, and only then acknowledges: Ack(persisted_seq) to each
// stream, metrics, the policy engines' decisions pushed to the run's streams. Duplicates by
// (run, rank, seq) are dropped here, against the last seq per agent, which survives restarts in
// the store. Each stored report is digested once (report_digest.h), before the transaction;
// its digest feeds the tensor totals, the policy engine and the metrics.
//
// A transaction that fails (PostgreSQL gone, a disk full) acknowledges nothing: the shard
// forgets its runs and ends their streams UNAVAILABLE, the agents spool and reconnect, and each
// run is restored from the store at its next Hello once the store answers (a broken PostgreSQL
// connection is made anew first). The server keeps serving queries meanwhile.
//
// The shards share one StoreWriter (one connection) and take turns on it (store_mu_): SQLite
// admits one writer at a time, and a second connection would wait for the first in SQLite's
// busy handler (sleep and retry) rather than on a mutex; what a shard does outside its
// transaction (digests before it; Acks, metrics and decisions after it) runs in parallel with
// the others' transactions.
//
// What a shard keeps per run (settled seq per agent, tensor totals) lives in the run's RunState
// (run_registry.h), next to the run's policy engine and series. Deleting a run (an operator's
// DeleteRun, or age retention) goes through the run's shard too, in queue order: the run's
// rows go in a transaction of their own, then the registry forgets it and its open streams end
// (ABORTED), their queued items dropped; a later Hello of the run starts it afresh. Retention
// runs on shard 0 under the store lock; the runs it deleted are forgotten by their own shards
// before those write anything again (pending_forget).
//
// Order on each stream: the decisions its reports caused are handed to it with the Ack of those
// reports, before it (StreamSink::on_settled); a stream whose Hello settles gets the policy in
// force the same way; the other streams of the run get each decision as it is decided.
//
// Thread safety: submit(), delete_run() and budget() from any thread; restore() before start(),
// stop() from one thread; everything else runs on the shards' threads.
#pragma once

#include <google/protobuf/arena.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ampscope/v1/telemetry.pb.h"
#include "ingest_budget.h"
#include "metrics.h"
#include "policy_host.h"
#include "run_ownership.h"
#include "run_registry.h"
#include "store.h"
#include "streams.h"
#include "validation.h"

namespace ampscope::server {

// The number of ingest shards for --ingest-shards `requested`: itself, or for 0 one per hardware
// thread, at most kDefaultIngestShards.
inline constexpr std::size_t kDefaultIngestShards = 8;
inline constexpr std::size_t kMaxIngestShards = 64;
std::size_t resolve_ingest_shards(std::size_t requested);

struct IngestOptions {
  std::size_t max_batch_items = 4096;  // items per transaction at most
  std::chrono::milliseconds retention_interval{60000};
  std::int64_t retention_max_age_ns = 0;             // 0: keep forever
  std::uint64_t retention_max_bytes = 0;             // 0: no size limit
  std::size_t top_k = 20;                            // per-tensor series per run
  std::chrono::milliseconds refresh_interval{1000};  // top-K series, store size gauge
  // Wire bytes of received items not settled yet beyond which streams stop reading
  // (ingest_budget.h).
  std::uint64_t max_queued_bytes = 64u << 20;
  // A test hook: a shard's batch takes this long more per item, outside the store lock (a slow
  // ingest whose shards still overlap).
  std::chrono::microseconds test_item_delay{0};
  // Which runs this server may write, among servers sharing the store (cluster/); null: every
  // run. Where runs move between servers, each commit is fenced by it (only runs still owned
  // are written) and a run is restored from the store at its first Hello here, not at start.
  RunOwnership* ownership = nullptr;
};

// The answer to Ingest::delete_run.
struct DeleteOutcome {
  enum class Result { kDeleted, kNotFound, kFailed };
  Result result = Result::kFailed;
  std::int64_t reports = 0;       // kDeleted: the run's stored reports that went
  std::size_t streams_ended = 0;  // kDeleted: its open streams, now ended
  std::string error;              // kFailed
};

struct IngestItem {
  // kRefusal: a second agent process refused for the rank (a notice of the run, no stream).
  enum class Kind { kHello, kReport, kReject, kDelete, kRefusal };
  Kind kind = Kind::kReport;
  std::shared_ptr<StreamSink> sink;  // null for kDelete and kRefusal
  std::string run_id;
  std::uint32_t rank = 0;
  std::uint64_t seq = 0;
  std::unique_ptr<v1::Hello> hello;  // kHello
  // kReport: the decoded report, in `arena` (freed with the item).
  std::unique_ptr<google::protobuf::Arena> arena;
  v1::StepReport* report = nullptr;
  std::string payload;               // kReport: the report serialised
  std::vector<std::string> notices;  // kReport: the server's, on parts refused alone
  Violation violation;               // kReject
  std::string notice;                // kRefusal
  std::function<void(const DeleteOutcome&)> deleted;  // kDelete: called on the ingest thread
  std::int64_t received_ns = 0;
  std::chrono::steady_clock::time_point received{};
  std::uint64_t bytes = 0;  // the message's wire size, charged to the IngestBudget until settled
};

class Ingest {
 public:
  Ingest(StoreWriter& store, RunRegistry& runs, Metrics& metrics, PolicyHost& policy,
         StreamTable& streams, IngestOptions options);
  ~Ingest();

  // Before start(): last seq per agent, tensor totals, policy engines from the store, for every
  // run (a server alone), or for none where runs move between servers (each is restored at its
  // first Hello instead; any run unknown here is looked up in the store at its Hello).
  void restore();
  // Drops everything this server holds of the run, on the run's shard before its next
  // transaction. `taken`: another server owns the run now, and its streams end; otherwise this
  // server claims it afresh (what it held may be stale): the streams stay, and the run is
  // restored from the store before anything more of it is taken. Any thread.
  void drop_run(const std::string& run_id, bool taken);
  void start();
  // False once the run's shard stopped: the item was not taken.
  bool submit(IngestItem item);
  // Deletes the run from the store and forgets it (see above); `done` is called on the run's
  // shard. False once that shard stopped.
  bool delete_run(const std::string& run_id, std::function<void(const DeleteOutcome&)> done);
  // Commits everything queued, saves the policy state, and joins the shards.
  void stop();

  std::size_t shards() const { return shards_.size(); }

  // The bound on received work not settled yet; streams ask it before each read. Any thread.
  IngestBudget& budget() { return budget_; }

 private:
  struct Batch;
  // One ingest thread, its queue and its timers.
  struct Shard {
    std::size_t index = 0;
    std::mutex mu;
    std::condition_variable cv;
    std::deque<IngestItem> queue;
    bool stopping = false;
    bool stopped = false;
    // Runs of this shard to forget before its next transaction (retention on shard 0 deleted
    // them; drop_run), and what their streams are told as they end; nullopt: the streams stay.
    // Under mu.
    std::vector<std::pair<std::string, std::optional<std::string>>> pending_forget;
    std::thread thread;
    // The shard's thread only.
    std::chrono::steady_clock::time_point next_retention{};
    std::chrono::steady_clock::time_point next_refresh{};
    // When the runs' steps waiting for their ranks are checked next (deadline, ended streams).
    std::chrono::steady_clock::time_point next_merge_check{};
  };
  static constexpr std::chrono::milliseconds kMergeCheckInterval{100};
  Shard& shard_of(const std::string& run_id);
  bool enqueue(Shard& shard, IngestItem item);
  void run(Shard& shard);
  void process(Shard& shard, std::vector<IngestItem>& items);
  // The runs of `state` into the registry: settled seqs, totals, merges, policy engines.
  void restore_runs(RestoredState& state);
  // Under the store lock, before the transaction: the runs of the items that this server does
  // not hold, from the store (a run new to this server, or dropped by drop_run).
  void restore_unknown(const std::vector<IngestItem>& items);
  // Where runs move between servers, inside the transaction: of the runs it may write (the
  // items' runs, this shard's runs with steps waiting for ranks or an engine state not saved),
  // those another server owns now are forgotten, their streams ended; returns them (their
  // items are skipped).
  std::set<std::string> fence(Shard& shard, const std::vector<IngestItem>& items);
  bool runs_move() const {
    return options_.ownership != nullptr && options_.ownership->runs_move();
  }
  void write(Shard& shard, std::vector<IngestItem>& items, Batch& batch, std::int64_t now_ns);
  void publish(Shard& shard, Batch& batch, std::int64_t now_ns);
  // A step merged over the ranks of `run`: stored, observed by the policy engine, its decisions
  // stored; its metrics left in the batch for after the commit.
  void settle_merged(RunState& run, MergedStep& step, Batch& batch, std::int64_t now_ns);
  // A failed transaction: nothing acknowledged, the shard's runs forgotten (restored from the
  // store at their next Hello), their streams ended UNAVAILABLE; the shard goes on.
  void fail(Shard& shard, std::vector<IngestItem>& items, const std::string& message);
  void remove_run(Shard& shard, IngestItem& item);
  // Runs handed over by shard 0's retention or by drop_run: forgotten now. Under the store lock.
  void forget_pending(Shard& shard);
  // Items settled or dropped: their bytes leave the budget (which may resume streams).
  void release(const std::vector<IngestItem>& items);
  // Drops the run from the registry and ends its open streams with `why`, dropping what they
  // queued. Returns the streams ended. On the run's shard.
  std::size_t forget(Shard& shard, const std::string& run_id, const std::string& why);
  std::size_t end_streams(Shard& shard, const std::vector<std::shared_ptr<StreamSink>>& ended,
                          const std::string& why);
  void maintenance(Shard& shard, bool force);
  void retention();
  void refresh_top_tensors(RunState& run);

  StoreWriter& store_;
  RunRegistry& runs_;
  Metrics& metrics_;
  PolicyHost& policy_;
  StreamTable& streams_;
  IngestOptions options_;
  IngestBudget budget_;

  // The one writing connection, taken in turns by the shards (see above).
  std::mutex store_mu_;
  std::vector<std::unique_ptr<Shard>> shards_;
};

}  // namespace ampscope::server
