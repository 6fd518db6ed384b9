// One function per rule; validate_hello / validate_report run them in field order and return
// the first violation, so a message is described by the first field a reader would look at.
// validate_report checks the report's own rules first and takes refused parts out only of a
// report that passed them, so that a rejected report is left as it came.
#include "validation.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "ampscope/proto/quantizer_codec.h"
#include "ampscope/proto/stats_codec.h"
#include "ampscope/proto/vocabulary_codec.h"
#include "ampscope/recipe.h"

namespace ampscope::server {
namespace {

using Result = std::optional<Violation>;

// A field's name ("report.tensors[3].histogram"), spelled out only when a rule fails: checking
// a valid report builds no string (it did per tensor, a third of validation's time). A Field
// refers to the name or the parent Field it was made from, which must outlive it: keep a Field
// made from a temporary within the expression that made it.
class Field {
 public:
  Field(const std::string& name) : name_(name) {}  // NOLINT(google-explicit-constructor)
  Field(const char* name) : name_(name) {}         // NOLINT(google-explicit-constructor)

  Field operator/(const char* member) const { return Field(this, member, -1); }  // field.member
  Field operator[](int index) const { return Field(this, {}, index); }           // field[index]

  std::string str() const {
    if (parent_ == nullptr) return std::string(name_);
    std::string s = parent_->str();
    if (index_ >= 0) return s + "[" + std::to_string(index_) + "]";
    return s.append(".").append(name_);
  }

 private:
  Field(const Field* parent, std::string_view member, int index)
      : parent_(parent), name_(member), index_(index) {}

