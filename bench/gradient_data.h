// Synthetic gradients for the benchmarks: N(0, stddev) values with a few specials, the way a
// real gradient tensor looks to the statistics kernels (exact zeros, the odd NaN/Inf, a value
// far out of FP16/E4M3 range). Element i depends only on (seed, i), so FP32, FP16 and BF16
// buffers hold the same values (rounded by ampscope::convert_from_fp32) whatever the thread
// count, and bench/peers/torch_stats.py can place the same specials.
//
// Layout, per chunk of kGradientChunk elements (the chunk's normals come from mt19937_64 seeded
// by (seed, chunk index)): element 512 of every 1024 is 0; chunk offsets 17, 4242, 9999 and
// 31337 hold NaN, +Inf, -Inf and 1e5.
// Thread safety: re-entrant.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ampscope/formats.h"

namespace ampscope::bench {

inline constexpr std::size_t kGradientChunk = std::size_t{1} << 16;

struct GradientSpec {
  double stddev = 1e-3;
  std::uint64_t seed = 42;
};

// Writes n elements of `storage` (fp32, fp16 or bf16) to out, generated on `threads` threads.
void fill_gradients(void* out, std::size_t n, Format storage, const GradientSpec& spec,
                    int threads);

}  // namespace ampscope::bench
