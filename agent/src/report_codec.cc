#include "report_codec.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "ampscope/proto/wire_time.h"

#include "ampscope/proto/quantizer_codec.h"
#include "ampscope/proto/stats_codec.h"
#include "ampscope/proto/vocabulary_codec.h"
#include "ampscope/text.h"

namespace ampscope::agent {

using proto::to_proto;

namespace {

v1::PolicyAgreement agreement_to_proto(PolicyAgreementMode m) {
  switch (m) {
    case PolicyAgreementMode::kSingle:
      return v1::POLICY_AGREEMENT_SINGLE;
    case PolicyAgreementMode::kPerStep:
      return v1::POLICY_AGREEMENT_PER_STEP;
    case PolicyAgreementMode::kNone:
      return v1::POLICY_AGREEMENT_NONE;
    case PolicyAgreementMode::kIndependent:
      return v1::POLICY_AGREEMENT_INDEPENDENT;
    case PolicyAgreementMode::kAuto:
      break;
  }
  return v1::POLICY_AGREEMENT_UNSPECIFIED;
}

v1::FlightEvent flight_event_to_proto(FlightEvent e) {
  switch (e) {
    case FlightEvent::kNonfinite:
      return v1::FLIGHT_EVENT_NONFINITE;
    case FlightEvent::kSkipped:
      return v1::FLIGHT_EVENT_SKIPPED;
    case FlightEvent::kUnderflow:
      return v1::FLIGHT_EVENT_UNDERFLOW;
    case FlightEvent::kNone:
      break;
  }
  return v1::FLIGHT_EVENT_UNSPECIFIED;
}

void encode_tensor(const TensorSample& s, v1::TensorStats* t) {
  t->set_name(s.name);
  t->set_role(to_proto(s.role));
  t->set_phase(to_proto(s.phase));
  t->set_dtype(to_proto(s.dtype));
  if (s.held) t->set_held(to_proto(*s.held));
  for (auto d : s.shape) t->add_shape(d);
  t->set_order(static_cast<std::uint32_t>(std::max(0, s.order)));
  t->set_micro_step(static_cast<std::uint32_t>(std::max(0, s.micro_step)));
  t->set_scale(s.scale);
  proto::encode_stats(s.stats, s.level == Level::kFull, t);
}

// The kernel's account: field 22 of /proc/self/stat (after the parenthesised command name,
// which may hold spaces) in clock ticks after boot, and btime of /proc/stat. 0 when unreadable.
std::int64_t start_from_proc() {
  std::ifstream stat("/proc/self/stat");
  std::string line;
  if (!std::getline(stat, line)) return 0;
  const auto close = line.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(line.substr(close + 1));
  std::string field;
  // After the command name come field 3 (state) onwards; start time is field 22.
  for (int i = 3; i < 22 && fields >> field;) ++i;
  unsigned long long ticks = 0;
  if (!(fields >> ticks)) return 0;
  std::ifstream proc_stat("/proc/stat");
  long long boot_s = 0;
  for (std::string key; proc_stat >> key;) {
    if (key == "btime") {
      proc_stat >> boot_s;
      break;
    }
    std::getline(proc_stat, key);
  }
  const long hz = ::sysconf(_SC_CLK_TCK);
  if (boot_s <= 0 || hz <= 0) return 0;
  return boot_s * 1'000'000'000LL +
         static_cast<std::int64_t>(ticks / static_cast<unsigned long long>(hz)) * 1'000'000'000LL +
         static_cast<std::int64_t>(ticks % static_cast<unsigned long long>(hz)) *
             (1'000'000'000LL / hz);
}

}  // namespace

std::int64_t process_start_unix_ns() {
  static const std::int64_t start = [] {
    const std::int64_t from_proc = start_from_proc();
    return from_proc > 0 ? from_proc : proto::unix_now_ns();
  }();
  return start;
}

void encode_report(const StepRecord& record, const ReportContext& context, v1::StepReport* out) {
  const StepInfo& i = record.info;
  out->set_run_id(context.config->run_id);
  out->set_rank(context.config->rank);
  out->set_step(i.step);
  out->set_loss(i.loss);
  out->set_loss_scale(i.loss_scale);
  out->set_scale_after(i.scale_after);
  out->set_found_inf(i.found_inf);
  out->set_skipped(i.skipped);
  out->set_grad_norm(i.grad_norm);
  out->set_lr(i.lr);
  out->set_step_time_s(i.step_time_s);
  out->set_tokens(static_cast<std::uint64_t>(std::max<std::int64_t>(0, i.tokens)));
  out->set_optimizer_steps(static_cast<std::uint64_t>(std::max<std::int64_t>(0, i.optimizer_steps)));
  out->set_time_unix_ns(context.time_unix_ns);
  if (i.val_loss) out->set_val_loss(*i.val_loss);
  for (const auto& l : i.fp32_layers) {
    out->add_fp32_layers(text::clean_text(l, text::kNameMaxBytes));
  }
  for (const auto& l : i.bf16_gemms) {
    out->add_bf16_gemms(text::clean_text(l, text::kNameMaxBytes));
  }
  if (record.tensor_core_active_ratio) {
    out->set_tensor_core_active_ratio(*record.tensor_core_active_ratio);
  }
  const TensorSample* first = nullptr;
  for (const auto& s : record.samples) {
    if (!s.measured) continue;
    if (s.level != Level::kSkip) encode_tensor(s, out->add_tensors());
    if (s.stats.nonfinite() > 0 && (first == nullptr || s.order < first->order)) first = &s;
  }
  if (first != nullptr) {
    auto* f = out->mutable_first_offender();
    f->set_tensor(first->name);
    f->set_role(to_proto(first->role));
    f->set_phase(to_proto(first->phase));
    f->set_order(static_cast<std::uint32_t>(std::max(0, first->order)));
    f->set_micro_step(static_cast<std::uint32_t>(std::max(0, first->micro_step)));
  }
  for (const QuantizerSample& q : record.quantizers) {
    v1::QuantizerStats* w = out->add_quantizers();
    w->set_name(q.name);
    w->set_role(to_proto(q.role));
    w->set_phase(to_proto(q.phase));
    w->set_micro_step(static_cast<std::uint32_t>(std::max(0, q.micro_step)));
    w->set_layer(q.layer);
    w->set_what_if(q.what_if);
    if (q.loss_cost) w->set_loss_cost(*q.loss_cost);
    proto::encode_quantizer(q.counts, q.amax_history, w);
  }
  for (std::size_t i = 0; i < record.outcomes.size() && i < kMaxOutcomesPerReport; ++i) {
    const PolicyOutcome& o = record.outcomes[i];
    auto* p = out->add_policy_outcomes();
    p->set_policy_id(o.policy_id);
    p->set_applied(o.applied);
    p->set_reason(o.reason);
  }
  out->set_policy_seq(record.policy_seq);
  *out->mutable_agent() = context.counters;
  for (const auto& n : context.notices) out->add_notices(n);
  if (context.history != nullptr && !context.history->steps.empty()) {
    out->set_flight_event(flight_event_to_proto(context.history->event));
    for (const RecordedStep& step : context.history->steps) {
      v1::HistoryStep* h = out->add_history();
      h->set_step(step.step);
      h->set_loss_scale(step.loss_scale);
      for (const TensorSample& s : step.samples) encode_tensor(s, h->add_tensors());
    }
  }
}

void encode_hello(const AgentConfig& config, const RunInfo& run, const ScalerSettings& scaler,
                  const CapableLayers& capable, std::uint64_t resume_from,
                  std::uint64_t last_policy_seq, const std::string& agent_version, v1::Hello* out) {
  out->set_run_id(config.run_id);
  out->set_rank(config.rank);
  out->set_world_size(config.world_size);
  // What the trainer and the system say about the run, sent as clean text (ampscope/text.h).
  out->set_host(text::clean_text(run.host, text::kNameMaxBytes));
  out->set_trainer(text::clean_text(run.trainer, text::kNameMaxBytes));
  out->set_precision(text::clean_text(run.precision, text::kShortTextMaxBytes));
  out->set_compute_format(to_proto(run.compute_format));
  auto* s = out->mutable_scaler();
  s->set_kind(to_proto(scaler.kind));
  s->set_init_scale(scaler.scale);
  s->set_growth_factor(scaler.growth_factor);
  s->set_backoff_factor(scaler.backoff_factor);
  s->set_growth_interval(static_cast<std::uint32_t>(
      std::clamp<std::int64_t>(scaler.growth_interval, 0, std::int64_t{0xffffffff})));
  s->set_hysteresis(static_cast<std::uint32_t>(std::max(0, scaler.hysteresis)));
  s->set_min_scale(scaler.min_scale);
  s->set_max_scale(scaler.max_scale);
  out->set_agent_version(text::clean_text(agent_version, text::kShortTextMaxBytes));
  out->set_resume_from_seq(resume_from);
  for (const auto& l : capable.fp32) {
    out->add_fp32_capable_layers(text::clean_text(l, text::kNameMaxBytes));
  }
  for (const auto& l : capable.bf16_gemms) {
    out->add_bf16_capable_gemms(text::clean_text(l, text::kNameMaxBytes));
  }
  out->set_data_parallel_size(config.data_parallel_size);
  out->set_gradients_sharded(config.gradients_sharded);
  out->set_policy_agreement(agreement_to_proto(resolved_agreement(config)));
  out->set_last_policy_seq(last_policy_seq);
  out->set_pid(static_cast<std::uint64_t>(::getpid()));
  out->set_process_start_unix_ns(process_start_unix_ns());
}

}  // namespace ampscope::agent
