// The web UI's JSON API over the store's series (store_series.cc) and the server's live facts.
// Names of roles, phases and formats come from the shared vocabulary (ampscope/vocabulary.h,
// ampscope/formats.h) through the wire codec; format limits from the format definitions.
// nlohmann-json writes NaN and Inf as null, which is the contract for numbers.
#include "webui_api.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>

#include "ampscope/formats.h"
#include "ampscope/loss_scale.h"
#include "ampscope/proto/quantizer_codec.h"
#include "ampscope/proto/vocabulary_codec.h"
#include "ampscope/recipe.h"
#include "ampscope/vocabulary.h"
#include "live_facts.h"
#include "policy_wire.h"
#include "validation.h"

namespace ampscope::server {
namespace {

using nlohmann::json;
using Params = std::multimap<std::string, std::string>;

// A run with an agent connected is training while its reports keep coming, silent after this.
constexpr std::int64_t kSilentAfterNs = 60LL * 1'000'000'000;

// Points the page may ask for (clamped), and the defaults.
struct WidthLimits {
  std::int64_t fallback, least, most;
};
constexpr WidthLimits kRunWidth{1000, 10, 4000};
constexpr WidthLimits kTensorWidth{600, 10, 2000};
constexpr std::uint32_t kMaxRuns = 10000;

// The formats whose windows the tensor page draws.
constexpr Format kWindowFormats[] = {Format::kFP16, Format::kBF16, Format::kE4M3, Format::kE5M2};

// A refused request: its status and the message naming the parameter or resource.
struct ApiError {
  int status;
  std::string message;
};

// Text a request brought (a run id, a parameter) is quoted in errors as it came: bytes that are
// not UTF-8 become U+FFFD there rather than make the answer fail.
ApiResponse answer(int status, const json& body) {
  return {status, body.dump(-1, ' ', false, json::error_handler_t::replace)};
}
ApiResponse error(const ApiError& e) { return answer(e.status, json{{"error", e.message}}); }

std::string role_text(int wire) {
  const auto role = proto::from_proto(static_cast<v1::TensorRole>(wire));
  return role ? std::string(role_name(*role)) : "unknown";
}
std::string phase_text(int wire) {
  return std::string(phase_name(proto::from_proto(static_cast<v1::TensorPhase>(wire))));
}
// "none" for a tensor without targets (format 0).
std::string format_text(int wire) {
  const auto format = proto::from_proto(static_cast<v1::Format>(wire));
  return format ? std::string(format_name(*format)) : "none";
}
// The policy library's name of the mode ("static-params"), as the CLI and the server's log say
// it; empty without a policy.
std::string mode_text(v1::PolicyMode mode) {
  const auto m = mode_from_wire(mode);
  return m ? std::string(policy::mode_name(*m)) : std::string();
}

json optional_number(const std::optional<double>& v) { return v ? json(*v) : json(nullptr); }

// --- Parameters --------------------------------------------------------------------------------

const std::string* param(const Params& params, const std::string& name) {
  const auto it = params.find(name);
  return it == params.end() ? nullptr : &it->second;
}

std::optional<std::int64_t> parse_int(const std::string& text) {
  std::int64_t v = 0;
  const char* end = text.data() + text.size();
  const auto r = std::from_chars(text.data(), end, v);
  if (r.ec != std::errc() || r.ptr != end) return std::nullopt;
  return v;
}

// A step parameter: absent, or an integer >= 0.
std::optional<std::int64_t> step_param(const Params& params, const std::string& name) {
  const std::string* text = param(params, name);
  if (text == nullptr) return std::nullopt;
  const std::optional<std::int64_t> v = parse_int(*text);
  if (!v || *v < 0) throw ApiError{400, name + ": must be an integer >= 0, got '" + *text + "'"};
  return v;
}

SeriesRequest series_request(const Params& params, const WidthLimits& limits) {
  SeriesRequest q;
  q.from = step_param(params, "from");
  q.to = step_param(params, "to");
  if (q.from && q.to && *q.to < *q.from) throw ApiError{400, "to: must be >= from"};
  q.width = limits.fallback;
  if (const std::string* text = param(params, "width")) {
    const std::optional<std::int64_t> w = parse_int(*text);
    if (!w) throw ApiError{400, "width: must be an integer, got '" + *text + "'"};
    q.width = std::clamp(*w, limits.least, limits.most);
  }
  return q;
}

// --- Runs and alerts ---------------------------------------------------------------------------

json alert(const char* name, const char* severity, const std::string& summary) {
  return {{"name", name}, {"severity", severity}, {"summary", summary}};
}

std::string percent(double ratio) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", ratio * 100.0);
  return buf;
}

// The conditions of dashboards/prometheus/alerts.yml over the run's recent reports.
json alerts_of(const RecentReports& r) {
  using T = AlertThresholds;
  json out = json::array();
  std::map<int, std::uint64_t> nonfinite;  // by role, over formats
  for (const ReportCounts& c : r.counts) nonfinite[c.role] += c.nonfinite;
  for (const auto& [role, n] : nonfinite) {
    if (n == 0 || proto::is_loss_scaled(static_cast<v1::TensorRole>(role))) continue;
    out.push_back(alert("AmpscopeNonFiniteValues", "critical",
                        std::to_string(n) + " NaN/Inf values in " + role_text(role)));
  }
  if (r.nonfinite_loss) {
    out.push_back(alert("AmpscopeNonFiniteValues", "critical", "the training loss is NaN/Inf"));
  }
  for (const ReportCounts& c : r.counts) {
    if (c.checked == 0) continue;
    const double ratio = static_cast<double>(c.underflow) / static_cast<double>(c.checked);
    if (ratio > T::kUnderflowRatio) {
      out.push_back(alert("AmpscopeUnderflowHigh", "warning",
                          role_text(c.role) + " underflow in " + format_text(c.format) + " above " +
                              percent(T::kUnderflowRatio) + ": " + percent(ratio)));
    }
  }
  if (r.steps > 0 && r.skipped_steps > T::kSkippedMinimum &&
      static_cast<double>(r.skipped_steps) / static_cast<double>(r.steps) > T::kSkippedRatio) {
    out.push_back(alert("AmpscopeSkippedStepsHigh", "warning",
                        "more than " + percent(T::kSkippedRatio) + " of steps skipped: " +
                            std::to_string(r.skipped_steps) + " of " + std::to_string(r.steps)));
  }
  if (r.last_loss_scale && *r.last_loss_scale < T::kLossScaleFloor) {
    out.push_back(alert("AmpscopeLossScaleCollapsed", "critical",
                        "loss scale collapsed to " + json(*r.last_loss_scale).dump()));
  }
  if (r.divergent_steps > 0) {
    out.push_back(alert("AmpscopeRankDivergence", "critical",
                        "ranks disagree at " + std::to_string(r.divergent_steps) + " step(s)"));
  }
  return out;
}

std::string status_of(const v1::RunSummary& s, std::int64_t now_ns) {
  if (s.agents_connected() == 0) return "finished";
  return now_ns - s.last_seen_unix_ns() <= kSilentAfterNs ? "training" : "silent";
}

json run_row(const v1::RunSummary& s, const std::map<std::string, RecentReports>& recent,
             std::int64_t now_ns) {
  const auto it = recent.find(s.run_id());
  return {{"run_id", s.run_id()},
          {"status", status_of(s, now_ns)},
          {"world_size", s.world_size()},
          {"precision", s.precision()},
          {"trainer", s.trainer()},
          {"compute_format", format_text(s.compute_format())},
          {"policy_mode", mode_text(s.policy_mode())},
          {"first_step", s.first_step()},
          {"last_step", s.last_step()},
          {"steps", s.steps()},
          {"reports", s.reports()},
          {"skipped_steps", s.skipped_steps()},
          {"loss", s.loss()},
          {"loss_scale", s.loss_scale()},
          {"agents_connected", s.agents_connected()},
          {"last_seen_unix_ns", s.last_seen_unix_ns()},
          {"alerts", it == recent.end() ? json::array() : alerts_of(it->second)}};
}

// --- One run -----------------------------------------------------------------------------------

json range_json(const StepBuckets& r, std::int64_t first_step, std::int64_t last_step) {
  return {
      {"first_step", first_step},       {"last_step", last_step}, {"from", r.from}, {"to", r.to},
      {"bucket_steps", r.bucket_steps}, {"buckets", r.buckets}};
}

json steps_json(const std::vector<StepPoint>& points) {
  json step = json::array(), last_step = json::array(), reports = json::array(),
       loss = json::array(), loss_min = json::array(), loss_max = json::array(),
       val_loss = json::array(), scale_min = json::array(), scale_max = json::array(),
       scale_last = json::array(), skipped = json::array(), found_inf = json::array();
  for (const StepPoint& p : points) {
    step.push_back(p.step);
    last_step.push_back(p.last_step);
    reports.push_back(p.reports);
    loss.push_back(optional_number(p.loss));
    loss_min.push_back(optional_number(p.loss_min));
    loss_max.push_back(optional_number(p.loss_max));
    val_loss.push_back(optional_number(p.val_loss));
    scale_min.push_back(p.scale_min);
    scale_max.push_back(p.scale_max);
    scale_last.push_back(p.scale_last);
    skipped.push_back(p.skipped);
    found_inf.push_back(p.found_inf);
  }
  return {{"step", step},           {"last_step", last_step},
          {"reports", reports},     {"loss", loss},
          {"loss_min", loss_min},   {"loss_max", loss_max},
          {"val_loss", val_loss},   {"scale_min", scale_min},
          {"scale_max", scale_max}, {"scale_last", scale_last},
          {"skipped", skipped},     {"found_inf", found_inf}};
}

json counts_json(const std::vector<CountSeries>& series) {
  json out = json::array();
  for (const CountSeries& s : series) {
    // A series of zeros says nothing (tensors without a target format, all finite): left out.
    if (std::all_of(s.points.begin(), s.points.end(), [](const CountPoint& p) {
          return p.checked == 0 && p.underflow == 0 && p.overflow == 0 && p.subnormal == 0 &&
                 p.nonfinite == 0;
        })) {
      continue;
    }
    json step = json::array(), checked = json::array(), underflow = json::array(),
         overflow = json::array(), subnormal = json::array(), nonfinite = json::array();
    for (const CountPoint& p : s.points) {
      step.push_back(p.step);
      checked.push_back(p.checked);
      underflow.push_back(p.underflow);
      overflow.push_back(p.overflow);
      subnormal.push_back(p.subnormal);
      nonfinite.push_back(p.nonfinite);
    }
    out.push_back({{"role", role_text(s.role)},
                   {"format", format_text(s.format)},
                   {"step", step},
                   {"checked", checked},
                   {"underflow", underflow},
                   {"overflow", overflow},
                   {"subnormal", subnormal},
                   {"nonfinite", nonfinite}});
  }
  return out;
}

json ranks_json(const std::vector<RankSeries>& series) {
  json out = json::array();
  for (const RankSeries& s : series) {
    json step = json::array(), step_time = json::array(), tensor_core = json::array();
    for (const RankPoint& p : s.points) {
      step.push_back(p.step);
      step_time.push_back(optional_number(p.step_time_s));
      tensor_core.push_back(optional_number(p.tensor_core_active_ratio));
    }
    out.push_back({{"rank", s.rank},
                   {"step", step},
                   {"step_time_s", step_time},
                   {"tensor_core_active_ratio", tensor_core}});
  }
  return out;
}

json skips_json(const std::vector<v1::SkippedStep>& skips) {
  json out = json::array();
  for (const v1::SkippedStep& k : skips) {
    out.push_back(
        {{"step", k.step()},
         {"rank", k.rank()},
         {"loss_scale", k.loss_scale()},
         {"scale_after", k.scale_after()},
         {"found_inf", k.found_inf()},
         {"why", k.why()},
         {"offender", k.has_first_offender() ? json(k.first_offender().tensor()) : json(nullptr)},
         // The rank whose report held the step's merged first offender.
         {"offender_rank", k.has_first_offender() ? json(k.offender_rank()) : json(nullptr)}});
  }
  return out;
}

json update_json(const v1::PolicyUpdate& u) {
  json out = json::object();
  if (u.has_loss_scale()) out["loss_scale"] = u.loss_scale();
  if (u.has_growth_interval()) out["growth_interval"] = u.growth_interval();
  if (u.has_growth_factor()) out["growth_factor"] = u.growth_factor();
  if (u.has_backoff_factor()) out["backoff_factor"] = u.backoff_factor();
  if (u.has_hysteresis()) out["hysteresis"] = u.hysteresis();
  if (u.has_min_scale()) out["min_scale"] = u.min_scale();
  if (u.has_max_scale()) out["max_scale"] = u.max_scale();
  if (u.fp32_tensors_set()) {
    out["fp32_layers"] = std::vector<std::string>(u.fp32_tensors().begin(), u.fp32_tensors().end());
  }
  if (u.bf16_gemms_set()) {
    out["bf16_gemms"] = std::vector<std::string>(u.bf16_gemms().begin(), u.bf16_gemms().end());
  }
  if (u.has_amax_history_length()) out["amax_history_length"] = u.amax_history_length();
  if (u.has_amax_margin()) out["amax_margin"] = u.amax_margin();
  return out;
}

json decisions_json(const std::vector<v1::PolicyDecision>& decisions) {
  json out = json::array();
  for (const v1::PolicyDecision& d : decisions) {
    const v1::PolicyUpdate& u = d.update();
    json applications = json::array();
    for (const v1::PolicyApplication& a : d.applications()) {
      applications.push_back({{"rank", a.rank()},
                              {"step", a.step()},
                              {"applied", a.applied()},
                              {"reason", a.reason()}});
    }
    out.push_back({{"policy_id", u.policy_id()},
                   {"effective_from_step", u.effective_from_step()},
                   {"decided_unix_ns", u.decided_unix_ns()},
                   {"mode", mode_text(u.mode())},
                   {"reason", u.reason()},
                   {"update", update_json(u)},
                   {"applications", applications}});
  }
  return out;
}

json offenders_json(const std::vector<v1::OffenderEvent>& offenders) {
  json out = json::array();
  for (const v1::OffenderEvent& e : offenders) {
    const v1::FirstOffender& f = e.offender();
    out.push_back({{"step", e.step()},
                   {"rank", e.rank()},
                   {"tensor", f.tensor()},
                   {"role", role_text(f.role())},
                   {"phase", phase_text(f.phase())},
                   {"order", f.order()},
                   {"micro_step", f.micro_step()}});
  }
  return out;
}

json tensors_json(const std::vector<v1::TensorRecord>& tensors) {
  json out = json::array();
  for (const v1::TensorRecord& t : tensors) {
    out.push_back({{"name", t.name()},
                   {"role", role_text(t.role())},
                   {"format", format_text(t.format())},
                   {"samples", t.samples()},
                   {"checked", t.values()},
                   {"underflow", t.underflow()},
                   {"overflow", t.overflow()},
                   {"nonfinite", t.nonfinite()},
                   {"underflow_ratio", t.underflow_ratio()},
                   {"overflow_ratio", t.overflow_ratio()},
                   {"max_abs", t.max_abs()},
                   {"last_step", t.last_step()}});
  }
  return out;
}

// Every field of the message's scalar integers (AgentCounters: all uint64), by its proto name.
json counters_json(const google::protobuf::Message& m) {
  json out = json::object();
  const google::protobuf::Descriptor* d = m.GetDescriptor();
  const google::protobuf::Reflection* r = m.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    if (f->is_repeated()) continue;
    switch (f->cpp_type()) {
      case google::protobuf::FieldDescriptor::CPPTYPE_UINT64:
        out[f->name()] = r->GetUInt64(m, f);
        break;
      case google::protobuf::FieldDescriptor::CPPTYPE_UINT32:
        out[f->name()] = r->GetUInt32(m, f);
        break;
      case google::protobuf::FieldDescriptor::CPPTYPE_INT64:
        out[f->name()] = r->GetInt64(m, f);
        break;
      case google::protobuf::FieldDescriptor::CPPTYPE_DOUBLE:
        out[f->name()] = r->GetDouble(m, f);
        break;
      default:
        break;
    }
  }
  return out;
}

