// The C API (ampscope/agent/c_api.h) over the C++ Agent. Every entry point catches everything:
// no exception crosses into C.
#include "ampscope/agent/c_api.h"

#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ampscope/agent/agent.h"

using ampscope::agent::Agent;
using ampscope::agent::AgentConfig;
using ampscope::agent::Status;
using ampscope::agent::StatusCode;

struct ampscope_agent_config {
  AgentConfig config;
  std::string last_error;
};

namespace {

// The scaler as a C trainer exposes it.
class CScaler final : public ampscope::agent::ScalerControl {
 public:
  CScaler(const ampscope_scaler_ops& ops, void* user, const ampscope::agent::ScalerSettings& base)
      : ops_(ops), user_(user), base_(base) {}
  ampscope::agent::ScalerSettings settings() const override {
    ampscope::agent::ScalerSettings s = base_;
    if (ops_.scale != nullptr) s.scale = ops_.scale(user_);
    s.min_scale = ops_.min_scale;
    s.max_scale = ops_.max_scale;
    return s;
  }
  std::string schedule(const ampscope::agent::ScalerChange& c) override {
    ampscope_scaler_change cc{};
    cc.effective_from_step = c.effective_from_step;
    cc.has_scale = c.scale.has_value();
    cc.scale = c.scale.value_or(0.0);
    cc.has_growth_factor = c.growth_factor.has_value();
    cc.growth_factor = c.growth_factor.value_or(0.0);
    cc.has_backoff_factor = c.backoff_factor.has_value();
    cc.backoff_factor = c.backoff_factor.value_or(0.0);
    cc.has_growth_interval = c.growth_interval.has_value();
    cc.growth_interval = c.growth_interval.value_or(0);
    cc.has_hysteresis = c.hysteresis.has_value();
    cc.hysteresis = c.hysteresis.value_or(0);
    cc.has_min_scale = c.min_scale.has_value();
    cc.min_scale = c.min_scale.value_or(0.0);
    cc.has_max_scale = c.max_scale.has_value();
    cc.max_scale = c.max_scale.value_or(0.0);
    if (ops_.schedule == nullptr) return "the C scaler has no schedule callback";
    char reason[512] = {0};
    if (ops_.schedule(user_, &cc, reason, sizeof(reason)) == 0) return {};
    reason[sizeof(reason) - 1] = '\0';
    return reason[0] != '\0' ? std::string(reason) : std::string("refused by the trainer");
  }

 private:
  ampscope_scaler_ops ops_;
  void* user_;
  ampscope::agent::ScalerSettings base_;  // the run info's scaler: kind and factors
};

ampscope_status to_c(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return AMPSCOPE_OK;
    case StatusCode::kInvalidArgument:
      return AMPSCOPE_INVALID_ARGUMENT;
    case StatusCode::kUnavailable:
      return AMPSCOPE_UNAVAILABLE;
    case StatusCode::kDeadlineExceeded:
      return AMPSCOPE_DEADLINE_EXCEEDED;
    case StatusCode::kFailedPrecondition:
      return AMPSCOPE_FAILED_PRECONDITION;
    case StatusCode::kInternal:
      return AMPSCOPE_INTERNAL;
  }
  return AMPSCOPE_INTERNAL;
}

bool valid_format(int f) { return f >= 0 && f < ampscope::kNumFormats; }

}  // namespace

struct ampscope_agent {
  std::unique_ptr<Agent> agent;
  std::unique_ptr<CScaler> scaler;
  ampscope::agent::ScalerSettings base_scaler;
  std::vector<std::int64_t> shape;  // scratch for views without a shape
  mutable std::mutex mu;             // guards the strings below
  mutable std::string last_error;
  std::string notice;

  ampscope_status fail(ampscope_status s, std::string message) const {
    std::lock_guard lock(mu);
    last_error = std::move(message);
    return s;
  }
  ampscope_status result(const Status& s) const {
    if (s.ok()) return AMPSCOPE_OK;
    return fail(to_c(s.code), s.message);
  }
};

