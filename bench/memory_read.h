// The memory-read ceiling that the statistics kernels are compared against: a plain sum of a
// buffer read as 64-bit integers, split like compute_stats splits its work (the caller's thread
// plus threads - 1 more), so "stats GB/s / read GB/s" says how close a kernel gets to the
// physical limit of the machine.
// Thread safety: re-entrant; each call starts and joins its own threads.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ampscope::bench {

// Sum of the bytes / 8 little-endian 64-bit words at `data` (wrapping), read on `threads`
// std::threads over equal slices. bytes must be a multiple of 8 and data 8-byte aligned.
std::uint64_t read_sum_u64(const void* data, std::size_t bytes, int threads);

}  // namespace ampscope::bench
