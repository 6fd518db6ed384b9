// The training loop: accumulation, scaling, unscale + found_inf, clipping, AdamW, schedule.
#include "ampscope/trainer/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <span>
#include <sstream>

#include "ampscope/check.h"
#include "require.h"

namespace ampscope::trainer {

ScalerConfig default_scaler(PrecisionMode mode) {
  return mode == PrecisionMode::kAmpFP16 ? ScalerConfig::pytorch_defaults()
                                         : ScalerConfig::static_scale(1.0f);
}

std::string validate(const TrainerConfig& c) {
  std::ostringstream os;
  auto finite_pos = [](float x) { return std::isfinite(x) && x > 0.0f; };
  if (c.batch < 1) {
    os << "batch must be >= 1, got " << c.batch;
  } else if (c.accum < 1) {
    os << "accum must be >= 1, got " << c.accum;
  } else if (c.steps < 1) {
    os << "steps must be >= 1, got " << c.steps;
  } else if (!finite_pos(c.lr)) {
    os << "lr must be finite and > 0, got " << c.lr;
  } else if (!(std::isfinite(c.min_lr) && c.min_lr >= 0.0f && c.min_lr <= c.lr)) {
    os << "min_lr must be in [0, lr], got " << c.min_lr;
  } else if (c.warmup_steps < 0) {
    os << "warmup_steps must be >= 0, got " << c.warmup_steps;
  } else if (!(std::isfinite(c.weight_decay) && c.weight_decay >= 0.0f)) {
    os << "weight_decay must be finite and >= 0, got " << c.weight_decay;
  } else if (!(c.beta1 >= 0.0f && c.beta1 < 1.0f && c.beta2 >= 0.0f && c.beta2 < 1.0f)) {
    os << "betas must be in [0, 1), got " << c.beta1 << ", " << c.beta2;
  } else if (!finite_pos(c.eps)) {
    os << "eps must be finite and > 0, got " << c.eps;
  } else if (!(std::isfinite(c.grad_clip) && c.grad_clip >= 0.0f)) {
    os << "grad_clip must be finite and >= 0, got " << c.grad_clip;
  } else if (!(c.val_fraction > 0.0 && c.val_fraction < 1.0)) {
    os << "val_fraction must be in (0, 1), got " << c.val_fraction;
  } else if (!finite_pos(c.grad_shrink)) {
    os << "grad_shrink must be finite and > 0, got " << c.grad_shrink;
  } else if (c.grad_shrink_end && !finite_pos(*c.grad_shrink_end)) {
    os << "grad_shrink_end must be finite and > 0, got " << *c.grad_shrink_end;
  } else if (c.eval_every < 0) {
    os << "eval_every must be >= 0, got " << c.eval_every;
  } else if (c.eval_batches < 0) {
    os << "eval_batches must be >= 0, got " << c.eval_batches;
  } else if (c.fp8_delayed.history_length < 1) {
    os << "fp8 amax history length must be >= 1, got " << c.fp8_delayed.history_length;
  } else if (c.fp8_delayed.margin < 0 || c.fp8_delayed.margin > 64) {
    os << "fp8 margin must be in [0, 64], got " << c.fp8_delayed.margin;
  } else if (c.loss_cost_every < 0) {
    os << "loss_cost_every must be >= 0, got " << c.loss_cost_every;
  } else if (c.inject_rank && *c.inject_rank < 0) {
    os << "inject_rank must be >= 0, got " << *c.inject_rank;
  } else if (c.scaler) {
    if (std::string e = validate(*c.scaler); !e.empty()) os << "scaler: " << e;
  }
  return os.str();
}

namespace {
// The step's scalars in the back end's memory, read back once at the end of the step.
struct StepScalars {
  float found_inf = 0.0f;     // set to 1 by unscale_and_check
  float sum_sq = 0.0f;        // of the unscaled gradients
  double loss_sum = 0.0;      // sum over micro-batches of their mean loss
  LossScaleState scaler;   // the scaler's state, updated by the back end from found_inf
};

// The step's one max all-reduce of host doubles: {found_inf, -received_seq, fallback, loss_nan,
// loss_sum of rank 0, ..., of rank N-1, then fp8-delayed's amaxes of the step}. A rank fills its own loss slot and -inf in the others,
// so the maximum gathers every rank's loss and the mean is summed on the host in rank order
// (the same bits for any reduction tree). MPI and NCCL order NaN differently: a NaN loss
// travels as +inf with loss_nan set. received_seq is exact up to 2^53.
class StepAgreement {
 public:
  StepAgreement(bool found_inf, const PolicyVote& vote, double loss_sum, int rank, int ranks,
                std::span<const double> amaxes)
      : ranks_(static_cast<std::size_t>(ranks)),
        values_(kLossSlots + ranks_, -std::numeric_limits<double>::infinity()) {
    values_.insert(values_.end(), amaxes.begin(), amaxes.end());
    values_[kFoundInf] = found_inf ? 1.0 : 0.0;
    values_[kNegSeq] = -static_cast<double>(vote.received_seq);
    values_[kFallback] = vote.fallback ? 1.0 : 0.0;
    values_[kLossNan] = std::isnan(loss_sum) ? 1.0 : 0.0;
    values_[kLossSlots + static_cast<std::size_t>(rank)] =
        std::isnan(loss_sum) ? std::numeric_limits<double>::infinity() : loss_sum;
  }
  void reduce(Communicator& comm) { comm.all_reduce_max(values_); }

