// Bulk conversions between FP32 and the narrow formats (ampscope/cuda/convert.h).
//
// Design: elementwise and memory-bound, so the only concern is moving bytes efficiently. Each
// thread handles a group of 4 elements per grid-stride step: one 16-byte FP32 load or store and
// one 8-byte (FP16/BF16) or 4-byte (FP8, FP6, FP4: a byte each) narrow load or store. Where
// either pointer is not aligned to its group size the launcher picks the per-element kernel
// instead, which reads typed elements when the pointers are element-aligned and assembles them
// from bytes otherwise (a misaligned view is rare but legal). The rounding itself is
// convert_element.cuh: one template instantiation per format, chosen once by the launcher's
// switch.
#include <cstdint>
#include <type_traits>

#include "ampscope/check.h"
#include "ampscope/cuda/check.h"
#include "ampscope/cuda/convert.h"
#include "convert_element.cuh"
#include "runtime.cuh"

namespace ampscope::cuda {
namespace detail {
namespace {

constexpr int kGroup = 4;        // elements per thread per grid-stride step
constexpr int kBlocksPerSm = 8;  // 2048 resident threads per SM at 256 threads per block

// Four narrow elements in one aligned word: uint2 for 16-bit formats, uint32_t for byte ones.
template <Format F>
using NarrowGroup = std::conditional_t<sizeof(NarrowStorage<F>) == 2, uint2, std::uint32_t>;

template <Format F>
__device__ NarrowGroup<F> pack_group(float4 v, OverflowMode mode) {
  const std::uint32_t e0 = narrow_from_fp32<F>(v.x, mode);
  const std::uint32_t e1 = narrow_from_fp32<F>(v.y, mode);
  const std::uint32_t e2 = narrow_from_fp32<F>(v.z, mode);
  const std::uint32_t e3 = narrow_from_fp32<F>(v.w, mode);
  if constexpr (sizeof(NarrowStorage<F>) == 2) {
    return make_uint2(e0 | (e1 << 16), e2 | (e3 << 16));  // little-endian: element 0 is low
  } else {
    return e0 | (e1 << 8) | (e2 << 16) | (e3 << 24);
  }
}

template <Format F>
__device__ float4 unpack_group(NarrowGroup<F> g) {
  using S = NarrowStorage<F>;
  if constexpr (sizeof(S) == 2) {
    return make_float4(
        narrow_to_fp32<F>(static_cast<S>(g.x)), narrow_to_fp32<F>(static_cast<S>(g.x >> 16)),
        narrow_to_fp32<F>(static_cast<S>(g.y)), narrow_to_fp32<F>(static_cast<S>(g.y >> 16)));
  } else {
    return make_float4(
        narrow_to_fp32<F>(static_cast<S>(g)), narrow_to_fp32<F>(static_cast<S>(g >> 8)),
        narrow_to_fp32<F>(static_cast<S>(g >> 16)), narrow_to_fp32<F>(static_cast<S>(g >> 24)));
  }
}

// Element i of a T array at any byte address. kAligned: the address is a multiple of sizeof(T).
template <typename T, bool kAligned>
__device__ T load_element(const unsigned char* base, std::size_t i) {
  if constexpr (kAligned) return reinterpret_cast<const T*>(base)[i];
  T value;
  unsigned char* bytes = reinterpret_cast<unsigned char*>(&value);
  for (std::size_t b = 0; b < sizeof(T); ++b) bytes[b] = base[i * sizeof(T) + b];
  return value;
}

template <typename T, bool kAligned>
__device__ void store_element(unsigned char* base, std::size_t i, T value) {
  if constexpr (kAligned) {
    reinterpret_cast<T*>(base)[i] = value;
  } else {
    const unsigned char* bytes = reinterpret_cast<const unsigned char*>(&value);
    for (std::size_t b = 0; b < sizeof(T); ++b) base[i * sizeof(T) + b] = bytes[b];
  }
}

__device__ std::size_t global_thread() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ std::size_t grid_threads() { return static_cast<std::size_t>(gridDim.x) * blockDim.x; }

// src: (n,) FP32, 16-byte aligned; dst: (n,) narrow, aligned to a group. The n % 4 tail goes
// to the first threads of the grid.
template <Format F>
__global__ void from_fp32_grouped_kernel(const float* __restrict__ src,
                                         NarrowStorage<F>* __restrict__ dst, std::size_t n,
                                         OverflowMode mode) {
  const std::size_t groups = n / kGroup;
  const auto* src4 = reinterpret_cast<const float4*>(src);
  auto* dst4 = reinterpret_cast<NarrowGroup<F>*>(dst);
  for (std::size_t g = global_thread(); g < groups; g += grid_threads()) {
    dst4[g] = pack_group<F>(src4[g], mode);
  }
  const std::size_t tail = groups * kGroup + global_thread();
  if (tail < n) dst[tail] = narrow_from_fp32<F>(src[tail], mode);
}

// src: (n,) FP32 at any address; dst: (n,) narrow at any address.
template <Format F, bool kAligned>
__global__ void from_fp32_elementwise_kernel(const unsigned char* __restrict__ src,
                                             unsigned char* __restrict__ dst, std::size_t n,
                                             OverflowMode mode) {
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) {
    const float x = load_element<float, kAligned>(src, i);
    store_element<NarrowStorage<F>, kAligned>(dst, i, narrow_from_fp32<F>(x, mode));
  }
}

// src: (n,) narrow, aligned to a group; dst: (n,) FP32, 16-byte aligned.
template <Format F>
__global__ void to_fp32_grouped_kernel(const NarrowStorage<F>* __restrict__ src,
                                       float* __restrict__ dst, std::size_t n) {
  const std::size_t groups = n / kGroup;
  const auto* src4 = reinterpret_cast<const NarrowGroup<F>*>(src);
  auto* dst4 = reinterpret_cast<float4*>(dst);
  for (std::size_t g = global_thread(); g < groups; g += grid_threads()) {
    dst4[g] = unpack_group<F>(src4[g]);
  }
  const std::size_t tail = groups * kGroup + global_thread();
  if (tail < n) dst[tail] = narrow_to_fp32<F>(src[tail]);
}

template <Format F, bool kAligned>
__global__ void to_fp32_elementwise_kernel(const unsigned char* __restrict__ src,
                                           unsigned char* __restrict__ dst, std::size_t n) {
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) {
    const auto bits = load_element<NarrowStorage<F>, kAligned>(src, i);
    store_element<float, kAligned>(dst, i, narrow_to_fp32<F>(bits));
  }
}

enum class Layout { kGrouped, kElementAligned, kMisaligned };

Layout choose_layout(const void* fp32, const void* narrow, std::size_t narrow_bytes) {
  if (is_aligned(fp32, sizeof(float4)) && is_aligned(narrow, kGroup * narrow_bytes)) {
    return Layout::kGrouped;
  }
  if (is_aligned(fp32, sizeof(float)) && is_aligned(narrow, narrow_bytes)) {
    return Layout::kElementAligned;
  }
  return Layout::kMisaligned;
}

template <Format F>
void launch_from_fp32(const float* src, void* dst, std::size_t n, OverflowMode mode,
                      cudaStream_t stream) {
  const auto* s = reinterpret_cast<const unsigned char*>(src);
  auto* d = static_cast<unsigned char*>(dst);
  switch (choose_layout(src, dst, sizeof(NarrowStorage<F>))) {
    case Layout::kGrouped: {
      // At least one block, whose first threads also convert the tail of fewer than 4.
      const int blocks = grid_blocks(n / kGroup, kBlocksPerSm);
      from_fp32_grouped_kernel<F><<<blocks, kThreadsPerBlock, 0, stream>>>(
          src, static_cast<NarrowStorage<F>*>(dst), n, mode);
      break;
    }
    case Layout::kElementAligned:
      from_fp32_elementwise_kernel<F, true>
          <<<grid_blocks(n, kBlocksPerSm), kThreadsPerBlock, 0, stream>>>(s, d, n, mode);
      break;
    case Layout::kMisaligned:
      from_fp32_elementwise_kernel<F, false>
          <<<grid_blocks(n, kBlocksPerSm), kThreadsPerBlock, 0, stream>>>(s, d, n, mode);
      break;
  }
  AMPSCOPE_CHECK_CUDA(cudaGetLastError());
}

template <Format F>
void launch_to_fp32(const void* src, float* dst, std::size_t n, cudaStream_t stream) {
  const auto* s = static_cast<const unsigned char*>(src);
  auto* d = reinterpret_cast<unsigned char*>(dst);
  switch (choose_layout(dst, src, sizeof(NarrowStorage<F>))) {
    case Layout::kGrouped: {
      const int blocks = grid_blocks(n / kGroup, kBlocksPerSm);
      to_fp32_grouped_kernel<F><<<blocks, kThreadsPerBlock, 0, stream>>>(
          static_cast<const NarrowStorage<F>*>(src), dst, n);
      break;
    }
    case Layout::kElementAligned:
      to_fp32_elementwise_kernel<F, true>
          <<<grid_blocks(n, kBlocksPerSm), kThreadsPerBlock, 0, stream>>>(s, d, n);
      break;
    case Layout::kMisaligned:
      to_fp32_elementwise_kernel<F, false>
          <<<grid_blocks(n, kBlocksPerSm), kThreadsPerBlock, 0, stream>>>(s, d, n);
      break;
  }
  AMPSCOPE_CHECK_CUDA(cudaGetLastError());
}

void check_format(Format f) {
  AMPSCOPE_CHECK(static_cast<int>(f) < kNumFormats, "unknown format ", static_cast<int>(f));
}

// Shared preconditions; false when there is nothing to do.
bool check_buffers(const void* src, const void* dst, std::size_t n, std::size_t src_bytes,
                   std::size_t dst_bytes) {
  if (n == 0) return false;
  check_device_accessible(src, "src");
  check_device_accessible(dst, "dst");
  const auto s = reinterpret_cast<std::uintptr_t>(src);
  const auto d = reinterpret_cast<std::uintptr_t>(dst);
  AMPSCOPE_CHECK(s + n * src_bytes <= d || d + n * dst_bytes <= s, "src and dst overlap: ", n,
                 " elements at ", src, " and ", dst);
  return true;
}

}  // namespace
}  // namespace detail

