// Private helpers shared by the CUDA launchers: the NVTX domain every launcher names itself in,
// the grid-size rule and the pointer preconditions.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <nvtx3/nvtx3.hpp>

namespace ampscope::cuda::detail {

// All ranges go into the "ampscope" domain so that profiles separate them from the trainer's.
struct NvtxDomain {
  static constexpr const char* name{"ampscope"};
};
using NvtxRange = nvtx3::scoped_range_in<NvtxDomain>;

inline constexpr int kThreadsPerBlock = 256;

// Blocks for a grid-stride kernel over `units` work items of one thread each: enough to cover
// them, at most `blocks_per_sm` per multiprocessor of the current device (beyond that, threads
// loop instead of blocks queueing). At least 1.
int grid_blocks(std::size_t units, int blocks_per_sm);

int current_device();

// Throws ampscope::Error unless p can be dereferenced by a kernel (device, managed, or pinned
// host memory). `what` names the argument in the message. nullptr is rejected too.
void check_device_accessible(const void* p, const char* what);

inline bool is_aligned(const void* p, std::size_t alignment) {
  return reinterpret_cast<std::uintptr_t>(p) % alignment == 0;
}

}  // namespace ampscope::cuda::detail
