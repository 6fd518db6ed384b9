// The Agent: the public facade over the recorder (recorder.h: the training side, one thread at a
// time under its step lock) and the delivery pipeline (delivery.h: the queue, the worker, the
// spool and the transport). It owns both, and what they share: the configuration, the run
// information and the notices (immutable or thread-safe), and the policy applier (updates
// arrive on the transport's reader thread and are applied by the recorder). Every public member
// catches everything at its boundary (agent.h: a guest never throws).
#include "ampscope/agent/agent.h"

#include <unistd.h>

#include <exception>
#include <filesystem>
#include <mutex>
#include <optional>
#include <utility>

#include "delivery.h"
#include "notices.h"
#include "policy.h"
#include "recorder.h"
#include "report_codec.h"
#include "spool.h"

#ifndef AMPSCOPE_VERSION
#define AMPSCOPE_VERSION "dev"
#endif

namespace ampscope::agent {
namespace {

using Clock = std::chrono::steady_clock;

std::string host_name() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

// The boundary: no exception leaves a public member. What escaped becomes a notice (once per
// call name) and the caller gets `failed`, or a kInternal status that says what happened.
void note_failure(Notices& notices, const char* call, const char* what) noexcept {
  try {
    notices.raise(call, std::string("agent: ") + call + " failed: " + what);
  } catch (...) {
  }
}

template <typename Fn>
auto guarded(Notices& notices, const char* call, decltype(std::declval<Fn>()()) failed,
             Fn&& fn) noexcept -> decltype(fn()) {
  try {
    return fn();
  } catch (const std::exception& e) {
    note_failure(notices, call, e.what());
  } catch (...) {
    note_failure(notices, call, "unknown error");
  }
  return failed;
}

template <typename Fn>
Status guarded_status(Notices& notices, const char* call, Fn&& fn) noexcept {
  try {
    return fn();
  } catch (const std::exception& e) {
    note_failure(notices, call, e.what());
    try {
      return {StatusCode::kInternal, e.what()};
    } catch (...) {
    }
  } catch (...) {
    note_failure(notices, call, "unknown error");
  }
  return {StatusCode::kInternal, {}};
}

// The configuration in force on this rank: the launcher's local rank filled in, and no flight
// recorder where full statistics are not sent (its history is full statistics: every rank of a
// large job would send its own with every skipped step).
AgentConfig for_this_rank(const AgentConfig& config) {
  AgentConfig c = config;
  const std::optional<std::uint32_t> local = local_rank_of(config);
  if (local) c.local_rank = static_cast<std::int32_t>(*local);
  if (!sends_full_stats(config, local)) c.flight_recorder_steps = 0;
  return c;
}

}  // namespace

struct Agent::Impl {
  Impl(const AgentConfig& c, const RunInfo& r) : config(c), run(r) {}

  // Destroyed in reverse: the recorder first, then the pipeline (its threads use the policy
  // and the notices), then what they shared.
  const AgentConfig config;
  RunInfo run;  // completed by create(), then immutable
  Notices notices;
  std::unique_ptr<PolicyApplier> policy;
  std::unique_ptr<Delivery> delivery;
  std::unique_ptr<Recorder> recorder;

