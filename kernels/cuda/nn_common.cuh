// Private helpers of the trainer kernels (trainer/layers/<layer>/<layer>.cu): precondition
// checks, stream-ordered scratch, grid-stride indexing and deterministic warp and block
// reductions.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "ampscope/check.h"
#include "ampscope/cuda/check.h"
#include "ampscope/cuda/nn.h"
#include "runtime.cuh"

namespace ampscope::cuda::nn::detail {

using ::ampscope::cuda::detail::grid_blocks;
using ::ampscope::cuda::detail::kThreadsPerBlock;
using ::ampscope::cuda::detail::NvtxRange;

inline constexpr int kWarpSize = 32;
inline constexpr unsigned kFullWarp = 0xFFFFFFFFu;
inline constexpr int kElementwiseBlocksPerSm = 8;
// Kernels that give each row a warp run kWarpsPerBlock rows per block.
inline constexpr int kWarpsPerBlock = kThreadsPerBlock / kWarpSize;

inline bool is_trainer_format(Format f) {
  return f == Format::kFP32 || f == Format::kFP16 || f == Format::kBF16;
}

// Throws unless the array's format is FP32/FP16/BF16 and, when it holds elements, its data is
// device-accessible memory aligned to its element.
inline void check_array(ConstArray a, std::int64_t n, const char* what) {
  AMPSCOPE_CHECK(is_trainer_format(a.dtype), what, ": expected fp32, fp16 or bf16 storage, found ",
                 format_name(a.dtype));
  AMPSCOPE_CHECK(n >= 0, what, ": negative element count ", n);
  if (n == 0) return;
  ::ampscope::cuda::detail::check_device_accessible(a.data, what);
  AMPSCOPE_CHECK(::ampscope::cuda::detail::is_aligned(
                     a.data, static_cast<std::size_t>(storage_bytes(a.dtype))),
                 what, " (", a.data, ") is not aligned to its ", storage_bytes(a.dtype),
                 "-byte elements");
}

inline void check_compute(Format compute, const char* what) {
  AMPSCOPE_CHECK(is_trainer_format(compute), what, ": compute format must be fp32, fp16 or bf16, ",
                 "found ", format_name(compute));
}

inline void check_launch() { AMPSCOPE_CHECK_CUDA(cudaGetLastError()); }

// Throws when `rows` blocks (one per row) would not fit a grid's x dimension.
inline void check_grid_rows(std::int64_t rows, const char* what) {
  AMPSCOPE_CHECK(rows <= (std::int64_t{1} << 31) - 1, what, ": ", rows, " rows exceed the grid");
}

inline int elementwise_blocks(std::int64_t n) {
  return grid_blocks(static_cast<std::size_t>(n), kElementwiseBlocksPerSm);
}

// Device memory for the duration of one launcher's work, from the stream-ordered allocator:
// allocated on `stream` and given back on `stream` after the work enqueued before the
// destructor, so no synchronisation is needed and the pool reuses it on the next call.
class StreamScratch {
 public:
  StreamScratch(std::size_t bytes, cudaStream_t stream) : stream_(stream) {
    if (bytes > 0) AMPSCOPE_CHECK_CUDA(cudaMallocAsync(&data_, bytes, stream));
  }
  ~StreamScratch() {
    if (data_ != nullptr) (void)cudaFreeAsync(data_, stream_);
  }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;

  void* get() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
  cudaStream_t stream_;
};

__device__ inline std::int64_t global_thread() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline std::int64_t grid_threads() {
  return static_cast<std::int64_t>(gridDim.x) * blockDim.x;
}

// Butterfly reductions: every lane ends with the same value, formed in the same order on every
// run. max is written as the CPU's std::max comparison.
template <typename T>
__device__ inline T warp_sum(T v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(kFullWarp, v, offset);
  }
  return v;
}

__device__ inline float warp_max(float v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const float other = __shfl_xor_sync(kFullWarp, v, offset);
    v = (v < other) ? other : v;
  }
  return v;
}

// Block-wide reductions for blocks of kThreadsPerBlock threads; every thread gets the result.
// `shared` holds one value per warp. Callers must reach them with the whole block.
template <typename T>
__device__ inline T block_sum(T v, T* shared) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  v = warp_sum(v);
  __syncthreads();  // `shared` may still be read from a previous reduction
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / kWarpSize;
  T total = lane < warps ? shared[lane] : T(0);
  return warp_sum(total);
}

__device__ inline float block_max(float v, float* shared) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / kWarpSize;
  float m = lane < warps ? shared[lane] : -INFINITY;
  return warp_max(m);
}

__device__ inline void report(DeviceError* error, int code, std::int64_t index, int value,
                              std::int64_t limit) {
  if (error == nullptr) return;
  if (atomicCAS(&error->code, 0, code) == 0) {
    error->index = static_cast<int>(index);
    error->value = value;
    error->limit = static_cast<int>(limit);
  }
}

}  // namespace ampscope::cuda::nn::detail
