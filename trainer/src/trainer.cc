// The training loop: accumulation, scaling, unscale + found_inf, clipping, AdamW, schedule.
#include "ampscope/trainer/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
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
                 std::unique_ptr<Backend> backend)
    : config_(resolved(config, corpus)),
      backend_(std::move(backend)),
      loader_(corpus, config_.batch, config_.model.context, config_.val_fraction, config_.seed),
      model_(std::make_unique<Gpt>(config_.model, config_.precision, *backend_, config_.batch)),
      scaler_(*config_.scaler),
      overrides_(model_->layer_names()) {
  const auto names = model_->injectable_tensors();
  for (const auto& inj : config_.injections) {
    AMPSCOPE_REQUIRE(std::find(names.begin(), names.end(), inj.tensor) != names.end(),
                     "unknown tensor '", inj.tensor, "' for fault injection");
    AMPSCOPE_REQUIRE(inj.step >= 0, "fault injection step must be >= 0, got ", inj.step);
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
  ctx.observer = observing ? observer_ : nullptr;
  ctx.injections = &config_.injections;
  ctx.order = &order;

  model.zero_grads();
  model.emit_weights(ctx);
  auto* scalars = static_cast<StepScalars*>(scalars_->data());
  const ScalerState before = scaler_.state();  // after begin_step's scheduled changes
  StepScalars start;
  start.scaler = before;
  be.copy_from_host(scalars, &start, sizeof(start));
  // The loss-gradient seed: scale, mean over micro-batches, optional shrink (fault injection).
  const float dloss = static_cast<float>(static_cast<double>(scale) * grad_shrink_at(step) /
                                         static_cast<double>(config_.accum));
  for (int micro = 0; micro < config_.accum; ++micro) {
    ctx.micro_step = micro;
    loader_.next_train(batch_);
    model.forward(batch_, ctx, &scalars->loss_sum);
    model.backward(dloss, ctx);
  }
  model.finish_backward(ctx);

  // Unscale with inv_scale computed in FP64 and cast to FP32 (GradScaler), checking for
  // non-finite values in the same pass; then the global norm. The step's one host read brings
  // found_inf, the norm and the loss back together.
  const Tensor found_inf(&scalars->found_inf, Format::kFP32, {1}, be.device());
  const Tensor sum_sq(&scalars->sum_sq, Format::kFP32, {1}, be.device());
  const Tensor grads = model.grad_buffer();
  be.unscale_and_check(grads, inverse_scale(scale), found_inf);
  model.emit_unscaled_grads(ctx);
  be.sum_squares(sum_sq, grads);
  be.update_loss_scale(&scalars->scaler, found_inf, before.config);
  StepScalars host;
  be.copy_to_host(&host, scalars, sizeof(host));
  const double norm = std::sqrt(static_cast<double>(host.sum_sq));
  const bool found = host.found_inf != 0.0f || !std::isfinite(norm);

  StepEvent ev;
  ev.step = step;
  ev.loss = host.loss_sum / config_.accum;
  ev.loss_scale = scale;
  ev.found_inf = found;
  ev.skipped = found;
  ev.grad_norm = norm;
  ev.lr = schedule_.at(updates_);
  ev.tokens = static_cast<std::int64_t>(config_.batch) * config_.model.context * config_.accum;
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
  Batch b;
  double sum = 0.0;
  for (int i = 0; i < batches; ++i) {
    loader_.val_batch(i, batches, b);
    sum += model_->forward(b, ctx);
  }
  return sum / batches;
}

}  // namespace ampscope::trainer
