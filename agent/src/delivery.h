// The delivery pipeline: what becomes of a step's record once end_step hands it over. A bounded
// queue feeds one worker thread, which finishes the measurements the recorder left pending (GPU
// results, host copies in worker mode), encodes the StepReport and appends it to the spool; the
// transport streams the spool to the server and trims it as the acknowledgements come back.
// The pipeline keeps the delivery counters: nothing is lost without being counted
// (docs/agent.md, "Delivery guarantees").
//
// Owner: the Agent, which creates it before the first step and stops it at shutdown. Threads:
// - the worker thread owns the record it has taken off the queue;
// - the queue, the worker's busy flag, the bytes held by copies and the stop request are behind
//   mu_;
// - start() and stop() decide the lifecycle under lifecycle_mu_, which is never held while
//   waiting (stop() waits for the worker and the acknowledgements after releasing it);
// - the spool and the transport exist from construction to destruction (the transport's
//   threads run between start() and stop()), are thread-safe, and the pointers never change;
// - the counters are atomics.
// So every public member may be called from any thread, concurrently, at any time: before
// start(), while it runs, during and after stop().
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "ampscope/agent/agent.h"
#include "ampscope/v1/telemetry.pb.h"
#include "flight_recorder.h"
#include "notices.h"
#include "record.h"
#include "spool.h"
#include "transport.h"

namespace ampscope::agent {

class PolicyApplier;

class Delivery {
 public:
  using Deadline = std::chrono::steady_clock::time_point;

  // `config`, `run`, `policy` and `notices` are borrowed and must outlive the pipeline; the
  // policy receives the server's updates and says what the Hello announces.
  Delivery(const AgentConfig& config, const RunInfo& run, std::unique_ptr<Spool> spool,
           PolicyApplier* policy, Notices* notices);
  ~Delivery();  // stop() at once if not done
  Delivery(const Delivery&) = delete;
  Delivery& operator=(const Delivery&) = delete;

  // Starts the worker and the transport. Idempotent; does nothing once stop() began.
  void start();

  // Hands a finished step over. False when it was dropped (the queue is full, or the pipeline
  // is stopping): counted in dropped_reports and dropped_tensors, and noticed once.
  bool submit(StepRecord record);
  // Bytes of host copies queued or being measured (the budget worker_max_bytes caps).
  std::uint64_t copy_bytes_held() const;
  // What the caller lost before submitting: samples of a step that never ended, reports of a
  // step that failed.
  void count_dropped_tensors(std::uint64_t n);
  void count_dropped_reports(std::uint64_t n);
  // A policy_lockstep wait given up (lockstep.h); carried in every report's AgentCounters.
  void count_lockstep_timeout() { lockstep_timeouts_.fetch_add(1); }

  // Waits until everything submitted is spooled and, with a server, acknowledged.
  Status flush(Deadline deadline);

  // For policy_lockstep (lockstep.h): how a wait for the acknowledgement of everything
  // submitted so far ended.
  enum class AckWait { kAcked, kTimedOut, kLost, kInterrupted };
  // Waits until the worker has spooled every submitted record and the server acknowledged the
  // spool up to its last seq (*target: that seq). Ends early when the stream that was open is
  // lost (kLost) or at interrupt_waits(). Without a server: kAcked at once.
  AckWait wait_all_acked(Deadline deadline, std::uint64_t* target);
  // Ends every wait_all_acked, the one in progress and all later ones (shutdown: the step call
  // that waits must give the step lock back).
  void interrupt_waits();
  std::uint64_t acked() const { return spool_->acked(); }
  bool connected() const { return transport_->connected(); }
  // Stops accepting records, spools what is queued, waits for the acknowledgements until the
  // deadline and stops the transport. What is not acknowledged stays in the spool. The first
  // call does the work; a later or concurrent one returns Ok at once.
  Status stop(Deadline deadline);

  // Fills the delivery fields of `c`: reports spooled, acknowledged, dropped and rejected,
  // dropped tensors, spool bytes, reconnects, protocol errors, lockstep timeouts, connected.
  void fill(Counters* c) const;

 private:
  void run_worker();
  void process(StepRecord& record);
  v1::AgentCounters wire_counters() const;
  TransportHooks transport_hooks();
  Status acknowledged_by(std::uint64_t last, Deadline deadline, const char* what) const;

  const AgentConfig& config_;
  const RunInfo& run_;
  PolicyApplier* policy_;
  Notices* notices_;
  const std::unique_ptr<Spool> spool_;
  const std::unique_ptr<Transport> transport_;
  std::array<bool, kNumTensorRoles> full_role_{};
  FlightRecorder flight_;  // the worker thread's

  std::mutex lifecycle_mu_;
  std::atomic<bool> started_{false};  // written under lifecycle_mu_
  bool stopped_ = false;              // guarded by lifecycle_mu_
  std::thread worker_;                // started and joined under the lifecycle's decisions

  mutable std::mutex mu_;
  std::condition_variable cv_;         // the queue changed, the worker finished a record
  std::deque<StepRecord> queue_;       // guarded by mu_
  bool stopping_ = false;              // guarded by mu_: the worker drains the queue and exits
  bool worker_busy_ = false;           // guarded by mu_
  std::uint64_t queued_copy_bytes_ = 0;  // guarded by mu_

  std::atomic<bool> interrupted_{false};  // set under mu_ (cv_ waits on it)

  std::atomic<std::uint64_t> spooled_{0};
  std::atomic<std::uint64_t> dropped_reports_{0};
  std::atomic<std::uint64_t> dropped_tensors_{0};
  std::atomic<std::uint64_t> lockstep_timeouts_{0};
};

}  // namespace ampscope::agent