json agents_json(const std::vector<v1::AgentInfo>& agents) {
  json out = json::array();
  for (const v1::AgentInfo& a : agents) {
    out.push_back({{"rank", a.rank()},
                   {"host", a.host()},
                   {"trainer", a.trainer()},
                   {"agent_version", a.agent_version()},
                   {"connected", a.connected()},
                   {"last_seen_unix_ns", a.last_seen_unix_ns()},
                   {"last_seq", a.last_seq()},
                   {"mean_step_time_s", a.mean_step_time_s()},
                   {"counters", counters_json(a.counters())},
                   {"notices", std::vector<std::string>(a.notices().begin(), a.notices().end())}});
  }
  return out;
}

json divergences_json(const std::vector<v1::RankDivergence>& divergences) {
  json out = json::array();
  for (const v1::RankDivergence& d : divergences) {
    json values = json::array();
    for (const v1::RankValue& v : d.values()) {
      values.push_back({{"rank", v.rank()}, {"value", v.value()}});
    }
    out.push_back({{"step", d.step()}, {"field", d.field()}, {"values", values}});
  }
  return out;
}

// --- One tensor --------------------------------------------------------------------------------

json format_json(Format f) {
  const FormatInfo& info = format_info(f);
  return {{"name", info.name},
          {"max", info.max_finite},
          {"min_normal", info.min_normal()},
          {"min_subnormal", info.min_subnormal()},
          {"max_exponent", info.max_exponent},
          {"min_normal_exponent", info.min_normal_exponent},
          {"min_subnormal_exponent", info.min_subnormal_exponent}};
}

