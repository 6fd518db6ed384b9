// The C API (ampscope/agent/c_api.h) over the C++ Agent. Every entry point catches everything:
// no exception crosses into C. Structs from the caller are read through read_struct (never
// past their struct_size) and structs for the caller written through write_struct; enums
// convert through c_vocabulary.h.
#include "ampscope/agent/c_api.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ampscope/agent/agent.h"
#include "ampscope/loss_scale.h"
#include "ampscope/recipe.h"
#include "ampscope/tensor_stats.h"
#include "c_vocabulary.h"

using ampscope::agent::Agent;
using ampscope::agent::AgentConfig;
using ampscope::agent::Status;
namespace c = ampscope::agent::c;

// A layout that ends inside its 8-byte alignment would let an older caller's tail padding
// (counted in its sizeof) overlap the next version's first field.
static_assert(AMPSCOPE_RUN_INFO_SIZE_V1 % alignof(ampscope_run_info) == 0);
static_assert(AMPSCOPE_TENSOR_VIEW_SIZE_V1 % alignof(ampscope_tensor_view) == 0);
static_assert(AMPSCOPE_STEP_INFO_SIZE_V1 % alignof(ampscope_step_info) == 0);
static_assert(offsetof(ampscope_run_info, struct_size) == 0 &&
              offsetof(ampscope_tensor_view, struct_size) == 0 &&
              offsetof(ampscope_step_info, struct_size) == 0 &&
              offsetof(ampscope_scaler_change, struct_size) == 0 &&
              offsetof(ampscope_scaler_ops, struct_size) == 0 &&
              offsetof(ampscope_overrides_ops, struct_size) == 0 &&
              offsetof(ampscope_agent_counters, struct_size) == 0 &&
              offsetof(ampscope_loss_scale_rule, struct_size) == 0 &&
              offsetof(ampscope_recipe_change, struct_size) == 0 &&
              offsetof(ampscope_recipe_ops, struct_size) == 0 &&
              offsetof(ampscope_quantizer, struct_size) == 0 &&
              offsetof(ampscope_recipe_counts, struct_size) == 0);
// Each layout ends on its alignment, so that a later field never overlaps an older caller's
// tail padding (the step info's ABI 2 layout is where ABI 7 appends).
static_assert(offsetof(ampscope_step_info, bf16_gemms) % alignof(ampscope_step_info) == 0 &&
              AMPSCOPE_QUANTIZER_SIZE_V1 % alignof(ampscope_quantizer) == 0 &&
              AMPSCOPE_RECIPE_COUNTS_SIZE_V1 % alignof(ampscope_recipe_counts) == 0 &&
              AMPSCOPE_RECIPE_OPS_SIZE_V1 % alignof(ampscope_recipe_ops) == 0);
static_assert(AMPSCOPE_AGENT_COUNTERS_SIZE_V1 % alignof(ampscope_agent_counters) == 0);
static_assert(AMPSCOPE_TENSOR_STATS_SIZE_V1 % alignof(ampscope_tensor_stats) == 0 &&
              offsetof(ampscope_tensor_stats, struct_size) == 0);
static_assert(AMPSCOPE_HISTOGRAM_BINS == ampscope::kHistogramBins);
// The C numbers of the formats are ampscope::Format's (c_vocabulary.h checks the same).
static_assert(sizeof(ampscope_target) == 8 && sizeof(ampscope_target_counts) == 32);
// The C state is ampscope::LossScaleState, field for field.
static_assert(sizeof(ampscope_loss_scale_state) == sizeof(ampscope::LossScaleState) &&
              offsetof(ampscope_loss_scale_state, scale) ==
                  offsetof(ampscope::LossScaleState, scale) &&
              offsetof(ampscope_loss_scale_state, hysteresis_tracker) ==
                  offsetof(ampscope::LossScaleState, hysteresis_tracker) &&
              offsetof(ampscope_loss_scale_state, growth_tracker) ==
                  offsetof(ampscope::LossScaleState, growth_tracker));

struct ampscope_agent_config {
  AgentConfig config;
  std::string last_error;
};

