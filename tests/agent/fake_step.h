// A tiny "model" for the in-process agent tests: FP16 tensors with names, roles and values,
// shown to the agent in execution order, and an agent that spools into a test directory.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "ampscope/agent/agent.h"
#include "ampscope/convert.h"
#include "ampscope/testing/files.h"

namespace ampscope::agent::testing {

struct FakeTensor {
  std::string name;
  TensorRole role;
  TensorPhase phase;
  std::vector<std::uint16_t> fp16;  // FP16 storage
  std::vector<std::int64_t> shape;
};

// Seven tensors of 256 finite values: a weight, three activations, two activation gradients
// and a weight gradient, in execution order.
inline std::vector<FakeTensor> make_step_tensors() {
  std::vector<FakeTensor> t;
  auto add = [&](const std::string& name, TensorRole role, TensorPhase phase, float base) {
    FakeTensor f{name, role, phase, {}, {4, 64}};
    for (int i = 0; i < 256; ++i) f.fp16.push_back(fp32_to_fp16(base * (1.0f + 0.01f * i)));
    t.push_back(std::move(f));
  };
  add("h0.weight", TensorRole::kWeight, TensorPhase::kStepStart, 0.02f);
  add("embed", TensorRole::kActivation, TensorPhase::kForward, 0.5f);
  add("h0.mlp.fc", TensorRole::kActivation, TensorPhase::kForward, 1.5f);
  add("logits", TensorRole::kActivation, TensorPhase::kForward, 3.0f);
  add("logits.grad", TensorRole::kActivationGrad, TensorPhase::kBackward, 1e-3f);
  add("h0.mlp.fc.grad", TensorRole::kActivationGrad, TensorPhase::kBackward, 2e-3f);
  add("h0.weight.grad", TensorRole::kWeightGrad, TensorPhase::kBackward, 5e-4f);
  return t;
}

// The view a trainer would show of `t`: loss-scaled roles carry `scale`, weight gradients are
// held in FP32.
inline TensorView view_of(const FakeTensor& t, int order, double scale) {
  TensorView v;
  v.name = t.name;
  v.role = t.role;
  v.phase = t.phase;
  v.dtype = Format::kFP16;
  v.data = t.fp16.data();
  v.shape = t.shape;
  v.scale = is_loss_scaled(t.role) ? scale : 1.0;
  v.order = order;
  if (t.role == TensorRole::kWeightGrad) v.held = Format::kFP32;
  return v;
}

// No server, counts only (no full steps), a spool under `dir`, no wait at shutdown.
inline AgentConfig base_config(const ampscope::testing::TempDir& dir, const std::string& run) {
  AgentConfig c;
  c.run_id = run;
  c.spool_dir = (dir / "spool").string();
  c.sampling.full_every = 0;
  c.flush_timeout = std::chrono::milliseconds(0);
  return c;
}

inline std::unique_ptr<Agent> make_agent(const AgentConfig& c) {
  std::unique_ptr<Agent> a;
  RunInfo run;
  run.trainer = "agent_test";
  run.precision = "amp-fp16";
  const Status s = Agent::create(c, run, &a);
  EXPECT_TRUE(s.ok()) << s.message;
  return a;
}

}  // namespace ampscope::agent::testing