  const Field* parent_ = nullptr;
  std::string_view name_;
  int index_ = -1;
};

template <typename... Args>
Violation violation(const Field& field, std::string_view reason, const Args&... args) {
  std::string name = field.str();
  std::ostringstream os;
  os << name << ": ";
  (os << ... << args);
  return Violation{std::move(name), std::string(reason), os.str()};
}

Result check_string(std::string_view value, const Field& field, std::size_t max_bytes,
                    bool required) {
  if (required && value.empty()) return violation(field, "string", "must not be empty");
  if (value.size() > max_bytes) {
    return violation(field, "string", "is ", value.size(), " bytes, at most ", max_bytes,
                     " allowed");
  }
  if (!text::is_clean_text(value)) {
    return violation(field, "string", "must be valid UTF-8 without control characters");
  }
  return std::nullopt;
}

Result check_string_list(const google::protobuf::RepeatedPtrField<std::string>& values,
                         const Field& field, int max_count, std::size_t max_bytes) {
  if (values.size() > max_count) {
    return violation(field, "too_many", "has ", values.size(), " entries, at most ", max_count,
                     " allowed");
  }
  for (int i = 0; i < values.size(); ++i) {
    if (auto v = check_string(values[i], field[i], max_bytes, true)) return v;
  }
  return std::nullopt;
}

Result check_count(int count, const Field& field, int max_count) {
  if (count > max_count) {
    return violation(field, "too_many", "has ", count, " entries, at most ", max_count, " allowed");
  }
  return std::nullopt;
}

Result check_finite(double value, const Field& field) {
  if (!std::isfinite(value)) return violation(field, "non_finite", "must be finite, got ", value);
  return std::nullopt;
}

Result check_positive(double value, const Field& field) {
  if (auto v = check_finite(value, field)) return v;
  if (!(value > 0.0)) return violation(field, "range", "must be > 0, got ", value);
  return std::nullopt;
}

Result check_non_negative(double value, const Field& field) {
  if (auto v = check_finite(value, field)) return v;
  if (value < 0.0) return violation(field, "range", "must be >= 0, got ", value);
  return std::nullopt;
}

Result check_world(std::uint32_t rank, std::uint32_t world_size, const Field& prefix) {
  if (world_size < 1 || world_size > limits::kMaxWorldSize) {
    return violation(prefix / "world_size", "rank", "must be in [1, ", limits::kMaxWorldSize,
                     "], got ", world_size);
  }
  if (rank >= world_size) {
    return violation(prefix / "rank", "rank", "must be < world_size ", world_size, ", got ", rank);
  }
  return std::nullopt;
}

Result check_scaler(const v1::ScalerConfig& s, const Field& field) {
  if (!v1::ScalerKind_IsValid(s.kind())) {
    return violation(field / "kind", "enum", "unknown value ", static_cast<int>(s.kind()));
  }
  if (auto v = check_positive(s.init_scale(), field / "init_scale")) return v;
  if (auto v = check_finite(s.growth_factor(), field / "growth_factor")) return v;
  if (s.growth_factor() < 1.0) {
    return violation(field / "growth_factor", "range", "must be >= 1, got ", s.growth_factor());
  }
  if (auto v = check_finite(s.backoff_factor(), field / "backoff_factor")) return v;
  if (!(s.backoff_factor() > 0.0 && s.backoff_factor() <= 1.0)) {
    return violation(field / "backoff_factor", "range", "must be in (0, 1], got ",
                     s.backoff_factor());
  }
  if (auto v = check_non_negative(s.min_scale(), field / "min_scale")) return v;
  if (auto v = check_non_negative(s.max_scale(), field / "max_scale")) return v;
  if (s.max_scale() != 0.0 && s.max_scale() < s.min_scale()) {
    return violation(field / "max_scale", "range", "must be 0 or >= min_scale ", s.min_scale(),
                     ", got ", s.max_scale());
  }
  return std::nullopt;
}

Result check_identity(const v1::StepReport& r, const StreamIdentity& stream) {
  if (r.run_id() != stream.run_id) {
    return violation("report.run_id", "identity", "'", quote(r.run_id()),
                     "' differs from the stream's Hello '", quote(stream.run_id), "'");
  }
  if (r.rank() != stream.rank) {
    return violation("report.rank", "identity", r.rank(), " differs from the stream's Hello ",
                     stream.rank);
  }
  return std::nullopt;
}

Result check_seq(std::uint64_t seq, const StreamIdentity& stream) {
  if (seq == 0) return violation("report.seq", "seq_order", "must be >= 1");
  if (seq > limits::kMaxSeq) {
    return violation("report.seq", "range", "must be <= 2^63-1 (", limits::kMaxSeq, "), got ", seq);
  }
  if (seq <= stream.previous_seq) {
    return violation("report.seq", "seq_order", seq, " is not above the previous seq ",
                     stream.previous_seq, " of this stream");
  }
  return std::nullopt;
}

Result check_step_scalars(const v1::StepReport& r) {
  if (r.step() < 0 || r.step() > limits::kMaxStep) {
    return violation("report.step", "range", "must be in [0, 2^62-1], got ", r.step());
  }
  if (auto v = check_positive(r.loss_scale(), "report.loss_scale")) return v;
  if (auto v = check_positive(r.scale_after(), "report.scale_after")) return v;
  if (!std::isfinite(r.grad_norm()) && !r.found_inf()) {
    return violation("report.grad_norm", "non_finite", "is not finite but found_inf is false, got ",
                     r.grad_norm());
  }
  if (std::isfinite(r.grad_norm()) && r.grad_norm() < 0.0) {
    return violation("report.grad_norm", "range", "must be >= 0, got ", r.grad_norm());
  }
  if (auto v = check_non_negative(r.lr(), "report.lr")) return v;
  if (auto v = check_non_negative(r.step_time_s(), "report.step_time_s")) return v;
  if (r.has_tensor_core_active_ratio()) {
    const double x = r.tensor_core_active_ratio();
    if (auto v = check_finite(x, "report.tensor_core_active_ratio")) return v;
    if (x < 0.0 || x > 1.0) {
      return violation("report.tensor_core_active_ratio", "range", "must be in [0, 1], got ", x);
    }
  }
  if (r.time_unix_ns() < 0) {
    return violation("report.time_unix_ns", "range", "must be >= 0, got ", r.time_unix_ns());
  }
  return std::nullopt;
}

// The first offender's role and phase; its name is a part of its own (refuse_parts).
Result check_first_offender(const v1::StepReport& r) {
  if (!r.has_first_offender()) return std::nullopt;
  const v1::FirstOffender& f = r.first_offender();
  if (!v1::TensorRole_IsValid(f.role())) {
    return violation("report.first_offender.role", "enum", "unknown value ",
                     static_cast<int>(f.role()));
  }
  if (!v1::TensorPhase_IsValid(f.phase())) {
    return violation("report.first_offender.phase", "enum", "unknown value ",
                     static_cast<int>(f.phase()));
  }
  return std::nullopt;
}

Result check_list_sizes(const v1::StepReport& r) {
  if (auto v = check_count(r.tensors_size(), "report.tensors", limits::kMaxTensorsPerReport)) {
    return v;
  }
  if (auto v = check_count(r.quantizers_size(), "report.quantizers",
                           limits::kMaxQuantizersPerReport)) {
    return v;
  }
  if (auto v = check_count(r.fp32_layers_size(), "report.fp32_layers", limits::kMaxLayerNames)) {
    return v;
  }
  if (auto v = check_count(r.bf16_gemms_size(), "report.bf16_gemms", limits::kMaxLayerNames)) {
    return v;
  }
  if (auto v = check_count(r.policy_outcomes_size(), "report.policy_outcomes",
                           limits::kMaxPolicyOutcomes)) {
    return v;
  }
  return check_count(r.notices_size(), "report.notices", limits::kMaxNotices);
}

Result check_policy_outcome(const v1::PolicyOutcome& o, const Field& field) {
  if (auto v =
          check_string(o.policy_id(), field / "policy_id", limits::kShortStringMaxBytes, true)) {
    return v;
  }
  return check_string(o.reason(), field / "reason", limits::kNoticeMaxBytes, false);
}

// --- TensorStats rules ------------------------------------------------------------------------

Result check_tensor_identity(const v1::TensorStats& t, const Field& field) {
  if (auto v = check_string(t.name(), field / "name", limits::kNameMaxBytes, true)) return v;
  if (!v1::TensorRole_IsValid(t.role()) || t.role() == v1::TENSOR_ROLE_UNSPECIFIED) {
    return violation(field / "role", "enum", "must be a known role, got ",
                     static_cast<int>(t.role()));
  }
  if (!v1::TensorPhase_IsValid(t.phase())) {
    return violation(field / "phase", "enum", "unknown value ", static_cast<int>(t.phase()));
  }
  if (t.dtype() != v1::FORMAT_FP32 && t.dtype() != v1::FORMAT_FP16 &&
      t.dtype() != v1::FORMAT_BF16) {
    return violation(field / "dtype", "enum", "must be FP32, FP16 or BF16, got ",
                     static_cast<int>(t.dtype()));
  }
  if (t.has_held() && (!v1::Format_IsValid(t.held()) || t.held() == v1::FORMAT_UNSPECIFIED)) {
    return violation(field / "held", "enum", "must be a known format, got ",
                     static_cast<int>(t.held()));
  }
  if (t.level() != v1::STATS_LEVEL_COUNTS && t.level() != v1::STATS_LEVEL_FULL) {
    return violation(field / "level", "enum", "must be COUNTS or FULL, got ",
                     static_cast<int>(t.level()));
  }
  return std::nullopt;
}

Result check_shape(const v1::TensorStats& t, const Field& field) {
  if (t.shape_size() > limits::kMaxShapeDims) {
    return violation(field / "shape", "shape", "has ", t.shape_size(), " dimensions, at most ",
                     limits::kMaxShapeDims, " allowed");
  }
  if (t.shape_size() == 0) return std::nullopt;
  unsigned __int128 product = 1;
  for (int i = 0; i < t.shape_size(); ++i) {
    if (t.shape(i) < 0) {
      return violation((field / "shape")[i], "shape", "must be >= 0, got ", t.shape(i));
    }
    product *= static_cast<std::uint64_t>(t.shape(i));
    if (product > std::numeric_limits<std::uint64_t>::max()) break;
  }
  if (product != t.numel()) {
    return violation(field / "shape", "shape", "product of the dimensions differs from numel ",
                     t.numel());
  }
  return std::nullopt;
}

Result check_counts(const v1::TensorStats& t, const Field& field) {
  // Summed in 128 bits so that wrap-around cannot hide an inconsistency.
  const unsigned __int128 special =
      static_cast<unsigned __int128>(t.zeros()) + t.nan() + t.pos_inf() + t.neg_inf();
  if (special > t.numel()) {
    return violation(field / "numel", "counts_exceed_numel",
                     "zeros + nan + pos_inf + neg_inf = ", static_cast<std::uint64_t>(special),
                     " exceeds numel ", t.numel());
  }
  return std::nullopt;
}

Result check_magnitudes(const v1::TensorStats& t, const Field& field) {
  if (auto v = check_positive(t.scale(), field / "scale")) return v;
  if (auto v = check_non_negative(t.max_abs(), field / "max_abs")) return v;
  if (auto v = check_non_negative(t.min_abs_nonzero(), field / "min_abs_nonzero")) return v;
  if (t.min_abs_nonzero() > t.max_abs()) {
    return violation(field / "min_abs_nonzero", "range", t.min_abs_nonzero(), " exceeds max_abs ",
                     t.max_abs());
  }
  if (auto v = check_finite(t.sum(), field / "sum")) return v;
  if (auto v = check_non_negative(t.sum_sq(), field / "sum_sq")) return v;
  return std::nullopt;
}

// A sparse binade histogram's size and range: at most kMaxHistogramBins bins, all within
// [kHistogramMinExponent, kHistogramMaxExponent] (a tensor's values, a quantiser's block scales).
Result check_histogram_range(const v1::BinadeHistogram& h, const Field& hfield) {
  if (h.counts_size() > limits::kMaxHistogramBins) {
    return violation(hfield / "counts", "histogram_range", "has ", h.counts_size(),
                     " bins, at most ", limits::kMaxHistogramBins, " allowed");
  }
  if (h.counts_size() > 0) {
    const long long top = static_cast<long long>(h.min_exponent()) + h.counts_size() - 1;
    if (h.min_exponent() < limits::kHistogramMinExponent || top > limits::kHistogramMaxExponent) {
      return violation(hfield / "min_exponent", "histogram_range", "binades [", h.min_exponent(),
                       ", ", top, "] leave [", limits::kHistogramMinExponent, ", ",
                       limits::kHistogramMaxExponent, "]");
    }
  }
  return std::nullopt;
}

Result check_histogram(const v1::TensorStats& t, const Field& field) {
  const bool full = t.level() == v1::STATS_LEVEL_FULL;
  if (full != t.has_histogram()) {
    return violation(field / "histogram", "histogram_presence",
                     full ? "is required with level FULL" : "must be absent with level COUNTS");
  }
  if (!full) return std::nullopt;
  const v1::BinadeHistogram& h = t.histogram();
  const Field hfield = field / "histogram";
  if (auto v = check_histogram_range(h, hfield)) return v;
  unsigned __int128 total = 0;
  for (std::uint64_t c : h.counts()) total += c;
  if (total != proto::finite_nonzero(t)) {
    return violation(hfield / "counts", "histogram_total", "sum ",
                     static_cast<std::uint64_t>(total), " differs from the finite nonzero count ",
                     proto::finite_nonzero(t));
  }
  return std::nullopt;
}

Result check_targets(const v1::TensorStats& t, const Field& field) {
  if (auto v = check_count(t.targets_size(), field / "targets", limits::kMaxTargets)) return v;
  const std::uint64_t values = proto::finite_nonzero(t);
  const Field targets = field / "targets";
  for (int i = 0; i < t.targets_size(); ++i) {
    const v1::TargetCounts& c = t.targets(i);
    const Field tfield = targets[i];
    if (!v1::Format_IsValid(c.format()) || c.format() == v1::FORMAT_UNSPECIFIED) {
      return violation(tfield / "format", "enum", "must be a known format, got ",
                       static_cast<int>(c.format()));
    }
    if (c.scale_log2() < -limits::kMaxScaleLog2 || c.scale_log2() > limits::kMaxScaleLog2) {
      return violation(tfield / "scale_log2", "range", "must be in [", -limits::kMaxScaleLog2, ", ",
                       limits::kMaxScaleLog2, "], got ", c.scale_log2());
    }
    const unsigned __int128 sum =
        static_cast<unsigned __int128>(c.overflow()) + c.underflow() + c.subnormal();
    if (sum > values) {
      return violation(tfield, "target_counts",
                       "overflow + underflow + subnormal = ", static_cast<std::uint64_t>(sum),
                       " exceeds the finite nonzero count ", values);
    }
  }
  return std::nullopt;
}

Result check_tensor(const v1::TensorStats& t, const Field& field) {
  if (auto v = check_tensor_identity(t, field)) return v;
  if (auto v = check_counts(t, field)) return v;
  if (auto v = check_shape(t, field)) return v;
  if (auto v = check_magnitudes(t, field)) return v;
  if (auto v = check_histogram(t, field)) return v;
  if (auto v = check_targets(t, field)) return v;
  return std::nullopt;
}

// --- QuantizerStats rules ---------------------------------------------------------------------

Result check_quantizer_identity(const v1::QuantizerStats& q, const Field& field) {
  if (auto v = check_string(q.name(), field / "name", limits::kNameMaxBytes, true)) return v;
  if (!v1::TensorRole_IsValid(q.role()) || q.role() == v1::TENSOR_ROLE_UNSPECIFIED) {
    return violation(field / "role", "enum", "must be a known role, got ",
                     static_cast<int>(q.role()));
  }
  if (!v1::TensorPhase_IsValid(q.phase())) {
    return violation(field / "phase", "enum", "unknown value ", static_cast<int>(q.phase()));
  }
  return std::nullopt;
}

// The recipe text is what to_string writes (so that one recipe is one text in the store and the
// metrics' labels), and the element format is the recipe's.
Result check_recipe(const v1::QuantizerStats& q, const Field& field) {
  if (auto v = check_string(q.recipe(), field / "recipe", limits::kRecipeMaxBytes, true)) return v;
  std::string error;
  const std::optional<Recipe> recipe = parse_recipe(q.recipe(), &error);
  if (!recipe) {
    return violation(field / "recipe", "recipe", "'", quote(q.recipe()), "' is no recipe: ",
                     error);
  }
  if (const std::string canonical = to_string(*recipe); canonical != q.recipe()) {
    return violation(field / "recipe", "recipe", "'", quote(q.recipe()),
                     "' is not canonical: write '", canonical, "'");
  }
  if (q.element() != proto::to_proto(recipe->element)) {
    return violation(field / "element", "recipe", "format ", static_cast<int>(q.element()),
                     " is not the element format of recipe '", q.recipe(), "'");
  }
  return std::nullopt;
}

Result check_quantizer_counts(const v1::QuantizerStats& q, const Field& field) {
  const std::pair<std::uint64_t, const char*> counts[] = {{q.underflow(), "underflow"},
                                                          {q.subnormal(), "subnormal"},
                                                          {q.saturated(), "saturated"},
                                                          {q.overflow(), "overflow"}};
  unsigned __int128 sum = 0;
  for (const auto& [n, name] : counts) {
    if (n > q.values()) {
      return violation(field / name, "quantizer_counts", n, " exceeds values ", q.values());
    }
    sum += n;
  }
  if (sum > q.values()) {
    return violation(field, "quantizer_counts", "underflow + subnormal + saturated + overflow = ",
                     static_cast<std::uint64_t>(sum), " exceeds values ", q.values());
  }
  if (q.zero_blocks() > q.blocks() || q.saturated_blocks() > q.blocks() ||
      q.nan_blocks() > q.blocks() - q.zero_blocks()) {
    return violation(field / "blocks", "quantizer_counts",
                     "zero_blocks + nan_blocks or saturated_blocks exceed blocks ", q.blocks());
  }
  return std::nullopt;
}

Result check_quantizer_magnitudes(const v1::QuantizerStats& q, const Field& field) {
  if (auto v = check_non_negative(q.amax(), field / "amax")) return v;
  if (auto v = check_non_negative(q.signal_sq(), field / "signal_sq")) return v;
  if (auto v = check_non_negative(q.error_sq(), field / "error_sq")) return v;
  if (auto v = check_non_negative(q.tensor_scale(), field / "tensor_scale")) return v;
  if (q.has_loss_cost()) {
    if (auto v = check_finite(q.loss_cost(), field / "loss_cost")) return v;
  }
  const Field history = field / "amax_history";
  if (auto v = check_count(q.amax_history_size(), history, limits::kMaxAmaxHistory)) return v;
  for (int i = 0; i < q.amax_history_size(); ++i) {
    if (auto v = check_non_negative(q.amax_history(i), history[i])) return v;
  }
  return std::nullopt;
}

Result check_scale_histogram(const v1::QuantizerStats& q, const Field& field) {
  if (!q.has_scale_histogram()) return std::nullopt;
  const v1::BinadeHistogram& h = q.scale_histogram();
  const Field hfield = field / "scale_histogram";
  if (auto v = check_histogram_range(h, hfield)) return v;
  unsigned __int128 total = 0;
  for (std::uint64_t c : h.counts()) total += c;
  // Validated above: zero_blocks + nan_blocks <= blocks.
  const std::uint64_t scaled = q.blocks() - q.zero_blocks() - q.nan_blocks();
  if (total > scaled) {
    return violation(hfield / "counts", "histogram_total", "sum ",
                     static_cast<std::uint64_t>(total), " exceeds the blocks with a scale ",
                     scaled);
  }
  return std::nullopt;
}

Result check_quantizer(const v1::QuantizerStats& q, const Field& field) {
  if (auto v = check_quantizer_identity(q, field)) return v;
  if (auto v = check_recipe(q, field)) return v;
  if (auto v = check_quantizer_counts(q, field)) return v;
  if (auto v = check_quantizer_magnitudes(q, field)) return v;
  return check_scale_histogram(q, field);
}

// A quantiser's layer: none, or one the stream's Hello said the agent can move.
Result check_quantizer_layer(const v1::QuantizerStats& q, const Field& field,
                             const std::vector<std::string>& capable) {
  if (q.layer().empty()) return std::nullopt;
  if (auto v = check_string(q.layer(), field / "layer", limits::kNameMaxBytes, true)) return v;
  if (!std::binary_search(capable.begin(), capable.end(), q.layer())) {
    return violation(field / "layer", "layer", "'", quote(q.layer()),
                     "' is not one of the Hello's bf16_capable_gemms");
  }
  return std::nullopt;
}

Result check_process(const v1::Hello& h) {
  if (h.pid() > limits::kMaxPid) {
    return violation("hello.pid", "range", "must be <= 2^31-1 (", limits::kMaxPid, "), got ",
                     h.pid());
  }
  if (h.process_start_unix_ns() < 0) {
    return violation("hello.process_start_unix_ns", "range", "must be >= 0, got ",
                     h.process_start_unix_ns());
  }
  return std::nullopt;
}

Result check_hello_seqs(const v1::Hello& h) {
  if (h.resume_from_seq() > limits::kMaxSeq) {
    return violation("hello.resume_from_seq", "range", "must be <= 2^63-1, got ",
                     h.resume_from_seq());
  }
  if (h.last_policy_seq() > limits::kMaxSeq) {
    return violation("hello.last_policy_seq", "range", "must be <= 2^63-1, got ",
                     h.last_policy_seq());
  }
  return std::nullopt;
}

// StepReport.history: past steps in increasing order below the report's step, flight_event set
// exactly with a history, within the bounds on steps and tensors. Each history tensor (at the
// full level, valid as report.tensors are) is a part of its own (refuse_parts).
Result check_history_shape(const v1::StepReport& r) {
  if (!v1::FlightEvent_IsValid(r.flight_event())) {
    return violation("report.flight_event", "enum", "unknown value ",
                     static_cast<int>(r.flight_event()));
  }
  if ((r.flight_event() != v1::FLIGHT_EVENT_UNSPECIFIED) != (r.history_size() > 0)) {
    return violation("report.flight_event", "history",
                     "must be set exactly when report.history is present");
  }
  if (auto v = check_count(r.history_size(), "report.history", limits::kMaxHistorySteps)) {
    return v;
  }
  int tensors = 0;
  const Field history = "report.history";
  for (int i = 0; i < r.history_size(); ++i) {
    const v1::HistoryStep& h = r.history(i);
    const Field field = history[i];
    const std::int64_t floor = i == 0 ? 0 : r.history(i - 1).step() + 1;
    if (h.step() < floor || h.step() >= r.step()) {
      return violation(field / "step", "range", "must be in [", floor, ", ", r.step(),
                       ") (increasing, below the report's step), got ", h.step());
    }
    if (auto v = check_positive(h.loss_scale(), field / "loss_scale")) return v;
    tensors += h.tensors_size();
    if (tensors > limits::kMaxHistoryTensors) {
      return violation(field / "tensors", "too_many", "the history holds more than ",
                       limits::kMaxHistoryTensors, " tensors");
    }
  }
  return std::nullopt;
}

Result check_history_tensor(const v1::TensorStats& t, const Field& field) {
  if (t.level() != v1::STATS_LEVEL_FULL) {
    return violation(field / "level", "history", "must be STATS_LEVEL_FULL");
  }
  return check_tensor(t, field);
}

// Keeps the entries of `list` that `check(entry, field)` passes; for each other one, appends a
// Refusal whose notice is `notice(entry, violation)`. Fields name the index as sent.
template <typename T, typename Check, typename Notice>
void keep_valid(google::protobuf::RepeatedPtrField<T>* list, const Field& field, const Check& check,
                const Notice& notice, std::vector<Refusal>& refused) {
  int kept = 0;
  for (int i = 0; i < list->size(); ++i) {
    if (Result v = check(list->Get(i), field[i])) {
      std::string line = notice(list->Get(i), *v);
      refused.push_back(Refusal{std::move(*v), std::move(line)});
      continue;
    }
    if (kept != i) list->SwapElements(kept, i);
    ++kept;
  }
  while (list->size() > kept) list->RemoveLast();
}

// A refused part's notice: which part, and the rule it broke by the field inside the part and
// the reason token (no numbers of this step, so that the same part refused again is the same
// notice).
std::string part_notice(std::string_view part, std::string_view name, const Violation& v,
                        std::string_view list_field) {
  std::string where = v.field;
  if (where.starts_with(list_field)) {
    const std::size_t close = where.find(']', list_field.size());
    where = close == std::string::npos ? std::string() : where.substr(close + 1);
    if (where.starts_with(".")) where.erase(0, 1);
  }
  std::string line = "server: refused " + std::string(part) + " '" + quote(name) + "' alone (" +
                     v.reason + (where.empty() ? "" : " at " + where) +
                     "); the rest of its step is stored";
  return text::clean_text(line, limits::kNoticeMaxBytes);
}

// A list of layer names: each one clean text of at most kNameMaxBytes, a bad one refused alone.
void keep_valid_names(google::protobuf::RepeatedPtrField<std::string>* names,
                      std::string_view field, std::string_view part,
                      std::vector<Refusal>& refused) {
  keep_valid(
      names, std::string(field),
      [](const std::string& name, const Field& f) {
        return check_string(name, f, limits::kNameMaxBytes, true);
      },
      [field, part](const std::string& name, const Violation& v) {
        return part_notice(part, name, v, field);
      },
      refused);
}

// Takes out of a report that passed the report's own rules every part that breaks a rule of its
// own.
std::vector<Refusal> refuse_parts(v1::StepReport& r, const StreamIdentity& stream) {
  std::vector<Refusal> refused;
  const auto tensor_notice = [](std::string_view list) {
    return [list](const v1::TensorStats& t, const Violation& v) {
      return part_notice("tensor", t.name(), v, list);
    };
  };
  keep_valid(r.mutable_tensors(), "report.tensors", check_tensor, tensor_notice("report.tensors"),
             refused);
  for (int i = 0; i < r.history_size(); ++i) {
    const std::string field = (Field("report.history")[i] / "tensors").str();
    keep_valid(r.mutable_history(i)->mutable_tensors(), field, check_history_tensor,
               tensor_notice(field), refused);
  }
  keep_valid(
      r.mutable_quantizers(), "report.quantizers",
      [&stream](const v1::QuantizerStats& q, const Field& field) -> Result {
        if (auto v = check_quantizer(q, field)) return v;
        return check_quantizer_layer(q, field, stream.bf16_capable_gemms);
      },
      [](const v1::QuantizerStats& q, const Violation& v) {
        return part_notice("quantizer", q.name(), v, "report.quantizers");
      },
      refused);
  if (r.has_first_offender()) {
    v1::FirstOffender& f = *r.mutable_first_offender();
    if (Result v =
            check_string(f.tensor(), "report.first_offender.tensor", limits::kNameMaxBytes, true)) {
      std::string stored =
          f.tensor().empty() ? "(unnamed)" : text::clean_text(f.tensor(), limits::kNameMaxBytes);
      std::string line = "server: first offender '" + quote(f.tensor()) + "' (" + v->reason +
                         "): stored as '" + stored + "'";
      refused.push_back(Refusal{std::move(*v), text::clean_text(line, limits::kNoticeMaxBytes)});
      f.set_tensor(std::move(stored));
    }
  }
  keep_valid_names(r.mutable_fp32_layers(), "report.fp32_layers", "fp32 layer", refused);
  keep_valid_names(r.mutable_bf16_gemms(), "report.bf16_gemms", "bf16 layer", refused);
  keep_valid(
      r.mutable_policy_outcomes(), "report.policy_outcomes", check_policy_outcome,
      [](const v1::PolicyOutcome& o, const Violation& v) {
        return part_notice("outcome of policy", o.policy_id(), v, "report.policy_outcomes");
      },
      refused);
  keep_valid(
      r.mutable_notices(), "report.notices",
      [](const std::string& notice, const Field& field) {
        return check_string(notice, field, limits::kNoticeMaxBytes, true);
      },
      [](const std::string& notice, const Violation& v) {
        return part_notice("notice", notice, v, "report.notices");
      },
      refused);
  return refused;
}

}  // namespace

std::string quote(std::string_view text) {
  std::string out;
  std::size_t i = 0;
  while (i < text.size()) {
    const std::size_t n = text::clean_char(text, i);
    if (out.size() + std::max<std::size_t>(n, 1) > limits::kQuoteMaxBytes) break;
    if (n == 0) {
      // One '?' per control character, and per byte that starts no valid sequence.
      out.push_back('?');
      i += std::max<std::size_t>(text::utf8_sequence(text, i), 1);
    } else {
      out.append(text.substr(i, n));
      i += n;
    }
  }
  if (i < text.size()) out += "...(truncated, " + std::to_string(text.size()) + " bytes)";
  return out;
}

std::optional<Violation> check_run_id(std::string_view run_id, std::string_view field) {
  const std::string f(field);
  if (run_id.empty() || run_id.size() > limits::kRunIdMaxBytes) {
    return violation(f, "run_id", "must be 1..", limits::kRunIdMaxBytes, " characters, got ",
                     run_id.size());
  }
  for (char c : run_id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) return violation(f, "run_id", "may use only [A-Za-z0-9._-]");
  }
  return std::nullopt;
}

