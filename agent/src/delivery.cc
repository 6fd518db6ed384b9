#include "delivery.h"

#include <algorithm>
#include <exception>

#include "ampscope/proto/quantizer_codec.h"
#include "ampscope/proto/wire_time.h"
#include "ampscope/text.h"
#include "gpu_stats.h"
#include "measure.h"
#include "nvtx.h"
#include "policy.h"
#include "report_codec.h"

namespace ampscope::agent {

Delivery::Delivery(const AgentConfig& config, const RunInfo& run, std::unique_ptr<Spool> spool,
                   PolicyApplier* policy, Notices* notices)
    : config_(config),
      run_(run),
      policy_(policy),
      notices_(notices),
      spool_(std::move(spool)),
      transport_(std::make_unique<Transport>(config_, spool_.get(), notices_, transport_hooks())),
      flight_(config_.flight_recorder_steps, config_.flight_recorder_bytes) {
  for (TensorRole role : config_.sampling.full_roles) full_role_[static_cast<int>(role)] = true;
}

Delivery::~Delivery() { stop(std::chrono::steady_clock::now()); }

TransportHooks Delivery::transport_hooks() {
  TransportHooks hooks;
  // The sender thread builds the Hello of every stream. The attached controls are fixed before
  // start() (the recorder refuses attach_* after its first step), and the thread that calls
  // this hook is created after that.
  hooks.hello = [this](std::uint64_t resume_from) {
    v1::Hello h;
    ScalerSettings scaler = run_.scaler;
    if (policy_->scaler() != nullptr) {
      // The trainer's code, on the sender thread: what it throws must not end the process.
      try {
        scaler = policy_->scaler()->settings();
      } catch (...) {
        notices_->raise("hello-scaler",
                        "agent: the scaler's settings() failed; the Hello announces the "
                        "configuration given at start");
      }
    }
    encode_hello(config_, run_, scaler, {policy_->capable_layers(), policy_->capable_gemms()},
                 resume_from, policy_->received_seq(), version(), &h);
    return h;
  };
  hooks.on_policy = [this](const v1::PolicyUpdate& u) { policy_->receive(u); };
  hooks.on_connected = [this](bool c) { policy_->set_connected(c); };
  return hooks;
}

void Delivery::start() {
  if (started_.load(std::memory_order_acquire)) return;
  std::lock_guard lock(lifecycle_mu_);
  if (started_.load(std::memory_order_relaxed) || stopped_) return;
  worker_ = std::thread([this] { run_worker(); });
  // From here on stop() joins the worker, even if the transport cannot start.
  started_.store(true, std::memory_order_release);
  transport_->start();
}

bool Delivery::submit(StepRecord record) {
  bool stopping = false;
  {
    std::lock_guard lock(mu_);
    stopping = stopping_;
    if (!stopping && queue_.size() < config_.queue_steps) {
      queued_copy_bytes_ += record.copy_bytes;
      queue_.push_back(std::move(record));
      cv_.notify_all();
      return true;
    }
  }
  dropped_reports_.fetch_add(1);
  dropped_tensors_.fetch_add(record.samples.size());
  if (stopping) {
    notices_->raise("after-stop", "agent: a step ended after shutdown; its report was dropped");
  } else {
    notices_->raise("queue-full", "agent: the worker fell behind (queue_steps " +
                                      std::to_string(config_.queue_steps) +
                                      " full); reports are dropped and counted");
  }
  return false;
}

std::uint64_t Delivery::copy_bytes_held() const {
  std::lock_guard lock(mu_);
  return queued_copy_bytes_;
}

void Delivery::count_dropped_tensors(std::uint64_t n) { dropped_tensors_.fetch_add(n); }

void Delivery::count_dropped_reports(std::uint64_t n) { dropped_reports_.fetch_add(n); }

Status Delivery::acknowledged_by(std::uint64_t last, Deadline deadline, const char* what) const {
  if (config_.server.empty() || transport_->wait_acked(last, deadline)) return Status::Ok();
  return {StatusCode::kDeadlineExceeded,
          std::to_string(last - std::min(last, spool_->acked())) + " reports not acknowledged" +
              what + "; they stay in the spool at " + spool_->dir()};
}

Status Delivery::flush(Deadline deadline) {
  // Before start() nothing was submitted: a record is submitted only after start() returned.
  if (!started_.load(std::memory_order_acquire)) return Status::Ok();
  {
    std::unique_lock lock(mu_);
    if (!cv_.wait_until(lock, deadline, [&] { return queue_.empty() && !worker_busy_; })) {
      return {StatusCode::kDeadlineExceeded, "the worker is still encoding reports"};
    }
  }
  return acknowledged_by(spool_->last_seq(), deadline, " yet");
}

Delivery::AckWait Delivery::wait_all_acked(Deadline deadline, std::uint64_t* target) {
  *target = spool_->last_seq();
  if (config_.server.empty()) return AckWait::kAcked;
  {
    // A submitted record has its seq once the worker spooled it.
    std::unique_lock lock(mu_);
    const bool idle = cv_.wait_until(lock, deadline, [&] {
      return interrupted_.load() || (queue_.empty() && !worker_busy_);
    });
    if (interrupted_.load()) return AckWait::kInterrupted;
    *target = spool_->last_seq();
    if (!idle) return AckWait::kTimedOut;
  }
  // Acks wake wait_acked at once; the slices only bound how late a loss or an interrupt is seen.
  constexpr std::chrono::milliseconds kSlice{20};
  for (;;) {
    if (spool_->acked() >= *target) return AckWait::kAcked;
    if (interrupted_.load()) return AckWait::kInterrupted;
    if (transport_->lost()) return AckWait::kLost;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return AckWait::kTimedOut;
    transport_->wait_acked(*target, std::min(deadline, now + kSlice));
  }
}

void Delivery::interrupt_waits() {
  {
    std::lock_guard lock(mu_);
    interrupted_.store(true);
  }
  cv_.notify_all();
}

Status Delivery::stop(Deadline deadline) {
  interrupt_waits();
  {
    std::lock_guard lock(lifecycle_mu_);
    if (stopped_) return Status::Ok();
    stopped_ = true;
  }
  // start() cannot run any more; started_ is final.
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (!started_.load(std::memory_order_acquire)) return Status::Ok();
  if (worker_.joinable()) worker_.join();  // drains the queue into the spool
  const Status result = acknowledged_by(spool_->last_seq(), deadline, "");
  transport_->stop(deadline);
  return result;
}

void Delivery::fill(Counters* c) const {
  c->reports_spooled = spooled_.load();
  c->reports_acked = spool_->acked();
  c->dropped_reports = dropped_reports_.load();
  c->dropped_tensors = dropped_tensors_.load();
  c->rejected_reports = transport_->rejected();
  c->spool_bytes = spool_->bytes();
  c->reconnects = transport_->reconnects();
  c->protocol_errors = transport_->protocol_errors();
  c->lockstep_timeouts = lockstep_timeouts_.load();
  c->connected = transport_->connected();
}

v1::AgentCounters Delivery::wire_counters() const {
  v1::AgentCounters c;
  c.set_dropped_reports(dropped_reports_.load());
  c.set_dropped_tensors(dropped_tensors_.load());
  c.set_spool_bytes(spool_->bytes());
  c.set_reconnects(transport_->reconnects());
  c.set_lockstep_timeouts(lockstep_timeouts_.load());
  c.set_protocol_errors(transport_->protocol_errors());
  return c;
}

void Delivery::run_worker() {
  for (;;) {
    StepRecord record;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      record = std::move(queue_.front());
      queue_.pop_front();
      worker_busy_ = true;
    }
    try {
      process(record);
    } catch (const std::exception& e) {
      dropped_reports_.fetch_add(1);
      notices_->raise("worker", std::string("agent: a report was lost: ") + e.what());
    }
    {
      std::lock_guard lock(mu_);
      queued_copy_bytes_ -= std::min(queued_copy_bytes_, record.copy_bytes);
      worker_busy_ = false;
    }
    cv_.notify_all();
  }
}