json formats_json() {
  json out = json::array();
  for (const Format f : kWindowFormats) out.push_back(format_json(f));
  return out;
}

// A sample in the unscaled domain: magnitudes divided by the scale the tensor carried, binade
// exponents shifted by -log2(scale) (floor(log2(scale)) for a scale that is not a power of two,
// then marked approximate).
json column_json(const TensorSample& s) {
  const v1::TensorStats& t = s.stats;
  const double scale = std::isfinite(t.scale()) && t.scale() > 0 ? t.scale() : 1.0;
  json targets = json::array();
  for (const v1::TargetCounts& c : t.targets()) {
    targets.push_back({{"format", format_text(c.format())},
                       {"scale_log2", c.scale_log2()},
                       {"overflow", c.overflow()},
                       {"underflow", c.underflow()},
                       {"subnormal", c.subnormal()}});
  }
  json histogram = nullptr;
  if (t.has_histogram()) {
    histogram = {{"min_exponent", t.histogram().min_exponent() - scale_exponent(scale)},
                 {"counts", std::vector<std::uint64_t>(t.histogram().counts().begin(),
                                                       t.histogram().counts().end())}};
    if (!is_power_of_two(scale)) histogram["approximate_shift"] = true;
  }
  return {{"step", s.step},
          {"rank", s.rank},
          {"from_flight_recorder", s.from_flight_recorder},
          {"loss_scale", t.scale()},
          {"numel", t.numel()},
          {"zeros", t.zeros()},
          {"nan", t.nan()},
          {"pos_inf", t.pos_inf()},
          {"neg_inf", t.neg_inf()},
          {"max_abs", t.max_abs() / scale},
          {"min_abs_nonzero", t.min_abs_nonzero() / scale},
          {"targets", targets},
          {"histogram", histogram}};
}

