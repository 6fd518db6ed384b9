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
// as a Status or turn into notices in the reports and counted drops, and a failing collector
// stops collecting instead of failing the run. begin_step/observe/end_step never block on the
// network or the disk: they hand work to a bounded queue and count what does not fit. The one
// exception is asked for: with policy_lockstep on, begin_step waits, bounded by
// policy_lockstep_timeout, for the server's acknowledgement of the reports before it (config.h).
//
// Threads. The step calls (begin_step, observe, observe_stats, observe_quantizer, stats_target,
// mark_phase, end_step, wanted) and attach_* may come
// from any thread: the agent serialises them, one at a time, under its own step lock held for
// the whole call. So a training thread and PyTorch's autograd threads (whose hooks call
// observe, even concurrently with each other) need no lock of their own; the calls of a step
// are recorded in the order they take the lock, and tensors shown between end_step and the
// next begin_step are ignored. A call waits at most for the step call in progress (its work on
// the caller's side: counting or, in stats_thread=caller mode, fully measuring a tensor; the
// scaler's callbacks; the CUPTI range of a profiled step, a lockstep begin_step's wait), never
// for the network, the disk or the worker.
// The one misuse is re-entry: a step call from inside another on the same thread (from a
// ScalerControl or PrecisionOverrides callback, which run under the step lock) would deadlock,
// so it is refused with kFailedPrecondition (begin_step returns false), counted in
// Counters::refused_calls and reported once as a notice; shutdown() from such a callback is
// refused the same way. Callbacks must not wait for another thread that is calling into the
// agent (from Python: call through ctypes.CDLL, which releases the GIL).
// counters(), notices(), flush(), shutdown() and config() may be called from any thread at any
// time: before the first step, during steps, concurrently with each other and after shutdown.
// Per-thread resources stay with the thread of begin_step: the step's NVTX ranges are pushed
// and popped there (observe on another thread opens no phase range), and a CUPTI range opened
// by begin_step is closed only by an end_step on the same thread (otherwise CUPTI stops, with a
// notice). The agent runs a worker thread (statistics from copies, report encoding, the spool)
// and a sender thread (the gRPC stream), plus one reader thread per open stream.
// Destroy the Agent only once no other thread can call it.
// Ownership: the Agent owns its threads, its spool files and its CUDA resources; attached
// controls are borrowed and must outlive the Agent (or shutdown()).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ampscope/agent/config.h"
#include "ampscope/agent/interfaces.h"
#include "ampscope/formats.h"
#include "ampscope/recipe.h"
#include "ampscope/tensor_stats.h"

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

// What a quantiser measured of one tensor this step (a GEMM input under an FP8/FP6/FP4 recipe):
// the counts ampscope/recipe.h's fake_quantize or recipe_counts returned for the recipe it
// applied, and, for delayed scaling, the amax history the scale came from. Borrowed for the
// call only.
struct QuantizerView {
  // Any bytes, sent as TensorView::name is (escaped when not clean text within 256 bytes).
  std::string_view name;
  TensorRole role = TensorRole::kActivation;
  TensorPhase phase = TensorPhase::kUnknown;
  int micro_step = 0;
  RecipeCounts counts;
  std::span<const float> amax_history;  // oldest first; the newest 1024 are sent
  // The linear layer whose GEMM the quantiser feeds (one of the attached GEMM overrides'
  // capable_layers(), QuantizerStats.layer), or empty when it feeds none the policy can move.
  std::string_view layer;
  // The GEMM ran in BF16 and `counts` say what the recipe would have done to its input
  // (QuantizerStats.what_if): the evidence for moving the layer back to the recipe.
  bool what_if = false;
  // QuantizerStats.loss_cost: on the layer's output-gradient quantiser, what the recipe's
  // rounding of the layer's forward output costs the loss to first order (nats); finite.
  std::optional<double> loss_cost;
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
  std::uint64_t protocol_errors = 0;   // streams cut because the server broke the protocol
                                       // (an Ack of a report never sent; docs/agent.md)
  std::uint64_t policies_applied = 0;
  std::uint64_t policies_refused = 0;
  std::uint64_t refused_calls = 0;     // step calls refused by the threading contract (re-entry)
  std::uint64_t lockstep_timeouts = 0;  // policy_lockstep waits given up (timeout, stream lost)
  double training_thread_s = 0.0;      // time inside begin_step/observe/end_step, all callers
                                       // (policy_lockstep's waits included)
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
  // Per-layer precision of an FP8/FP4 run: `gemms` is the set of linear layers computed in BF16
  // instead of the run's recipe (Hello.bf16_capable_gemms are its capable_layers(),
  // PolicyUpdate.bf16_gemms its replace()); `recipe` takes a delayed recipe's history length
  // and margin (PolicyUpdate.amax_history_length, amax_margin). Either may be nullptr.
  Status attach_gemm_precision(PrecisionOverrides* gemms, RecipeControl* recipe) noexcept;

