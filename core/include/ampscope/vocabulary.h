// The words every component of ampscope shares: the role a tensor plays in training, where in a
// step it is shown, where its memory lives, and the kind of loss scaler a run uses. Defined
// once here; the trainer, the agent, the server, the policy engine, the wire (proto/) and the
// C API all use these enums, and their conversions to the wire and to C are written once each
// with static_asserts that catch a renumbering (ampscope/proto/vocabulary_codec.h,
// agent/src/c_vocabulary.h).
//
// Thread safety: everything here is constexpr.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

namespace ampscope {

// What a tensor is in the training step.
enum class TensorRole : std::uint8_t {
  kWeight = 0,          // the copy the forward pass reads (FP16/BF16 under AMP)
  kMasterWeight = 1,    // FP32 master weights (AMP only)
  kActivation = 2,
  kActivationGrad = 3,  // carries the loss scale
  kWeightGrad = 4,      // carries the loss scale until unscaled
  kOptimizerState = 5,
  kLoss = 6,
};
inline constexpr int kNumTensorRoles = 7;

// Where in the step a tensor is shown.
enum class TensorPhase : std::uint8_t {
  kUnknown = 0,
  kStepStart = 1,     // weights before the first micro-batch
  kForward = 2,
  kBackward = 3,      // activation grads per micro-batch; weight grads after the last one
  kAfterUnscale = 4,  // weight grads after unscaling, before clipping
};
inline constexpr int kNumTensorPhases = 5;

// Where a tensor's memory lives.
enum class Device : std::uint8_t { kCpu = 0, kCuda = 1 };

// The loss-scale rule a run's scaler follows (ampscope/loss_scale.h has the rules).
enum class ScalerKind : std::uint8_t { kStatic = 0, kDynamic = 1, kHysteresis = 2 };
inline constexpr int kNumScalerKinds = 3;

namespace detail {
inline constexpr std::array<std::string_view, kNumTensorRoles> kRoleNames = {
    "weight",         "master_weight", "activation", "activation_grad",
    "weight_grad",    "optimizer_state", "loss"};
inline constexpr std::array<std::string_view, kNumTensorPhases> kPhaseNames = {
    "unknown", "step_start", "forward", "backward", "after_unscale"};
inline constexpr std::array<std::string_view, kNumScalerKinds> kScalerKindNames = {
    "static", "dynamic", "hysteresis"};
inline constexpr std::array<std::string_view, 2> kDeviceNames = {"cpu", "cuda"};

template <typename Enum, std::size_t N>
constexpr std::string_view name_of(Enum value, const std::array<std::string_view, N>& names) {
  const auto i = static_cast<std::size_t>(value);
  return i < N ? names[i] : std::string_view("unknown");
}
constexpr bool equal_ignoring_case(std::string_view a, std::string_view lower) {
  if (a.size() != lower.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const char c = (a[i] >= 'A' && a[i] <= 'Z') ? static_cast<char>(a[i] - 'A' + 'a') : a[i];
    if (c != lower[i]) return false;
  }
  return true;
}
template <typename Enum, std::size_t N>
constexpr std::optional<Enum> parse_name(std::string_view name,
                                         const std::array<std::string_view, N>& names) {
  for (std::size_t i = 0; i < N; ++i) {
    if (equal_ignoring_case(name, names[i])) return static_cast<Enum>(i);
  }
  return std::nullopt;
}
}  // namespace detail

// Lower-case names as they appear in flags, JSON, metrics labels and reports
// ("activation_grad", "after_unscale", "hysteresis"); "unknown" for a value out of range.
constexpr std::string_view role_name(TensorRole r) { return detail::name_of(r, detail::kRoleNames); }
constexpr std::string_view phase_name(TensorPhase p) {
  return detail::name_of(p, detail::kPhaseNames);
}
constexpr std::string_view scaler_kind_name(ScalerKind k) {
  return detail::name_of(k, detail::kScalerKindNames);
}
constexpr std::string_view device_name(Device d) { return detail::name_of(d, detail::kDeviceNames); }
// The names above, in any case; nullopt otherwise.
constexpr std::optional<TensorRole> parse_role(std::string_view name) {
  return detail::parse_name<TensorRole>(name, detail::kRoleNames);
}
constexpr std::optional<TensorPhase> parse_phase(std::string_view name) {
  return detail::parse_name<TensorPhase>(name, detail::kPhaseNames);
}
constexpr std::optional<ScalerKind> parse_scaler_kind(std::string_view name) {
  return detail::parse_name<ScalerKind>(name, detail::kScalerKindNames);
}

// The roles whose values the loss scale multiplies.
constexpr bool is_loss_scaled(TensorRole r) {
  return r == TensorRole::kActivationGrad || r == TensorRole::kWeightGrad;
}

}  // namespace ampscope
