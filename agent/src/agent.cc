// The Agent: the training-thread side (sampling, measuring or handing off, NVTX, CUPTI, policy
// application) and the worker that turns a step's record into a spooled StepReport. Every
// public member catches everything at its boundary (agent.h: a guest never throws).
#include "ampscope/agent/agent.h"

#include <unistd.h>

#include <array>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <mutex>
#include <thread>

#include "cupti_collector.h"
#include "gpu_stats.h"
#include "measure.h"
#include "notices.h"
#include "nvtx.h"
#include "policy.h"
#include "report_codec.h"
#include "sampling.h"
#include "spool.h"
#include "transport.h"

#ifndef AMPSCOPE_VERSION
#define AMPSCOPE_VERSION "dev"
#endif

namespace ampscope::agent {
namespace {

using Clock = std::chrono::steady_clock;

std::int64_t unix_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string host_name() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

std::uint64_t numel_of(std::span<const std::int64_t> shape) {
  std::uint64_t n = 1;
  for (auto d : shape) n *= static_cast<std::uint64_t>(std::max<std::int64_t>(0, d));
  return n;
}

// Time spent inside the agent on the training thread.
class ThreadTimer {
 public:
  explicit ThreadTimer(std::atomic<std::int64_t>* total) : total_(total), t0_(Clock::now()) {}
  ~ThreadTimer() {
    total_->fetch_add((Clock::now() - t0_).count(), std::memory_order_relaxed);
  }

 private:
  std::atomic<std::int64_t>* total_;
  Clock::time_point t0_;
};

}  // namespace

struct Agent::Impl {
  Impl(const AgentConfig& c, const RunInfo& r) : config(c), run(r), sampler(c.sampling) {
    for (TensorRole role : c.sampling.full_roles) full_role[static_cast<int>(role)] = true;
  }

  AgentConfig config;
  RunInfo run;
  Notices notices;
  std::unique_ptr<Spool> spool;
  std::unique_ptr<PolicyApplier> policy;
  std::unique_ptr<Transport> transport;
  std::array<bool, kNumTensorRoles> full_role{};

  // Training thread.
  Sampler sampler;
  bool started = false;  // the first begin_step (or flush) happened: threads running
  bool in_step = false;
  bool observing = false;
  StepRecord current;
  double step_scale = 1.0;
  int sampled_this_step = 0;
  bool nonfinite_this_step = false;
  bool saw_device_tensor = false;
  int nvtx_depth = 0;           // ranges pushed: step + phase
  TensorPhase nvtx_phase = TensorPhase::kUnknown;
  bool phase_open = false;
  std::int64_t resume_skip_through = -1;  // steps a previous process already reported
  std::unique_ptr<GpuStats> gpu;
  bool gpu_tried = false;
  std::unique_ptr<CuptiCollector> cupti;
  bool cupti_tried = false;
  bool cupti_open = false;

  // The queue to the worker.
  std::mutex q_mu;
  std::condition_variable q_cv;
  std::deque<StepRecord> queue;
  bool q_stop = false;
  bool worker_busy = false;
  std::uint64_t queued_copy_bytes = 0;  // guarded by q_mu
  std::thread worker;

  // Counters.
  std::atomic<std::uint64_t> steps{0};
  std::atomic<std::uint64_t> spooled{0};
  std::atomic<std::uint64_t> dropped_reports{0};
  std::atomic<std::uint64_t> dropped_tensors{0};
  std::atomic<std::int64_t> training_ns{0};
  std::atomic<bool> shut{false};
  std::mutex shutdown_mu;

