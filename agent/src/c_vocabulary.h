// The shared vocabulary (ampscope/vocabulary.h, ampscope/formats.h) and the agent's own enums
// (StepPhase, StatusCode) in the C API (ampscope/agent/c_api.h) and back: the one place that
// maps them. The C enums carry the same numbers as the C++ ones, so every conversion is a cast
// after a range check; the static_asserts below fail the build when either side is renumbered
// or grows without the other.
// Thread safety: pure functions.
#pragma once

#include <optional>

#include "ampscope/agent/agent.h"
#include "ampscope/agent/c_api.h"
#include "ampscope/agent/interfaces.h"
#include "ampscope/formats.h"
#include "ampscope/vocabulary.h"

namespace ampscope::agent::c {

namespace detail {
template <typename C, typename Cpp>
constexpr bool same(C c, Cpp cpp) {
  return static_cast<int>(c) == static_cast<int>(cpp);
}
// A C value as the C++ enum, or nullopt when it is outside [0, count).
template <typename Cpp>
constexpr std::optional<Cpp> in_range(int value, int count) {
  if (value < 0 || value >= count) return std::nullopt;
  return static_cast<Cpp>(value);
}
}  // namespace detail

static_assert(detail::same(AMPSCOPE_FORMAT_FP32, Format::kFP32) &&
              detail::same(AMPSCOPE_FORMAT_FP16, Format::kFP16) &&
              detail::same(AMPSCOPE_FORMAT_BF16, Format::kBF16) &&
              detail::same(AMPSCOPE_FORMAT_E4M3, Format::kE4M3) &&
              detail::same(AMPSCOPE_FORMAT_E5M2, Format::kE5M2) &&
              detail::same(AMPSCOPE_FORMAT_E2M1, Format::kE2M1) &&
              detail::same(AMPSCOPE_FORMAT_E3M2, Format::kE3M2) &&
              detail::same(AMPSCOPE_FORMAT_E2M3, Format::kE2M3) &&
              AMPSCOPE_FORMAT_E2M3 + 1 == kNumFormats);
static_assert(detail::same(AMPSCOPE_ROLE_WEIGHT, TensorRole::kWeight) &&
              detail::same(AMPSCOPE_ROLE_MASTER_WEIGHT, TensorRole::kMasterWeight) &&
              detail::same(AMPSCOPE_ROLE_ACTIVATION, TensorRole::kActivation) &&
              detail::same(AMPSCOPE_ROLE_ACTIVATION_GRAD, TensorRole::kActivationGrad) &&
              detail::same(AMPSCOPE_ROLE_WEIGHT_GRAD, TensorRole::kWeightGrad) &&
              detail::same(AMPSCOPE_ROLE_OPTIMIZER_STATE, TensorRole::kOptimizerState) &&
              detail::same(AMPSCOPE_ROLE_LOSS, TensorRole::kLoss) &&
              AMPSCOPE_ROLE_LOSS + 1 == kNumTensorRoles);
static_assert(detail::same(AMPSCOPE_PHASE_UNKNOWN, TensorPhase::kUnknown) &&
              detail::same(AMPSCOPE_PHASE_STEP_START, TensorPhase::kStepStart) &&
              detail::same(AMPSCOPE_PHASE_FORWARD, TensorPhase::kForward) &&
              detail::same(AMPSCOPE_PHASE_BACKWARD, TensorPhase::kBackward) &&
              detail::same(AMPSCOPE_PHASE_AFTER_UNSCALE, TensorPhase::kAfterUnscale) &&
              AMPSCOPE_PHASE_AFTER_UNSCALE + 1 == kNumTensorPhases);
static_assert(detail::same(AMPSCOPE_DEVICE_CPU, Device::kCpu) &&
              detail::same(AMPSCOPE_DEVICE_CUDA, Device::kCuda));
static_assert(detail::same(AMPSCOPE_SCALER_STATIC, ScalerKind::kStatic) &&
              detail::same(AMPSCOPE_SCALER_DYNAMIC, ScalerKind::kDynamic) &&
              detail::same(AMPSCOPE_SCALER_HYSTERESIS, ScalerKind::kHysteresis) &&
              AMPSCOPE_SCALER_HYSTERESIS + 1 == kNumScalerKinds);
static_assert(detail::same(AMPSCOPE_STEP_PHASE_FORWARD, StepPhase::kForward) &&
              detail::same(AMPSCOPE_STEP_PHASE_BACKWARD, StepPhase::kBackward) &&
              detail::same(AMPSCOPE_STEP_PHASE_UNSCALE_CHECK, StepPhase::kUnscaleCheck) &&
              detail::same(AMPSCOPE_STEP_PHASE_OPTIMIZER, StepPhase::kOptimizer));
static_assert(detail::same(AMPSCOPE_OK, StatusCode::kOk) &&
              detail::same(AMPSCOPE_INVALID_ARGUMENT, StatusCode::kInvalidArgument) &&
              detail::same(AMPSCOPE_UNAVAILABLE, StatusCode::kUnavailable) &&
              detail::same(AMPSCOPE_DEADLINE_EXCEEDED, StatusCode::kDeadlineExceeded) &&
              detail::same(AMPSCOPE_FAILED_PRECONDITION, StatusCode::kFailedPrecondition) &&
              detail::same(AMPSCOPE_INTERNAL, StatusCode::kInternal));

// C -> C++: nullopt for a number the vocabulary does not have (a caller's garbage, or a newer
// header's value). The arguments are ints so that a value outside the C enum's list is seen.
constexpr std::optional<Format> from_c_format(int f) {
  return detail::in_range<Format>(f, kNumFormats);
}
constexpr std::optional<TensorRole> from_c_role(int r) {
  return detail::in_range<TensorRole>(r, kNumTensorRoles);
}
constexpr std::optional<TensorPhase> from_c_phase(int p) {
  return detail::in_range<TensorPhase>(p, kNumTensorPhases);
}
constexpr std::optional<Device> from_c_device(int d) {
  return detail::in_range<Device>(d, AMPSCOPE_DEVICE_CUDA + 1);
}
constexpr std::optional<ScalerKind> from_c_scaler_kind(int k) {
  return detail::in_range<ScalerKind>(k, kNumScalerKinds);
}
constexpr std::optional<StepPhase> from_c_step_phase(int p) {
  return detail::in_range<StepPhase>(p, AMPSCOPE_STEP_PHASE_OPTIMIZER + 1);
}

// C++ -> C; a status code the C API does not list (a newer agent's) is AMPSCOPE_INTERNAL.
constexpr ampscope_status to_c(StatusCode code) {
  const int i = static_cast<int>(code);
  return i >= AMPSCOPE_OK && i <= AMPSCOPE_INTERNAL ? static_cast<ampscope_status>(i)
                                                   : AMPSCOPE_INTERNAL;
}

}  // namespace ampscope::agent::c