namespace {

std::string below_first_layout(const char* what, std::size_t size, std::size_t size_v1) {
  return std::string(what) + ".struct_size is " + std::to_string(size) +
         ", below its first layout (" + std::to_string(size_v1) +
         " bytes): initialise it with its _INIT macro";
}

// The caller's struct of any layout as this library's: the bytes within its struct_size (at
// most this library's size), the rest zero, which every field reads as its default. Returns
// empty, or a message naming `what` when the pointer is NULL or the struct is smaller than its
// first layout.
template <typename T>
std::string read_struct(const T* in, std::size_t size_v1, const char* what, T* out) {
  if (in == nullptr) return std::string(what) + " must not be NULL";
  const std::size_t size = in->struct_size;
  if (size < size_v1) return below_first_layout(what, size, size_v1);
  *out = T{};
  std::memcpy(static_cast<void*>(out), static_cast<const void*>(in), std::min(size, sizeof(T)));
  out->struct_size = static_cast<std::uint32_t>(std::min(size, sizeof(T)));
  return {};
}

// Writes `value` into the caller's struct up to its struct_size, which then says how much.
template <typename T>
std::string write_struct(const T& value, std::size_t size_v1, const char* what, T* out) {
  if (out == nullptr) return std::string(what) + " must not be NULL";
  const std::size_t size = std::min<std::size_t>(out->struct_size, sizeof(T));
  if (size < size_v1) return below_first_layout(what, out->struct_size, size_v1);
  std::memcpy(static_cast<void*>(out), static_cast<const void*>(&value), size);
  out->struct_size = static_cast<std::uint32_t>(size);
  return {};
}

void write_reason(const std::string& text, char* reason, std::size_t reason_size);

// A caller's tensor view as the agent's, with the storage its shape may point to.
struct CView {
  ampscope::agent::TensorView view;
  std::int64_t flat_shape[1] = {0};  // a view without a shape is one dimension of numel
  CView() = default;
  CView(const CView&) = delete;
  CView& operator=(const CView&) = delete;
};

// Empty when `view` is valid (then out->view holds it), else a message naming the field.
std::string read_view(const ampscope_tensor_view* view, CView* out) {
  ampscope_tensor_view in;
  if (std::string e = read_struct(view, AMPSCOPE_TENSOR_VIEW_SIZE_V1, "view", &in); !e.empty()) {
    return e;
  }
  if (in.name == nullptr) return "view.name is NULL";
  const auto role = c::from_c_role(in.role);
  const auto phase = c::from_c_phase(in.phase);
  const auto dtype = c::from_c_format(in.dtype);
  const auto device = c::from_c_device(in.device);
  const auto held = in.has_held != 0 ? c::from_c_format(in.held) : std::nullopt;
  const char* bad = !role                                   ? "role"
                    : !phase                                ? "phase"
                    : !dtype                                ? "dtype"
                    : !device                               ? "device"
                    : in.has_held != 0 && !held             ? "held"
                    : in.rank < 0 || in.rank > 8            ? "rank (0..8)"
                    : in.rank > 0 && in.shape == nullptr    ? "shape (NULL with rank > 0)"
                    : in.rank == 0 && in.numel < 0          ? "numel"
                                                            : nullptr;
  if (bad != nullptr) return std::string("view of '") + in.name + "': bad " + bad;
  ampscope::agent::TensorView& v = out->view;
  v.name = in.name;
  v.role = *role;
  v.phase = *phase;
  v.dtype = *dtype;
  v.data = in.data;
  out->flat_shape[0] = in.numel;
  if (in.rank > 0) {
    v.shape = std::span<const std::int64_t>(in.shape, static_cast<std::size_t>(in.rank));
  } else {
    v.shape = out->flat_shape;
  }
  v.device = *device;
  v.stream = in.stream;
  v.scale = in.scale != 0.0 ? in.scale : 1.0;
  v.micro_step = in.micro_step;
  v.order = in.order;
  v.held = held;
  return {};
}

ampscope_target to_c_target(const ampscope::TargetSpec& t) {
  return {static_cast<int32_t>(t.format), t.scale_log2};
}

// The most targets one statistics call counts (a bound on what a caller's struct can ask).
constexpr std::uint32_t kMaxCTargets = 64;

// A caller's binade histogram (`bins` counts from min_exponent on) into *out; empty, or a
// message naming the fields.
std::string read_histogram(std::uint32_t bins, const std::uint64_t* counts,
                           std::int32_t min_exponent, const char* bins_field,
                           const char* counts_field, ampscope::BinadeHistogram* out) {
  if (bins > static_cast<std::uint32_t>(ampscope::kHistogramBins) ||
      (bins > 0 && counts == nullptr)) {
    return std::string(bins_field) + ": at most " + std::to_string(ampscope::kHistogramBins) +
           ", with " + counts_field;
  }
  if (bins > 0) {
    out->min_exponent = min_exponent;
    out->counts.assign(counts, counts + bins);
  }
  return {};
}

// The caller's statistics as TensorStats; empty, or a message naming the field.
std::string from_c_stats(const ampscope_tensor_stats* stats, ampscope::TensorStats* out) {
  ampscope_tensor_stats in;
  if (std::string e = read_struct(stats, AMPSCOPE_TENSOR_STATS_SIZE_V1, "stats", &in);
      !e.empty()) {
    return e;
  }
  ampscope::TensorStats& s = *out;
  if (std::string e = read_histogram(in.histogram_bins, in.histogram_counts,
                                     in.histogram_min_exponent, "stats.histogram_bins",
                                     "histogram_counts", &s.histogram);
      !e.empty()) {
    return e;
  }
  if (in.num_targets > kMaxCTargets || (in.num_targets > 0 && in.targets == nullptr)) {
    return "stats.num_targets: at most " + std::to_string(kMaxCTargets) + ", with targets";
  }
  s.numel = in.numel;
  s.zeros = in.zeros;
  s.nan = in.nan;
  s.pos_inf = in.pos_inf;
  s.neg_inf = in.neg_inf;
  s.max_abs = in.max_abs;
  s.min_abs_nonzero = in.min_abs_nonzero;
  s.sum = in.sum;
  s.sum_sq = in.sum_sq;
  for (std::uint32_t i = 0; i < in.num_targets; ++i) {
    const ampscope_target_counts& t = in.targets[i];
    const auto format = c::from_c_format(t.target.format);
    if (!format) return "stats.targets[" + std::to_string(i) + "]: bad format";
    s.targets.push_back({{*format, t.target.scale_log2}, t.overflow, t.underflow, t.subnormal});
  }
  return {};
}

// Computes into the caller's struct: its targets say what to count.
template <typename Compute>
ampscope_status stats_into(ampscope_tensor_stats* out, int32_t dtype, char* reason,
                           std::size_t reason_size, Compute&& compute) {
  try {
    ampscope_tensor_stats in;
    if (std::string e = read_struct(out, AMPSCOPE_TENSOR_STATS_SIZE_V1, "out", &in); !e.empty()) {
      write_reason(e, reason, reason_size);
      return AMPSCOPE_INVALID_ARGUMENT;
    }
    const auto format = c::from_c_format(dtype);
    const char* bad = !format || !ampscope::is_stats_storage_format(*format)
                          ? "dtype: fp32, fp16, bf16, e4m3 or e5m2 storage"
                      : in.histogram_counts == nullptr
                          ? "out.histogram_counts: room for AMPSCOPE_HISTOGRAM_BINS counts"
                      : in.num_targets > kMaxCTargets || (in.num_targets > 0 && !in.targets)
                          ? "out.num_targets: at most 64, with targets"
                          : nullptr;
    if (bad != nullptr) {
      write_reason(std::string("bad ") + bad, reason, reason_size);
      return AMPSCOPE_INVALID_ARGUMENT;
    }
    std::vector<ampscope::TargetSpec> targets;
    for (std::uint32_t i = 0; i < in.num_targets; ++i) {
      const auto f = c::from_c_format(in.targets[i].target.format);
      if (!f) {
        write_reason("bad out.targets[" + std::to_string(i) + "].target.format", reason,
                     reason_size);
        return AMPSCOPE_INVALID_ARGUMENT;
      }
      targets.push_back({*f, in.targets[i].target.scale_log2});
    }
    const ampscope::TensorStats s = compute(*format, std::span<const ampscope::TargetSpec>(targets));
    in.numel = s.numel;
    in.zeros = s.zeros;
    in.nan = s.nan;
    in.pos_inf = s.pos_inf;
    in.neg_inf = s.neg_inf;
    in.max_abs = s.max_abs;
    in.min_abs_nonzero = s.min_abs_nonzero;
    in.sum = s.sum;
    in.sum_sq = s.sum_sq;
    in.histogram_min_exponent = s.histogram.min_exponent;
    in.histogram_bins = static_cast<std::uint32_t>(s.histogram.counts.size());
    std::copy(s.histogram.counts.begin(), s.histogram.counts.end(), in.histogram_counts);
    for (std::size_t i = 0; i < s.targets.size(); ++i) {
      in.targets[i].overflow = s.targets[i].overflow;
      in.targets[i].underflow = s.targets[i].underflow;
      in.targets[i].subnormal = s.targets[i].subnormal;
    }
    (void)write_struct(in, AMPSCOPE_TENSOR_STATS_SIZE_V1, "out", out);
    return AMPSCOPE_OK;
  } catch (const std::exception& e) {
    write_reason(e.what(), reason, reason_size);
    return AMPSCOPE_INVALID_ARGUMENT;  // the kernels throw on bad arguments (a target's scale)
  } catch (...) {
    write_reason("internal error", reason, reason_size);
    return AMPSCOPE_INTERNAL;
  }
}

// Calls a trainer's accept-or-refuse callback, `call(reason, reason_size)` (0: accepted):
// empty when it accepted, else its one-line reason ("refused by the trainer" when it left the
// buffer empty).
template <typename Call>
std::string ask_trainer(Call&& call) {
  char reason[512] = {0};
  if (call(reason, sizeof(reason)) == 0) return {};
  reason[sizeof(reason) - 1] = '\0';
  return reason[0] != '\0' ? std::string(reason) : std::string("refused by the trainer");
}

// An optional field of a change as the C struct's has_ flag and value (0 when unset).
template <typename U, typename T>
void put_optional(const std::optional<U>& from, int* has, T* to) {
  *has = from.has_value() ? 1 : 0;
  *to = from ? static_cast<T>(*from) : T{};
}

// A change handed to a trainer's schedule callback (the scaler's or the recipe's).
template <typename Ops, typename Change>
std::string schedule_with(const Ops& ops, void* user, const Change& change) {
  return ask_trainer([&](char* reason, std::size_t size) {
    return ops.schedule(user, &change, reason, size);
  });
}

// The scaler as a C trainer exposes it.
class CScaler final : public ampscope::agent::ScalerControl {
 public:
  CScaler(const ampscope_scaler_ops& ops, void* user, const ampscope::agent::ScalerSettings& base)
      : ops_(ops), user_(user), base_(base) {}
  ampscope::agent::ScalerSettings settings() const override {
    ampscope::agent::ScalerSettings s = base_;
    s.scale = ops_.scale(user_);
    if (ops_.min_scale > 0) s.min_scale = ops_.min_scale;
    if (ops_.max_scale > 0) s.max_scale = ops_.max_scale;
    return s;
  }
  std::string schedule(const ampscope::agent::ScalerChange& c) override {
    ampscope_scaler_change cc{};
    cc.struct_size = sizeof(cc);
    cc.effective_from_step = c.effective_from_step;
    put_optional(c.scale, &cc.has_scale, &cc.scale);
    put_optional(c.growth_factor, &cc.has_growth_factor, &cc.growth_factor);
    put_optional(c.backoff_factor, &cc.has_backoff_factor, &cc.backoff_factor);
    put_optional(c.growth_interval, &cc.has_growth_interval, &cc.growth_interval);
    put_optional(c.hysteresis, &cc.has_hysteresis, &cc.hysteresis);
    put_optional(c.min_scale, &cc.has_min_scale, &cc.min_scale);
    put_optional(c.max_scale, &cc.has_max_scale, &cc.max_scale);
    return schedule_with(ops_, user_, cc);
  }

