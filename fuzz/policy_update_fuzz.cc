// Target: the agent's handling of PolicyUpdates (agent/src/policy.h): validate_update and the
// PolicyApplier that receives updates on the stream's thread and applies them at their step,
// through a scaler, an FP32 override set, a BF16 GEMM set and a delayed recipe that accept
// whatever they are given (so that only the agent's own checks stand between the wire and the
// trainer).
// Input: protobuf's length-delimited PolicyUpdates (support.h, parse_delimited), received in
// order by one rank (policy_agreement single); then the steps 0, each effective step, and one
// past the last are begun.
// Properties:
//   - every update received once gets exactly one outcome; one already handled gets none;
//   - validate_update answers one line; an outcome keeps to the server's rules for a report
//     (policy_id 1..64 bytes, reason at most 512, both clean text: valid UTF-8 without control
//     characters), whatever the update held;
//   - the scaler's settings stay valid: after every step min <= max, the scale a power of two,
//     growth_factor >= 1, backoff_factor in (0, 1], growth_interval >= 1, and a loss scale an
//     update applied lies within the bounds in force after it;
//   - the FP32 set and the BF16 GEMM set applied hold capable layers only, each once;
//   - validate_gemm_update answers one line; a recipe change has a history length in [1, 1024]
//     and a margin in [0, 64].
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ampscope/text.h"
#include "notices.h"
#include "policy.h"
#include "support.h"

namespace ampscope::fuzz {
namespace {

using agent::ScalerChange;
using agent::ScalerSettings;

class AcceptingScaler : public agent::ScalerControl {
 public:
  ScalerSettings settings() const override { return s_; }
  std::string schedule(const ScalerChange& c) override {
    if (c.scale) s_.scale = *c.scale;
    if (c.growth_factor) s_.growth_factor = *c.growth_factor;
    if (c.backoff_factor) s_.backoff_factor = *c.backoff_factor;
    if (c.growth_interval) s_.growth_interval = *c.growth_interval;
    if (c.hysteresis) s_.hysteresis = *c.hysteresis;
    if (c.min_scale) s_.min_scale = *c.min_scale;
    if (c.max_scale) s_.max_scale = *c.max_scale;
    return {};
  }

  ScalerSettings s_;
};

// Layers as ampscope-train names them; a tensor "hN.attn.scores" is computed by "hN.attn.core".
// As the BF16 GEMM set, the linear layers.
class AcceptingOverrides : public agent::PrecisionOverrides {
 public:
  explicit AcceptingOverrides(std::vector<std::string> capable) : capable_(std::move(capable)) {}
  std::vector<std::string> capable_layers() const override { return capable_; }
  std::string replace(const std::vector<std::string>& layers, std::int64_t) override {
    const std::vector<std::string> capable = capable_layers();
    std::set<std::string> once;
    for (const std::string& l : layers) {
      FUZZ_CHECK(std::find(capable.begin(), capable.end(), l) != capable.end(), l);
      FUZZ_CHECK(once.insert(l).second, "layer applied twice: " + l);
    }
    applied_ = layers;
    return {};
  }
  std::string layer_of(std::string_view tensor) const override {
    std::string t(tensor);
    if (t.ends_with(".attn.scores")) t = t.substr(0, t.size() - 7) + ".core";
    return PrecisionOverrides::layer_of(t);
  }