  // The step calls (serialised by the agent; see Threads above). Each returns
  // kFailedPrecondition when refused (re-entry, or after shutdown) and otherwise Ok: what
  // goes wrong inside a step becomes counted drops and notices, not a status.
  //
  // At the start of each step, before the step reads its loss scale: applies policy updates
  // due at `step` and decides what to measure. Returns true when observe() calls are wanted
  // this step (false when refused). With policy_lockstep on it first waits (bounded) until the
  // server acknowledged every report handed over before; shutdown() from another thread ends
  // that wait at once.
  bool begin_step(std::int64_t step) noexcept;
  // Between begin_step and end_step, in execution order (TensorView::order says it exactly).
  Status observe(const TensorView& tensor) noexcept;
  // Fused statistics: a tensor whose full statistics the caller computed already, in a pass
  // that reads the data anyway (a fused unscale; the CPU's scale_and_compute_stats, the CUDA
  // multi-tensor unscale). Recorded exactly as observe(meta) would record meta's data: the same
  // level (a counts-level sample keeps the counts; a non-finite value escalates as it does
  // there), the same report. The data is not read or copied; meta.data may be null.
  // Contract: `stats` are compute_stats()'s of the values as stored (meta.dtype), counting the
  // target stats_target(meta) names (other targets are ignored). Stats that lack that target
  // are measured again from meta.data when it is a host pointer, and otherwise reported
  // without target counts (a notice says so once). Checked before anything is recorded:
  // numel equal to the product of meta.shape, counts that add up, a histogram within
  // [kHistogramMinExponent, kHistogramMaxExponent] holding every finite nonzero value, finite
  // extrema and sums; bad stats are kInvalidArgument with a notice, and nothing is recorded.
  // Outside a step, or when nothing would measure meta this step, the stats are accepted and
  // dropped (cheap: no copy).
  Status observe_stats(const TensorView& meta, const TensorStats& stats) noexcept;
  // The target a full measurement of `meta` counts at this point of the step (the run's
  // compute format at the scale the values would be cast with), or nullopt when observe(meta)
  // would not measure it at all (then there is nothing to compute). wanted() tells counts
  // from full statistics; a counts-level tensor gets the target too, since a non-finite value
  // makes it a full one. A step call, serialised like the others. Ask it just before computing
  // the statistics: it depends on the loss-scaled tensors shown before it in the step.
  std::optional<TargetSpec> stats_target(const TensorView& meta) noexcept;
  // A quantiser's measurement for this step, carried in the step's report next to the tensor
  // statistics (StepReport.quantizers). Cheap: the counts come from the pass that quantised the
  // tensor, nothing is measured here. Recorded on every step whose begin_step returned true (at
  // most 4096 a step, the server's bound; more are counted drops); the amax history goes with it
  // on steps where the sampling takes full statistics of the tensor's role and phase, and is
  // left out on the others. The recipe goes as to_string's canonical text. Checked before
  // anything is recorded, with the server's rules: a recipe whose text parse_recipe does not
  // read back (an element format the recipe cannot have), counts above the finite
  // values, non-finite or negative amax, sums or scale, block counts above the blocks, a scale
  // histogram outside [kHistogramMinExponent, kHistogramMaxExponent] or holding more blocks
  // than have a scale, a non-finite or negative amax history entry: kInvalidArgument with a
  // notice, nothing recorded. Outside a step, or on a step begin_step declined, it does
  // nothing, the checks included (Ok).
  Status observe_quantizer(const QuantizerView& quantizer) noexcept;
  // An optional phase marker for the NVTX timeline (on the thread of begin_step).
  Status mark_phase(StepPhase phase) noexcept;
  // After the step (the optimizer update or its skip).
  Status end_step(const StepInfo& info) noexcept;
  // What observe() of a tensor of `role` shown in `phase` would measure at this point of the
  // step: 0 nothing, 1 counts, 2 full statistics (0 outside a step). A step call, serialised
  // like the others; it lets a caller skip preparing tensors nothing would measure (the
  // answer can rise within a step: the first non-finite value escalates the rest of it).
  int wanted(TensorRole role, TensorPhase phase) noexcept;

  // The per-step policy agreement of a multi-rank run (policy_agreement=per_step; see
  // PolicyVote). Once per step, after the step's gradients are checked and before the next
  // begin_step: take this rank's vote, reduce the votes of all ranks (lowest received_seq, any
  // fallback), and hand the result to policy_agreed(); the next begin_step applies the updates
  // up to the agreed seq, falls back when agreed, and does the same on every rank. Any thread;
  // not step calls (they take no step lock). policy_agreed is kFailedPrecondition unless the
  // mode is per_step, kInvalidArgument when the agreed seq exceeds what this rank received.
  PolicyVote policy_vote() noexcept;
  Status policy_agreed(const PolicyVote& agreed) noexcept;

  // Waits until everything handed over so far is acknowledged by the server, or the timeout.
  Status flush(std::chrono::milliseconds timeout) noexcept;
  // Stops accepting steps (waiting for the step call in progress, if any), encodes and spools
  // what is queued, waits up to `timeout` for the server's acknowledgements, then closes the
  // stream and stops the threads. What is not acknowledged stays in the spool for the next
  // process. Idempotent; a concurrent call waits for the first to finish.
  Status shutdown(std::chrono::milliseconds timeout) noexcept;

  // A notice from the host (the trainer or a binding such as the PyTorch package): reported
  // once in the next report, like the agent's own ("torch: hook on h0.mlp failed: ..."); any
  // bytes, sent as UTF-8 text of at most 512 bytes (docs/agent.md, "Names and text": invalid
  // UTF-8 and control characters escaped as \xHH). Any thread, any time. kInvalidArgument when
  // empty.
  Status add_notice(const std::string& text) noexcept;

  Counters counters() const noexcept;
  // Every notice raised so far ("cupti: unavailable: no CUDA device"), oldest first.
  std::vector<std::string> notices() const noexcept;
  // The configuration in force: as given, with the launcher's local rank filled in and the
  // flight recorder off on a rank that does not send full statistics (SamplingConfig).
  const AgentConfig& config() const noexcept;

  struct Impl;

 private:
  explicit Agent(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The agent's version string ("0.1.0").
const char* version() noexcept;

}  // namespace ampscope::agent