  void start_threads();
  void run_worker();
  void process(StepRecord& record);
  void drop_sample(const std::string& why);
  bool copy_for_worker(const void* data, TensorSample& s);
  void nvtx_phase_to(TensorPhase phase);
  void nvtx_close_step();
  void cupti_begin(std::int64_t step);
  void cupti_end();
  v1::AgentCounters wire_counters() const;
};

void Agent::Impl::start_threads() {
  if (started) return;
  started = true;
  TransportHooks hooks;
  hooks.hello = [this](std::uint64_t resume_from) {
    v1::Hello h;
    const ScalerSettings scaler =
        policy->scaler() != nullptr ? policy->scaler()->settings() : run.scaler;
    encode_hello(config, run, scaler, policy->capable_layers(), resume_from, AMPSCOPE_VERSION, &h);
    return h;
  };
  hooks.on_policy = [this](const v1::PolicyUpdate& u) { policy->receive(u); };
  hooks.on_connected = [this](bool c) { policy->set_connected(c); };
  transport = std::make_unique<Transport>(config, spool.get(), &notices, std::move(hooks));
  worker = std::thread([this] { run_worker(); });
  transport->start();
}

void Agent::Impl::drop_sample(const std::string& why) {
  current.dropped_tensors += 1;
  notices.raise("sample:" + why, "stats: sample skipped: " + why);
}

bool Agent::Impl::copy_for_worker(const void* data, TensorSample& s) {
  const std::uint64_t bytes = s.numel * static_cast<std::uint64_t>(storage_bytes(s.dtype));
  std::uint64_t held;
  {
    std::lock_guard lock(q_mu);
    held = queued_copy_bytes;
  }
  if (held + current.copy_bytes + bytes > config.worker_max_bytes) {
    drop_sample("the worker's copies reached worker_max_bytes");
    return false;
  }
  const auto* p = static_cast<const unsigned char*>(data);
  s.copy.assign(p, p + bytes);
  current.copy_bytes += bytes;
  return true;
}

void Agent::Impl::nvtx_phase_to(TensorPhase phase) {
  if (!config.nvtx || !nvtx::kEnabled || phase == nvtx_phase || !in_step) return;
  nvtx::Range r;
  switch (phase) {
    case TensorPhase::kForward:
      r = nvtx::Range::kForward;
      break;
    case TensorPhase::kBackward:
      r = nvtx::Range::kBackward;
      break;
    case TensorPhase::kAfterUnscale:
      r = nvtx::Range::kUnscaleCheck;
      break;
    default:
      return;
  }
  if (phase_open) nvtx::pop();
  nvtx::push(r);
  phase_open = true;
  nvtx_phase = phase;
}

void Agent::Impl::nvtx_close_step() {
  if (!config.nvtx || !nvtx::kEnabled) return;
  if (phase_open) nvtx::pop();
  phase_open = false;
  nvtx_phase = TensorPhase::kUnknown;
  if (nvtx_depth > 0) nvtx::pop();
  nvtx_depth = 0;
}

void Agent::Impl::cupti_begin(std::int64_t step) {
  if (config.sampling.cupti_every <= 0 || step % config.sampling.cupti_every != 0) return;
  if (!cupti_tried) {
    // Only a run whose tensors live on a GPU has anything to profile; until one is seen the
    // collector is not created (and says why once).
    if (!saw_device_tensor) return;
    cupti_tried = true;
    std::string why;
    cupti = CuptiCollector::create(&why);
    if (!cupti) {
      notices.raise("cupti", "cupti: unavailable: " + why);
      return;
    }
  }
  if (!cupti) return;
  std::string error;
  if (cupti->begin(step, &error)) {
    cupti_open = true;
  } else {
    notices.raise("cupti", "cupti: stopped: " + error);
    cupti.reset();
  }
}

void Agent::Impl::cupti_end() {
  if (!cupti_open) return;
  cupti_open = false;
  std::string error;
  if (auto ratio = cupti->end(&error)) {
    current.tensor_core_active_ratio = *ratio;
  } else {
    notices.raise("cupti", "cupti: stopped: " + error);
    cupti.reset();
  }
}

v1::AgentCounters Agent::Impl::wire_counters() const {
  v1::AgentCounters c;
  c.set_dropped_reports(dropped_reports.load());
  c.set_dropped_tensors(dropped_tensors.load());
  c.set_spool_bytes(spool->bytes());
  c.set_reconnects(transport ? transport->reconnects() : 0);
  return c;
}

void Agent::Impl::run_worker() {
  for (;;) {
    StepRecord record;
    {
      std::unique_lock lock(q_mu);
      q_cv.wait(lock, [&] { return q_stop || !queue.empty(); });
      if (queue.empty()) return;  // stopping and drained
      record = std::move(queue.front());
      queue.pop_front();
      worker_busy = true;
    }
    try {
      process(record);
    } catch (const std::exception& e) {
      dropped_reports.fetch_add(1);
      notices.raise("worker", std::string("agent: a report was lost: ") + e.what());
    }
    {
      std::lock_guard lock(q_mu);
      queued_copy_bytes -= std::min(queued_copy_bytes, record.copy_bytes);
      worker_busy = false;
    }
    q_cv.notify_all();
  }
}

void Agent::Impl::process(StepRecord& record) {
  nvtx::Scoped range(nvtx::Range::kAgentEncode, config.nvtx);
  // Pending samples, in execution order. Device samples arrive with every statistic computed;
  // their level escalates from the first non-finite one on, as host samples do on the
  // training thread.
  bool escalated = false;
  const bool escalate = config.sampling.full_on_nonfinite;
  for (TensorSample& s : record.samples) {
    if (s.measured) continue;
    std::string error;
    if (s.gpu) {
      if (s.gpu->collect(&s.stats, &error)) {
        s.measured = true;
        const bool nonfinite = s.stats.nonfinite() > 0;
        escalated = escalated || (escalate && nonfinite);
        if (escalated && (nonfinite || full_role[static_cast<int>(s.role)])) {
          s.level = Level::kFull;
        }
      }
      s.gpu.reset();
    } else {
      // A full-level sample copied by the training thread in worker mode.
      const MeasureResult r = measure_host(s.copy.data(), s, false, /*max_threads=*/1);
      if (!r.ok) error = r.error;
      std::vector<unsigned char>().swap(s.copy);
    }
    if (!s.measured) {
      record.dropped_tensors += 1;
      notices.raise("sample:" + error, "stats: sample skipped: " + error);
    }
  }
  dropped_tensors.fetch_add(record.dropped_tensors);

  ReportContext ctx;
  ctx.config = &config;
  ctx.time_unix_ns = unix_ns();
  ctx.counters = wire_counters();
  notices.take_pending(&ctx.notices, Notices::kMaxPerReport);
  v1::StepReport report;
  encode_report(record, ctx, &report);
  std::string bytes;
  if (!report.SerializeToString(&bytes)) {
    dropped_reports.fetch_add(1);
    notices.raise("encode", "agent: a report could not be encoded");
    return;
  }
  std::string error;
  if (spool->append(bytes, record.info.step, &error) == 0) {
    dropped_reports.fetch_add(1);
    notices.raise("spool-append", error + "; reports are dropped and counted until it drains");
    notices.requeue(ctx.notices);
    return;
  }
  spooled.fetch_add(1);
}

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
    auto impl = std::make_unique<Impl>(config, run);
    if (impl->run.host.empty()) impl->run.host = host_name();
    namespace fs = std::filesystem;
    const fs::path base = config.spool_dir.empty()
                              ? fs::temp_directory_path() / "ampscope-spool"
                              : fs::path(config.spool_dir);
    const fs::path leaf = fs::path(config.run_id) / ("rank-" + std::to_string(config.rank));
    SpoolOptions so;
    so.dir = (base / leaf).string();
    so.max_bytes = config.spool_max_bytes;
    // Acknowledged space comes back a segment at a time: keep segments a fraction of the cap.
    so.segment_bytes = std::min(config.spool_segment_bytes, std::max<std::uint64_t>(config.spool_max_bytes / 4, 4096));
    std::string error;
    std::vector<std::string> repaired;
    impl->spool = Spool::open(so, &error, &repaired);
    if (!impl->spool) {
      // Another process holds it, or it cannot be written: a private directory keeps the run
      // measured, without the replay across restarts.
      const std::string first_error = error;
      so.dir = (fs::temp_directory_path() /
                ("ampscope-spool-" + std::to_string(::getpid())) / leaf).string();
      impl->spool = Spool::open(so, &error, &repaired);
      if (!impl->spool) return {StatusCode::kUnavailable, first_error + "; " + error};
      impl->notices.raise(first_error + "; using " + so.dir + " for this process only");
    }
    for (const auto& n : repaired) impl->notices.raise(n);
    if (const std::uint64_t pending = impl->spool->pending(); pending > 0) {
      impl->notices.raise("spool: replaying " + std::to_string(pending) +
                          " reports a previous process left unacknowledged");
    }
    if (impl->spool->last_seq() > 0) impl->resume_skip_through = impl->spool->last_step();
    impl->policy = std::make_unique<PolicyApplier>(impl->config, impl->spool.get(),
                                                   &impl->notices);
    *out = std::unique_ptr<Agent>(new Agent(std::move(impl)));
    return Status::Ok();
  } catch (const std::exception& e) {
    return {StatusCode::kInternal, e.what()};
  } catch (...) {
    return {StatusCode::kInternal, "unknown error"};
  }
}

