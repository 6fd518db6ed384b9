// save_state()/restore(): the engine as a versioned JSON document. Doubles are written with
// round-trip precision, so a restored engine compares and decides bit for bit like the
// original. Version 2 (version 1 had no per-layer precision: it restores with none recorded);
// a document of another version is refused rather than guessed at.
#include <algorithm>

#include <nlohmann/json.hpp>

#include "ampscope/policy/policy_engine.h"

namespace ampscope::policy {

using nlohmann::json;

namespace {

constexpr const char* kDocumentKind = "ampscope.policy.state";
constexpr int kVersion = 2;
constexpr int kOldestVersion = 1;

template <typename T>
json opt(const std::optional<T>& v) {
  return v ? json(*v) : json(nullptr);
}

template <typename T>
std::optional<T> get_opt(const json& j, const char* key) {
  const json& v = j.at(key);
  if (v.is_null()) return std::nullopt;
  return v.get<T>();
}

json settings_to_json(const ScalerSettings& s) {
  return json{{"loss_scale", opt(s.loss_scale)},       {"growth_interval", opt(s.growth_interval)},
              {"growth_factor", opt(s.growth_factor)}, {"backoff_factor", opt(s.backoff_factor)},
              {"hysteresis", opt(s.hysteresis)},       {"min_scale", opt(s.min_scale)},
              {"max_scale", opt(s.max_scale)}};
}

ScalerSettings settings_from_json(const json& j) {
  ScalerSettings s;
  s.loss_scale = get_opt<double>(j, "loss_scale");
  s.growth_interval = get_opt<std::int64_t>(j, "growth_interval");
  s.growth_factor = get_opt<double>(j, "growth_factor");
  s.backoff_factor = get_opt<double>(j, "backoff_factor");
  s.hysteresis = get_opt<int>(j, "hysteresis");
  s.min_scale = get_opt<double>(j, "min_scale");
  s.max_scale = get_opt<double>(j, "max_scale");
  return s;
}

json config_to_json(const EngineConfig& c) {
  const HeadroomParams& h = c.headroom;
  const Fp32FallbackParams& f = c.fp32_fallback;
  const GemmPrecisionParams& g = c.gemm_precision;
  return json{
      {"mode", std::string(mode_name(c.mode))},
      {"lead_steps", c.lead_steps},
      {"apply_grace_steps", c.apply_grace_steps},
      {"static_params", settings_to_json(c.static_params)},
      {"headroom",
       {{"margin_binades", h.margin_binades},
        {"window_steps", h.window_steps},
        {"update_every_steps", h.update_every_steps},
        {"raise_after_evaluations", h.raise_after_evaluations},
        {"min_raise_binades", h.min_raise_binades},
        {"lower_tolerance_binades", h.lower_tolerance_binades},
        {"min_scale", h.min_scale},
        {"max_scale", h.max_scale},
        {"local_growth_interval", h.local_growth_interval},
        {"blind_drop_binades", h.blind_drop_binades}}},
      {"fp32_fallback",
       {{"enabled", f.enabled},
        {"window_reports", f.window_reports},
        {"min_reports", f.min_reports},
        {"range_trim_fraction", f.range_trim_fraction},
        {"max_tensors", f.max_tensors}}},
      {"gemm_precision",
       {{"enabled", g.enabled},
        {"window_reports", g.window_reports},
        {"min_reports", g.min_reports},
        {"max_underflow_share", g.max_underflow_share},
        {"max_saturated_share", g.max_saturated_share},
        {"sqnr_margin_db", g.sqnr_margin_db},
        {"max_bf16_share", g.max_bf16_share},
        {"promote_reports", g.promote_reports},
        {"promote_factor", g.promote_factor},
        {"min_dwell_steps", g.min_dwell_steps},
        {"spike_reports", g.spike_reports},
        {"max_amax_margin", g.max_amax_margin},
        {"min_loss_cost", g.min_loss_cost},
        {"loss_cost_reports", g.loss_cost_reports},
        {"loss_cost_z", g.loss_cost_z}}},
  };
}

EngineConfig config_from_json(const json& j) {
  EngineConfig c;
  const auto mode = parse_mode(j.at("mode").get<std::string>());
  if (!mode) throw PolicyError("state: unknown mode '" + j.at("mode").get<std::string>() + "'");
  c.mode = *mode;
  c.lead_steps = j.at("lead_steps").get<int>();
  c.apply_grace_steps = j.at("apply_grace_steps").get<int>();
  c.static_params = settings_from_json(j.at("static_params"));
  const json& h = j.at("headroom");
  c.headroom.margin_binades = h.at("margin_binades").get<int>();
  c.headroom.window_steps = h.at("window_steps").get<int>();
  c.headroom.update_every_steps = h.at("update_every_steps").get<int>();
  c.headroom.raise_after_evaluations = h.at("raise_after_evaluations").get<int>();
  c.headroom.min_raise_binades = h.at("min_raise_binades").get<int>();
  c.headroom.lower_tolerance_binades = h.at("lower_tolerance_binades").get<int>();
  c.headroom.min_scale = h.at("min_scale").get<double>();
  c.headroom.max_scale = h.at("max_scale").get<double>();
  c.headroom.local_growth_interval = h.at("local_growth_interval").get<std::int64_t>();
  c.headroom.blind_drop_binades = h.at("blind_drop_binades").get<int>();
  const json& f = j.at("fp32_fallback");
  c.fp32_fallback.enabled = f.at("enabled").get<bool>();
  c.fp32_fallback.window_reports = f.at("window_reports").get<int>();
  c.fp32_fallback.min_reports = f.at("min_reports").get<int>();
  c.fp32_fallback.range_trim_fraction = f.at("range_trim_fraction").get<double>();
  c.fp32_fallback.max_tensors = f.at("max_tensors").get<int>();
  // Version 1 has none: the per-layer precision off, as it then was.
  if (const auto it = j.find("gemm_precision"); it != j.end()) {
    const json& g = *it;
    GemmPrecisionParams& p = c.gemm_precision;
    p.enabled = g.at("enabled").get<bool>();
    p.window_reports = g.at("window_reports").get<int>();
    p.min_reports = g.at("min_reports").get<int>();
    p.max_underflow_share = g.at("max_underflow_share").get<double>();
    p.max_saturated_share = g.at("max_saturated_share").get<double>();
    p.sqnr_margin_db = g.at("sqnr_margin_db").get<double>();
    p.max_bf16_share = g.at("max_bf16_share").get<double>();
    p.promote_reports = g.at("promote_reports").get<int>();
    p.promote_factor = g.at("promote_factor").get<double>();
    p.min_dwell_steps = g.at("min_dwell_steps").get<std::int64_t>();
    p.spike_reports = g.at("spike_reports").get<int>();
    p.max_amax_margin = g.at("max_amax_margin").get<int>();
    // Added within version 2: a document written before keeps the defaults.
    p.min_loss_cost = g.value("min_loss_cost", p.min_loss_cost);
    p.loss_cost_reports = g.value("loss_cost_reports", p.loss_cost_reports);
    p.loss_cost_z = g.value("loss_cost_z", p.loss_cost_z);
  }
  return c;
}

json scaler_to_json(const ScalerConfig& s) {
  return json{{"kind", std::string(scaler_kind_name(s.kind))},
              {"scale", s.scale},
              {"growth_factor", s.growth_factor},
              {"backoff_factor", s.backoff_factor},
              {"growth_interval", s.growth_interval},
              {"hysteresis", s.hysteresis},
              {"min_scale", s.min_scale},
              {"max_scale", s.max_scale}};
}

ScalerConfig scaler_from_json(const json& j) {
  ScalerConfig s;
  const auto kind = parse_scaler_kind(j.at("kind").get<std::string>());
  if (!kind)
    throw PolicyError("state: unknown scaler kind '" + j.at("kind").get<std::string>() + "'");
  s.kind = *kind;
  s.scale = j.at("scale").get<double>();
  s.growth_factor = j.at("growth_factor").get<double>();
  s.backoff_factor = j.at("backoff_factor").get<double>();
  s.growth_interval = j.at("growth_interval").get<std::int64_t>();
  s.hysteresis = j.at("hysteresis").get<int>();
  s.min_scale = j.at("min_scale").get<double>();
  s.max_scale = j.at("max_scale").get<double>();
  return s;
}

json decision_to_json(const PolicyDecision& d) {
  return json{{"policy_id", d.policy_id},
              {"effective_from_step", d.effective_from_step},
              {"scaler", settings_to_json(d.scaler)},
              {"fp32_tensors", d.fp32_tensors},
              {"bf16_gemms", d.bf16_gemms},
              {"amax_history_length", opt(d.amax_history_length)},
              {"amax_margin", opt(d.amax_margin)},
              {"reason", d.reason}};
}

PolicyDecision decision_from_json(const json& j) {
  PolicyDecision d;
  d.policy_id = j.at("policy_id").get<std::uint64_t>();
  d.effective_from_step = j.at("effective_from_step").get<std::int64_t>();
  d.scaler = settings_from_json(j.at("scaler"));
  d.fp32_tensors = j.at("fp32_tensors").get<std::vector<std::string>>();
  d.reason = j.at("reason").get<std::string>();
  if (j.contains("bf16_gemms")) {  // from version 2
    d.bf16_gemms = j.at("bf16_gemms").get<std::vector<std::string>>();
    d.amax_history_length = get_opt<int>(j, "amax_history_length");
    d.amax_margin = get_opt<int>(j, "amax_margin");
  }
  return d;
}

std::vector<std::string> sorted_names(const json& j, const char* what) {
  auto names = j.get<std::vector<std::string>>();
  if (!std::is_sorted(names.begin(), names.end())) {
    throw PolicyError(std::string("state: ") + what + " is not sorted");
  }
  return names;
}

}  // namespace

// Friend of PolicyEngine: reads and writes its private state.
struct StateCodec {
  static json flags_to_json(const PolicyEngine::StepFlags& f) {
    return json{{"steps", f.steps}, {"flags", f.flags}};
  }
  static PolicyEngine::StepFlags flags_from_json(const json& j, const std::string& owner) {
    PolicyEngine::StepFlags f;
    f.steps = j.at("steps").get<std::vector<std::int64_t>>();
    f.flags = j.at("flags").get<std::vector<std::uint8_t>>();
    if (f.steps.size() != f.flags.size()) {
      throw PolicyError("state: " + owner + " has " + std::to_string(f.steps.size()) +
                        " steps but " + std::to_string(f.flags.size()) + " flags");
    }
    return f;
  }
  static json finding_to_json(const PolicyEngine::GemmFinding& f) {
    return json{
        {"text", f.text}, {"recipe", f.recipe}, {"severity", f.severity}, {"step", f.step}};
  }
  static PolicyEngine::GemmFinding finding_from_json(const json& j) {
    return {j.at("text").get<std::string>(), j.at("recipe").get<std::string>(),
            j.at("severity").get<double>(), j.at("step").get<std::int64_t>()};
  }

