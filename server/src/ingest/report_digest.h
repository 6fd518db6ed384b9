// A stored report, digested once. One pass over its tensors yields everything the server derives
// from them, and the same digest feeds all three consumers: the run's tensor totals (Ingest,
// stored with the report and ranked for the top-K series), the per-report series (Metrics) and
// the policy engine's input (PolicyHost).
//
// Thread safety: pure functions; a digest points into nothing (it copies the names it keeps).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "ampscope/formats.h"
#include "ampscope/policy/policy_engine.h"
#include "ampscope/v1/telemetry.pb.h"
#include "ampscope/vocabulary.h"

namespace ampscope::server {

// Buckets of ampscope_gradient_magnitude: le = 2^e for e in [kGradBucketMinLog2,
// kGradBucketMaxLog2] (the unscaled range of FP16/FP8 gradients under any usual loss scale),
// plus +Inf.
inline constexpr int kGradBucketMinLog2 = -64;
inline constexpr int kGradBucketMaxLog2 = 16;
inline constexpr int kGradBuckets = kGradBucketMaxLog2 - kGradBucketMinLog2 + 1;  // without +Inf
// Slots indexed by the wire enums' values, UNSPECIFIED (0) included.
inline constexpr int kRoleSlots = kNumTensorRoles + 1;
inline constexpr int kFormatSlots = kNumFormats + 1;

// One TensorStats, as the run's tensor totals add it up.
struct TensorDigest {
  std::string name;
  int role = 0;    // v1::TensorRole
  int format = 0;  // v1::Format of targets[0]; 0 without targets
  std::uint64_t nonfinite = 0;
  // From targets[0], when there is one: finite nonzero elements checked, and their counts.
  std::uint64_t values = 0;
  std::uint64_t overflow = 0;
  std::uint64_t underflow = 0;
  double max_abs = 0.0;  // unscaled
};

// The tensors of one role, summed: each per-(rank, role[, format]) series is touched once.
struct RoleDigest {
  struct Target {
    bool seen = false;
    std::uint64_t checked = 0;  // finite nonzero elements
    std::uint64_t overflow = 0;
    std::uint64_t underflow = 0;
    std::uint64_t subnormal = 0;
  };
  bool seen = false;
  std::array<std::uint64_t, 3> nonfinite{};  // nan, pos_inf, neg_inf
  std::array<Target, kFormatSlots> targets{};  // by targets[0].format (0: out of range)
};

// Unscaled gradient magnitudes of one role in ampscope_gradient_magnitude's buckets.
struct GradientDigest {
  std::vector<double> buckets;  // kGradBuckets + 1 (the last is +Inf); empty: no histogram seen
  double sum = 0.0;             // each value of binade e counted as 1.5 * 2^e
};

struct ReportDigest {
  std::vector<TensorDigest> tensors;        // in the report's order
  std::array<RoleDigest, kRoleSlots> roles{};
  std::array<GradientDigest, 2> gradient;   // activation_grad, weight_grad
  int first_offender_role = 0;              // v1::TensorRole; 0 when none (or out of range)
  policy::StepInput step_input;             // what the policy engine observes
};

// `policy_all_tensors`: the engine's input holds every tensor (FP32 fallback needs them), or
// only those the loss scale multiplies (all the headroom mode reads). `policy_quantizers`: it
// holds the report's quantisers (per-layer precision needs them).
ReportDigest digest_report(const v1::StepReport& report, bool policy_all_tensors,
                           bool policy_quantizers = false);

// The engine's input alone, for replaying stored reports into a restored engine.
// The engine's view of a report's first offender.
policy::StepInput::Offender to_offender(const v1::FirstOffender& offender);

policy::StepInput to_step_input(const v1::StepReport& report, bool all_tensors = true,
                                bool quantizers = true);

}  // namespace ampscope::server