namespace {
// Runs an attach before the first step, turning any exception into a status (the public API
// never lets one escape).
template <typename Fn>
Status attach_before_start(bool started, const char* what, Fn&& fn) noexcept {
  if (started) {
    return {StatusCode::kFailedPrecondition,
            std::string("attach the ") + what + " before the first step"};
  }
  try {
    fn();
    return Status::Ok();
  } catch (const std::exception& e) {
    return {StatusCode::kInternal, e.what()};
  } catch (...) {
    return {StatusCode::kInternal, "unknown error"};
  }
}
}  // namespace

Status Agent::attach_scaler(ScalerControl* scaler) noexcept {
  return attach_before_start(impl_->started, "scaler",
                             [&] { impl_->policy->attach_scaler(scaler); });
}

Status Agent::attach_overrides(PrecisionOverrides* overrides) noexcept {
  return attach_before_start(impl_->started, "overrides",
                             [&] { impl_->policy->attach_overrides(overrides); });
}

bool Agent::begin_step(std::int64_t step) noexcept {
  Impl& m = *impl_;
  if (m.shut.load()) return false;
  ThreadTimer timer(&m.training_ns);
  try {
    m.start_threads();
    if (m.in_step) {
      // The previous step never ended: its samples cannot become a report.
      m.dropped_tensors.fetch_add(m.current.samples.size());
      m.notices.raise("begin-twice", "agent: begin_step without end_step; a step was dropped");
      m.nvtx_close_step();
    }
    m.current = StepRecord{};
    m.current.info.step = step;
    m.in_step = true;
    m.step_scale = 1.0;
    m.sampled_this_step = 0;
    m.nonfinite_this_step = false;
    m.policy->begin_step(step, &m.current.outcomes);
    m.observing = m.sampler.begin_step(step);
    if (m.config.nvtx && nvtx::kEnabled) {
      nvtx::push(nvtx::Range::kStep, step);
      m.nvtx_depth = 1;
    }
    m.cupti_begin(step);
    return m.observing;
  } catch (const std::exception& e) {
    m.notices.raise("begin_step", std::string("agent: begin_step failed: ") + e.what());
    m.observing = false;
    return false;
  } catch (...) {
    m.observing = false;
    return false;
  }
}