  static json costs_to_json(const PolicyEngine::CostWindow& w) {
    return json{{"steps", w.steps}, {"sums", w.sums}, {"counts", w.counts}};
  }
  static PolicyEngine::CostWindow costs_from_json(const json& j, const std::string& owner) {
    PolicyEngine::CostWindow w;
    w.steps = j.at("steps").get<std::vector<std::int64_t>>();
    w.sums = j.at("sums").get<std::vector<double>>();
    w.counts = j.at("counts").get<std::vector<int>>();
    const bool counted = std::all_of(w.counts.begin(), w.counts.end(), [](int n) { return n > 0; });
    if (w.steps.size() != w.sums.size() || w.steps.size() != w.counts.size() || !counted ||
        !std::is_sorted(w.steps.begin(), w.steps.end())) {
      throw PolicyError("state: " + owner + " loss costs are not one sorted entry per step");
    }
    return w;
  }

  static json gemms_to_json(const PolicyEngine& e) {
    json tracks = json::array();
    for (const auto& k : e.gemm_tracks_) {
      tracks.push_back({{"layer", k.layer},
                        {"applied", flags_to_json(k.applied)},
                        {"what_if", flags_to_json(k.what_if)},
                        {"worst", finding_to_json(k.worst)},
                        {"bf16_from_step", k.bf16_from_step},
                        {"costed", k.costed},
                        {"cost", costs_to_json(k.cost)},
                        {"what_if_cost", costs_to_json(k.what_if_cost)},
                        {"cause", finding_to_json(k.cause)},
                        {"returns", k.returns},
                        {"moved_cost", k.moved_cost},
                        {"unheeded", flags_to_json(k.unheeded)},
                        {"refusals", k.refusals},
                        {"held_until", k.held_until}});
    }
    return json{{"tracks", tracks},
                {"bf16_set", e.bf16_set_},
                {"delayed_spikes", flags_to_json(e.delayed_spikes_)},
                {"delayed_worst", finding_to_json(e.delayed_worst_)},
                {"delayed_from_step", e.delayed_from_step_},
                {"amax_history_seen", e.amax_history_seen_},
                {"amax_margin_seen", opt(e.amax_margin_seen_)},
                {"amax_history_length", opt(e.amax_history_length_)},
                {"amax_margin", opt(e.amax_margin_)}};
  }

