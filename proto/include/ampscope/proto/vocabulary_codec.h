// The shared vocabulary (ampscope/vocabulary.h, ampscope/formats.h) on the wire and back: the
// one place that maps ampscope's enums to ampscope.v1's. proto3 enums start with an UNSPECIFIED
// zero, so formats, roles and scaler kinds are one up on the wire; phases have the same numbers
// (the vocabulary's kUnknown is UNSPECIFIED). The static_asserts below fail the build when
// either side is renumbered.
// Thread safety: pure functions.
#pragma once

#include <optional>

#include "ampscope/formats.h"
#include "ampscope/v1/stats.pb.h"
#include "ampscope/v1/telemetry.pb.h"
#include "ampscope/vocabulary.h"

namespace ampscope::proto {

namespace detail {
template <typename Wire, typename Enum>
constexpr bool one_up(Wire w, Enum e) {
  return static_cast<int>(w) == static_cast<int>(e) + 1;
}
}  // namespace detail

static_assert(detail::one_up(v1::FORMAT_FP32, Format::kFP32) &&
              detail::one_up(v1::FORMAT_FP16, Format::kFP16) &&
              detail::one_up(v1::FORMAT_BF16, Format::kBF16) &&
              detail::one_up(v1::FORMAT_E4M3, Format::kE4M3) &&
              detail::one_up(v1::FORMAT_E5M2, Format::kE5M2) &&
              detail::one_up(v1::FORMAT_E2M1, Format::kE2M1) &&
              detail::one_up(v1::FORMAT_E3M2, Format::kE3M2) &&
              detail::one_up(v1::FORMAT_E2M3, Format::kE2M3) &&
              v1::Format_MAX == kNumFormats);
static_assert(detail::one_up(v1::TENSOR_ROLE_WEIGHT, TensorRole::kWeight) &&
              detail::one_up(v1::TENSOR_ROLE_MASTER_WEIGHT, TensorRole::kMasterWeight) &&
              detail::one_up(v1::TENSOR_ROLE_ACTIVATION, TensorRole::kActivation) &&
              detail::one_up(v1::TENSOR_ROLE_ACTIVATION_GRAD, TensorRole::kActivationGrad) &&
              detail::one_up(v1::TENSOR_ROLE_WEIGHT_GRAD, TensorRole::kWeightGrad) &&
              detail::one_up(v1::TENSOR_ROLE_OPTIMIZER_STATE, TensorRole::kOptimizerState) &&
              detail::one_up(v1::TENSOR_ROLE_LOSS, TensorRole::kLoss) &&
              v1::TensorRole_MAX == kNumTensorRoles);
static_assert(static_cast<int>(v1::TENSOR_PHASE_UNSPECIFIED) ==
                  static_cast<int>(TensorPhase::kUnknown) &&
              static_cast<int>(v1::TENSOR_PHASE_STEP_START) ==
                  static_cast<int>(TensorPhase::kStepStart) &&
              static_cast<int>(v1::TENSOR_PHASE_FORWARD) ==
                  static_cast<int>(TensorPhase::kForward) &&
              static_cast<int>(v1::TENSOR_PHASE_BACKWARD) ==
                  static_cast<int>(TensorPhase::kBackward) &&
              static_cast<int>(v1::TENSOR_PHASE_AFTER_UNSCALE) ==
                  static_cast<int>(TensorPhase::kAfterUnscale) &&
              v1::TensorPhase_MAX + 1 == kNumTensorPhases);
static_assert(detail::one_up(v1::SCALER_KIND_STATIC, ScalerKind::kStatic) &&
              detail::one_up(v1::SCALER_KIND_DYNAMIC, ScalerKind::kDynamic) &&
              detail::one_up(v1::SCALER_KIND_HYSTERESIS, ScalerKind::kHysteresis) &&
              v1::ScalerKind_MAX == kNumScalerKinds);

constexpr v1::Format to_proto(Format f) { return static_cast<v1::Format>(static_cast<int>(f) + 1); }
constexpr v1::TensorRole to_proto(TensorRole r) {
  return static_cast<v1::TensorRole>(static_cast<int>(r) + 1);
}
constexpr v1::TensorPhase to_proto(TensorPhase p) {
  return static_cast<v1::TensorPhase>(static_cast<int>(p));
}
constexpr v1::ScalerKind to_proto(ScalerKind k) {
  return static_cast<v1::ScalerKind>(static_cast<int>(k) + 1);
}

// nullopt for UNSPECIFIED and for numbers this build does not know (a newer peer's).
constexpr std::optional<Format> from_proto(v1::Format f) {
  const int i = static_cast<int>(f) - 1;
  if (i < 0 || i >= kNumFormats) return std::nullopt;
  return static_cast<Format>(i);
}
constexpr std::optional<TensorRole> from_proto(v1::TensorRole r) {
  const int i = static_cast<int>(r) - 1;
  if (i < 0 || i >= kNumTensorRoles) return std::nullopt;
  return static_cast<TensorRole>(i);
}
constexpr std::optional<ScalerKind> from_proto(v1::ScalerKind k) {
  const int i = static_cast<int>(k) - 1;
  if (i < 0 || i >= kNumScalerKinds) return std::nullopt;
  return static_cast<ScalerKind>(i);
}
// UNSPECIFIED and unknown numbers are TensorPhase::kUnknown.
constexpr TensorPhase from_proto(v1::TensorPhase p) {
  const int i = static_cast<int>(p);
  return i > 0 && i < kNumTensorPhases ? static_cast<TensorPhase>(i) : TensorPhase::kUnknown;
}

// A wire role the loss scale multiplies (activation and weight gradients).
constexpr bool is_loss_scaled(v1::TensorRole r) {
  const auto role = from_proto(r);
  return role && ::ampscope::is_loss_scaled(*role);
}

}  // namespace ampscope::proto