void convert_from_fp32(const float* src, void* dst, std::size_t n, Format dst_format,
                       OverflowMode mode, cudaStream_t stream) {
  using namespace detail;
  const NvtxRange range{"ampscope::cuda::convert_from_fp32"};
  check_format(dst_format);
  const auto dst_bytes = static_cast<std::size_t>(storage_bytes(dst_format));
  if (!check_buffers(src, dst, n, sizeof(float), dst_bytes)) return;
  switch (dst_format) {
    case Format::kFP32:
      AMPSCOPE_CHECK_CUDA(
          cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
      return;
    case Format::kFP16:
      return launch_from_fp32<Format::kFP16>(src, dst, n, mode, stream);
    case Format::kBF16:
      return launch_from_fp32<Format::kBF16>(src, dst, n, mode, stream);
    case Format::kE4M3:
      return launch_from_fp32<Format::kE4M3>(src, dst, n, mode, stream);
    case Format::kE5M2:
      return launch_from_fp32<Format::kE5M2>(src, dst, n, mode, stream);
    case Format::kE2M1:
      return launch_from_fp32<Format::kE2M1>(src, dst, n, mode, stream);
    case Format::kE3M2:
      return launch_from_fp32<Format::kE3M2>(src, dst, n, mode, stream);
    case Format::kE2M3:
      return launch_from_fp32<Format::kE2M3>(src, dst, n, mode, stream);
  }
}

void convert_to_fp32(const void* src, float* dst, std::size_t n, Format src_format,
                     cudaStream_t stream) {
  using namespace detail;
  const NvtxRange range{"ampscope::cuda::convert_to_fp32"};
  check_format(src_format);
  const auto src_bytes = static_cast<std::size_t>(storage_bytes(src_format));
  if (!check_buffers(src, dst, n, src_bytes, sizeof(float))) return;
  switch (src_format) {
    case Format::kFP32:
      AMPSCOPE_CHECK_CUDA(
          cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
      return;
    case Format::kFP16:
      return launch_to_fp32<Format::kFP16>(src, dst, n, stream);
    case Format::kBF16:
      return launch_to_fp32<Format::kBF16>(src, dst, n, stream);
    case Format::kE4M3:
      return launch_to_fp32<Format::kE4M3>(src, dst, n, stream);
    case Format::kE5M2:
      return launch_to_fp32<Format::kE5M2>(src, dst, n, stream);
    case Format::kE2M1:
      return launch_to_fp32<Format::kE2M1>(src, dst, n, stream);
    case Format::kE3M2:
      return launch_to_fp32<Format::kE3M2>(src, dst, n, stream);
    case Format::kE2M3:
      return launch_to_fp32<Format::kE2M3>(src, dst, n, stream);
  }
}

}  // namespace ampscope::cuda