// --- Quantisers --------------------------------------------------------------------------------

// SQNR in dB; +Inf (nothing lost) and NaN (no signal) are both null in JSON: `exact` tells them
// apart.
void put_sqnr(double db, json* out) {
  (*out)["sqnr_db"] = db;
  (*out)["exact"] = std::isinf(db) && db > 0;
}

json quantizer_record_json(const v1::QuantizerRecord& q) {
  json out = {{"name", q.name()},
              {"role", role_text(q.role())},
              {"phase", phase_text(q.phase())},
              {"recipe", q.recipe()},
              {"element", format_text(q.element())},
              {"samples", q.samples()},
              {"values", q.values()},
              {"nonfinite", q.nonfinite()},
              {"underflow", q.underflow()},
              {"subnormal", q.subnormal()},
              {"saturated", q.saturated()},
              {"overflow", q.overflow()},
              {"underflow_ratio", q.underflow_ratio()},
              {"saturated_ratio", q.saturated_ratio()},
              {"amax", q.amax()},
              {"last_amax", q.last_amax()},
              {"tensor_scale_min", q.tensor_scale_min()},
              {"tensor_scale_max", q.tensor_scale_max()},
              {"last_tensor_scale", q.last_tensor_scale()},
              {"scale_min_exponent", q.has_scale_binades() ? json(q.scale_min_exponent()) : json()},
              {"scale_max_exponent", q.has_scale_binades() ? json(q.scale_max_exponent()) : json()},
              {"blocks", q.blocks()},
              {"zero_blocks", q.zero_blocks()},
              {"saturated_blocks", q.saturated_blocks()},
              {"nan_blocks", q.nan_blocks()},
              {"last_step", q.last_step()},
              {"loss_cost_samples", q.loss_cost_samples()},
              {"loss_cost_mean", q.loss_cost_samples() > 0 ? json(q.loss_cost_mean()) : json()},
              {"loss_cost_stddev", q.loss_cost_samples() > 0 ? json(q.loss_cost_stddev()) : json()}};
  put_sqnr(q.sqnr_db(), &out);
  return out;
}