  static void gemms_from_json(const json& j, PolicyEngine& e) {
    for (const json& k : j.at("tracks")) {
      PolicyEngine::GemmTrack t;
      t.layer = k.at("layer").get<std::string>();
      t.applied = flags_from_json(k.at("applied"), "gemm track '" + t.layer + "'");
      t.what_if = flags_from_json(k.at("what_if"), "gemm track '" + t.layer + "'");
      t.worst = finding_from_json(k.at("worst"));
      t.bf16_from_step = k.at("bf16_from_step").get<std::int64_t>();
      // Added within version 2: a document written before has no loss costs.
      if (k.contains("costed")) {
        const std::string owner = "gemm track '" + t.layer + "'";
        t.costed = k.at("costed").get<bool>();
        t.cost = costs_from_json(k.at("cost"), owner);
        t.what_if_cost = costs_from_json(k.at("what_if_cost"), owner + " what-if");
        t.cause = finding_from_json(k.at("cause"));
        t.returns = k.value("returns", 0);
        t.moved_cost = k.value("moved_cost", 0.0);
        if (t.returns < 0) throw PolicyError("state: " + owner + " has a negative return count");
      }
      // Added within version 2 too: a document written before knows of no unheeded move.
      if (k.contains("unheeded")) {
        const std::string owner = "gemm track '" + t.layer + "'";
        t.unheeded = flags_from_json(k.at("unheeded"), owner + " unheeded");
        t.refusals = k.at("refusals").get<int>();
        t.held_until = k.at("held_until").get<std::int64_t>();
        if (t.refusals < 0) throw PolicyError("state: " + owner + " has a negative refusal count");
      }
      e.gemm_tracks_.push_back(std::move(t));
    }
    if (!std::is_sorted(e.gemm_tracks_.begin(), e.gemm_tracks_.end(),
                        [](const auto& a, const auto& b) { return a.layer < b.layer; })) {
      throw PolicyError("state: gemm tracks are not sorted by layer");
    }
    e.bf16_set_ = sorted_names(j.at("bf16_set"), "bf16_set");
    e.delayed_spikes_ = flags_from_json(j.at("delayed_spikes"), "delayed_spikes");
    e.delayed_worst_ = finding_from_json(j.at("delayed_worst"));
    e.delayed_from_step_ = j.at("delayed_from_step").get<std::int64_t>();
    e.amax_history_seen_ = j.at("amax_history_seen").get<int>();
    e.amax_margin_seen_ = get_opt<int>(j, "amax_margin_seen");
    e.amax_history_length_ = get_opt<int>(j, "amax_history_length");
    e.amax_margin_ = get_opt<int>(j, "amax_margin");
  }

