// ampscope::agent — the in-process agent: attach it to a training loop, show it tensors and
// steps, and it measures them, streams the results to ampscope-server and applies the server's
// loss-scaler policy.
//
//   AgentConfig config;                     // or set_option()/apply_environment()
//   config.server = "127.0.0.1:50051";
//   config.run_id = "gpt-small-7";
//   RunInfo run{.trainer = "mytrainer 1.0", .precision = "amp-fp16",
//               .compute_format = Format::kFP16};
//   std::unique_ptr<Agent> agent;
//   if (Status s = Agent::create(config, run, &agent); !s.ok()) { ...s.message... }
//   agent->attach_scaler(&my_scaler_control);        // optional: enables policy updates
//   agent->attach_overrides(&my_fp32_overrides);     // optional: enables FP32 fallback
//   for (step ...) {
//     if (agent->begin_step(step)) {                 // before the step reads its loss scale
//       ... agent->observe(view) for each tensor, in execution order ...
//     }
//     agent->end_step(info);                         // after the optimizer step
//   }
//   agent->shutdown(std::chrono::seconds(10));       // flush: wait for the server's acks
//
// A guest in someone else's process: no member throws, exits or aborts. Failures are returned
// as a Status (create, attach_*) or turn into notices in the reports and counted drops, and a
// failing collector stops collecting instead of failing the run. begin_step/observe/end_step
// never block on the network or the disk: they hand work to a bounded queue and count what
// does not fit.
//
// Threads: begin_step, observe, mark_phase and end_step belong to the training thread (one
// thread, in step order). counters(), notices() and flush() may be called from any thread.
// The agent runs a worker thread (statistics from copies, report encoding, the spool) and a
// sender thread (the gRPC stream), plus one reader thread per open stream.
// Ownership: the Agent owns its threads, its spool files and its CUDA resources; attached
// controls are borrowed and must outlive the Agent (or shutdown()).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ampscope/agent/config.h"
#include "ampscope/agent/interfaces.h"
#include "ampscope/formats.h"

namespace ampscope::agent {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,  // a bad configuration or argument; the message names it
  kUnavailable = 2,      // a resource could not be used (spool, device); the agent degrades
  kDeadlineExceeded = 3, // flush/shutdown ran out of time; what is left stays in the spool
  kFailedPrecondition = 4,  // called in the wrong state (after shutdown, twice)
  kInternal = 5,         // an unexpected failure, caught at the boundary
};

struct Status {
  StatusCode code = StatusCode::kOk;
  std::string message;
  bool ok() const { return code == StatusCode::kOk; }
  static Status Ok() { return {}; }
};

// What the Hello tells the server about the run (besides the config's run_id/rank/world_size).
struct RunInfo {
  std::string host;        // empty: gethostname()
  std::string trainer;     // "ampscope-train 0.1.0"
  std::string precision;   // fp32, fp16, amp-fp16, amp-bf16, ...
  Format compute_format = Format::kFP16;  // the format of the run's matmuls
  ScalerSettings scaler;   // the local scaler as configured; ignored when attach_scaler() is used
};

// Cumulative counters (what the reports carry in AgentCounters, and more).
struct Counters {
  std::uint64_t steps = 0;             // end_step calls
  std::uint64_t reports_spooled = 0;   // reports written to the spool
  std::uint64_t reports_acked = 0;     // highest seq the server acknowledged
  std::uint64_t dropped_reports = 0;   // lost: queue or spool full
  std::uint64_t dropped_tensors = 0;   // samples skipped (budgets, errors)
  std::uint64_t rejected_reports = 0;  // refused by the server's validation
  std::uint64_t spool_bytes = 0;       // in the spool now
  std::uint64_t reconnects = 0;        // streams opened after the first
  std::uint64_t policies_applied = 0;
  std::uint64_t policies_refused = 0;
  double training_thread_s = 0.0;      // time spent inside begin_step/observe/end_step
  bool connected = false;              // a stream is open and has been acknowledged
};

class Agent {
 public:
  // Validates the configuration, opens the spool (replaying what a previous process left
  // unacknowledged) and starts the threads. On failure *out is left empty and the status says
  // why; nothing is left running.
  static Status create(const AgentConfig& config, const RunInfo& run,
                       std::unique_ptr<Agent>* out) noexcept;
  ~Agent();  // shutdown(config.flush_timeout) if not done
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Optional controls for policy application; call before the first begin_step. Passing
  // nullptr detaches. kFailedPrecondition once steps have begun.
  Status attach_scaler(ScalerControl* scaler) noexcept;
  Status attach_overrides(PrecisionOverrides* overrides) noexcept;

  // Training thread, at the start of each step, before the step reads its loss scale: applies
  // policy updates due at `step` and decides what to measure. Returns true when observe()
  // calls are wanted this step.
  bool begin_step(std::int64_t step) noexcept;
  // Training thread, between begin_step and end_step, in execution order.
  void observe(const TensorView& tensor) noexcept;
  // Training thread: an optional phase marker for the NVTX timeline.
  void mark_phase(StepPhase phase) noexcept;
  // Training thread, after the step (the optimizer update or its skip).
  void end_step(const StepInfo& info) noexcept;

  // Waits until everything handed over so far is acknowledged by the server, or the timeout.
  Status flush(std::chrono::milliseconds timeout) noexcept;
  // Stops accepting steps, encodes and spools what is queued, waits up to `timeout` for the
  // server's acknowledgements, then closes the stream and stops the threads. What is not
  // acknowledged stays in the spool for the next process. Idempotent.
  Status shutdown(std::chrono::milliseconds timeout) noexcept;

  Counters counters() const noexcept;
  // Every notice raised so far ("cupti: unavailable: no CUDA device"), oldest first.
  std::vector<std::string> notices() const noexcept;
  const AgentConfig& config() const noexcept;

  struct Impl;

 private:
  explicit Agent(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The agent's version string ("0.1.0").
const char* version() noexcept;

}  // namespace ampscope::agent
