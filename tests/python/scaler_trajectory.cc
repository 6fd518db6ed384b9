// scaler_trajectory: the built-in trainer's loss scaler (ampscope::trainer::ScalerHandle) run over
// a found_inf sequence, printed step by step, so that the Python package's tests can compare
// ampscope.torch.LossScaler with it float for float.
//
//   scaler_trajectory '{"kind": "dynamic", "init_scale": 1024, "found_inf": "0010", ...}'
//   scaler_trajectory < spec.json
//
// The spec (one JSON object; every rule field optional, the kind's defaults otherwise: PyTorch
// GradScaler's for static and dynamic, Megatron-LM's for hysteresis):
//   kind             "static" | "dynamic" | "hysteresis"
//   init_scale, growth_factor, backoff_factor, growth_interval, hysteresis, min_scale, max_scale
//   found_inf        "0110..." or [0, 1, 1, 0, ...]: one entry per step
//   changes          [{"step": N, "fields": {"scale": ..., "growth_interval": ..., ...}}]:
//                    scheduled just before step N begins (effective from N), as the agent hands
//                    a policy update to the trainer; the field names are ScalerChange's
// Output on stdout:
//   {"steps": [{"scale": used, "scale_after": after update, "growth_tracker": ...,
//               "hysteresis_tracker": ...}, ...],
//    "changes": [{"step": N, "reason": "" when accepted, else why not}, ...]}
// Scales are printed as the doubles of their FP32 values, with all the digits a double needs.
// Bad input: {"error": "..."} and exit status 2.
#include <cstdint>
#include <exception>
#include <iostream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "ampscope/loss_scale.h"
#include "ampscope/trainer/loss_scaler.h"
#include "ampscope/vocabulary.h"

namespace {

using ampscope::trainer::ScalerConfig;
using ampscope::trainer::ScalerHandle;
using ampscope::trainer::ScalerUpdate;
using nlohmann::json;

struct BadInput : std::exception {
  explicit BadInput(std::string m) : message(std::move(m)) {}
  const char* what() const noexcept override { return message.c_str(); }
  std::string message;
};

ScalerConfig read_config(const json& spec) {
  const std::string kind_name = spec.value("kind", std::string("dynamic"));
  const auto kind = ampscope::parse_scaler_kind(kind_name);
  if (!kind) throw BadInput("unknown kind '" + kind_name + "'");
  ScalerConfig c = *kind == ampscope::ScalerKind::kHysteresis ? ScalerConfig::megatron_defaults()
                                                              : ScalerConfig::pytorch_defaults();
  c.kind = *kind;
  c.init_scale = spec.value("init_scale", static_cast<double>(c.init_scale));
  c.growth_factor = spec.value("growth_factor", c.growth_factor);
  c.backoff_factor = spec.value("backoff_factor", c.backoff_factor);
  c.growth_interval = spec.value("growth_interval", c.growth_interval);
  c.hysteresis = spec.value("hysteresis", c.hysteresis);
  c.min_scale = static_cast<float>(spec.value("min_scale", static_cast<double>(c.min_scale)));
  c.max_scale = static_cast<float>(spec.value("max_scale", static_cast<double>(c.max_scale)));
  if (std::string err = ampscope::trainer::validate(c); !err.empty()) {
    throw BadInput("invalid rule: " + err);
  }
  return c;
}

std::vector<bool> read_found_inf(const json& spec) {
  std::vector<bool> out;
  if (!spec.contains("found_inf")) return out;
  const json& f = spec.at("found_inf");
  if (f.is_string()) {
    for (char ch : f.get<std::string>()) {
      if (ch != '0' && ch != '1') throw BadInput("found_inf: '0' and '1' only");
      out.push_back(ch == '1');
    }
  } else if (f.is_array()) {
    for (const json& v : f) out.push_back(v.is_boolean() ? v.get<bool>() : v.get<int>() != 0);
  } else {
    throw BadInput("found_inf must be a string of 0/1 or an array");
  }
  return out;
}

ScalerUpdate read_change(std::int64_t step, const json& fields) {
  ScalerUpdate u;
  u.effective_from_step = step;
  for (const auto& [key, v] : fields.items()) {
    // Narrowed as the C API narrows ampscope_scaler_change's doubles.
    if (key == "scale") {
      u.scale = static_cast<float>(v.get<double>());
    } else if (key == "growth_factor") {
      u.growth_factor = v.get<double>();
    } else if (key == "backoff_factor") {
      u.backoff_factor = v.get<double>();
    } else if (key == "growth_interval") {
      u.growth_interval = v.get<std::int64_t>();
    } else if (key == "hysteresis") {
      u.hysteresis = v.get<std::int32_t>();
    } else if (key == "min_scale") {
      u.min_scale = static_cast<float>(v.get<double>());
    } else if (key == "max_scale") {
      u.max_scale = static_cast<float>(v.get<double>());
    } else {
      throw BadInput("unknown change field '" + key + "'");
    }
  }
  return u;
}

json run(const json& spec) {
  const ScalerConfig config = read_config(spec);
  const std::vector<bool> found_inf = read_found_inf(spec);
  std::multimap<std::int64_t, json> changes;
  for (const json& c : spec.value("changes", json::array())) {
    changes.emplace(c.at("step").get<std::int64_t>(), c.value("fields", json::object()));
  }

  ScalerHandle handle(config);
  json steps = json::array();
  json reasons = json::array();
  for (std::int64_t step = 0; step < static_cast<std::int64_t>(found_inf.size()); ++step) {
    const auto [first, last] = changes.equal_range(step);
    for (auto it = first; it != last; ++it) {
      const std::string reason = handle.schedule(read_change(step, it->second));
      reasons.push_back({{"step", step}, {"reason", reason}});
    }
    const float used = handle.begin_step(step);
    const float after = handle.end_step(found_inf[static_cast<std::size_t>(step)]);
    const ampscope::trainer::ScalerState s = handle.state();
    steps.push_back({{"scale", static_cast<double>(used)},
                     {"scale_after", static_cast<double>(after)},
                     {"growth_tracker", s.growth_tracker},
                     {"hysteresis_tracker", s.hysteresis_tracker}});
  }
  return json{{"steps", steps}, {"changes", reasons}};
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string text;
    if (argc > 1) {
      text = argv[1];
    } else {
      text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    }
    const json out = run(json::parse(text));
    std::cout << out.dump() << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cout << json{{"error", e.what()}}.dump() << "\n";
    return 2;
  }
}
