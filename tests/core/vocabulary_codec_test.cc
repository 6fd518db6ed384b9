// The vocabulary on the wire: every value maps to the proto enum of the same meaning and back,
// and what the wire may carry that the vocabulary lacks (UNSPECIFIED, a newer peer's numbers)
// maps to nothing rather than to a wrong value.
#include "ampscope/proto/vocabulary_codec.h"

#include <gtest/gtest.h>

#include <string>

namespace ampscope::proto {
namespace {

// The proto enum's own name, lower-cased without its prefix, is the vocabulary's name.
std::string wire_name(const std::string& proto_name, const std::string& prefix) {
  std::string s = proto_name.substr(prefix.size());
  for (char& c : s) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  return s;
}

TEST(VocabularyCodecTest, RolesMapByMeaning) {
  for (int i = 0; i < kNumTensorRoles; ++i) {
    const auto r = static_cast<TensorRole>(i);
    EXPECT_EQ(wire_name(v1::TensorRole_Name(to_proto(r)), "TENSOR_ROLE_"), role_name(r));
    EXPECT_EQ(from_proto(to_proto(r)), r);
  }
  EXPECT_FALSE(from_proto(v1::TENSOR_ROLE_UNSPECIFIED).has_value());
  EXPECT_FALSE(from_proto(static_cast<v1::TensorRole>(99)).has_value());
  EXPECT_TRUE(is_loss_scaled(v1::TENSOR_ROLE_WEIGHT_GRAD));
  EXPECT_FALSE(is_loss_scaled(v1::TENSOR_ROLE_UNSPECIFIED));
}

TEST(VocabularyCodecTest, PhasesMapByMeaning) {
  for (int i = 1; i < kNumTensorPhases; ++i) {
    const auto p = static_cast<TensorPhase>(i);
    EXPECT_EQ(wire_name(v1::TensorPhase_Name(to_proto(p)), "TENSOR_PHASE_"), phase_name(p));
    EXPECT_EQ(from_proto(to_proto(p)), p);
  }
  EXPECT_EQ(to_proto(TensorPhase::kUnknown), v1::TENSOR_PHASE_UNSPECIFIED);
  EXPECT_EQ(from_proto(static_cast<v1::TensorPhase>(99)), TensorPhase::kUnknown);
}

TEST(VocabularyCodecTest, FormatsMapByMeaning) {
  for (int i = 0; i < kNumFormats; ++i) {
    const auto f = static_cast<Format>(i);
    EXPECT_EQ(wire_name(v1::Format_Name(to_proto(f)), "FORMAT_"), format_name(f));
    EXPECT_EQ(from_proto(to_proto(f)), f);
  }
  EXPECT_FALSE(from_proto(v1::FORMAT_UNSPECIFIED).has_value());
}

TEST(VocabularyCodecTest, ScalerKindsMapByMeaning) {
  for (int i = 0; i < kNumScalerKinds; ++i) {
    const auto k = static_cast<ScalerKind>(i);
    EXPECT_EQ(wire_name(v1::ScalerKind_Name(to_proto(k)), "SCALER_KIND_"), scaler_kind_name(k));
    EXPECT_EQ(from_proto(to_proto(k)), k);
  }
  EXPECT_FALSE(from_proto(v1::SCALER_KIND_UNSPECIFIED).has_value());
}

}  // namespace
}  // namespace ampscope::proto