json quantizer_records_json(const std::vector<v1::QuantizerRecord>& records) {
  json out = json::array();
  for (const v1::QuantizerRecord& q : records) out.push_back(quantizer_record_json(q));
  return out;
}

// One sample as its report carried it. `loss_scale`: the scale its input carried, the report's
// loss scale for the loss-scaled roles and 1 for the others (as a tensor column's), so that the
// page can draw the recipe's windows in the unscaled domain.
json quantizer_sample_json(const QuantizerSample& s) {
  const v1::QuantizerStats& q = s.stats;
  const bool scaled =
      proto::is_loss_scaled(q.role()) && std::isfinite(s.loss_scale) && s.loss_scale > 0;
  json histogram = nullptr;
  if (q.has_scale_histogram() && q.scale_histogram().counts_size() > 0) {
    histogram = {{"min_exponent", q.scale_histogram().min_exponent()},
                 {"counts", std::vector<std::uint64_t>(q.scale_histogram().counts().begin(),
                                                       q.scale_histogram().counts().end())}};
  }
  json out = {
      {"step", s.step},
      {"rank", s.rank},
      {"loss_scale", scaled ? s.loss_scale : 1.0},
      {"recipe", q.recipe()},
      {"layer", q.layer()},
      {"what_if", q.what_if()},
      {"values", q.values()},
      {"nonfinite", q.nonfinite()},
      {"underflow", q.underflow()},
      {"subnormal", q.subnormal()},
      {"saturated", q.saturated()},
      {"overflow", q.overflow()},
      {"amax", q.amax()},
      {"tensor_scale", q.tensor_scale()},
      {"blocks", q.blocks()},
      {"zero_blocks", q.zero_blocks()},
      {"saturated_blocks", q.saturated_blocks()},
      {"nan_blocks", q.nan_blocks()},
      {"scale_histogram", histogram},
      {"amax_history", std::vector<float>(q.amax_history().begin(), q.amax_history().end())},
      {"loss_cost", q.has_loss_cost() ? json(q.loss_cost()) : json()}};
  put_sqnr(proto::sqnr_db(q.signal_sq(), q.error_sq()), &out);
  return out;
}