std::optional<Violation> check_tensor_stats(const v1::TensorStats& t, const std::string& field) {
  return check_tensor(t, field);
}

std::optional<Violation> check_quantizer_stats(const v1::QuantizerStats& q,
                                               const std::string& field) {
  return check_quantizer(q, field);
}

std::optional<Violation> validate_hello(const v1::Hello& h) {
  if (auto v = check_run_id(h.run_id(), "hello.run_id")) return v;
  if (auto v = check_world(h.rank(), h.world_size(), "hello")) return v;
  if (auto v = check_string(h.host(), "hello.host", limits::kNameMaxBytes, false)) return v;
  if (auto v = check_string(h.trainer(), "hello.trainer", limits::kNameMaxBytes, false)) return v;
  if (auto v =
          check_string(h.precision(), "hello.precision", limits::kShortStringMaxBytes, false)) {
    return v;
  }
  if (!v1::Format_IsValid(h.compute_format())) {
    return violation("hello.compute_format", "enum", "unknown value ",
                     static_cast<int>(h.compute_format()));
  }
  if (h.has_scaler()) {
    if (auto v = check_scaler(h.scaler(), "hello.scaler")) return v;
  }
  if (auto v = check_string(h.agent_version(), "hello.agent_version", limits::kShortStringMaxBytes,
                            false)) {
    return v;
  }
  if (auto v = check_hello_seqs(h)) return v;
  if (auto v = check_process(h)) return v;
  if (h.data_parallel_size() > h.world_size()) {
    return violation("hello.data_parallel_size", "range", "must be in [0, world_size ",
                     h.world_size(), "], got ", h.data_parallel_size());
  }
  if (auto v = check_string_list(h.fp32_capable_layers(), "hello.fp32_capable_layers",
                                 limits::kMaxLayerNames, limits::kNameMaxBytes)) {
    return v;
  }
  return check_string_list(h.bf16_capable_gemms(), "hello.bf16_capable_gemms",
                           limits::kMaxLayerNames, limits::kNameMaxBytes);
}

StreamIdentity stream_identity(const v1::Hello& h) {
  StreamIdentity s{h.run_id(), h.rank(), 0, {}};
  s.bf16_capable_gemms.assign(h.bf16_capable_gemms().begin(), h.bf16_capable_gemms().end());
  std::sort(s.bf16_capable_gemms.begin(), s.bf16_capable_gemms.end());
  return s;
}

ReportVerdict validate_report(v1::StepReport& r, const StreamIdentity& stream) {
  const auto report_rules = [&]() -> Result {
    if (auto v = check_identity(r, stream)) return v;
    if (auto v = check_seq(r.seq(), stream)) return v;
    if (auto v = check_step_scalars(r)) return v;
    if (auto v = check_first_offender(r)) return v;
    if (auto v = check_list_sizes(r)) return v;
    return check_history_shape(r);
  };
  ReportVerdict verdict;
  verdict.rejected = report_rules();
  if (!verdict.rejected) verdict.refused = refuse_parts(r, stream);
  return verdict;
}

}  // namespace ampscope::server