  std::mutex shutdown_mu;  // one shutdown at a time
  bool shut = false;       // guarded by shutdown_mu
};

Agent::Agent(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Agent::~Agent() {
  if (impl_) shutdown(impl_->config.flush_timeout);
}

Status Agent::create(const AgentConfig& config, const RunInfo& run,
                     std::unique_ptr<Agent>* out) noexcept {
  try {
    out->reset();
    if (std::string err = validate(config); !err.empty()) {
      return {StatusCode::kInvalidArgument, err};
    }
    auto impl = std::make_unique<Impl>(for_this_rank(config), run);
    if (impl->run.host.empty()) impl->run.host = host_name();
    // Chosen by node (the answer depends on the local rank), which is unknown.
    if (config.world_size > 1 && !local_rank_of(config) &&
        sends_full_stats(config, 0) != sends_full_stats(config, 1)) {
      impl->notices.raise("sample_full_ranks=" + full_ranks_text(config.sampling.full_ranks) +
                          ": this rank's local rank is unknown (set local_rank, or launch with "
                          "torchrun, mpirun or srun); it sends full statistics");
    }
    process_start_unix_ns();  // fixes the fallback of the Hello's process start (no /proc)
    namespace fs = std::filesystem;
    const fs::path shared_base = fs::temp_directory_path() / "ampscope-spool";
    const fs::path leaf = fs::path(config.run_id) / ("rank-" + std::to_string(config.rank));
    SpoolOptions so;
    so.dir =
        ((config.spool_dir.empty() ? shared_base : fs::path(config.spool_dir)) / leaf).string();
    so.max_bytes = config.spool_max_bytes;
    // Acknowledged space comes back a segment at a time: keep segments a fraction of the cap.
    so.segment_bytes = std::min(config.spool_segment_bytes,
                                std::max<std::uint64_t>(config.spool_max_bytes / 4, 4096));
    std::string error;
    std::vector<std::string> repaired;
    std::unique_ptr<Spool> spool = Spool::open(so, &error, &repaired);
    if (!spool) {
      // Cannot be written (a file in its place, a read-only or full file system), or another
      // process holds it. First the default location, derived from run and rank only, so the
      // next process with this configuration meets the same failure and replays what this one
      // left there; when that fails too, a directory of this process's own (not replayed).
      const std::string first_error = error;
      const std::string shared = (shared_base / leaf).string();
      const std::string own = shared + "-pid-" + std::to_string(::getpid());
      std::string tail;
      for (const std::string& dir : {shared, own}) {
        if (dir == so.dir) continue;
        so.dir = dir;
        spool = Spool::open(so, &error, &repaired);
        if (spool) break;
        tail += "; " + error;
      }
      if (!spool) return {StatusCode::kUnavailable, first_error + tail};
      impl->notices.raise_loud(
          "spool-fallback",
          first_error + tail + "; spooling to " + so.dir +
              (so.dir == shared ? " instead (a later process of this run and rank replays it "
                                  "from there)"
                                : " for this process only (a later process does not replay it)"));
    }
    for (const auto& n : repaired) impl->notices.raise(n);
    if (const std::uint64_t pending = spool->pending(); pending > 0) {
      impl->notices.raise("spool: replaying " + std::to_string(pending) +
                          " reports a previous process left unacknowledged");
    }
    const std::int64_t resume_skip_through = spool->last_seq() > 0 ? spool->last_step() : -1;
    impl->policy = std::make_unique<PolicyApplier>(impl->config, spool.get(), &impl->notices);
    impl->delivery = std::make_unique<Delivery>(impl->config, impl->run, std::move(spool),
                                                impl->policy.get(), &impl->notices);
    impl->recorder =
        std::make_unique<Recorder>(impl->config, impl->run, &impl->notices, impl->policy.get(),
                                   impl->delivery.get(), resume_skip_through);
    *out = std::unique_ptr<Agent>(new Agent(std::move(impl)));
    return Status::Ok();
  } catch (const std::exception& e) {
    return {StatusCode::kInternal, e.what()};
  } catch (...) {
    return {StatusCode::kInternal, "unknown error"};
  }
}

Status Agent::attach_scaler(ScalerControl* scaler) noexcept {
  return guarded_status(impl_->notices, "attach_scaler",
                        [&] { return impl_->recorder->attach_scaler(scaler); });
}

Status Agent::attach_overrides(PrecisionOverrides* overrides) noexcept {
  return guarded_status(impl_->notices, "attach_overrides",
                        [&] { return impl_->recorder->attach_overrides(overrides); });
}

Status Agent::attach_gemm_precision(PrecisionOverrides* gemms, RecipeControl* recipe) noexcept {
  return guarded_status(impl_->notices, "attach_gemm_precision",
                        [&] { return impl_->recorder->attach_gemm_precision(gemms, recipe); });
}

bool Agent::begin_step(std::int64_t step) noexcept {
  return guarded(impl_->notices, "begin_step", false,
                 [&] { return impl_->recorder->begin_step(step); });
}

Status Agent::observe(const TensorView& tensor) noexcept {
  return guarded_status(impl_->notices, "observe",
                        [&] { return impl_->recorder->observe(tensor); });
}

Status Agent::observe_stats(const TensorView& meta, const TensorStats& stats) noexcept {
  return guarded_status(impl_->notices, "observe_stats",
                        [&] { return impl_->recorder->observe_stats(meta, stats); });
}

Status Agent::observe_quantizer(const QuantizerView& quantizer) noexcept {
  return guarded_status(impl_->notices, "observe_quantizer",
                        [&] { return impl_->recorder->observe_quantizer(quantizer); });
}

std::optional<TargetSpec> Agent::stats_target(const TensorView& meta) noexcept {
  return guarded(impl_->notices, "stats_target", std::optional<TargetSpec>{},
                 [&] { return impl_->recorder->stats_target(meta); });
}

Status Agent::mark_phase(StepPhase phase) noexcept {
  return guarded_status(impl_->notices, "mark_phase",
                        [&] { return impl_->recorder->mark_phase(phase); });
}

int Agent::wanted(TensorRole role, TensorPhase phase) noexcept {
  return guarded(impl_->notices, "wanted", 0, [&] { return impl_->recorder->wanted(role, phase); });
}

Status Agent::end_step(const StepInfo& info) noexcept {
  return guarded_status(impl_->notices, "end_step",
                        [&] { return impl_->recorder->end_step(info); });
}

PolicyVote Agent::policy_vote() noexcept {
  return guarded(impl_->notices, "policy_vote", PolicyVote{},
                 [&] { return impl_->policy->vote(); });
}

Status Agent::policy_agreed(const PolicyVote& agreed) noexcept {
  return guarded_status(impl_->notices, "policy_agreed", [&]() -> Status {
    std::string err = impl_->policy->agreed(agreed);
    if (err.empty()) return Status::Ok();
    const StatusCode code = impl_->policy->mode() == PolicyAgreementMode::kPerStep
                                ? StatusCode::kInvalidArgument
                                : StatusCode::kFailedPrecondition;
    return {code, std::move(err)};
  });
}

Status Agent::flush(std::chrono::milliseconds timeout) noexcept {
  return guarded_status(impl_->notices, "flush",
                        [&] { return impl_->delivery->flush(Clock::now() + timeout); });
}

Status Agent::shutdown(std::chrono::milliseconds timeout) noexcept {
  Impl& m = *impl_;
  return guarded_status(m.notices, "shutdown", [&]() -> Status {
    // From a callback of this thread's step call: waiting for that call would never end.
    if (m.recorder->held_by_this_thread()) return m.recorder->refuse_reentry("shutdown");
    std::lock_guard once(m.shutdown_mu);
    if (m.shut) return Status::Ok();
    m.shut = true;
    const auto deadline = Clock::now() + timeout;
    m.delivery->interrupt_waits();  // a lockstep begin_step gives the step lock back
    m.recorder->close();            // no step call hands anything over after this
    const Status result = m.delivery->stop(deadline);
    m.recorder->release_devices();
    return result;
  });
}

Status Agent::add_notice(const std::string& text) noexcept {
  if (text.empty()) return {StatusCode::kInvalidArgument, "a notice must not be empty"};
  try {
    impl_->notices.raise(text);
    return Status::Ok();
  } catch (const std::exception& e) {
    return {StatusCode::kInternal, e.what()};
  } catch (...) {
    return {StatusCode::kInternal, "unknown error"};
  }
}

Counters Agent::counters() const noexcept {
  const Impl& m = *impl_;
  Counters c;
  c.steps = m.recorder->steps();
  c.policies_applied = m.policy->applied();
  c.policies_refused = m.policy->refused();
  c.refused_calls = m.recorder->refused_calls();
  c.training_thread_s = m.recorder->training_thread_s();
  try {
    m.delivery->fill(&c);  // the spool's counters are behind its lock
  } catch (...) {
  }
  return c;
}

std::vector<std::string> Agent::notices() const noexcept {
  try {
    return impl_->notices.all();
  } catch (...) {
    return {};
  }
}

const AgentConfig& Agent::config() const noexcept { return impl_->config; }

const char* version() noexcept { return AMPSCOPE_VERSION; }

}  // namespace ampscope::agent