// The tensor's quantisers: per name the recipe of the latest sample (else of the totals), its
// element format's limits, whether it scales per block, the totals and the samples.
json tensor_quantizers_json(const TensorSeries& s) {
  std::map<std::string, json> by_name;
  const auto entry = [&](const std::string& name, const std::string& recipe) -> json& {
    json& e = by_name[name];
    if (e.is_null()) {
      e = {{"name", name}, {"totals", nullptr}, {"samples", json::array()}};
    }
    const std::optional<Recipe> r = parse_recipe(recipe);
    if (r) {
      e["recipe"] = recipe;
      e["scaling"] = scaling_name(r->scaling);
      e["block"] = is_block_recipe(r->scaling);
      e["element"] = format_json(r->element);
    }
    return e;
  };
  for (const v1::QuantizerRecord& r : s.quantizer_totals) {
    entry(r.name(), r.recipe())["totals"] = quantizer_record_json(r);
  }
  for (const QuantizerSample& q : s.quantizers) {
    entry(q.stats.name(), q.stats.recipe())["samples"].push_back(quantizer_sample_json(q));
  }
  json out = json::array();
  for (auto& [name, e] : by_name) {
    if (e.contains("element")) out.push_back(std::move(e));  // a recipe the server can read
  }
  return out;
}

