// The agent's cheap every-step pass: element, zero, NaN and +-Inf counts and the largest finite
// |x| of a tensor, read as integer bit patterns (no conversion, no histogram), so that counting
// every gradient of every step costs about one read of the memory. compute_stats() gives the
// same fields (tests/agent/counts_test.cc checks them against compute_stats_reference); this
// pass exists because the full statistics cost several times more per element.
// Thread safety: re-entrant.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ampscope/cpu_features.h"
#include "ampscope/formats.h"
#include "ampscope/tensor_stats.h"

namespace ampscope::agent {

// Fills numel, zeros, nan, pos_inf, neg_inf and max_abs of a TensorStats (the rest stays 0).
// dtype must be FP32, FP16, BF16, E4M3 or E5M2 (is_stats_storage_format); anything else counts
// nothing and returns false.
bool count_nonfinite(const void* data, std::size_t n, Format dtype, TensorStats* out);

// The same at an explicit SIMD level (clamped to what the CPU has); the call above uses
// active_simd_level(). The results do not depend on the level.
bool count_nonfinite(const void* data, std::size_t n, Format dtype, SimdLevel level,
                     TensorStats* out);

}  // namespace ampscope::agent