 private:
  ampscope_scaler_ops ops_;
  void* user_;
  ampscope::agent::ScalerSettings base_;  // the run info's scaler: kind, factors, bounds
};

// The FP32 override set as a C trainer exposes it. The capable layers are asked for once, at
// attach, so that no callback runs on the agent's own threads.
class COverrides final : public ampscope::agent::PrecisionOverrides {
 public:
  COverrides(const ampscope_overrides_ops& ops, void* user, std::vector<std::string> capable)
      : ops_(ops), user_(user), capable_(std::move(capable)) {}
  std::vector<std::string> capable_layers() const override { return capable_; }
  std::string replace(const std::vector<std::string>& layers, std::int64_t from_step) override {
    std::vector<const char*> names;
    names.reserve(layers.size());
    for (const std::string& l : layers) names.push_back(l.c_str());
    return ask_trainer([&](char* reason, std::size_t size) {
      return ops_.replace(user_, names.data(), names.size(), from_step, reason, size);
    });
  }

 private:
  ampscope_overrides_ops ops_;
  void* user_;
  std::vector<std::string> capable_;
};

// The trainer's capable layers through its count-then-fill callback.
std::vector<std::string> ask_capable_layers(const ampscope_overrides_ops& ops, void* user) {
  const std::size_t count = ops.capable_layers(user, nullptr, 0);
  std::vector<const char*> names(count, nullptr);
  const std::size_t filled = std::min(count, ops.capable_layers(user, names.data(), count));
  std::vector<std::string> out;
  for (std::size_t i = 0; i < filled; ++i) {
    if (names[i] != nullptr && names[i][0] != '\0') out.emplace_back(names[i]);
  }
  return out;
}

// A caller's override ops (`what` names them in messages) as COverrides, its capable layers
// asked for now; empty, or a message.
std::string make_overrides(const ampscope_overrides_ops* ops, void* user, const char* what,
                           std::unique_ptr<COverrides>* out) {
  ampscope_overrides_ops in;
  if (std::string e = read_struct(ops, AMPSCOPE_OVERRIDES_OPS_SIZE_V1, what, &in); !e.empty()) {
    return e;
  }
  if (in.capable_layers == nullptr || in.replace == nullptr) {
    return std::string(what) + ".capable_layers and " + what + ".replace are required";
  }
  *out = std::make_unique<COverrides>(in, user, ask_capable_layers(in, user));
  return {};
}

// A delayed recipe's settings as a C trainer takes them. Whether the run is delayed is read at
// attach: the agent asks delayed() on its reader thread, where no callback may run.
class CRecipe final : public ampscope::agent::RecipeControl {
 public:
  CRecipe(const ampscope_recipe_ops& ops, void* user) : ops_(ops), user_(user) {}
  bool delayed() const override { return ops_.delayed != 0; }
  std::string schedule(const ampscope::agent::RecipeChange& c) override {
    ampscope_recipe_change cc{};
    cc.struct_size = sizeof(cc);
    cc.effective_from_step = c.effective_from_step;
    put_optional(c.amax_history_length, &cc.has_amax_history_length, &cc.amax_history_length);
    put_optional(c.margin, &cc.has_margin, &cc.margin);
    return schedule_with(ops_, user_, cc);
  }

