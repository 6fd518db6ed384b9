// Stand-ins for a trainer's controls in the policy applier's tests (policy_test.cc,
// gemm_policy_test.cc): a scaler that takes what a real one would and records each change, and
// the PolicyUpdate every test starts from.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "ampscope/agent/interfaces.h"
#include "ampscope/v1/telemetry.pb.h"

namespace ampscope::agent::testing {

class FakeScaler final : public ScalerControl {
 public:
  ScalerSettings settings() const override { return s; }
  std::string schedule(const ScalerChange& c) override {
    changes.push_back(c);
    if (c.scale) s.scale = *c.scale;
    if (c.growth_interval) s.growth_interval = *c.growth_interval;
    return refuse;
  }
  ScalerSettings s;
  std::vector<ScalerChange> changes;
  std::string refuse;  // non-empty: the scaler's own refusal
};

// An update of run "run" with an id and an effective step, and nothing else.
inline v1::PolicyUpdate update(const std::string& id, std::int64_t step) {
  v1::PolicyUpdate u;
  u.set_policy_id(id);
  u.set_run_id("run");
  u.set_effective_from_step(step);
  return u;
}

// update(id, step) carrying a complete set: the FP32 fallback's fp32_tensors or the FP8/FP4
// per-layer precision's bf16_gemms, with its _set flag.
enum class SetField { kFp32Tensors, kBf16Gemms };
inline v1::PolicyUpdate set_update(const std::string& id, std::int64_t step, SetField field,
                                   std::initializer_list<const char*> names) {
  v1::PolicyUpdate u = update(id, step);
  const bool gemms = field == SetField::kBf16Gemms;
  gemms ? u.set_bf16_gemms_set(true) : u.set_fp32_tensors_set(true);
  for (const char* n : names) gemms ? u.add_bf16_gemms(n) : u.add_fp32_tensors(n);
  return u;
}

}  // namespace ampscope::agent::testing