ApiError unknown_run(const std::string& run_id) { return {404, "unknown run '" + run_id + "'"}; }

std::int64_t now_unix_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

WebApi::WebApi(StoreReader& store, const StreamTable& streams, const RunRegistry& runs)
    : store_(store), streams_(streams), runs_(runs) {}

ApiResponse WebApi::handle(const std::string& path, const Params& params) const {
  try {
    const std::int64_t now_ns = now_unix_ns();
    if (path == "/runs" || path == "/runs/") {
      const std::map<std::string, RecentReports> recent =
          store_.recent_reports(now_ns - AlertThresholds::kWindowNs);
      json rows = json::array();
      for (v1::RunSummary& s : store_.list_runs(kMaxRuns)) {
        add_live_facts(live_facts(streams_, runs_, s.run_id()), &s);
        rows.push_back(run_row(s, recent, now_ns));
      }
      return answer(200, {{"now_unix_ns", now_ns}, {"runs", rows}});
    }
    constexpr std::string_view kRuns = "/runs/";
    constexpr std::string_view kTensor = "/tensor";
    if (path.rfind(kRuns, 0) != 0) throw ApiError{404, "no such API: '" + path + "'"};
    std::string run_id = path.substr(kRuns.size());
    const bool tensor =
        run_id.size() > kTensor.size() &&
        run_id.compare(run_id.size() - kTensor.size(), kTensor.size(), kTensor) == 0;
    if (tensor) run_id.resize(run_id.size() - kTensor.size());
    if (run_id.empty() || run_id.find('/') != std::string::npos) {
      throw ApiError{404, "no such API: '" + path + "'"};
    }
    // Every stored run passed the same rule at its Hello: another id is a bad request.
    if (const std::optional<Violation> bad = check_run_id(run_id, "run id")) {
      throw ApiError{400, bad->message};
    }
    return tensor ? tensor_answer(run_id, params) : run_answer(run_id, params, now_ns);
  } catch (const ApiError& e) {
    return error(e);
  } catch (const std::exception& e) {
    return error({500, std::string("store: ") + e.what()});
  }
}

