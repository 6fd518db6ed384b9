#include "ampscope/proto/stats_codec.h"

#include "ampscope/proto/vocabulary_codec.h"

namespace ampscope::proto {

void encode_stats(const TensorStats& s, bool full, v1::TensorStats* out) {
  out->set_numel(s.numel);
  out->set_zeros(s.zeros);
  out->set_nan(s.nan);
  out->set_pos_inf(s.pos_inf);
  out->set_neg_inf(s.neg_inf);
  out->set_max_abs(s.max_abs);
  if (!full) {
    out->set_level(v1::STATS_LEVEL_COUNTS);
    return;
  }
  out->set_level(v1::STATS_LEVEL_FULL);
  out->set_min_abs_nonzero(s.min_abs_nonzero);
  out->set_sum(s.sum);
  out->set_sum_sq(s.sum_sq);
  v1::BinadeHistogram* h = out->mutable_histogram();
  if (!s.histogram.empty()) {
    h->set_min_exponent(s.histogram.min_exponent);
    for (std::uint64_t c : s.histogram.counts) h->add_counts(c);
  }
  for (const TargetCounts& c : s.targets) {
    v1::TargetCounts* t = out->add_targets();
    t->set_format(to_proto(c.target.format));
    t->set_scale_log2(c.target.scale_log2);
    t->set_overflow(c.overflow);
    t->set_underflow(c.underflow);
    t->set_subnormal(c.subnormal);
  }
}

}  // namespace ampscope::proto