 private:
  ampscope_recipe_ops ops_;
  void* user_;
};

// A caller's quantiser as the agent's (counts aside), with the recipe it names parsed.
struct CQuantizer {
  ampscope::Recipe recipe;
  ampscope::agent::QuantizerView view;
};

// Empty when `quantizer` is valid, else a message naming the field.
std::string read_quantizer(const ampscope_quantizer* quantizer, CQuantizer* out) {
  ampscope_quantizer in;
  if (std::string e = read_struct(quantizer, AMPSCOPE_QUANTIZER_SIZE_V1, "quantizer", &in);
      !e.empty()) {
    return e;
  }
  if (in.recipe == nullptr) return "quantizer.recipe is NULL";
  std::string why;
  const std::optional<ampscope::Recipe> recipe = ampscope::parse_recipe(in.recipe, &why);
  if (!recipe) return "quantizer.recipe: '" + std::string(in.recipe) + "' is not a recipe: " + why;
  if (in.amax_history_length > 0 && in.amax_history == nullptr) {
    return "quantizer.amax_history is NULL with amax_history_length " +
           std::to_string(in.amax_history_length);
  }
  // Zero for a caller of an older layout (read_struct clears what it did not send).
  if (in.has_loss_cost != 0 && !std::isfinite(in.loss_cost)) {
    return "quantizer.loss_cost is not finite: " + std::to_string(in.loss_cost);
  }
  out->recipe = *recipe;
  ampscope::agent::QuantizerView& q = out->view;
  q.layer = in.layer != nullptr ? std::string_view(in.layer) : std::string_view();
  q.what_if = in.what_if != 0;
  if (in.amax_history_length > 0) q.amax_history = {in.amax_history, in.amax_history_length};
  if (in.has_loss_cost != 0) q.loss_cost = in.loss_cost;
  return {};
}

// The tensor of a quantiser: its identity, and for counting, host data of a storage format.
void take_identity(const ampscope::agent::TensorView& t, ampscope::agent::QuantizerView* q) {
  q->name = t.name;
  q->role = t.role;
  q->phase = t.phase;
  q->micro_step = t.micro_step;
}

// The scalar counts, which RecipeCounts and the C struct name alike, either way.
template <typename From, typename To>
void copy_count_fields(const From& f, To* t) {
  t->values = f.values;
  t->nonfinite = f.nonfinite;
  t->underflow = f.underflow;
  t->subnormal = f.subnormal;
  t->saturated = f.saturated;
  t->overflow = f.overflow;
  t->amax = f.amax;
  t->signal_sq = f.signal_sq;
  t->error_sq = f.error_sq;
  t->tensor_scale = f.tensor_scale;
  t->blocks = f.blocks;
  t->zero_blocks = f.zero_blocks;
  t->saturated_blocks = f.saturated_blocks;
  t->nan_blocks = f.nan_blocks;
}

// The caller's counts as RecipeCounts of `recipe`; empty, or a message naming the field.
std::string from_c_counts(const ampscope_recipe_counts* counts, const ampscope::Recipe& recipe,
                          ampscope::RecipeCounts* out) {
  ampscope_recipe_counts in;
  if (std::string e = read_struct(counts, AMPSCOPE_RECIPE_COUNTS_SIZE_V1, "counts", &in);
      !e.empty()) {
    return e;
  }
  ampscope::RecipeCounts& c = *out;
  c.recipe = recipe;
  copy_count_fields(in, &c);
  return read_histogram(in.scale_histogram_bins, in.scale_histogram_counts,
                        in.scale_histogram_min_exponent, "counts.scale_histogram_bins",
                        "scale_histogram_counts", &c.scale_histogram);
}

// RecipeCounts into the caller's struct `in` (read already; its array has room for them all).
void to_c_counts(const ampscope::RecipeCounts& c, ampscope_recipe_counts* in) {
  copy_count_fields(c, in);
  in->scale_histogram_min_exponent = c.scale_histogram.min_exponent;
  in->scale_histogram_bins = static_cast<std::uint32_t>(c.scale_histogram.counts.size());
  std::copy(c.scale_histogram.counts.begin(), c.scale_histogram.counts.end(),
            in->scale_histogram_counts);
}

// Rows of the tensor's last dimension; a 1-D or shapeless tensor is one row (row length 0), as
// the agent's recipe_targets and `ampscope stats --target` read a tensor.
std::size_t recipe_row_length(const ampscope::agent::TensorView& t) {
  return t.shape.size() >= 2 ? static_cast<std::size_t>(std::max<std::int64_t>(0, t.shape.back()))
                             : 0;
}

// A reason into a caller's buffer (when it gave one), cut to fit and NUL-terminated.
void write_reason(const std::string& text, char* reason, std::size_t reason_size) {
  if (reason == nullptr || reason_size == 0) return;
  const std::size_t n = std::min(text.size(), reason_size - 1);
  std::memcpy(reason, text.data(), n);
  reason[n] = '\0';
}

// The C rule as the core's, or a reason.
std::string to_rule(const ampscope_loss_scale_rule* in, ampscope::LossScaleRule* out) {
  ampscope_loss_scale_rule r{};
  if (std::string e = read_struct(in, AMPSCOPE_LOSS_SCALE_RULE_SIZE_V1, "rule", &r); !e.empty()) {
    return e;
  }
  const auto kind = c::from_c_scaler_kind(r.kind);
  if (!kind) return "rule.kind " + std::to_string(r.kind) + " is not an ampscope_scaler_kind";
  *out = ampscope::LossScaleRule{*kind,        r.growth_factor, r.backoff_factor,
                                 r.growth_interval, r.hysteresis, r.min_scale, r.max_scale};
  return {};
}

ampscope_loss_scale_rule to_c_rule(const ampscope::LossScaleRule& r) {
  ampscope_loss_scale_rule out{};
  out.struct_size = sizeof(out);
  out.kind = static_cast<int32_t>(r.kind);
  out.growth_factor = r.growth_factor;
  out.backoff_factor = r.backoff_factor;
  out.growth_interval = r.growth_interval;
  out.hysteresis = r.hysteresis;
  out.min_scale = r.min_scale;
  out.max_scale = r.max_scale;
  return out;
}

ampscope::LossScaleState to_state(const ampscope_loss_scale_state& s) {
  return {s.scale, s.hysteresis_tracker, s.growth_tracker};
}

ampscope_loss_scale_state to_c_state(const ampscope::LossScaleState& s) {
  return {s.scale, s.hysteresis_tracker, s.growth_tracker};
}

std::string to_run_info(const ampscope_run_info& run, ampscope::agent::RunInfo* r) {
  if (run.host != nullptr) r->host = run.host;
  if (run.trainer != nullptr) r->trainer = run.trainer;
  if (run.precision != nullptr) r->precision = run.precision;
  const auto format = c::from_c_format(run.compute_format);
  if (!format) return "run.compute_format: unknown format " + std::to_string(run.compute_format);
  r->compute_format = *format;
  const auto kind = c::from_c_scaler_kind(run.scaler_kind);
  if (!kind) return "run.scaler_kind: unknown kind " + std::to_string(run.scaler_kind);
  ampscope::agent::ScalerSettings& s = r->scaler;
  s.kind = *kind;
  if (run.loss_scale > 0) s.scale = run.loss_scale;
  if (run.growth_factor > 0) s.growth_factor = run.growth_factor;
  if (run.backoff_factor > 0) s.backoff_factor = run.backoff_factor;
  if (run.growth_interval > 0) s.growth_interval = run.growth_interval;
  if (run.hysteresis < 0) return "run.hysteresis: must be >= 0";
  s.hysteresis = run.hysteresis;
  if (!(run.min_scale >= 0) || !(run.max_scale >= 0)) {
    return "run.min_scale, run.max_scale: must be >= 0 (0: none)";
  }
  if (run.max_scale > 0 && run.max_scale < run.min_scale) {
    return "run.max_scale: below run.min_scale";
  }
  s.min_scale = run.min_scale;
  s.max_scale = run.max_scale;
  return {};
}

}  // namespace