namespace {

// The recipe_targets counts measured with the step's samples become its quantiser entries,
// after those observe_quantizer recorded; beyond the report's bound they are counted drops, as
// observe_quantizer's are. Each is named "TENSOR [RECIPE]": the server sums a run's quantiser
// samples per name, role and phase, so one tensor counted against two recipes needs two names.
void take_recipe_counts(StepRecord& record) {
  for (TensorSample& s : record.samples) {
    for (RecipeCounts& counts : s.recipe_counts) {
      if (record.quantizers.size() >= proto::kMaxQuantizersPerReport) {
        record.dropped_tensors += 1;
        continue;
      }
      QuantizerSample q;
      q.name = s.name + " [" + to_string(counts.recipe) + "]";
      if (q.name.size() > text::kNameMaxBytes) {
        q.name = text::clean_text(q.name, text::kNameMaxBytes);
      }
      q.role = s.role;
      q.phase = s.phase;
      q.micro_step = s.micro_step;
      q.counts = std::move(counts);
      record.quantizers.push_back(std::move(q));
    }
    std::vector<RecipeCounts>().swap(s.recipe_counts);
  }
}

}  // namespace

void Delivery::process(StepRecord& record) {
  nvtx::Scoped range(nvtx::Range::kAgentEncode, config_.nvtx);
  // Pending samples, in execution order. Device samples arrive with every statistic computed;
  // their level escalates from the first non-finite one on, as host samples do on the
  // recorder's side.
  bool escalated = false;
  const bool escalate = config_.sampling.full_on_nonfinite;
  for (TensorSample& s : record.samples) {
    if (s.measured) continue;
    std::string error;
    if (s.gpu) {
      if (s.gpu->collect(&s.stats, &error)) {
        s.measured = true;
        s.full = true;
        const bool nonfinite = s.stats.nonfinite() > 0;
        escalated = escalated || (escalate && nonfinite);
        if (escalated && (nonfinite || full_role_[static_cast<int>(s.role)])) {
          s.level = Level::kFull;
        }
      }
      s.gpu.reset();
    } else {
      // A full-level (or recorded) sample copied by the recorder in worker mode.
      const MeasureResult r =
          measure_host(s.copy.data(), s, escalate, /*max_threads=*/1, config_.recipe_targets);
      if (!r.ok) error = r.error;
      std::vector<unsigned char>().swap(s.copy);
    }
    if (!s.measured) {
      record.dropped_tensors += 1;
      notices_->raise("sample:" + error, "stats: sample skipped: " + error);
    }
  }
  take_recipe_counts(record);
  dropped_tensors_.fetch_add(record.dropped_tensors);

  if (record.outcomes.size() > kMaxOutcomesPerReport) {
    notices_->raise("outcomes-cut", "policy: step " + std::to_string(record.info.step) + " had " +
                                        std::to_string(record.outcomes.size()) +
                                        " policy outcomes; a report carries the first " +
                                        std::to_string(kMaxOutcomesPerReport) +
                                        " (all are counted in policies_applied/refused)");
  }
  FlightHistory history;
  flight_.on_step(record, &history);
  ReportContext ctx;
  ctx.config = &config_;
  ctx.history = &history;
  ctx.time_unix_ns = proto::unix_now_ns();
  ctx.counters = wire_counters();
  notices_->take_pending(&ctx.notices, Notices::kMaxPerReport);
  v1::StepReport report;
  encode_report(record, ctx, &report);
  std::string bytes;
  if (!report.SerializeToString(&bytes)) {
    dropped_reports_.fetch_add(1);
    notices_->raise("encode", "agent: a report could not be encoded");
    return;
  }
  std::string error;
  if (spool_->append(bytes, record.info.step, &error) == 0) {
    dropped_reports_.fetch_add(1);
    notices_->raise("spool-append", error + "; reports are dropped and counted until it drains");
    notices_->requeue(ctx.notices);
    return;
  }
  spooled_.fetch_add(1);
}

}  // namespace ampscope::agent
