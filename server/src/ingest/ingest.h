// The ingest thread: the single writer of the store. Streams submit validated Hellos, reports
// and rejections; the thread takes everything queued, writes it in one transaction (group
// commit: the batch grows with the load, no timer), commits, and only then acknowledges:
// Ack(persisted_seq) to each stream, metrics, the policy engines' decisions pushed to the run's
// streams. Duplicates by (run, rank, seq) are dropped here, against the last seq per agent,
// which survives restarts in the store. Each stored report is digested once (report_digest.h);
// its digest feeds the tensor totals, the policy engine and the metrics.
//
// What it keeps per run (settled seq per agent, tensor totals) lives in the run's RunState
// (run_registry.h), next to the run's policy engine and series. Deleting a run (an operator's
// DeleteRun, or age retention) goes through here too, in queue order: the run's rows go in a
// transaction of their own, then the registry forgets it and its open streams end (ABORTED),
// their queued items dropped; a later Hello of the run starts it afresh.
//
// Order on each stream: the decisions its reports caused are handed to it with the Ack of those
// reports, before it (StreamSink::on_settled); a stream whose Hello settles gets the policy in
// force the same way; the other streams of the run get each decision as it is decided.
//
// Thread safety: submit() from any thread; everything else runs on the ingest thread or before
// start() / after stop().
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ampscope/v1/telemetry.pb.h"
#include "metrics.h"
#include "policy_host.h"
#include "run_registry.h"
#include "store.h"
#include "streams.h"
#include "validation.h"

namespace ampscope::server {

struct IngestOptions {
  std::size_t max_batch_items = 4096;  // items per transaction at most
  std::chrono::milliseconds retention_interval{60000};
  std::int64_t retention_max_age_ns = 0;             // 0: keep forever
  std::uint64_t retention_max_bytes = 0;             // 0: no size limit
  std::size_t top_k = 20;                            // per-tensor series per run
  std::chrono::milliseconds refresh_interval{1000};  // top-K series, store size gauge
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
  std::unique_ptr<v1::Hello> hello;        // kHello
  std::unique_ptr<v1::StepReport> report;  // kReport
  std::string payload;                     // kReport: the report serialised
  std::vector<std::string> notices;        // kReport: the server's, on parts refused alone
  Violation violation;                     // kReject
  std::string notice;                      // kRefusal
  std::function<void(const DeleteOutcome&)> deleted;  // kDelete: called on the ingest thread
  std::int64_t received_ns = 0;
  std::chrono::steady_clock::time_point received{};
};

class Ingest {
 public:
  Ingest(StoreWriter& store, RunRegistry& runs, Metrics& metrics, PolicyHost& policy,
         StreamTable& streams, IngestOptions options);
  ~Ingest();

  // Before start(): last seq per agent, tensor totals, policy engines from the store.
  void restore();
  void start();
  // False once the ingest thread stopped or failed: the item was not taken.
  bool submit(IngestItem item);
  // Deletes the run from the store and forgets it (see above); `done` is called on the ingest
  // thread. False once the ingest thread stopped or failed.
  bool delete_run(const std::string& run_id, std::function<void(const DeleteOutcome&)> done);
  // Commits everything queued, saves the policy state, and joins the thread.
  void stop();

  // Called once, from the ingest thread, when a commit fails (the server then shuts down).
  void on_failure(std::function<void(const std::string&)> callback);

 private:
  struct Batch;
  void run();
  void process(std::vector<IngestItem>& items);
  void write(std::vector<IngestItem>& items, Batch& batch, std::int64_t now_ns);
  void publish(Batch& batch, std::int64_t now_ns);
  // A step merged over the ranks of `run`: stored, observed by the policy engine, its decisions
  // stored; its metrics left in the batch for after the commit.
  void settle_merged(RunState& run, MergedStep& step, Batch& batch, std::int64_t now_ns);
  void fail(std::vector<IngestItem>& items, Batch& batch, const std::string& message);
  void remove_run(IngestItem& item);
  // Drops the run from the registry and ends its open streams with `why`, dropping what they
  // queued. Returns the streams ended.
  std::size_t forget(const std::string& run_id, const std::string& why);
  std::size_t end_streams(const std::vector<std::shared_ptr<StreamSink>>& ended,
                          const std::string& why);
  void maintenance(bool force);
  void refresh_top_tensors(RunState& run);

  StoreWriter& store_;
  RunRegistry& runs_;
  Metrics& metrics_;
  PolicyHost& policy_;
  StreamTable& streams_;
  IngestOptions options_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<IngestItem> queue_;
  bool stopping_ = false;
  bool stopped_ = false;
  std::function<void(const std::string&)> on_failure_;
  std::thread thread_;

  // Ingest thread only.
  std::chrono::steady_clock::time_point next_retention_{};
  std::chrono::steady_clock::time_point next_refresh_{};
  // When the runs' steps waiting for their ranks are checked next (deadline, ended streams).
  static constexpr std::chrono::milliseconds kMergeCheckInterval{100};
  std::chrono::steady_clock::time_point next_merge_check_{};
};

}  // namespace ampscope::server
