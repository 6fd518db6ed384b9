// What the recorder hands to the worker: one StepRecord per step, holding the step's
// samples (measured already, or waiting for the worker: a host copy or a GPU job in flight),
// the step's outcome and the policy outcomes that belong to it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ampscope/agent/interfaces.h"
#include "ampscope/recipe.h"
#include "ampscope/tensor_stats.h"
#include "sampling.h"

namespace ampscope::agent {

class GpuJob;  // gpu_stats.h

struct TensorSample {
  std::string name;
  TensorRole role = TensorRole::kActivation;
  TensorPhase phase = TensorPhase::kUnknown;
  Format dtype = Format::kFP32;
  std::vector<std::int64_t> shape;
  std::uint64_t numel = 0;
  double scale = 1.0;
  int micro_step = 0;
  int order = 0;
  Level level = Level::kCounts;      // what the report carries (kSkip: nothing)
  // Measured in full whatever `level` says, for the flight recorder (flight_recorder.h); its
  // target is set as for kFull.
  bool record_full = false;
  std::optional<TargetSpec> target;  // for kFull and record_full
  std::optional<Format> held;        // TensorView::held
  bool measured = false;             // stats below are final
  bool full = false;                 // ... and hold full statistics (whatever `level` says)
  TensorStats stats;
  // The recipe_targets counts of a full-level host sample (measure_host), moved to the step's
  // quantizers by the worker.
  std::vector<RecipeCounts> recipe_counts;
  // Pending work (exactly one set while !measured).
  std::vector<unsigned char> copy;   // worker mode: the tensor's bytes
  std::shared_ptr<GpuJob> gpu;       // device tensors: the job in flight
};

// A quantiser's measurement (Agent::observe_quantizer), checked and ready to encode.
struct QuantizerSample {
  std::string name;
  TensorRole role = TensorRole::kActivation;
  TensorPhase phase = TensorPhase::kUnknown;
  int micro_step = 0;
  RecipeCounts counts;
  std::vector<float> amax_history;  // empty on steps that do not send it
  std::string layer;                // QuantizerView::layer as sent
  bool what_if = false;
  std::optional<double> loss_cost;
};

struct PolicyOutcome {
  std::string policy_id;
  bool applied = false;
  std::string reason;
};

struct StepRecord {
  StepInfo info;
  std::vector<TensorSample> samples;
  std::vector<QuantizerSample> quantizers;
  std::vector<PolicyOutcome> outcomes;
  std::uint64_t policy_seq = 0;  // the highest policy seq handled so far (PolicyApplier)
  std::optional<double> tensor_core_active_ratio;
  std::uint64_t dropped_tensors = 0;  // skipped in this step (budgets)
  std::uint64_t copy_bytes = 0;       // bytes held by worker copies
};

}  // namespace ampscope::agent