void Agent::observe(const TensorView& t) noexcept {
  Impl& m = *impl_;
  if (!m.in_step || !m.observing) return;
  ThreadTimer timer(&m.training_ns);
  try {
    m.nvtx_phase_to(t.phase);
    nvtx::Scoped range(nvtx::Range::kAgentObserve, m.config.nvtx);
    // The step's loss scale, from the tensors that carry it (before unscaling).
    if (is_loss_scaled(t.role) && t.phase != TensorPhase::kAfterUnscale && t.scale > m.step_scale) {
      m.step_scale = t.scale;
    }
    if (t.device == Device::kCuda) m.saw_device_tensor = true;
    const Level level = m.sampler.level(t.role, t.phase);
    if (level == Level::kSkip) return;
    if (++m.sampled_this_step > m.config.sampling.max_tensors_per_step) {
      m.current.dropped_tensors += 1;
      return;
    }
    TensorSample s;
    s.name.assign(t.name);
    s.role = t.role;
    s.phase = t.phase;
    s.dtype = t.dtype;
    s.shape.assign(t.shape.begin(), t.shape.end());
    s.numel = numel_of(t.shape);
    s.scale = t.scale > 0.0 && std::isfinite(t.scale) ? t.scale : 1.0;
    s.micro_step = t.micro_step;
    s.order = t.order;
    s.level = level;
    s.target = target_for(m.run.compute_format, t.role, s.scale, m.step_scale);
    s.held = t.held;
    if (!is_stats_storage_format(t.dtype)) {
      m.drop_sample("unsupported dtype " + std::string(format_name(t.dtype)));
      return;
    }
    if (s.numel > 0 && t.data == nullptr) {
      m.drop_sample("tensor '" + s.name + "' has no data");
      return;
    }
    if (t.device == Device::kCuda) {
      if (!m.gpu_tried) {
        m.gpu_tried = true;
        std::string why;
        m.gpu = GpuStats::create(&why);
        if (!m.gpu) m.notices.raise("gpu", "gpu stats: unavailable: " + why);
      }
      if (!m.gpu) {
        m.current.dropped_tensors += 1;
        return;
      }
      std::string error;
      s.gpu = m.gpu->launch(t.data, s.numel, t.dtype, &*s.target, t.stream, &error);
      if (!s.gpu) {
        m.drop_sample(error);
        return;
      }
    } else {
      // Counts on this thread (one cheap read); full statistics here or, in worker mode, from
      // a copy on the worker. A counted tensor that holds a non-finite value is measured in
      // full too, and escalates the rest of the step.
      const bool defer_full = m.config.stats_thread == StatsThread::kWorker;
      if (s.level == Level::kCounts) {
        const MeasureResult r = measure_host(t.data, s, !defer_full && m.config.sampling.full_on_nonfinite, 0);
        if (!r.ok) {
          m.drop_sample(r.error);
          return;
        }
        if (r.nonfinite) {
          m.nonfinite_this_step = true;
          m.sampler.saw_nonfinite();
          if (defer_full && m.config.sampling.full_on_nonfinite) {
            s.level = Level::kFull;
            s.measured = false;
          }
        }
      }
      if (s.level == Level::kFull && !s.measured) {
        if (defer_full) {
          if (!m.copy_for_worker(t.data, s)) return;
        } else {
          const MeasureResult r = measure_host(t.data, s, false, 0);
          if (!r.ok) {
            m.drop_sample(r.error);
            return;
          }
          if (r.nonfinite) {
            m.nonfinite_this_step = true;
            m.sampler.saw_nonfinite();
          }
        }
      }
    }
    m.current.samples.push_back(std::move(s));
  } catch (const std::exception& e) {
    m.current.dropped_tensors += 1;
    m.notices.raise("observe", std::string("agent: observe failed: ") + e.what());
  } catch (...) {
    m.current.dropped_tensors += 1;
  }
}

