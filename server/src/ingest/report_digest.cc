#include "report_digest.h"

#include <cmath>

#include "ampscope/loss_scale.h"
#include "ampscope/proto/stats_codec.h"
#include "ampscope/proto/quantizer_codec.h"
#include "ampscope/proto/vocabulary_codec.h"

namespace ampscope::server {
policy::StepInput::Offender to_offender(const v1::FirstOffender& f) {
  return {f.tensor(), proto::from_proto(f.role()).value_or(TensorRole::kActivation)};
}

namespace {

// The report's own fields of the engine's input; the tensors are the caller's.
policy::StepInput step_header(const v1::StepReport& r) {
  policy::StepInput in;
  in.run_id = r.run_id();
  in.rank = static_cast<int>(r.rank());
  in.step = r.step();
  in.loss_scale = r.loss_scale();
  in.scale_after = r.scale_after();
  in.found_inf = r.found_inf();
  in.skipped = r.skipped();
  if (r.has_first_offender()) in.first_offender = to_offender(r.first_offender());
  return in;
}

policy::TensorInput to_tensor_input(const v1::TensorStats& t) {
  policy::TensorInput ti;
  ti.name = t.name();
  ti.role = proto::from_proto(t.role()).value_or(TensorRole::kActivation);
  ti.storage = proto::from_proto(t.dtype()).value_or(Format::kFP32);
  ti.scale = t.scale();
  ti.phase = proto::from_proto(t.phase());
  if (t.has_histogram()) {
    BinadeHistogram h;
    h.min_exponent = t.histogram().min_exponent();
    h.counts.assign(t.histogram().counts().begin(), t.histogram().counts().end());
    ti.histogram = std::move(h);
  }
  ti.max_abs = t.max_abs();
  ti.numel = t.numel();
  ti.nan = t.nan();
  ti.pos_inf = t.pos_inf();
  ti.neg_inf = t.neg_inf();
  if (t.targets_size() > 0) {
    const v1::TargetCounts& c = t.targets(0);
    ti.target = proto::from_proto(c.format());
    // targets[0] at scale_log2 0 is the question "as cast this step": its counts are exact.
    if (c.scale_log2() == 0) {
      ti.overflow = c.overflow();
      ti.underflow = c.underflow();
    }
  }
  // Where the values are really held, when the agent says so: the counts of targets[0] then
  // answer a what-if question about another format and are no overflow evidence.
  if (t.has_held() && proto::from_proto(t.held()) != ti.target) {
    ti.target = proto::from_proto(t.held());
    ti.overflow.reset();
    ti.underflow.reset();
  }
  return ti;
}

// The report's quantisers as the engine reads them. Validation let only recipes through that
// parse_recipe reads.
void add_quantizers(const v1::StepReport& r, policy::StepInput& in) {
  in.quantizers.reserve(static_cast<std::size_t>(r.quantizers_size()));
  for (const v1::QuantizerStats& q : r.quantizers()) {
    std::optional<RecipeCounts> counts = proto::decode_quantizer(q);
    if (!counts) continue;
    policy::QuantizerInput& qi = in.quantizers.emplace_back();
    qi.name = q.name();
    qi.layer = q.layer();
    qi.role = proto::from_proto(q.role()).value_or(TensorRole::kActivation);
    qi.what_if = q.what_if();
    qi.counts = std::move(*counts);
    qi.amax_history.assign(q.amax_history().begin(), q.amax_history().end());
    if (q.has_loss_cost()) qi.loss_cost = q.loss_cost();
  }
}

bool for_policy(const v1::TensorStats& t, bool all_tensors) {
  return all_tensors || proto::is_loss_scaled(t.role());
}

TensorDigest tensor_digest(const v1::TensorStats& t) {
  TensorDigest d;
  d.name = t.name();
  d.role = t.role();
  d.nonfinite = proto::nonfinite(t);
  d.max_abs = t.max_abs() / t.scale();
  if (t.targets_size() > 0) {
    const v1::TargetCounts& c = t.targets(0);
    d.format = c.format();
    d.values = proto::finite_nonzero(t);
    d.overflow = c.overflow();
    d.underflow = c.underflow();
  }
  return d;
}

void add_to_role(const v1::TensorStats& t, const TensorDigest& td, RoleDigest& r) {
  r.seen = true;
  r.nonfinite[0] += t.nan();
  r.nonfinite[1] += t.pos_inf();
  r.nonfinite[2] += t.neg_inf();
  if (t.targets_size() == 0) return;
  const int fmt = td.format > 0 && td.format < kFormatSlots ? td.format : 0;
  RoleDigest::Target& target = r.targets[fmt];
  target.seen = true;
  target.checked += td.values;
  target.overflow += td.overflow;
  target.underflow += td.underflow;
  target.subnormal += t.targets(0).subnormal();
}

// The binade histogram shifted to the unscaled domain, into power-of-two buckets: binade e
// holds values in [2^e, 2^(e+1)), all <= 2^(e+1).
void add_to_gradient(const v1::TensorStats& t, GradientDigest& g) {
  if (g.buckets.empty()) g.buckets.assign(kGradBuckets + 1, 0.0);
  const int shift = scale_exponent(t.scale());
  const v1::BinadeHistogram& h = t.histogram();
  for (int i = 0; i < h.counts_size(); ++i) {
    if (h.counts(i) == 0) continue;
    const int e = h.min_exponent() + i - shift;
    const int upper = e + 1;
    const int bucket = upper < kGradBucketMinLog2   ? 0
                       : upper > kGradBucketMaxLog2 ? kGradBuckets
                                                    : upper - kGradBucketMinLog2;
    const double n = static_cast<double>(h.counts(i));
    g.buckets[static_cast<std::size_t>(bucket)] += n;
    g.sum += n * 1.5 * std::ldexp(1.0, e);
  }
}

}  // namespace

ReportDigest digest_report(const v1::StepReport& r, bool policy_all_tensors,
                           bool policy_quantizers) {
  ReportDigest d;
  d.step_input = step_header(r);
  if (policy_quantizers) add_quantizers(r, d.step_input);
  d.tensors.reserve(static_cast<std::size_t>(r.tensors_size()));
  for (const v1::TensorStats& t : r.tensors()) {
    const TensorDigest& td = d.tensors.emplace_back(tensor_digest(t));
    if (for_policy(t, policy_all_tensors)) d.step_input.tensors.push_back(to_tensor_input(t));
    if (t.role() <= 0 || t.role() >= kRoleSlots) continue;
    add_to_role(t, td, d.roles[t.role()]);
    // Weight grads are also measured after unscaling; counting both would count them twice.
    if (proto::is_loss_scaled(t.role()) && t.has_histogram() &&
        t.phase() != v1::TENSOR_PHASE_AFTER_UNSCALE) {
      add_to_gradient(t, d.gradient[t.role() == v1::TENSOR_ROLE_ACTIVATION_GRAD ? 0 : 1]);
    }
  }
  if (r.has_first_offender()) {
    const int role = r.first_offender().role();
    if (role > 0 && role < kRoleSlots) d.first_offender_role = role;
  }
  return d;
}

policy::StepInput to_step_input(const v1::StepReport& r, bool all_tensors, bool quantizers) {
  policy::StepInput in = step_header(r);
  if (quantizers) add_quantizers(r, in);
  in.tensors.reserve(static_cast<std::size_t>(r.tensors_size()));
  for (const v1::TensorStats& t : r.tensors()) {
    if (for_policy(t, all_tensors)) in.tensors.push_back(to_tensor_input(t));
  }
  return in;
}

}  // namespace ampscope::server
