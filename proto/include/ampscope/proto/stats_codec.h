// TensorStats (kernels) -> ampscope.v1.TensorStats (wire): the one place that writes the
// measurement fields, shared by the agent's encoder, the server's test harness and the load
// generator. The tensor's identity (name, role, phase, dtype, shape, scale) is the caller's.
// Thread safety: pure functions.
#pragma once

#include "ampscope/formats.h"
#include "ampscope/tensor_stats.h"
#include "ampscope/v1/stats.pb.h"

namespace ampscope::proto {

// The wire enum's numbers are ampscope::Format's plus one (FORMAT_UNSPECIFIED is 0).
v1::Format to_proto(Format f);

// Writes numel, the zero/NaN/Inf counts and max_abs always; with `full` also min_abs_nonzero,
// the FP64 sums, the binade histogram and the target counts, and sets the level to FULL
// (COUNTS otherwise).
void encode_stats(const TensorStats& s, bool full, v1::TensorStats* out);

}  // namespace ampscope::proto
