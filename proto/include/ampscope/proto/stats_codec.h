// TensorStats (kernels) -> ampscope.v1.TensorStats (wire): the one place that writes the
// measurement fields, shared by the agent's encoder, the server's test harness and the load
// generator. The tensor's identity (name, role, phase, dtype, shape, scale) is the caller's.
// Thread safety: pure functions.
#pragma once

#include <cstdint>

#include "ampscope/tensor_stats.h"
#include "ampscope/v1/stats.pb.h"

namespace ampscope::proto {

// Writes numel, the zero/NaN/Inf counts and max_abs always; with `full` also min_abs_nonzero,
// the FP64 sums, the binade histogram and the target counts, and sets the level to FULL
// (COUNTS otherwise).
void encode_stats(const TensorStats& s, bool full, v1::TensorStats* out);

// The counts derived from a wire TensorStats, as ampscope::TensorStats derives them. Valid once
// zeros + nan + pos_inf + neg_inf <= numel (the server's validation checks it first).
inline std::uint64_t nonfinite(const v1::TensorStats& t) {
  return t.nan() + t.pos_inf() + t.neg_inf();
}
inline std::uint64_t finite_nonzero(const v1::TensorStats& t) {
  return t.numel() - t.zeros() - nonfinite(t);
}

}  // namespace ampscope::proto