struct ampscope_agent {
  std::unique_ptr<Agent> agent;
  std::unique_ptr<CScaler> scaler;
  std::unique_ptr<COverrides> overrides;
  std::unique_ptr<COverrides> gemms;
  std::unique_ptr<CRecipe> recipe;
  ampscope::agent::ScalerSettings base_scaler;
  // begin_step returned 1 and end_step has not come yet: quantisers are recorded (and only then
  // counted). Written by the step calls, which the caller makes on its training thread.
  std::atomic<bool> recording{false};
  mutable std::mutex mu;             // guards the strings below
  mutable std::string last_error;
  std::string notice;

  ampscope_status fail(ampscope_status s, std::string message) const noexcept {
    try {
      std::lock_guard lock(mu);
      last_error = std::move(message);
    } catch (...) {
    }
    return s;
  }
  ampscope_status result(const Status& s) const {
    if (s.ok()) return AMPSCOPE_OK;
    return fail(c::to_c(s.code), s.message);
  }
  // Inside a catch block: the exception in flight as AMPSCOPE_INTERNAL, with its message.
  ampscope_status internal(const char* where) const noexcept {
    try {
      throw;
    } catch (const std::exception& e) {
      try {
        return fail(AMPSCOPE_INTERNAL, std::string(where) + ": " + e.what());
      } catch (...) {
      }
    } catch (...) {
      try {
        return fail(AMPSCOPE_INTERNAL, std::string(where) + ": unknown error");
      } catch (...) {
      }
    }
    return AMPSCOPE_INTERNAL;
  }
};