  static json encode(const PolicyEngine& e) {
    json window = json::array();
    for (const auto& s : e.window_) {
      window.push_back({{"step", s.step},
                        {"ceiling_log2", opt(s.ceiling_log2)},
                        {"limiting", s.limiting},
                        {"reaction_log2", opt(s.reaction_log2)},
                        {"reaction_why", s.reaction_why},
                        {"found_inf", s.found_inf}});
    }
    json tracks = json::array();
    for (const auto& k : e.tracks_) {
      json track = flags_to_json(k.reports);
      track["name"] = k.name;
      track["format"] = std::string(format_name(k.format));
      track["range"] = k.range;
      tracks.push_back(std::move(track));
    }
    json clean_tops = json::array();
    for (const auto& c : e.clean_tops_) {
      clean_tops.push_back({{"name", c.name}, {"step", c.step}, {"top", c.top}});
    }
    const Evaluation& v = e.evaluation_;
    return json{
        {"kind", kDocumentKind},
        {"version", kVersion},
        {"run_id", e.run_id_},
        {"config", config_to_json(e.config_)},
        {"run_scaler", scaler_to_json(e.run_scaler_)},
        {"latest_step", e.latest_step_},
        {"next_evaluation_step", e.next_evaluation_step_},
        {"last_reacted_step", e.last_reacted_step_},
        {"reported_scale", e.reported_scale_},
        {"next_policy_id", e.next_policy_id_},
        {"static_pushed", e.static_pushed_},
        {"commanded_scale", opt(e.commanded_scale_)},
        {"commanded_from_step", e.commanded_from_step_},
        {"consecutive_raises", e.consecutive_raises_},
        {"lowest_raise_target", opt(e.lowest_raise_target_)},
        {"window", window},
        {"tracks", tracks},
        {"clean_tops", clean_tops},
        {"fp32_set", e.fp32_set_},
        {"gemm_precision", gemms_to_json(e)},
        {"cumulative", settings_to_json(e.cumulative_)},
        {"last_decision", e.last_decision_ ? decision_to_json(*e.last_decision_) : json(nullptr)},
        {"evaluation",
         {{"step", v.step},
          {"ceiling_log2", opt(v.ceiling_log2)},
          {"target_log2", opt(v.target_log2)},
          {"scale_in_use", v.scale_in_use},
          {"consecutive_raises", v.consecutive_raises},
          {"limiting_tensor", v.limiting_tensor}}},
    };
  }