void Agent::mark_phase(StepPhase phase) noexcept {
  Impl& m = *impl_;
  if (!m.in_step || !m.config.nvtx || !nvtx::kEnabled) return;
  switch (phase) {
    case StepPhase::kForward:
      m.nvtx_phase_to(TensorPhase::kForward);
      break;
    case StepPhase::kBackward:
      m.nvtx_phase_to(TensorPhase::kBackward);
      break;
    case StepPhase::kUnscaleCheck:
      m.nvtx_phase_to(TensorPhase::kAfterUnscale);
      break;
    case StepPhase::kOptimizer:
      if (m.phase_open) nvtx::pop();
      nvtx::push(nvtx::Range::kOptimizer);
      m.phase_open = true;
      m.nvtx_phase = TensorPhase::kUnknown;  // any tensor phase after it opens a new range
      break;
  }
}

void Agent::end_step(const StepInfo& info) noexcept {
  Impl& m = *impl_;
  if (m.shut.load()) return;
  ThreadTimer timer(&m.training_ns);
  try {
    m.start_threads();
    if (!m.in_step) {
      // A trainer that never calls begin_step still gets its steps reported.
      m.current = StepRecord{};
    }
    m.cupti_end();
    m.nvtx_close_step();
    m.in_step = false;
    m.observing = false;
    m.steps.fetch_add(1);
    m.sampler.end_step(m.nonfinite_this_step || info.found_inf,
                       info.scale_after != info.loss_scale);
    if (m.config.sampling.cupti_every > 0 && !m.saw_device_tensor && !m.cupti_tried) {
      m.cupti_tried = true;
      m.notices.raise("cupti", std::string("cupti: unavailable: ") +
                                   (cuda_device_present() ? "the run's tensors are on the CPU"
                                                          : "no CUDA device"));
    }
    if (info.step <= m.resume_skip_through) {
      // Re-run after a restart from a checkpoint: the previous process reported this step.
      m.notices.raise("resume", "resume: steps up to " + std::to_string(m.resume_skip_through) +
                                    " were reported by a previous process; their re-runs are "
                                    "not reported again");
      m.current = StepRecord{};
      return;
    }
    m.current.info = info;
    StepRecord record = std::move(m.current);
    m.current = StepRecord{};
    {
      std::lock_guard lock(m.q_mu);
      if (m.queue.size() >= m.config.queue_steps) {
        m.dropped_reports.fetch_add(1);
        m.dropped_tensors.fetch_add(record.samples.size());
        m.notices.raise("queue-full", "agent: the worker fell behind (queue_steps " +
                                          std::to_string(m.config.queue_steps) +
                                          " full); reports are dropped and counted");
        return;
      }
      m.queued_copy_bytes += record.copy_bytes;
      m.queue.push_back(std::move(record));
    }
    m.q_cv.notify_all();
  } catch (const std::exception& e) {
    m.dropped_reports.fetch_add(1);
    m.notices.raise("end_step", std::string("agent: end_step failed: ") + e.what());
  } catch (...) {
    m.dropped_reports.fetch_add(1);
  }
}