extern "C" {

uint32_t ampscope_agent_abi_version(void) { return AMPSCOPE_AGENT_ABI_VERSION; }

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
  try {
    if (key == nullptr || value == nullptr) {
      config->last_error = "key and value must not be NULL";
      return AMPSCOPE_INVALID_ARGUMENT;
    }
    config->last_error = ampscope::agent::set_option(config->config, key, value);
    return config->last_error.empty() ? AMPSCOPE_OK : AMPSCOPE_INVALID_ARGUMENT;
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
  try {
    ampscope_run_info in;
    std::string error = read_struct(run, AMPSCOPE_RUN_INFO_SIZE_V1, "run", &in);
    ampscope::agent::RunInfo r;
    if (error.empty()) error = to_run_info(in, &r);
    if (!error.empty()) {
      config->last_error = std::move(error);
      return AMPSCOPE_INVALID_ARGUMENT;
    }
    auto handle = std::make_unique<ampscope_agent>();
    handle->base_scaler = r.scaler;
    const Status s = Agent::create(config->config, r, &handle->agent);
    if (!s.ok()) {
      config->last_error = s.message;
      return c::to_c(s.code);
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
    const Status s =
        agent->agent->shutdown(std::chrono::milliseconds(std::max<int64_t>(0, timeout_ms)));
    result = c::to_c(s.code);
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
    ampscope_scaler_ops in;
    if (std::string e = read_struct(ops, AMPSCOPE_SCALER_OPS_SIZE_V1, "ops", &in); !e.empty()) {
      return agent->fail(AMPSCOPE_INVALID_ARGUMENT, std::move(e));
    }
    if (in.schedule == nullptr || in.scale == nullptr) {
      return agent->fail(AMPSCOPE_INVALID_ARGUMENT, "ops.schedule and ops.scale are required");
    }
    auto scaler = std::make_unique<CScaler>(in, user, agent->base_scaler);
    const Status s = agent->agent->attach_scaler(scaler.get());
    if (s.ok()) agent->scaler = std::move(scaler);
    return agent->result(s);
  } catch (...) {
    return agent->internal("attach_scaler");
  }
}

ampscope_status ampscope_agent_attach_overrides(ampscope_agent* agent,
                                                const ampscope_overrides_ops* ops, void* user) {
  if (agent == nullptr) return AMPSCOPE_INVALID_ARGUMENT;
  try {
    if (ops == nullptr) {
      const Status s = agent->agent->attach_overrides(nullptr);
      if (s.ok()) agent->overrides.reset();
      return agent->result(s);
    }
    std::unique_ptr<COverrides> overrides;
    if (std::string e = make_overrides(ops, user, "ops", &overrides); !e.empty()) {
      return agent->fail(AMPSCOPE_INVALID_ARGUMENT, std::move(e));
    }
    const Status s = agent->agent->attach_overrides(overrides.get());
    if (s.ok()) agent->overrides = std::move(overrides);
    return agent->result(s);
  } catch (...) {
    return agent->internal("attach_overrides");
  }
}

ampscope_status ampscope_agent_attach_gemm_precision(ampscope_agent* agent,
                                                    const ampscope_overrides_ops* gemms,
                                                    void* gemms_user,
                                                    const ampscope_recipe_ops* recipe,
                                                    void* recipe_user) {
  if (agent == nullptr) return AMPSCOPE_INVALID_ARGUMENT;
  try {
    std::unique_ptr<COverrides> g;
    if (gemms != nullptr) {
      if (std::string e = make_overrides(gemms, gemms_user, "gemms", &g); !e.empty()) {
        return agent->fail(AMPSCOPE_INVALID_ARGUMENT, std::move(e));
      }
    }
    std::unique_ptr<CRecipe> r;
    if (recipe != nullptr) {
      ampscope_recipe_ops in;
      if (std::string e = read_struct(recipe, AMPSCOPE_RECIPE_OPS_SIZE_V1, "recipe", &in);
          !e.empty()) {
        return agent->fail(AMPSCOPE_INVALID_ARGUMENT, std::move(e));
      }
      if (in.schedule == nullptr) {
        return agent->fail(AMPSCOPE_INVALID_ARGUMENT, "recipe.schedule is required");
      }
      r = std::make_unique<CRecipe>(in, recipe_user);
    }
    const Status s = agent->agent->attach_gemm_precision(g.get(), r.get());
    if (s.ok()) {
      agent->gemms = std::move(g);
      agent->recipe = std::move(r);
    }
    return agent->result(s);
  } catch (...) {
    return agent->internal("attach_gemm_precision");
  }
}

int ampscope_agent_begin_step(ampscope_agent* agent, int64_t step) {
  if (agent == nullptr) return 0;
  const bool wanted = agent->agent->begin_step(step);  // noexcept
  agent->recording.store(wanted, std::memory_order_relaxed);
  return wanted ? 1 : 0;
}

ampscope_status ampscope_agent_observe(ampscope_agent* agent, const ampscope_tensor_view* view) {
  if (agent == nullptr) return AMPSCOPE_INVALID_ARGUMENT;
  try {
    CView v;
    if (std::string e = read_view(view, &v); !e.empty()) {
      return agent->fail(AMPSCOPE_INVALID_ARGUMENT, std::move(e));
    }
    agent->agent->observe(v.view);
    return AMPSCOPE_OK;
  } catch (...) {
    return agent->internal("observe");
  }
}

ampscope_status ampscope_agent_observe_stats(ampscope_agent* agent,
                                             const ampscope_tensor_view* view,
                                             const ampscope_tensor_stats* stats) {
  if (agent == nullptr) return AMPSCOPE_INVALID_ARGUMENT;
  try {
    CView v;
    if (std::string e = read_view(view, &v); !e.empty()) {
      return agent->fail(AMPSCOPE_INVALID_ARGUMENT, std::move(e));
    }
    ampscope::TensorStats s;
    if (std::string e = from_c_stats(stats, &s); !e.empty()) {
      return agent->fail(AMPSCOPE_INVALID_ARGUMENT, std::move(e));
    }
    return agent->result(agent->agent->observe_stats(v.view, s));
  } catch (...) {
    return agent->internal("observe_stats");
  }
}

ampscope_status ampscope_agent_observe_quantizer(ampscope_agent* agent,
                                                const ampscope_tensor_view* tensor,
                                                const ampscope_quantizer* quantizer) {
  if (agent == nullptr) return AMPSCOPE_INVALID_ARGUMENT;
  try {
    CView v;
    CQuantizer q;
    std::string e = read_view(tensor, &v);
    if (e.empty()) e = read_quantizer(quantizer, &q);
    if (e.empty() && v.view.device != ampscope::Device::kCpu) {
      e = "tensor '" + std::string(v.view.name) + "': counted on the host only (copy it there)";
    }
    if (e.empty() && !ampscope::is_stats_storage_format(v.view.dtype)) {
      e = "tensor '" + std::string(v.view.name) + "': bad dtype: fp32, fp16, bf16, e4m3 or e5m2 "
          "storage";
    }
    if (!e.empty()) return agent->fail(AMPSCOPE_INVALID_ARGUMENT, std::move(e));
    if (!agent->recording.load(std::memory_order_relaxed)) return AMPSCOPE_OK;
    std::size_t n = 1;
    for (const std::int64_t d : v.view.shape) {
      n *= static_cast<std::size_t>(std::max<std::int64_t>(0, d));
    }
    if (v.view.data == nullptr && n > 0) {
      return agent->fail(AMPSCOPE_INVALID_ARGUMENT,
                         "tensor '" + std::string(v.view.name) + "': data is NULL");
    }
    take_identity(v.view, &q.view);
    try {
      q.view.counts = ampscope::recipe_counts(v.view.data, n, v.view.dtype,
                                              recipe_row_length(v.view), q.recipe);
    } catch (const std::exception& x) {  // a recipe that cannot read the dtype, ragged rows
      return agent->fail(AMPSCOPE_INVALID_ARGUMENT,
                         "tensor '" + std::string(v.view.name) + "': " + x.what());
    }
    return agent->result(agent->agent->observe_quantizer(q.view));
  } catch (...) {
    return agent->internal("observe_quantizer");
  }
}

ampscope_status ampscope_agent_observe_quantizer_counts(ampscope_agent* agent,
                                                       const ampscope_tensor_view* tensor,
                                                       const ampscope_quantizer* quantizer,
                                                       const ampscope_recipe_counts* counts) {
  if (agent == nullptr) return AMPSCOPE_INVALID_ARGUMENT;
  try {
    CView v;
    CQuantizer q;
    std::string e = read_view(tensor, &v);
    if (e.empty()) e = read_quantizer(quantizer, &q);
    if (e.empty()) e = from_c_counts(counts, q.recipe, &q.view.counts);
    if (!e.empty()) return agent->fail(AMPSCOPE_INVALID_ARGUMENT, std::move(e));
    take_identity(v.view, &q.view);
    return agent->result(agent->agent->observe_quantizer(q.view));
  } catch (...) {
    return agent->internal("observe_quantizer_counts");
  }
}

int ampscope_agent_stats_target(ampscope_agent* agent, const ampscope_tensor_view* view,
                                ampscope_target* target) {
  if (agent == nullptr || target == nullptr) return 0;
  try {
    CView v;
    if (std::string e = read_view(view, &v); !e.empty()) {
      agent->fail(AMPSCOPE_INVALID_ARGUMENT, std::move(e));
      return 0;
    }
    const std::optional<ampscope::TargetSpec> t = agent->agent->stats_target(v.view);
    if (!t) return 0;
    *target = to_c_target(*t);
    return 1;
  } catch (...) {
    agent->internal("stats_target");
    return 0;
  }
}

int ampscope_agent_wanted(ampscope_agent* agent, int32_t role, int32_t phase) {
  if (agent == nullptr) return 0;
  const auto r = c::from_c_role(role);
  const auto p = c::from_c_phase(phase);
  if (!r || !p) return 0;
  return agent->agent->wanted(*r, *p);  // noexcept
}

ampscope_status ampscope_agent_mark_phase(ampscope_agent* agent, int32_t phase) {
  if (agent == nullptr) return AMPSCOPE_INVALID_ARGUMENT;
  try {
    const auto p = c::from_c_step_phase(phase);
    if (!p) return agent->fail(AMPSCOPE_INVALID_ARGUMENT, "unknown step phase");
    agent->agent->mark_phase(*p);  // noexcept
    return AMPSCOPE_OK;
  } catch (...) {
    return agent->internal("mark_phase");
  }
}

ampscope_status ampscope_agent_end_step(ampscope_agent* agent, const ampscope_step_info* info) {
  if (agent == nullptr) return AMPSCOPE_INVALID_ARGUMENT;
  try {
    ampscope_step_info in;
    if (std::string e = read_struct(info, AMPSCOPE_STEP_INFO_SIZE_V1, "info", &in); !e.empty()) {
      return agent->fail(AMPSCOPE_INVALID_ARGUMENT, std::move(e));
    }
    if (in.num_fp32_layers > 0 && in.fp32_layers == nullptr) {
      return agent->fail(AMPSCOPE_INVALID_ARGUMENT, "info.fp32_layers is NULL");
    }
    if (in.num_bf16_gemms > 0 && in.bf16_gemms == nullptr) {
      return agent->fail(AMPSCOPE_INVALID_ARGUMENT, "info.bf16_gemms is NULL");
    }
    ampscope::agent::StepInfo s;
    s.step = in.step;
    s.loss = in.loss;
    s.loss_scale = in.loss_scale != 0.0 ? in.loss_scale : 1.0;
    s.scale_after = in.scale_after != 0.0 ? in.scale_after : 1.0;
    s.found_inf = in.found_inf != 0;
    s.skipped = in.skipped != 0;
    s.grad_norm = in.grad_norm;
    s.lr = in.lr;
    s.tokens = in.tokens;
    s.step_time_s = in.step_time_s;
    s.optimizer_steps = in.optimizer_steps;
    if (in.has_val_loss != 0) s.val_loss = in.val_loss;
    for (std::size_t i = 0; i < in.num_fp32_layers; ++i) {
      if (in.fp32_layers[i] != nullptr) s.fp32_layers.emplace_back(in.fp32_layers[i]);
    }
    for (std::size_t i = 0; i < in.num_bf16_gemms; ++i) {
      if (in.bf16_gemms[i] != nullptr) s.bf16_gemms.emplace_back(in.bf16_gemms[i]);
    }
    agent->recording.store(false, std::memory_order_relaxed);
    agent->agent->end_step(s);
    return AMPSCOPE_OK;
  } catch (...) {
    return agent->internal("end_step");
  }
}

ampscope_status ampscope_agent_flush(ampscope_agent* agent, int64_t timeout_ms) {
  if (agent == nullptr) return AMPSCOPE_INVALID_ARGUMENT;
  try {
    return agent->result(
        agent->agent->flush(std::chrono::milliseconds(std::max<int64_t>(0, timeout_ms))));
  } catch (...) {
    return agent->internal("flush");
  }
}

ampscope_status ampscope_agent_get_counters(const ampscope_agent* agent,
                                            ampscope_agent_counters* out) {
  if (agent == nullptr) return AMPSCOPE_INVALID_ARGUMENT;
  try {
    const ampscope::agent::Counters c = agent->agent->counters();
    ampscope_agent_counters v{};
    v.struct_size = sizeof(v);
    v.steps = c.steps;
    v.reports_spooled = c.reports_spooled;
    v.reports_acked = c.reports_acked;
    v.dropped_reports = c.dropped_reports;
    v.dropped_tensors = c.dropped_tensors;
    v.rejected_reports = c.rejected_reports;
    v.spool_bytes = c.spool_bytes;
    v.reconnects = c.reconnects;
    v.policies_applied = c.policies_applied;
    v.policies_refused = c.policies_refused;
    v.training_thread_s = c.training_thread_s;
    v.connected = c.connected ? 1 : 0;
    v.refused_calls = c.refused_calls;
    v.lockstep_timeouts = c.lockstep_timeouts;
    if (std::string e = write_struct(v, AMPSCOPE_AGENT_COUNTERS_SIZE_V1, "out", out); !e.empty()) {
      return agent->fail(AMPSCOPE_INVALID_ARGUMENT, std::move(e));
    }
    return AMPSCOPE_OK;
  } catch (...) {
    return agent->internal("get_counters");
  }
}

size_t ampscope_agent_notice_count(const ampscope_agent* agent) {
  if (agent == nullptr) return 0;
  return agent->agent->notices().size();  // noexcept
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
  try {
    std::lock_guard lock(agent->mu);
    return agent->last_error.c_str();
  } catch (...) {
    return "";
  }
}

ampscope_status ampscope_agent_add_notice(ampscope_agent* agent, const char* text) {
  if (agent == nullptr) return AMPSCOPE_INVALID_ARGUMENT;
  if (text == nullptr) return agent->fail(AMPSCOPE_INVALID_ARGUMENT, "text must not be NULL");
  try {
    return agent->result(agent->agent->add_notice(text));
  } catch (...) {
    return agent->internal("add_notice");
  }
}

ampscope_status ampscope_agent_policy_vote(ampscope_agent* agent, uint64_t* received_seq,
                                           int* fallback) {
  if (agent == nullptr) return AMPSCOPE_INVALID_ARGUMENT;
  if (received_seq == nullptr || fallback == nullptr) {
    return agent->fail(AMPSCOPE_INVALID_ARGUMENT, "received_seq and fallback must not be NULL");
  }
  const ampscope::agent::PolicyVote v = agent->agent->policy_vote();  // noexcept
  *received_seq = v.received_seq;
  *fallback = v.fallback ? 1 : 0;
  return AMPSCOPE_OK;
}

ampscope_status ampscope_agent_policy_agreed(ampscope_agent* agent, uint64_t received_seq,
                                             int fallback) {
  if (agent == nullptr) return AMPSCOPE_INVALID_ARGUMENT;
  try {
    return agent->result(agent->agent->policy_agreed({received_seq, fallback != 0}));
  } catch (...) {
    return agent->internal("policy_agreed");
  }
}

ampscope_status ampscope_loss_scale_defaults(int32_t kind, ampscope_loss_scale_rule* rule,
                                             ampscope_loss_scale_state* state) {
  try {
    const auto k = c::from_c_scaler_kind(kind);
    if (!k || rule == nullptr || state == nullptr) return AMPSCOPE_INVALID_ARGUMENT;
    ampscope::LossScaleRule r = ampscope::gradscaler_rule();
    float scale = ampscope::kGradScalerInitScale;
    if (*k == ampscope::ScalerKind::kHysteresis) {
      r = ampscope::megatron_rule();
      scale = ampscope::kMegatronInitScale;
    }
    r.kind = *k;
    if (!write_struct(to_c_rule(r), AMPSCOPE_LOSS_SCALE_RULE_SIZE_V1, "rule", rule).empty()) {
      return AMPSCOPE_INVALID_ARGUMENT;
    }
    *state = to_c_state(ampscope::initial_loss_scale_state(scale, r));
    return AMPSCOPE_OK;
  } catch (...) {
    return AMPSCOPE_INTERNAL;
  }
}

ampscope_status ampscope_loss_scale_update(ampscope_loss_scale_state* state,
                                           const ampscope_loss_scale_rule* rule, int found_inf) {
  try {
    ampscope::LossScaleRule r;
    if (state == nullptr || !to_rule(rule, &r).empty()) return AMPSCOPE_INVALID_ARGUMENT;
    ampscope::LossScaleState s = to_state(*state);
    ampscope::update_loss_scale_state(s, r, found_inf != 0);
    *state = to_c_state(s);
    return AMPSCOPE_OK;
  } catch (...) {
    return AMPSCOPE_INTERNAL;
  }
}

ampscope_status ampscope_loss_scale_apply_change(ampscope_loss_scale_rule* rule,
                                                 ampscope_loss_scale_state* state,
                                                 const ampscope_scaler_change* change,
                                                 char* reason, size_t reason_size) {
  try {
    ampscope::LossScaleRule r;
    if (std::string e = to_rule(rule, &r); !e.empty()) {
      write_reason(e, reason, reason_size);
      return AMPSCOPE_INVALID_ARGUMENT;
    }
    ampscope_scaler_change cc{};
    if (state == nullptr) {
      write_reason("state must not be NULL", reason, reason_size);
      return AMPSCOPE_INVALID_ARGUMENT;
    }
    if (std::string e = read_struct(change, AMPSCOPE_SCALER_CHANGE_SIZE_V1, "change", &cc);
        !e.empty()) {
      write_reason(e, reason, reason_size);
      return AMPSCOPE_INVALID_ARGUMENT;
    }
    ampscope::LossScaleChange c;
    if (cc.has_scale) c.scale = static_cast<float>(cc.scale);
    if (cc.has_growth_factor) c.growth_factor = cc.growth_factor;
    if (cc.has_backoff_factor) c.backoff_factor = cc.backoff_factor;
    if (cc.has_growth_interval) c.growth_interval = cc.growth_interval;
    if (cc.has_hysteresis) c.hysteresis = cc.hysteresis;
    if (cc.has_min_scale) c.min_scale = static_cast<float>(cc.min_scale);
    if (cc.has_max_scale) c.max_scale = static_cast<float>(cc.max_scale);
    ampscope::LossScaleState s = to_state(*state);
    if (std::string e = ampscope::apply_loss_scale_change(&r, &s, c); !e.empty()) {
      write_reason(e, reason, reason_size);
      return AMPSCOPE_INVALID_ARGUMENT;
    }
    // `rule` was read above, so its struct_size is a valid layout: the write cannot fail.
    (void)write_struct(to_c_rule(r), AMPSCOPE_LOSS_SCALE_RULE_SIZE_V1, "rule", rule);
    *state = to_c_state(s);
    return AMPSCOPE_OK;
  } catch (...) {
    write_reason("internal error", reason, reason_size);
    return AMPSCOPE_INTERNAL;
  }
}

ampscope_status ampscope_compute_stats(const void* data, uint64_t n, int32_t dtype,
                                       ampscope_tensor_stats* out, char* reason,
                                       size_t reason_size) {
  return stats_into(out, dtype, reason, reason_size, [&](ampscope::Format f, auto targets) {
    return ampscope::compute_stats(data, static_cast<std::size_t>(n), f, targets);
  });
}

ampscope_status ampscope_scale_and_compute_stats(void* data, uint64_t n, int32_t dtype,
                                                 float factor, ampscope_tensor_stats* out,
                                                 char* reason, size_t reason_size) {
  return stats_into(out, dtype, reason, reason_size, [&](ampscope::Format f, auto targets) {
    return ampscope::scale_and_compute_stats(data, static_cast<std::size_t>(n), f, factor,
                                             targets);
  });
}

ampscope_status ampscope_count_recipe(const void* data, uint64_t n, int32_t dtype,
                                      uint64_t row_length, const char* recipe,
                                      ampscope_recipe_counts* out, char* reason,
                                      size_t reason_size) {
  try {
    ampscope_recipe_counts in;
    std::string e = read_struct(out, AMPSCOPE_RECIPE_COUNTS_SIZE_V1, "out", &in);
    const auto format = c::from_c_format(dtype);
    std::optional<ampscope::Recipe> r;
    if (e.empty() && (!format || !ampscope::is_stats_storage_format(*format))) {
      e = "bad dtype: fp32, fp16, bf16, e4m3 or e5m2 storage";
    } else if (e.empty() && in.scale_histogram_counts == nullptr) {
      e = "bad out.scale_histogram_counts: room for AMPSCOPE_HISTOGRAM_BINS counts";
    } else if (e.empty() && recipe == nullptr) {
      e = "recipe is NULL";
    } else if (e.empty() && data == nullptr && n > 0) {
      e = "data is NULL";
    } else if (e.empty()) {
      std::string why;
      r = ampscope::parse_recipe(recipe, &why);
      if (!r) e = "recipe: '" + std::string(recipe) + "' is not a recipe: " + why;
    }
    if (!e.empty()) {
      write_reason(e, reason, reason_size);
      return AMPSCOPE_INVALID_ARGUMENT;
    }
    const ampscope::RecipeCounts counts =
        ampscope::recipe_counts(data, static_cast<std::size_t>(n), *format,
                                static_cast<std::size_t>(row_length), *r);
    to_c_counts(counts, &in);
    (void)write_struct(in, AMPSCOPE_RECIPE_COUNTS_SIZE_V1, "out", out);
    return AMPSCOPE_OK;
  } catch (const std::exception& e) {
    write_reason(e.what(), reason, reason_size);
    return AMPSCOPE_INVALID_ARGUMENT;  // the recipe refuses the dtype, or ragged rows
  } catch (...) {
    write_reason("internal error", reason, reason_size);
    return AMPSCOPE_INTERNAL;
  }
}

}  // extern "C"