  std::vector<std::string> capable_;
  std::vector<std::string> applied_;
};

class AcceptingRecipe : public agent::RecipeControl {
 public:
  bool delayed() const override { return true; }
  std::string schedule(const agent::RecipeChange& c) override {
    FUZZ_CHECK(
        !c.amax_history_length || (*c.amax_history_length >= 1 && *c.amax_history_length <= 1024),
        std::to_string(*c.amax_history_length));
    FUZZ_CHECK(!c.margin || (*c.margin >= 0 && *c.margin <= 64), std::to_string(*c.margin));
    return {};
  }
};

bool printable(const std::string& s) { return text::is_clean_text(s); }

bool power_of_two(double x) {
  int e = 0;
  return std::isfinite(x) && x > 0.0 && std::frexp(x, &e) == 0.5;
}

void check_scaler(const ScalerSettings& s) {
  const std::string what = "scale " + std::to_string(s.scale) + " min " +
                           std::to_string(s.min_scale) + " max " + std::to_string(s.max_scale);
  FUZZ_CHECK(power_of_two(s.scale), what);
  FUZZ_CHECK(s.max_scale == 0.0 || s.min_scale <= s.max_scale, what);
  FUZZ_CHECK(std::isfinite(s.growth_factor) && s.growth_factor >= 1.0, what);
  FUZZ_CHECK(s.backoff_factor > 0.0 && s.backoff_factor <= 1.0, what);
  FUZZ_CHECK(s.growth_interval >= 1, what);
}

}  // namespace
}  // namespace ampscope::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ampscope;
  using namespace ampscope::fuzz;
  const std::vector<v1::PolicyUpdate> updates = parse_delimited<v1::PolicyUpdate>(data, size);
  if (updates.empty()) return 0;

  agent::AgentConfig config;
  config.run_id = "fuzz-run";
  agent::Notices notices;
  AcceptingScaler scaler;
  AcceptingOverrides overrides(
      {"h0.attn.core", "h0.mlp.fc", "h1.attn.core", "h1.mlp.fc", "lm_head"});
  AcceptingOverrides gemms({"h0.attn.qkv", "h0.mlp.fc", "h1.mlp.proj"});
  AcceptingRecipe recipe;
  agent::PolicyApplier applier(config, nullptr, &notices);
  applier.attach_scaler(&scaler);
  applier.attach_overrides(&overrides);
  applier.attach_gemm_precision(&gemms, &recipe);

  // Outcomes expected: one for each first sighting of an id (every update without one).
  std::set<std::string> ids;
  std::size_t expected = 0;
  std::map<std::string, const v1::PolicyUpdate*> first_of;
  std::set<std::int64_t> steps = {0};
  for (const v1::PolicyUpdate& u : updates) {
    // Each update checked alone against the scaler as it starts, as the reader thread does.
    const std::string err = agent::validate_update(u, config.run_id, scaler.settings(), true,
                                                   &overrides);
    FUZZ_CHECK(one_line(err), err);
    const std::string gemm_err =
        agent::validate_gemm_update(u, &applier.capable_gemms(), true, true);
    FUZZ_CHECK(one_line(gemm_err), gemm_err);
    if (u.policy_id().empty() || ids.insert(u.policy_id()).second) ++expected;
    first_of.try_emplace(u.policy_id(), &u);
    applier.receive(u);
    if (u.effective_from_step() >= 0 && steps.size() < 64) steps.insert(u.effective_from_step());
  }
  if (*steps.rbegin() < std::numeric_limits<std::int64_t>::max()) {
    steps.insert(*steps.rbegin() + 1);
  }

  std::size_t outcomes = 0;
  for (std::int64_t step : steps) {
    std::vector<agent::PolicyOutcome> out;
    applier.begin_step(step, &out);
    for (const agent::PolicyOutcome& o : out) {
      ++outcomes;
      FUZZ_CHECK(o.applied == o.reason.empty(), o.reason);
      // The server's rules for an outcome in a report (server/src/validation.h).
      FUZZ_CHECK(!o.policy_id.empty() && o.policy_id.size() <= 64 && printable(o.policy_id),
                 o.policy_id);
      FUZZ_CHECK(o.reason.size() <= 512 && printable(o.reason), o.reason);
    }
    // One update applied at this step: its loss scale is within the bounds it leaves.
    if (out.size() == 1 && out[0].applied && first_of.contains(out[0].policy_id)) {
      const v1::PolicyUpdate& u = *first_of.at(out[0].policy_id);
      const ScalerSettings& s = scaler.s_;
      if (u.has_loss_scale()) {
        FUZZ_CHECK(s.scale == u.loss_scale(), u.ShortDebugString());
        FUZZ_CHECK(s.scale >= s.min_scale && (s.max_scale == 0.0 || s.scale <= s.max_scale),
                   u.ShortDebugString());
      }
    }
    check_scaler(scaler.s_);
  }
  // Updates whose effective step lies beyond the 64 steps begun may still wait; the others
  // have their outcome.
  if (steps.size() < 64) {
    FUZZ_CHECK(outcomes == expected, "outcomes differ from the updates received once");
  }
  FUZZ_CHECK(applier.applied() + applier.refused() == outcomes,
             "the applier's counters disagree with its outcomes");
  return 0;
}
