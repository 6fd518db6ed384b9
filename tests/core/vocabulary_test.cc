// The names of the shared vocabulary: one table per enum, every value named, every name parsed
// back (in any case), nothing else accepted.
#include "ampscope/vocabulary.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace ampscope {
namespace {

// Values [first, count) have their own names; "unknown" names no value of them.
template <typename Enum, typename NameFn, typename ParseFn>
void expect_round_trip(int count, NameFn name_of, ParseFn parse, int first = 0) {
  std::set<std::string_view> seen;
  for (int i = first; i < count; ++i) {
    const auto value = static_cast<Enum>(i);
    const std::string_view name = name_of(value);
    EXPECT_NE(name, "unknown") << i;
    EXPECT_TRUE(seen.insert(name).second) << "duplicate name " << name;
    EXPECT_EQ(parse(name), value) << name;
    std::string upper(name);
    for (char& c : upper) c = static_cast<char>(c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c);
    EXPECT_EQ(parse(upper), value) << upper;
  }
  EXPECT_EQ(name_of(static_cast<Enum>(count)), "unknown");
  EXPECT_FALSE(parse("").has_value());
  if (first == 0) {
    EXPECT_FALSE(parse("unknown").has_value());
  }
  EXPECT_FALSE(parse(std::string(name_of(static_cast<Enum>(first))) + "x").has_value());
}

TEST(VocabularyTest, RolesRoundTripThroughTheirNames) {
  expect_round_trip<TensorRole>(kNumTensorRoles, role_name, parse_role);
  EXPECT_EQ(role_name(TensorRole::kActivationGrad), "activation_grad");
  EXPECT_EQ(role_name(TensorRole::kMasterWeight), "master_weight");
}

TEST(VocabularyTest, PhasesRoundTripThroughTheirNames) {
  // kUnknown (0) is the phase of a tensor shown outside any named point of the step.
  expect_round_trip<TensorPhase>(kNumTensorPhases, phase_name, parse_phase, 1);
  EXPECT_EQ(phase_name(TensorPhase::kUnknown), "unknown");
  EXPECT_EQ(parse_phase("unknown"), TensorPhase::kUnknown);
  EXPECT_EQ(phase_name(TensorPhase::kAfterUnscale), "after_unscale");
}

TEST(VocabularyTest, ScalerKindsRoundTripThroughTheirNames) {
  expect_round_trip<ScalerKind>(kNumScalerKinds, scaler_kind_name, parse_scaler_kind);
  EXPECT_EQ(parse_scaler_kind("Hysteresis"), ScalerKind::kHysteresis);
}

TEST(VocabularyTest, DevicesHaveNames) {
  EXPECT_EQ(device_name(Device::kCpu), "cpu");
  EXPECT_EQ(device_name(Device::kCuda), "cuda");
}

TEST(VocabularyTest, OnlyGradientsCarryTheLossScale) {
  for (int i = 0; i < kNumTensorRoles; ++i) {
    const auto r = static_cast<TensorRole>(i);
    EXPECT_EQ(is_loss_scaled(r), r == TensorRole::kActivationGrad || r == TensorRole::kWeightGrad)
        << role_name(r);
  }
}

// The numbers are part of the wire and C contracts (both convert with static_asserts); a
// renumbering here must be deliberate.
TEST(VocabularyTest, NumbersAreStable) {
  EXPECT_EQ(static_cast<int>(TensorRole::kWeight), 0);
  EXPECT_EQ(static_cast<int>(TensorRole::kLoss), 6);
  EXPECT_EQ(static_cast<int>(TensorPhase::kUnknown), 0);
  EXPECT_EQ(static_cast<int>(TensorPhase::kAfterUnscale), 4);
  EXPECT_EQ(static_cast<int>(ScalerKind::kStatic), 0);
  EXPECT_EQ(static_cast<int>(ScalerKind::kHysteresis), 2);
}

}  // namespace
}  // namespace ampscope
