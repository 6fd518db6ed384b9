#include "recorder.h"

#include <algorithm>
#include <cmath>
#include <span>
#include <string>

#include "ampscope/proto/quantizer_codec.h"
#include "ampscope/text.h"
#include "delivery.h"
#include "measure.h"
#include "nvtx.h"
#include "policy.h"

namespace ampscope::agent {
namespace {

using Clock = std::chrono::steady_clock;

std::uint64_t numel_of(std::span<const std::int64_t> shape) {
  std::uint64_t n = 1;
  for (auto d : shape) n *= static_cast<std::uint64_t>(std::max<std::int64_t>(0, d));
  return n;
}

// The loss scale a tensor's values carry (1 when it says none that is usable).
double sample_scale(const TensorView& t) {
  return t.scale > 0.0 && std::isfinite(t.scale) ? t.scale : 1.0;
}

// The step's loss scale after `t`: the tensors that carry it (before unscaling) raise it.
double scale_with(const TensorView& t, double step_scale) {
  if (is_loss_scaled(t.role) && t.phase != TensorPhase::kAfterUnscale && t.scale > step_scale) {
    return t.scale;
  }
  return step_scale;
}

// Why statistics handed to observe_stats() cannot be the statistics of `t`, or empty.
std::string check_provided_stats(const TensorView& t, const TensorStats& s) {
  const std::uint64_t numel = numel_of(t.shape);
  if (s.numel != numel) {
    return "numel " + std::to_string(s.numel) + " but the shape holds " + std::to_string(numel);
  }
  const std::uint64_t counted[] = {s.zeros, s.nan, s.pos_inf, s.neg_inf};
  std::uint64_t sum = 0;
  for (std::uint64_t c : counted) {
    if (c > numel - sum) return "zero and non-finite counts add up to more than numel";
    sum += c;
  }
  const std::uint64_t finite_nonzero = numel - sum;
  const BinadeHistogram& h = s.histogram;
  if (!h.empty() &&
      (h.min_exponent < kHistogramMinExponent || h.max_exponent() > kHistogramMaxExponent)) {
    return "histogram bins outside [" + std::to_string(kHistogramMinExponent) + ", " +
           std::to_string(kHistogramMaxExponent) + "]";
  }
  std::uint64_t binned = 0;
  bool too_many = false;
  for (std::uint64_t c : h.counts) {
    too_many = too_many || c > finite_nonzero - binned;
    if (!too_many) binned += c;
  }
  if (too_many || binned != finite_nonzero) {
    return "the histogram does not hold the " + std::to_string(finite_nonzero) +
           " finite nonzero values";
  }
  const bool values = finite_nonzero > 0;
  const auto magnitude = [](double x) { return std::isfinite(x) && x >= 0.0; };
  if (!magnitude(s.max_abs) || !magnitude(s.min_abs_nonzero) || !std::isfinite(s.sum) ||
      !magnitude(s.sum_sq) ||
      (values && (s.min_abs_nonzero == 0.0 || s.min_abs_nonzero > s.max_abs)) ||
      (!values && (s.max_abs != 0.0 || s.min_abs_nonzero != 0.0))) {
    return "extrema or sums that no finite values have";
  }
  // The histogram's end bins are those of the extrema (floor(log2) is exact for FP32 values).
  if (values && (h.counts.front() == 0 || h.counts.back() == 0 ||
                 std::ilogb(s.min_abs_nonzero) != h.min_exponent ||
                 std::ilogb(s.max_abs) != h.max_exponent())) {
    return "a histogram from " + std::to_string(h.min_exponent) + " to " +
           std::to_string(h.max_exponent()) + " that does not match min_abs_nonzero and max_abs";
  }
  for (const TargetCounts& c : s.targets) {
    if (c.overflow > finite_nonzero || c.underflow > finite_nonzero - c.overflow ||
        c.subnormal > finite_nonzero - c.overflow - c.underflow) {
      return "target " + to_string(c.target) + " counts more values than are finite and nonzero";
    }
  }
  return {};
}

// Why a quantiser's measurement would not pass the server's rules (telemetry.proto,
// QuantizerStats), or empty.
std::string check_quantizer(const QuantizerView& q) {
  const RecipeCounts& c = q.counts;
  std::string error;
  // What goes on the wire is the canonical text, which the server reads back with parse_recipe
  // (a delayed recipe's margin is not part of it: its scale already holds it).
  const std::string text = to_string(c.recipe);
  const std::optional<Recipe> back = parse_recipe(text, &error);
  if (!back || to_string(*back) != text || back->element != c.recipe.element ||
      text.size() > proto::kRecipeMaxBytes) {
    return "recipe '" + text + "' does not read back as itself" +
           (error.empty() ? "" : ": " + error);
  }
  const std::uint64_t counted[] = {c.underflow, c.subnormal, c.saturated, c.overflow};
  std::uint64_t sum = 0;
  for (std::uint64_t n : counted) {
    if (n > c.values - sum) return "underflow, subnormal, saturated and overflow exceed values";
    sum += n;
  }
  const auto magnitude = [](double x) { return std::isfinite(x) && x >= 0.0; };
  if (!magnitude(c.amax) || !magnitude(c.signal_sq) || !magnitude(c.error_sq) ||
      !magnitude(c.tensor_scale)) {
    return "amax, signal_sq, error_sq or tensor_scale not finite and >= 0";
  }
  if (c.zero_blocks > c.blocks || c.nan_blocks > c.blocks - c.zero_blocks ||
      c.saturated_blocks > c.blocks) {
    return "block counts above the " + std::to_string(c.blocks) + " blocks";
  }
  const BinadeHistogram& h = c.scale_histogram;
  if (!h.empty() &&
      (h.min_exponent < kHistogramMinExponent || h.max_exponent() > kHistogramMaxExponent)) {
    return "scale histogram bins outside [" + std::to_string(kHistogramMinExponent) + ", " +
           std::to_string(kHistogramMaxExponent) + "]";
  }
  const std::uint64_t scaled = c.blocks - c.zero_blocks - c.nan_blocks;
  std::uint64_t binned = 0;
  for (std::uint64_t n : h.counts) {
    if (n > scaled - binned) return "the scale histogram holds more than the scaled blocks";
    binned += n;
  }
  if (q.loss_cost && !std::isfinite(*q.loss_cost)) return "loss_cost not finite";
  for (float a : q.amax_history) {
    if (!magnitude(a)) return "an amax history entry not finite and >= 0";
  }
  return {};
}

}  // namespace

// One step call: holds step_mu_ for the call (unless the calling thread holds it already, which
// is a re-entry the caller must refuse) and adds the call's time to training_thread_s.
class Recorder::Call {
 public:
  Call(Recorder& r, bool timed) : r_(r), timed_(timed) {
    if (timed_) t0_ = Clock::now();
    if (r.held_by_this_thread()) return;
    lock_ = std::unique_lock(r.step_mu_);
    r.holder_.store(std::this_thread::get_id(), std::memory_order_relaxed);
  }
  ~Call() {
    if (lock_.owns_lock()) r_.holder_.store(std::thread::id{}, std::memory_order_relaxed);
    if (timed_) {
      r_.training_ns_.fetch_add((Clock::now() - t0_).count(), std::memory_order_relaxed);
    }
  }
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