ApiResponse WebApi::run_answer(const std::string& run_id, const Params& params,
                               std::int64_t now_ns) const {
  std::optional<std::int64_t> since = step_param(params, "since");
  const SeriesRequest q = series_request(params, kRunWidth);
  if (since) {
    const std::optional<std::int64_t> max_id = store_.max_report_id(run_id);
    if (!max_id) throw unknown_run(run_id);
    if (*max_id <= *since) return answer(200, {{"unchanged", true}, {"max_report_id", *max_id}});
  }
  std::optional<RunView> s = store_.run_series(run_id, q, now_ns - AlertThresholds::kWindowNs);
  if (!s) throw unknown_run(run_id);
  const LiveFacts facts = live_facts(streams_, runs_, run_id);
  add_live_facts(facts, &s->summary);
  mark_connected(facts, s->agents);
  std::map<std::string, RecentReports> recent;
  if (s->recent) recent.emplace(run_id, std::move(*s->recent));
  json scale_changes = json::array();
  for (const v1::ScalePoint& p : s->scale_changes) {
    scale_changes.push_back({{"step", p.step()}, {"loss_scale", p.loss_scale()}});
  }
  const json body = {
      {"run", run_row(s->summary, recent, now_ns)},
      {"max_report_id", s->max_report_id},
      {"range", range_json(s->range, s->summary.first_step(), s->summary.last_step())},
      {"steps", steps_json(s->steps)},
      {"counts", counts_json(s->counts)},
      {"ranks", ranks_json(s->ranks)},
      {"skips", skips_json(s->skips)},
      {"scale_changes", scale_changes},
      {"decisions", decisions_json(s->decisions)},
      {"offenders", offenders_json(s->offenders)},
      {"tensors", tensors_json(s->tensors)},
      {"agents", agents_json(s->agents)},
      {"divergences", divergences_json(s->divergences)},
      {"quantizers", quantizer_records_json(s->quantizers)},
      {"bf16_gemms", s->bf16_gemms},
      {"bf16_gemms_step", s->bf16_gemms_step}};
  return answer(200, body);
}

ApiResponse WebApi::tensor_answer(const std::string& run_id, const Params& params) const {
  TensorRequest q;
  const std::string* name = param(params, "name");
  if (name == nullptr || name->empty()) throw ApiError{400, "name: required"};
  q.name = *name;
  const std::string* role = param(params, "role");
  if (role == nullptr) throw ApiError{400, "role: required"};
  const std::optional<TensorRole> parsed_role = parse_role(*role);
  if (!parsed_role) throw ApiError{400, "role: unknown role '" + *role + "'"};
  q.role = proto::to_proto(*parsed_role);
  if (const std::string* phase = param(params, "phase")) {
    const std::optional<TensorPhase> p = parse_phase(*phase);
    if (!p) throw ApiError{400, "phase: unknown phase '" + *phase + "'"};
    q.phase = proto::to_proto(*p);
  }
  q.range = series_request(params, kTensorWidth);
  std::optional<TensorSeries> s = store_.tensor_series(run_id, q);
  if (!s) throw unknown_run(run_id);
  json columns = json::array();
  for (const TensorSample& c : s->columns) columns.push_back(column_json(c));
  const v1::TensorStats* latest = s->columns.empty() ? nullptr : &s->columns.back().stats;
  json body = {{"name", q.name},
               {"role", role_text(q.role)},
               {"phase", phase_text(s->phase)},
               {"dtype", latest ? json(format_text(latest->dtype())) : json(nullptr)},
               {"format", latest && latest->targets_size() > 0
                              ? json(format_text(latest->targets(0).format()))
                              : json(nullptr)},
               {"range", range_json(s->range, s->first_step, s->last_step)},
               {"formats", formats_json()},
               {"columns", columns},
               {"quantizers", tensor_quantizers_json(*s)}};
  return answer(200, body);
}

}  // namespace ampscope::server