  static PolicyEngine decode(const json& j) {
    if (j.at("kind").get<std::string>() != kDocumentKind) {
      throw PolicyError("state: not an ampscope policy state (kind '" +
                        j.at("kind").get<std::string>() + "')");
    }
    const int version = j.at("version").get<int>();
    if (version < kOldestVersion || version > kVersion) {
      throw PolicyError("state: version " + std::to_string(version) + " is not supported (this " +
                        "build reads versions " + std::to_string(kOldestVersion) + " to " +
                        std::to_string(kVersion) + ")");
    }
    PolicyEngine e(j.at("run_id").get<std::string>(), config_from_json(j.at("config")),
                   scaler_from_json(j.at("run_scaler")));
    e.latest_step_ = j.at("latest_step").get<std::int64_t>();
    e.next_evaluation_step_ = j.at("next_evaluation_step").get<std::int64_t>();
    e.last_reacted_step_ = j.at("last_reacted_step").get<std::int64_t>();
    e.reported_scale_ = j.at("reported_scale").get<double>();
    e.next_policy_id_ = j.at("next_policy_id").get<std::uint64_t>();
    e.static_pushed_ = j.at("static_pushed").get<bool>();
    e.commanded_scale_ = get_opt<double>(j, "commanded_scale");
    e.commanded_from_step_ = j.at("commanded_from_step").get<std::int64_t>();
    e.consecutive_raises_ = j.at("consecutive_raises").get<int>();
    e.lowest_raise_target_ = get_opt<int>(j, "lowest_raise_target");
    for (const json& s : j.at("window")) {
      PolicyEngine::StepSummary x;
      x.step = s.at("step").get<std::int64_t>();
      x.ceiling_log2 = get_opt<int>(s, "ceiling_log2");
      x.limiting = s.at("limiting").get<std::string>();
      x.reaction_log2 = get_opt<int>(s, "reaction_log2");
      x.reaction_why = s.at("reaction_why").get<std::string>();
      x.found_inf = s.at("found_inf").get<bool>();
      e.window_.push_back(std::move(x));
    }
    for (const json& k : j.at("tracks")) {
      PolicyEngine::TensorTrack t;
      t.name = k.at("name").get<std::string>();
      const auto fmt = parse_format(k.at("format").get<std::string>());
      if (!fmt) throw PolicyError("state: unknown format in track '" + t.name + "'");
      t.format = *fmt;
      t.range = k.at("range").get<int>();
      t.reports = flags_from_json(k, "track '" + t.name + "'");
      e.tracks_.push_back(std::move(t));
    }
    // Added within version 1: a document written before has none (the estimate after an
    // overflow then rests on the tail alone until clean reports come in).
    if (const auto c = j.find("clean_tops"); c != j.end()) {
      for (const json& k : *c) {
        e.clean_tops_.push_back({k.at("name").get<std::string>(),
                                 k.at("step").get<std::int64_t>(), k.at("top").get<int>()});
      }
      if (!std::is_sorted(e.clean_tops_.begin(), e.clean_tops_.end(),
                          [](const auto& a, const auto& b) { return a.name < b.name; })) {
        throw PolicyError("state: clean_tops are not sorted by name");
      }
    }
    e.fp32_set_ = j.at("fp32_set").get<std::vector<std::string>>();
    if (version >= 2) gemms_from_json(j.at("gemm_precision"), e);
    e.cumulative_ = settings_from_json(j.at("cumulative"));
    if (!j.at("last_decision").is_null())
      e.last_decision_ = decision_from_json(j.at("last_decision"));
    const json& v = j.at("evaluation");
    e.evaluation_.step = v.at("step").get<std::int64_t>();
    e.evaluation_.ceiling_log2 = get_opt<int>(v, "ceiling_log2");
    e.evaluation_.target_log2 = get_opt<int>(v, "target_log2");
    e.evaluation_.scale_in_use = v.at("scale_in_use").get<double>();
    e.evaluation_.consecutive_raises = v.at("consecutive_raises").get<int>();
    e.evaluation_.limiting_tensor = v.at("limiting_tensor").get<std::string>();
    return e;
  }
};

std::string PolicyEngine::save_state() const { return StateCodec::encode(*this).dump(); }

PolicyEngine PolicyEngine::restore(std::string_view saved) {
  try {
    return StateCodec::decode(json::parse(saved));
  } catch (const json::exception& ex) {
    throw PolicyError(std::string("state: malformed policy state: ") + ex.what());
  }
}

}  // namespace ampscope::policy