  bool found_inf() const { return values_[kFoundInf] != 0.0; }
  PolicyVote vote() const {
    return {static_cast<std::uint64_t>(-values_[kNegSeq]), values_[kFallback] != 0.0};
  }
  double loss_sum() const {
    if (values_[kLossNan] != 0.0) return std::numeric_limits<double>::quiet_NaN();
    double sum = 0.0;
    for (std::size_t i = kLossSlots; i < kLossSlots + ranks_; ++i) sum += values_[i];
    return sum;
  }
  std::span<const double> amaxes() const {
    return std::span<const double>(values_).subspan(kLossSlots + ranks_);
  }

 private:
  enum : std::size_t { kFoundInf, kNegSeq, kFallback, kLossNan, kLossSlots };
  std::size_t ranks_;
  std::vector<double> values_;
};

TrainerConfig resolved(TrainerConfig c, const Corpus& corpus) {
  if (c.model.vocab_size == 0) c.model.vocab_size = corpus.vocab_size();
  if (!c.scaler) c.scaler = default_scaler(c.precision);
  std::string err = validate(c);
  AMPSCOPE_REQUIRE(err.empty(), err);
  err = validate(c.model);
  AMPSCOPE_REQUIRE(err.empty(), err);
  AMPSCOPE_REQUIRE(c.model.vocab_size >= corpus.vocab_size(), "model vocabulary ",
                 c.model.vocab_size, " smaller than the data's ", corpus.vocab_size());
  return c;
}
}  // namespace

Trainer::Trainer(const TrainerConfig& config, const Corpus& corpus,
                 std::unique_ptr<Backend> backend, std::unique_ptr<Communicator> comm)
    : config_(resolved(config, corpus)),
      backend_(std::move(backend)),
      comm_(comm ? std::move(comm) : make_single_communicator()),
      loader_(corpus, config_.batch, config_.model.context, config_.val_fraction, config_.seed),
      model_(std::make_unique<Gpt>(config_.model, config_.precision, *backend_, config_.batch)),
      scaler_(*config_.scaler),
      overrides_(model_->layer_names()),
      gemm_(model_->gemm_layers()) {
  if (model_->policy().scaled_gemms) {
    AMPSCOPE_REQUIRE(backend_->supports_gemm_recipes(), "--precision ",
                     precision_name(config_.precision), " needs FP8/FP4 GEMM recipes, which the ",
                     backend_->name(), " back end does not implement (use the cpu back end)");
  }
  model_->set_loss_cost_every(config_.loss_cost_every);
  if (config_.precision == PrecisionMode::kFP8Delayed) {
    delayed_ = std::make_unique<DelayedScaling>(model_->gemm_layers(), config_.fp8_delayed);
  }
  const auto names = model_->injectable_tensors();
  for (const auto& inj : config_.injections) {
    AMPSCOPE_REQUIRE(std::find(names.begin(), names.end(), inj.tensor) != names.end(),
                     "unknown tensor '", inj.tensor, "' for fault injection");
    AMPSCOPE_REQUIRE(inj.step >= 0, "fault injection step must be >= 0, got ", inj.step);
  }
  AMPSCOPE_REQUIRE(comm_->supports(backend_->device()), "the ", comm_->name(),
                   " communicator cannot reduce the memory of the ", backend_->name(),
                   " back end");
  AMPSCOPE_REQUIRE(!config_.inject_rank || *config_.inject_rank < comm_->size(),
                   "inject_rank ", config_.inject_rank.value_or(0), " is not a rank of ",
                   comm_->size());
  if (!config_.inject_rank || *config_.inject_rank == comm_->rank()) {
    injections_ = config_.injections;
  }
  model_->init_weights(config_.seed);
  schedule_.max_lr = config_.lr;
  schedule_.min_lr = config_.min_lr;
  schedule_.warmup_steps = config_.warmup_steps;
  schedule_.total_steps = config_.steps;
  scalars_ = backend_->allocate(sizeof(StepScalars));
}

Trainer::~Trainer() = default;

StepEvent Trainer::step() {
  const auto t0 = std::chrono::steady_clock::now();
  Backend& be = *backend_;
  Gpt& model = *model_;
  const std::int64_t step = step_;
  int order = 0;
  const bool observing = observer_ != nullptr && observer_->observe_step(step);
  const float scale = scaler_.begin_step(step);

  StepContext ctx;
  ctx.step = step;
  ctx.loss_scale = scale;
  ctx.overrides = &overrides_;
  ctx.gemm = &gemm_;
  ctx.delayed = delayed_.get();
  ctx.record_amax = true;
  if (delayed_) apply_delayed_settings(step);
  ctx.observer = observing ? observer_ : nullptr;
  ctx.injections = &injections_;
  ctx.order = &order;

  model.zero_grads();
  model.emit_weights(ctx);
  auto* scalars = static_cast<StepScalars*>(scalars_->data());
  const ScalerState before = scaler_.state();  // after begin_step's scheduled changes
  StepScalars start;
  start.scaler = before;
  be.copy_from_host(scalars, &start, sizeof(start));
  // The loss-gradient seed: scale, mean over every rank's micro-batches, optional shrink (fault
  // injection). The same loss divisor on every rank.
  const int ranks = comm_->size();
  const double micro_batches = static_cast<double>(config_.accum) * ranks;
  const float dloss =
      static_cast<float>(static_cast<double>(scale) * grad_shrink_at(step) / micro_batches);
  for (int micro = 0; micro < config_.accum; ++micro) {
    ctx.micro_step = micro;
    next_batch();
    model.forward(batch_, ctx, &scalars->loss_sum);
    model.backward(dloss, ctx);
  }
  model.finish_backward(ctx);  // this rank's gradients (and weight-gradient injections)
  const Tensor grads = model.grad_buffer();
  if (ranks > 1) all_reduce_grads(grads);

  // Unscale with inv_scale computed in FP64 and cast to FP32 (GradScaler), checking for
  // non-finite values in the same pass; then the global norm. The step's one host read brings
  // found_inf, the norm and the loss back together.
  const Tensor found_inf(&scalars->found_inf, Format::kFP32, {1}, be.device());
  const Tensor sum_sq(&scalars->sum_sq, Format::kFP32, {1}, be.device());
  // With an observer that wants the unscaled gradients' statistics, the unscale pass computes
  // them (fused statistics: no second read of the gradients); without one, the plain pass.
  const Gpt::UnscaledGradStats fused = model.request_unscaled_grad_stats(ctx);
  if (fused.requests.empty()) {
    be.unscale_and_check(grads, inverse_scale(scale), found_inf);
  } else {
    be.unscale_check_and_measure(grads, inverse_scale(scale), found_inf, fused.requests);
  }
  model.emit_unscaled_grads(ctx, &fused);
  be.sum_squares(sum_sq, grads);
  be.update_loss_scale(&scalars->scaler, found_inf, before.config);
  StepScalars host;
  be.copy_to_host(&host, scalars, sizeof(host));
  const double norm = std::sqrt(static_cast<double>(host.sum_sq));
  // The summed gradients are the same on every rank, and so is found_inf; reducing it anyway
  // costs nothing extra (the votes travel in the same all-reduce) and makes the skip a collective
  // decision.
  StepAgreement agreement(host.found_inf != 0.0f || !std::isfinite(norm),
                          agreement_ != nullptr ? agreement_->vote() : PolicyVote{},
                          host.loss_sum, comm_->rank(), ranks,
                          delayed_ ? delayed_->step_amaxes() : std::span<const double>{});
  agreement.reduce(*comm_);
  // After every use of this step's scales (TE: the amax is pushed after it was used).
  if (delayed_) delayed_->end_step(agreement.amaxes());
  if (agreement_ != nullptr) agreement_->agreed(agreement.vote());
  const bool found = agreement.found_inf();

  StepEvent ev;
  ev.step = step;
  ev.loss = agreement.loss_sum() / micro_batches;
  ev.loss_scale = scale;
  ev.found_inf = found;
  ev.skipped = found;
  ev.grad_norm = norm;
  ev.lr = schedule_.at(updates_);
  ev.tokens = static_cast<std::int64_t>(config_.batch) * config_.model.context * config_.accum *
              ranks;
  if (!found) {
    if (config_.grad_clip > 0.0f && norm > config_.grad_clip) {
      be.scale(grads, static_cast<float>(config_.grad_clip / (norm + 1e-6)));
    }
    AdamWParams hp;
    hp.lr = ev.lr;
    hp.beta1 = config_.beta1;
    hp.beta2 = config_.beta2;
    hp.eps = config_.eps;
    hp.step = updates_ + 1;
    const auto& params = model.params();
    for (std::size_t i = 0; i < params.size(); ++i) {
      hp.weight_decay = params[i].decay ? config_.weight_decay : 0.0f;
      be.adamw(model.param(i), model.grad(i), model.m(i), model.v(i), hp);
    }
    model.refresh_compute_weights();
    ++updates_;
  }
  // The back end updated the scale from found_inf. A norm that overflowed with finite
  // gradients (found here, not there) is rare: the host's own update takes that step.
  ev.scale_after = host.found_inf == 0.0f && found
                       ? scaler_.end_step(true)
                       : scaler_.end_step(host.scaler);
  ev.optimizer_steps = updates_;
  ev.fp32_layers = overrides_.active_layers(step);
  if (model.policy().scaled_gemms) {
    for (const std::string& layer : gemm_.valid_layers()) {
      if (gemm_.bf16(layer, step)) ev.bf16_gemms.push_back(layer);
    }
  }
  ++step_;
  be.stream().synchronize();
  ev.step_time_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (config_.eval_batches > 0 &&
      (step_ == config_.steps || (config_.eval_every > 0 && step_ % config_.eval_every == 0))) {
    ev.val_loss = evaluate(config_.eval_batches);
  }
  for (auto* l : listeners_) l->on_step(ev);
  return ev;
}

// Rank r of N takes global micro-batch (step * accum + micro) * N + r of the shared stream.
void Trainer::next_batch() {
  const int rank = comm_->rank(), ranks = comm_->size();
  loader_.skip_train(rank);
  loader_.next_train(batch_);
  loader_.skip_train(ranks - 1 - rank);
}

// The sum over ranks in FP32: 16-bit gradients (pure FP16) go through an FP32 copy and are
// rounded once, as accumulating micro-batches on one rank rounds them (backend.h).
void Trainer::all_reduce_grads(const Tensor& grads) {
  Backend& be = *backend_;
  if (grads.dtype == Format::kFP32) {
    comm_->all_reduce_sum(grads, be.stream());
    return;
  }
  if (!reduce_fp32_) reduce_fp32_ = be.allocate(static_cast<std::size_t>(grads.numel()) * 4);
  const Tensor fp32(reduce_fp32_->data(), Format::kFP32, {grads.numel()}, be.device());
  be.convert(fp32, grads);
  comm_->all_reduce_sum(fp32, be.stream());
  be.convert(grads, fp32);
}

void Trainer::apply_delayed_settings(std::int64_t step) {
  const auto& inputs = delayed_->inputs();
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    delayed_->apply(i, gemm_.delayed(inputs[i].layer, step).value_or(config_.fp8_delayed));
  }
}

double Trainer::grad_shrink_at(std::int64_t step) const {
  const double start = config_.grad_shrink;
  if (!config_.grad_shrink_end || config_.steps < 2) return start;
  const double t = static_cast<double>(std::clamp<std::int64_t>(step, 0, config_.steps - 1)) /
                   static_cast<double>(config_.steps - 1);
  return start * std::pow(static_cast<double>(*config_.grad_shrink_end) / start, t);
}

double Trainer::evaluate(int batches) {
  AMPSCOPE_CHECK(batches >= 1, "evaluate needs >= 1 batch, got ", batches);
  StepContext ctx;
  ctx.step = step_;
  ctx.overrides = &overrides_;
  ctx.gemm = &gemm_;
  ctx.delayed = delayed_.get();  // the scales of the next step; nothing recorded
  Batch b;
  double sum = 0.0;
  for (int i = 0; i < batches; ++i) {
    loader_.val_batch(i, batches, b);
    sum += model_->forward(b, ctx);
  }
  return sum / batches;
}

}  // namespace ampscope::trainer