Status Agent::flush(std::chrono::milliseconds timeout) noexcept {
  Impl& m = *impl_;
  try {
    const auto deadline = Clock::now() + timeout;
    if (!m.started) return Status::Ok();
    {
      std::unique_lock lock(m.q_mu);
      if (!m.q_cv.wait_until(lock, deadline, [&] { return m.queue.empty() && !m.worker_busy; })) {
        return {StatusCode::kDeadlineExceeded, "the worker is still encoding reports"};
      }
    }
    if (m.config.server.empty()) return Status::Ok();
    const std::uint64_t last = m.spool->last_seq();
    if (!m.transport->wait_acked(last, deadline)) {
      return {StatusCode::kDeadlineExceeded,
              std::to_string(last - std::min(last, m.spool->acked())) +
                  " reports not acknowledged yet; they stay in the spool at " + m.spool->dir()};
    }
    return Status::Ok();
  } catch (const std::exception& e) {
    return {StatusCode::kInternal, e.what()};
  } catch (...) {
    return {StatusCode::kInternal, "unknown error"};
  }
}

Status Agent::shutdown(std::chrono::milliseconds timeout) noexcept {
  Impl& m = *impl_;
  std::lock_guard once(m.shutdown_mu);
  if (m.shut.exchange(true)) return Status::Ok();
  Status result;
  try {
    const auto deadline = Clock::now() + timeout;
    if (m.started) {
      {
        std::lock_guard lock(m.q_mu);
        m.q_stop = true;
      }
      m.q_cv.notify_all();
      if (m.worker.joinable()) m.worker.join();  // drains the queue into the spool
      if (!m.config.server.empty()) {
        const std::uint64_t last = m.spool->last_seq();
        if (!m.transport->wait_acked(last, deadline)) {
          result = {StatusCode::kDeadlineExceeded,
                    std::to_string(last - std::min(last, m.spool->acked())) +
                        " reports not acknowledged; they stay in the spool at " +
                        m.spool->dir()};
        }
      }
      m.transport->stop();
    }
    m.cupti.reset();
    m.gpu.reset();
  } catch (const std::exception& e) {
    result = {StatusCode::kInternal, e.what()};
  } catch (...) {
    result = {StatusCode::kInternal, "unknown error"};
  }
  return result;
}

Counters Agent::counters() const noexcept {
  const Impl& m = *impl_;
  Counters c;
  c.steps = m.steps.load();
  c.reports_spooled = m.spooled.load();
  c.reports_acked = m.spool->acked();
  c.dropped_reports = m.dropped_reports.load();
  c.dropped_tensors = m.dropped_tensors.load();
  c.rejected_reports = m.transport ? m.transport->rejected() : 0;
  c.spool_bytes = m.spool->bytes();
  c.reconnects = m.transport ? m.transport->reconnects() : 0;
  c.policies_applied = m.policy->applied();
  c.policies_refused = m.policy->refused();
  c.training_thread_s = static_cast<double>(m.training_ns.load()) * 1e-9;
  c.connected = m.transport && m.transport->connected();
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