  bool reentered() const { return !lock_.owns_lock(); }

 private:
  Recorder& r_;
  bool timed_;
  Clock::time_point t0_{};
  std::unique_lock<std::mutex> lock_;
};

Recorder::Recorder(const AgentConfig& config, const RunInfo& run, Notices* notices,
                   PolicyApplier* policy, Delivery* delivery, std::int64_t resume_skip_through)
    : config_(config),
      run_(run),
      notices_(notices),
      policy_(policy),
      delivery_(delivery),
      resume_skip_through_(resume_skip_through),
      lockstep_(config, delivery, notices),
      sampler_(config.sampling,
               config.flight_recorder_steps > 0 ? config.flight_recorder_roles
                                                : std::vector<TensorRole>{},
               sends_full_stats(config, local_rank_of(config))) {}

Recorder::~Recorder() = default;

Status Recorder::refuse_reentry(const char* call) {
  refused_calls_.fetch_add(1, std::memory_order_relaxed);
  std::string why = std::string(call) +
                    " was called from inside another agent call on the same thread (a scaler or "
                    "overrides callback); refused";
  notices_->raise("reentry", "agent: " + why);
  return {StatusCode::kFailedPrecondition, std::move(why)};
}

Status Recorder::attach_before_start(const char* what) const {
  if (!started_) return Status::Ok();
  return {StatusCode::kFailedPrecondition,
          std::string("attach the ") + what + " before the first step"};
}

Status Recorder::attach_scaler(ScalerControl* scaler) {
  Call call(*this, false);
  if (call.reentered()) return refuse_reentry("attach_scaler");
  Status s = attach_before_start("scaler");
  if (s.ok()) policy_->attach_scaler(scaler);
  return s;
}

Status Recorder::attach_overrides(PrecisionOverrides* overrides) {
  Call call(*this, false);
  if (call.reentered()) return refuse_reentry("attach_overrides");
  Status s = attach_before_start("overrides");
  if (s.ok()) policy_->attach_overrides(overrides);
  return s;
}

Status Recorder::attach_gemm_precision(PrecisionOverrides* gemms, RecipeControl* recipe) {
  Call call(*this, false);
  if (call.reentered()) return refuse_reentry("attach_gemm_precision");
  Status s = attach_before_start("GEMM precision");
  if (s.ok()) policy_->attach_gemm_precision(gemms, recipe);
  return s;
}

bool Recorder::begin_step(std::int64_t step) {
  Call call(*this, true);
  if (call.reentered()) {
    refuse_reentry("begin_step");
    return false;
  }
  if (closed_) return false;
  try {
    started_ = true;
    delivery_->start();
    if (in_step_) {
      // The previous step never ended: its samples cannot become a report.
      delivery_->count_dropped_tensors(current_.samples.size());
      notices_->raise("begin-twice", "agent: begin_step without end_step; a step was dropped");
    }
    nvtx_close_step();
    current_ = StepRecord{};
    current_.info.step = step;
    in_step_ = true;
    step_scale_ = 1.0;
    sampled_this_step_ = 0;
    nonfinite_this_step_ = false;
    lockstep_.before_step(step);
    policy_->begin_step(step, &current_.outcomes);
    current_.policy_seq = policy_->step_seq();
    observing_ = sampler_.begin_step(step);
    if (config_.nvtx && nvtx::kEnabled) {
      nvtx::push(nvtx::Range::kStep, step);
      nvtx_thread_ = std::this_thread::get_id();
      nvtx_depth_ = 1;
      phase_open_ = false;
      nvtx_phase_ = TensorPhase::kUnknown;
    }
    cupti_begin(step);
    return observing_;
  } catch (...) {
    observing_ = false;
    throw;
  }
}

Status Recorder::observe(const TensorView& t) {
  Call call(*this, true);
  if (call.reentered()) return refuse_reentry("observe");
  if (closed_) return {StatusCode::kFailedPrecondition, "observe after shutdown"};
  if (!in_step_ || !observing_) return Status::Ok();
  try {
    TensorSample s;
    if (!start_sample(t, s)) return Status::Ok();
    if (s.numel > 0 && t.data == nullptr) {
      drop_sample("tensor '" + s.name + "' has no data");
      return Status::Ok();
    }
    if (measure_into(t, s)) current_.samples.push_back(std::move(s));
    return Status::Ok();
  } catch (...) {
    current_.dropped_tensors += 1;
    throw;
  }
}

Status Recorder::observe_stats(const TensorView& t, const TensorStats& stats) {
  Call call(*this, true);
  if (call.reentered()) return refuse_reentry("observe_stats");
  if (closed_) return {StatusCode::kFailedPrecondition, "observe_stats after shutdown"};
  if (std::string why = check_provided_stats(t, stats); !why.empty()) {
    why = "observe_stats: tensor '" + std::string(t.name) + "': " + why;
    notices_->raise("observe_stats-invalid", "agent: " + why + "; not recorded");
    if (in_step_ && observing_) current_.dropped_tensors += 1;
    return {StatusCode::kInvalidArgument, std::move(why)};
  }
  if (!in_step_ || !observing_) return Status::Ok();
  try {
    TensorSample s;
    // Not measured at this step's level: dropped here, as observe() drops it.
    if (!start_sample(t, s, /*stats_given=*/true)) return Status::Ok();
    if (adopt_stats(t, stats, s)) current_.samples.push_back(std::move(s));
    return Status::Ok();
  } catch (...) {
    current_.dropped_tensors += 1;
    throw;
  }
}

Status Recorder::observe_quantizer(const QuantizerView& q) {
  Call call(*this, true);
  if (call.reentered()) return refuse_reentry("observe_quantizer");
  if (closed_) return {StatusCode::kFailedPrecondition, "observe_quantizer after shutdown"};
  // Checked only when it would be recorded: the check reads the recipe text back, and a trainer
  // calls this for every GEMM input of every micro-batch, observed step or not.
  if (!in_step_ || !observing_) return Status::Ok();
  if (std::string why = check_quantizer(q); !why.empty()) {
    why = "observe_quantizer: tensor '" + std::string(q.name) + "': " + why;
    notices_->raise("observe_quantizer-invalid", "agent: " + why + "; not recorded");
    current_.dropped_tensors += 1;
    return {StatusCode::kInvalidArgument, std::move(why)};
  }
  if (current_.quantizers.size() >= proto::kMaxQuantizersPerReport) {
    current_.dropped_tensors += 1;
    return Status::Ok();
  }
  QuantizerSample s;
  s.name = wire_name(q.name);
  s.role = q.role;
  s.phase = q.phase;
  s.micro_step = q.micro_step;
  s.counts = q.counts;
  s.layer = wire_name(q.layer);  // as the Hello's bf16_capable_gemms are sent
  s.what_if = q.what_if;
  s.loss_cost = q.loss_cost;
  // The history is the large part (up to 4 KiB): it travels at the full level only.
  if (sampler_.level(q.role, q.phase) == Level::kFull) {
    const std::size_t keep = std::min(q.amax_history.size(), proto::kMaxAmaxHistory);
    const auto newest = q.amax_history.last(keep);
    s.amax_history.assign(newest.begin(), newest.end());
  }
  current_.quantizers.push_back(std::move(s));
  return Status::Ok();
}

std::optional<TargetSpec> Recorder::stats_target(const TensorView& t) {
  Call call(*this, true);
  if (call.reentered() || closed_ || !in_step_ || !observing_) return std::nullopt;
  // The flight recorder keeps statistics handed over at any level (the unscaled gradients of a
  // fused unscale, free every step): it wants them whatever the sampling says.
  if (sampler_.level(t.role, t.phase) == Level::kSkip && config_.flight_recorder_steps == 0) {
    return std::nullopt;
  }
  return target_for(run_.compute_format, t.role, sample_scale(t), scale_with(t, step_scale_));
}

// The sample of `t` as this point of the step wants it (name, level, target...), with the
// step's bookkeeping done (NVTX phase, step scale, budget). False when `t` is not measured:
// its level is kSkip, the step's budget is spent or its dtype cannot be measured (the last
// two counted as drops).
bool Recorder::start_sample(const TensorView& t, TensorSample& s, bool stats_given) {
  nvtx_phase_to(t.phase);
  nvtx::Scoped range(nvtx::Range::kAgentObserve, config_.nvtx);
  step_scale_ = scale_with(t, step_scale_);
  if (t.device == Device::kCuda) saw_device_tensor_ = true;
  const Level level = sampler_.level(t.role, t.phase);
  // The flight recorder keeps statistics handed over in full at any level, and has its roles
  // measured in full.
  const bool record =
      config_.flight_recorder_steps > 0 && (stats_given || sampler_.records(t.role, t.phase));
  if (level == Level::kSkip && !record) return false;
  if (++sampled_this_step_ > config_.sampling.max_tensors_per_step) {
    current_.dropped_tensors += 1;
    return false;
  }
  s.name = wire_name(t.name);
  s.role = t.role;
  s.phase = t.phase;
  s.dtype = t.dtype;
  s.shape.assign(t.shape.begin(), t.shape.end());
  s.numel = numel_of(t.shape);
  s.scale = sample_scale(t);
  s.micro_step = t.micro_step;
  s.order = t.order;
  s.level = level;
  s.record_full = record && level != Level::kFull;
  s.target = target_for(run_.compute_format, t.role, s.scale, step_scale_);
  s.held = t.held;
  if (!is_stats_storage_format(t.dtype)) {
    drop_sample("unsupported dtype " + std::string(format_name(t.dtype)));
    return false;
  }
  return true;
}

// A tensor's name as it leaves the process: any name is taken (a PyTorch module name may be any
// Unicode, a C caller's any bytes), and one that is not clean text within the wire's limit is
// sent escaped (ampscope/text.h), said once in a notice, so that a name never costs a report.
std::string Recorder::wire_name(std::string_view name) {
  if (name.size() <= text::kNameMaxBytes && text::is_clean_text(name)) return std::string(name);
  std::string sent = text::clean_text(name, text::kNameMaxBytes);
  notices_->raise("name-escaped",
                  "agent: tensor names that are not valid UTF-8, hold control characters or "
                  "exceed " +
                      std::to_string(text::kNameMaxBytes) +
                      " bytes are sent escaped (\\xHH, cut with ~hash); the first: '" + sent + "'");
  return sent;
}

// Takes the caller's statistics of `t` as the sample's measurement: what measure_into() would
// have computed from the data. False when the sample was dropped (counted).
bool Recorder::adopt_stats(const TensorView& t, const TensorStats& stats, TensorSample& s) {
  const auto counted = std::find_if(stats.targets.begin(), stats.targets.end(),
                                    [&](const TargetCounts& c) { return c.target == *s.target; });
  if (counted == stats.targets.end() && s.level == Level::kFull) {
    const std::string missing =
        "observe_stats: '" + s.name + "' counted no " + to_string(*s.target);
    if (t.device == Device::kCpu && t.data != nullptr) {
      notices_->raise("observe_stats-target", "agent: " + missing + "; measured from its data");
      return measure_into(t, s);
    }
    notices_->raise("observe_stats-target",
                    "agent: " + missing + "; reported without counts for that target");
  }
  s.stats.numel = stats.numel;
  s.stats.zeros = stats.zeros;
  s.stats.nan = stats.nan;
  s.stats.pos_inf = stats.pos_inf;
  s.stats.neg_inf = stats.neg_inf;
  s.stats.max_abs = stats.max_abs;
  const bool nonfinite = stats.nonfinite() > 0;
  // A counted tensor that holds a non-finite value is measured in full (measure_into).
  if (s.level == Level::kCounts && nonfinite && config_.sampling.full_on_nonfinite) {
    s.level = Level::kFull;
  }
  if (s.level == Level::kFull || s.record_full) {
    s.full = true;
    s.stats.min_abs_nonzero = stats.min_abs_nonzero;
    s.stats.sum = stats.sum;
    s.stats.sum_sq = stats.sum_sq;
    s.stats.histogram = stats.histogram;
    if (counted != stats.targets.end()) s.stats.targets.assign(1, *counted);
  }
  s.measured = true;
  if (nonfinite) {
    nonfinite_this_step_ = true;
    sampler_.saw_nonfinite();
  }
  return true;
}

// Measures `t` into `s` (counts, full statistics, a copy for the worker or a device launch).
// False when the sample was dropped (counted already).
bool Recorder::measure_into(const TensorView& t, TensorSample& s) {
  if (t.device == Device::kCuda) {
    if (!gpu_tried_) {
      gpu_tried_ = true;
      std::string why;
      gpu_ = GpuStats::create(&why);
      if (!gpu_) notices_->raise("gpu", "gpu stats: unavailable: " + why);
    }
    if (!gpu_) {
      current_.dropped_tensors += 1;
      return false;
    }
    std::string error;
    s.gpu = gpu_->launch(t.data, s.numel, t.dtype, &*s.target, t.stream, &error);
    if (!s.gpu) {
      drop_sample(error);
      return false;
    }
    return true;
  }
  // Counts on this thread (one cheap read); full statistics here or, in worker mode, from a
  // copy on the worker. A counted tensor that holds a non-finite value is measured in full too,
  // and escalates the rest of the step.
  const bool defer_full = config_.stats_thread == StatsThread::kWorker;
  const bool escalate = config_.sampling.full_on_nonfinite;
  if (s.level == Level::kCounts && !s.record_full) {
    bool nonfinite = false;
    if (!measure_here(t.data, s, !defer_full && escalate, &nonfinite)) return false;
    if (nonfinite && defer_full && escalate) {
      s.level = Level::kFull;
      s.measured = false;
    }
  }
  if ((s.level == Level::kFull || s.record_full) && !s.measured) {
    return defer_full ? copy_for_worker(t.data, s) : measure_here(t.data, s, escalate);
  }
  return true;
}

// Measures a host sample on the calling thread. False when it was dropped (counted); a
// non-finite value marks the step and escalates the rest of it.
bool Recorder::measure_here(const void* data, TensorSample& s, bool upgrade_on_nonfinite,
                            bool* nonfinite) {
  const MeasureResult r = measure_host(data, s, upgrade_on_nonfinite, 0, config_.recipe_targets);
  if (!r.ok) {
    drop_sample(r.error);
    return false;
  }
  if (nonfinite != nullptr) *nonfinite = r.nonfinite;
  if (r.nonfinite) {
    nonfinite_this_step_ = true;
    sampler_.saw_nonfinite();
  }
  return true;
}

int Recorder::wanted(TensorRole role, TensorPhase phase) {
  Call call(*this, true);
  if (call.reentered() || closed_ || !in_step_ || !observing_) return 0;
  return static_cast<int>(sampler_.measured(role, phase));
}

Status Recorder::mark_phase(StepPhase phase) {
  Call call(*this, false);
  if (call.reentered()) return refuse_reentry("mark_phase");
  if (closed_) return {StatusCode::kFailedPrecondition, "mark_phase after shutdown"};
  if (!in_step_ || !config_.nvtx || !nvtx::kEnabled || !on_nvtx_thread()) return Status::Ok();
  switch (phase) {
    case StepPhase::kForward:
      nvtx_phase_to(TensorPhase::kForward);
      break;
    case StepPhase::kBackward:
      nvtx_phase_to(TensorPhase::kBackward);
      break;
    case StepPhase::kUnscaleCheck:
      nvtx_phase_to(TensorPhase::kAfterUnscale);
      break;
    case StepPhase::kOptimizer:
      if (phase_open_) nvtx::pop();
      nvtx::push(nvtx::Range::kOptimizer);
      phase_open_ = true;
      nvtx_phase_ = TensorPhase::kUnknown;  // any tensor phase after it opens a new range
      break;
  }
  return Status::Ok();
}

Status Recorder::end_step(const StepInfo& info) {
  Call call(*this, true);
  if (call.reentered()) return refuse_reentry("end_step");
  if (closed_) return {StatusCode::kFailedPrecondition, "end_step after shutdown"};
  try {
    started_ = true;
    delivery_->start();
    if (!in_step_) {
      // A trainer that never calls begin_step still gets its steps reported.
      current_ = StepRecord{};
    }
    cupti_end();
    nvtx_close_step();
    in_step_ = false;
    observing_ = false;
    steps_.fetch_add(1, std::memory_order_relaxed);
    sampler_.end_step(nonfinite_this_step_ || info.found_inf, info.scale_after != info.loss_scale);
    if (config_.sampling.cupti_every > 0 && !saw_device_tensor_ && !cupti_tried_) {
      cupti_tried_ = true;
      notices_->raise("cupti", std::string("cupti: unavailable: ") +
                                   (cuda_device_present() ? "the run's tensors are on the CPU"
                                                          : "no CUDA device"));
    }
    if (info.step <= resume_skip_through_) {
      // Re-run after a restart from a checkpoint: the previous process reported this step.
      notices_->raise("resume", "resume: steps up to " + std::to_string(resume_skip_through_) +
                                    " were reported by a previous process; their re-runs are "
                                    "not reported again");
      current_ = StepRecord{};
      return Status::Ok();
    }
    current_.info = info;
    StepRecord record = std::move(current_);
    current_ = StepRecord{};
    delivery_->submit(std::move(record));
    return Status::Ok();
  } catch (...) {
    delivery_->count_dropped_reports(1);
    throw;
  }
}

void Recorder::close() {
  Call call(*this, false);
  closed_ = true;
}

void Recorder::release_devices() {
  Call call(*this, false);
  if (call.reentered()) return;
  current_ = StepRecord{};  // device jobs of a step that never ended
  cupti_.reset();
  gpu_.reset();
}

void Recorder::drop_sample(const std::string& why) {
  current_.dropped_tensors += 1;
  notices_->raise("sample:" + why, "stats: sample skipped: " + why);
}

bool Recorder::copy_for_worker(const void* data, TensorSample& s) {
  const std::uint64_t bytes = s.numel * static_cast<std::uint64_t>(storage_bytes(s.dtype));
  if (delivery_->copy_bytes_held() + current_.copy_bytes + bytes > config_.worker_max_bytes) {
    drop_sample("the worker's copies reached worker_max_bytes");
    return false;
  }
  const auto* p = static_cast<const unsigned char*>(data);
  s.copy.assign(p, p + bytes);
  current_.copy_bytes += bytes;
  return true;
}

void Recorder::nvtx_phase_to(TensorPhase phase) {
  if (!config_.nvtx || !nvtx::kEnabled || phase == nvtx_phase_ || !in_step_ || !on_nvtx_thread()) {
    return;
  }
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
  if (phase_open_) nvtx::pop();
  nvtx::push(r);
  phase_open_ = true;
  nvtx_phase_ = phase;
}

void Recorder::nvtx_close_step() {
  // Ranges are popped on the thread that pushed them: a step ended on another thread leaves
  // them to that thread's next begin_step (a begin_step on yet another thread forgets them).
  if (!config_.nvtx || !nvtx::kEnabled || !on_nvtx_thread()) return;
  if (phase_open_) nvtx::pop();
  if (nvtx_depth_ > 0) nvtx::pop();
  phase_open_ = false;
  nvtx_phase_ = TensorPhase::kUnknown;
  nvtx_depth_ = 0;
}

void Recorder::cupti_begin(std::int64_t step) {
  if (config_.sampling.cupti_every <= 0 || step % config_.sampling.cupti_every != 0) return;
  if (!cupti_tried_) {
    // Only a run whose tensors live on a GPU has anything to profile; until one is seen the
    // collector is not created (and says why once).
    if (!saw_device_tensor_) return;
    cupti_tried_ = true;
    std::string why;
    cupti_ = CuptiCollector::create(&why);
    if (!cupti_) {
      notices_->raise("cupti", "cupti: unavailable: " + why);
      return;
    }
  }
  if (!cupti_) return;
  std::string error;
  if (cupti_->begin(step, &error)) {
    cupti_open_ = true;
    cupti_thread_ = std::this_thread::get_id();
  } else {
    notices_->raise("cupti", "cupti: stopped: " + error);
    cupti_.reset();
  }
}

void Recorder::cupti_end() {
  if (!cupti_open_) return;
  cupti_open_ = false;
  std::string error = "end_step on another thread than the begin_step that opened the range";
  if (cupti_thread_ == std::this_thread::get_id()) {
    error.clear();
    if (auto ratio = cupti_->end(&error)) {
      current_.tensor_core_active_ratio = *ratio;
      return;
    }
  }
  notices_->raise("cupti", "cupti: stopped: " + error);
  cupti_.reset();
}

}  // namespace ampscope::agent