extern "C" {

const char* ampscope_status_string(ampscope_status status) {
  switch (status) {
    case AMPSCOPE_OK:
      return "OK";
    case AMPSCOPE_INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case AMPSCOPE_UNAVAILABLE:
      return "UNAVAILABLE";
    case AMPSCOPE_DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case AMPSCOPE_FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case AMPSCOPE_INTERNAL:
      return "INTERNAL";
  }
  return "UNKNOWN";
}

const char* ampscope_agent_version(void) { return ampscope::agent::version(); }

ampscope_status ampscope_agent_config_create(ampscope_agent_config** out) {
  if (out == nullptr) return AMPSCOPE_INVALID_ARGUMENT;
  try {
    *out = new ampscope_agent_config();
    return AMPSCOPE_OK;
  } catch (...) {
    *out = nullptr;
    return AMPSCOPE_INTERNAL;
  }
}

void ampscope_agent_config_destroy(ampscope_agent_config* config) { delete config; }

ampscope_status ampscope_agent_config_set(ampscope_agent_config* config, const char* key,
                                          const char* value) {
  if (config == nullptr) return AMPSCOPE_INVALID_ARGUMENT;
  if (key == nullptr || value == nullptr) {
    config->last_error = "key and value must not be NULL";
    return AMPSCOPE_INVALID_ARGUMENT;
  }
  try {
    config->last_error = ampscope::agent::set_option(config->config, key, value);
    return config->last_error.empty() ? AMPSCOPE_OK : AMPSCOPE_INVALID_ARGUMENT;
  } catch (const std::exception& e) {
    config->last_error = e.what();
    return AMPSCOPE_INTERNAL;
  } catch (...) {
    return AMPSCOPE_INTERNAL;
  }
}

ampscope_status ampscope_agent_config_apply_env(ampscope_agent_config* config) {
  if (config == nullptr) return AMPSCOPE_INVALID_ARGUMENT;
  try {
    config->last_error = ampscope::agent::apply_environment(config->config);
    return config->last_error.empty() ? AMPSCOPE_OK : AMPSCOPE_INVALID_ARGUMENT;
  } catch (...) {
    return AMPSCOPE_INTERNAL;
  }
}

const char* ampscope_agent_config_last_error(const ampscope_agent_config* config) {
  return config == nullptr ? "config is NULL" : config->last_error.c_str();
}

ampscope_status ampscope_agent_create(ampscope_agent_config* config, const ampscope_run_info* run,
                                      ampscope_agent** out) {
  if (out == nullptr) return AMPSCOPE_INVALID_ARGUMENT;
  *out = nullptr;
  if (config == nullptr) return AMPSCOPE_INVALID_ARGUMENT;
  if (run == nullptr) {
    config->last_error = "run info must not be NULL";
    return AMPSCOPE_INVALID_ARGUMENT;
  }
  try {
    ampscope::agent::RunInfo r;
    if (run->host != nullptr) r.host = run->host;
    if (run->trainer != nullptr) r.trainer = run->trainer;
    if (run->precision != nullptr) r.precision = run->precision;
    if (!valid_format(run->compute_format)) {
      config->last_error = "run.compute_format: unknown format";
      return AMPSCOPE_INVALID_ARGUMENT;
    }
    r.compute_format = static_cast<ampscope::Format>(run->compute_format);
    r.scaler.kind = run->dynamic ? ampscope::ScalerKind::kDynamic
                                 : ampscope::ScalerKind::kStatic;
    if (run->loss_scale > 0) r.scaler.scale = run->loss_scale;
    if (run->growth_factor > 0) r.scaler.growth_factor = run->growth_factor;
    if (run->backoff_factor > 0) r.scaler.backoff_factor = run->backoff_factor;
    if (run->growth_interval > 0) r.scaler.growth_interval = run->growth_interval;
    auto handle = std::make_unique<ampscope_agent>();
    handle->base_scaler = r.scaler;
    const Status s = Agent::create(config->config, r, &handle->agent);
    if (!s.ok()) {
      config->last_error = s.message;
      return to_c(s.code);
    }
    config->last_error.clear();
    *out = handle.release();
    return AMPSCOPE_OK;
  } catch (const std::exception& e) {
    config->last_error = e.what();
    return AMPSCOPE_INTERNAL;
  } catch (...) {
    return AMPSCOPE_INTERNAL;
  }
}

ampscope_status ampscope_agent_destroy(ampscope_agent* agent, int64_t timeout_ms) {
  if (agent == nullptr) return AMPSCOPE_OK;
  ampscope_status result = AMPSCOPE_OK;
  try {
    const Status s = agent->agent->shutdown(std::chrono::milliseconds(std::max<int64_t>(0, timeout_ms)));
    result = to_c(s.code);
  } catch (...) {
    result = AMPSCOPE_INTERNAL;
  }
  delete agent;
  return result;
}

ampscope_status ampscope_agent_attach_scaler(ampscope_agent* agent, const ampscope_scaler_ops* ops,
                                             void* user) {
  if (agent == nullptr) return AMPSCOPE_INVALID_ARGUMENT;
  try {
    if (ops == nullptr) {
      const Status s = agent->agent->attach_scaler(nullptr);
      if (s.ok()) agent->scaler.reset();
      return agent->result(s);
    }
    if (ops->schedule == nullptr || ops->scale == nullptr) {
      return agent->fail(AMPSCOPE_INVALID_ARGUMENT, "ops.schedule and ops.scale are required");
    }
    auto scaler = std::make_unique<CScaler>(*ops, user, agent->base_scaler);
    const Status s = agent->agent->attach_scaler(scaler.get());
    if (s.ok()) agent->scaler = std::move(scaler);
    return agent->result(s);
  } catch (const std::exception& e) {
    return agent->fail(AMPSCOPE_INTERNAL, e.what());
  } catch (...) {
    return AMPSCOPE_INTERNAL;
  }
}

int ampscope_agent_begin_step(ampscope_agent* agent, int64_t step) {
  if (agent == nullptr) return 0;
  return agent->agent->begin_step(step) ? 1 : 0;  // noexcept
}

ampscope_status ampscope_agent_observe(ampscope_agent* agent, const ampscope_tensor_view* view) {
  if (agent == nullptr) return AMPSCOPE_INVALID_ARGUMENT;
  if (view == nullptr || view->name == nullptr) {
    return agent->fail(AMPSCOPE_INVALID_ARGUMENT, "view and view->name must not be NULL");
  }
  if (!valid_format(view->dtype) || view->role < AMPSCOPE_ROLE_WEIGHT ||
      view->role > AMPSCOPE_ROLE_LOSS || view->phase < AMPSCOPE_PHASE_UNKNOWN ||
      view->phase > AMPSCOPE_PHASE_AFTER_UNSCALE || view->rank < 0 || view->rank > 8 ||
      (view->rank > 0 && view->shape == nullptr)) {
    return agent->fail(AMPSCOPE_INVALID_ARGUMENT,
                       std::string("view of '") + view->name + "': bad dtype, role, phase or shape");
  }
  try {
    ampscope::agent::TensorView v;
    v.name = view->name;
    v.role = static_cast<ampscope::TensorRole>(view->role);
    v.phase = static_cast<ampscope::TensorPhase>(view->phase);
    v.dtype = static_cast<ampscope::Format>(view->dtype);
    v.data = view->data;
    if (view->rank > 0) {
      v.shape = std::span<const std::int64_t>(view->shape, static_cast<std::size_t>(view->rank));
    } else {
      agent->shape.assign(1, view->numel);
      v.shape = agent->shape;
    }
    v.device = view->device == 1 ? ampscope::Device::kCuda : ampscope::Device::kCpu;
    v.stream = view->stream;
    v.scale = view->scale;
    v.micro_step = view->micro_step;
    v.order = view->order;
    agent->agent->observe(v);
    return AMPSCOPE_OK;
  } catch (...) {
    return AMPSCOPE_INTERNAL;
  }
}

ampscope_status ampscope_agent_mark_phase(ampscope_agent* agent, ampscope_step_phase phase) {
  if (agent == nullptr) return AMPSCOPE_INVALID_ARGUMENT;
  if (phase < AMPSCOPE_STEP_PHASE_FORWARD || phase > AMPSCOPE_STEP_PHASE_OPTIMIZER) {
    return agent->fail(AMPSCOPE_INVALID_ARGUMENT, "unknown step phase");
  }
  agent->agent->mark_phase(static_cast<ampscope::agent::StepPhase>(phase));
  return AMPSCOPE_OK;
}

ampscope_status ampscope_agent_end_step(ampscope_agent* agent, const ampscope_step_info* info) {
  if (agent == nullptr) return AMPSCOPE_INVALID_ARGUMENT;
  if (info == nullptr) return agent->fail(AMPSCOPE_INVALID_ARGUMENT, "info must not be NULL");
  try {
    ampscope::agent::StepInfo s;
    s.step = info->step;
    s.loss = info->loss;
    s.loss_scale = info->loss_scale;
    s.scale_after = info->scale_after;
    s.found_inf = info->found_inf != 0;
    s.skipped = info->skipped != 0;
    s.grad_norm = info->grad_norm;
    s.lr = info->lr;
    s.tokens = info->tokens;
    s.step_time_s = info->step_time_s;
    s.optimizer_steps = info->optimizer_steps;
    if (info->has_val_loss != 0) s.val_loss = info->val_loss;
    agent->agent->end_step(s);
    return AMPSCOPE_OK;
  } catch (...) {
    return AMPSCOPE_INTERNAL;
  }
}

ampscope_status ampscope_agent_flush(ampscope_agent* agent, int64_t timeout_ms) {
  if (agent == nullptr) return AMPSCOPE_INVALID_ARGUMENT;
  return agent->result(
      agent->agent->flush(std::chrono::milliseconds(std::max<int64_t>(0, timeout_ms))));
}

ampscope_status ampscope_agent_get_counters(const ampscope_agent* agent,
                                            ampscope_agent_counters* out) {
  if (agent == nullptr || out == nullptr) return AMPSCOPE_INVALID_ARGUMENT;
  const ampscope::agent::Counters c = agent->agent->counters();
  out->steps = c.steps;
  out->reports_spooled = c.reports_spooled;
  out->reports_acked = c.reports_acked;
  out->dropped_reports = c.dropped_reports;
  out->dropped_tensors = c.dropped_tensors;
  out->rejected_reports = c.rejected_reports;
  out->spool_bytes = c.spool_bytes;
  out->reconnects = c.reconnects;
  out->policies_applied = c.policies_applied;
  out->policies_refused = c.policies_refused;
  out->training_thread_s = c.training_thread_s;
  out->connected = c.connected ? 1 : 0;
  return AMPSCOPE_OK;
}

size_t ampscope_agent_notice_count(const ampscope_agent* agent) {
  if (agent == nullptr) return 0;
  return agent->agent->notices().size();
}

const char* ampscope_agent_notice(ampscope_agent* agent, size_t index) {
  if (agent == nullptr) return nullptr;
  try {
    const auto all = agent->agent->notices();
    if (index >= all.size()) return nullptr;
    std::lock_guard lock(agent->mu);
    agent->notice = all[index];
    return agent->notice.c_str();
  } catch (...) {
    return nullptr;
  }
}

const char* ampscope_agent_last_error(const ampscope_agent* agent) {
  if (agent == nullptr) return "agent is NULL";
  std::lock_guard lock(agent->mu);
  return agent->last_error.c_str();
}

}  // extern "C"
