// fake_quantize on the device (ampscope/cuda/recipe.h).
//
// Design: the rules are ampscope/detail/recipe_rules.h's (the CPU's expressions, shared with the host-model
// test); this file only schedules them.
//   amax_kernel    the tensor's finite amax (current, delayed, nvfp4), an atomicMax on the
//                  magnitude bits (nonnegative floats order as their bits: exact, any order);
//   tensor_kernel  per-tensor recipes: every thread derives s and 1 / s from that amax with the
//                  CPU's rule, then quantises a grid-stride share of the elements;
//   block_kernel   block recipes: one warp per block (grid-stride over blocks), two passes over
//                  the block's elements (amax and Inf/NaN, then rounding), the scale decided by
//                  every lane from the warp-reduced amax. The element loops are per lane; the
//                  loop over blocks is warp-uniform, so the warp collectives have every lane.
// Counts: per-lane registers, a warp reduction, one global atomic per quantity and warp; the
// block-scale histogram in shared memory, flushed once per thread block. Integer counts are
// exact in any order; the FP64 squared sums are not (recipe.h says so).
// In place (out == x) is safe: an element is read (twice) and written only by its own lane.
#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <string>

#include "ampscope/check.h"
#include "ampscope/cuda/check.h"
#include "ampscope/cuda/recipe.h"
#include "ampscope/detail/recipe_rules.h"
#include "recipe_codes.cuh"
#include "runtime.cuh"

namespace ampscope::cuda {
namespace detail {
namespace {

using namespace ::ampscope::recipe_rules;

using ull = unsigned long long;
constexpr unsigned kFullWarp = 0xFFFFFFFFu;
constexpr int kWarp = 32;
constexpr int kBlocksPerSm = 8;
constexpr std::uint32_t kInfBits = 0x7F800000u;

// The device accumulators of one call; zeroed before the kernels run.
struct RecipeTally {
  ull values, nonfinite, underflow, subnormal, saturated, overflow;
  ull blocks, zero_blocks, saturated_blocks, nan_blocks;
  double signal_sq, error_sq;
  unsigned amax_bits;  // finite amax, as bits
  ull histogram[kHistogramBins];
};

template <typename T>
__device__ T warp_sum(T v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullWarp, v, offset);
  return v;
}
__device__ unsigned warp_max(unsigned v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    const unsigned other = __shfl_xor_sync(kFullWarp, v, offset);
    v = other > v ? other : v;
  }
  return v;
}

// What one lane counted, beyond the element tally.
struct LaneCounts {
  ull values = 0, nonfinite = 0;
  ull blocks = 0, zero_blocks = 0, saturated_blocks = 0, nan_blocks = 0;
  unsigned amax_bits = 0;
};

// Adds a lane's counts into the device accumulators; every lane of the warp must call it.
__device__ void flush(const ElementTally& e, const LaneCounts& c, RecipeTally* t) {
  const ull sums[] = {c.values,   c.nonfinite, e.underflow,   e.subnormal,        e.saturated,
                      e.overflow, c.blocks,    c.zero_blocks, c.saturated_blocks, c.nan_blocks};
  ull* targets[] = {&t->values,           &t->nonfinite, &t->underflow, &t->subnormal,
                    &t->saturated,        &t->overflow,  &t->blocks,    &t->zero_blocks,
                    &t->saturated_blocks, &t->nan_blocks};
  const bool lead = threadIdx.x % kWarp == 0;
  for (int i = 0; i < 10; ++i) {
    const ull s = warp_sum(sums[i]);
    if (lead && s != 0) atomicAdd(targets[i], s);
  }
  const double signal = warp_sum(e.signal_sq), error = warp_sum(e.error_sq);
  const unsigned amax = warp_max(c.amax_bits);
  if (lead) {
    if (signal != 0.0) atomicAdd(&t->signal_sq, signal);
    if (error != 0.0) atomicAdd(&t->error_sq, error);
    if (amax != 0) atomicMax(&t->amax_bits, amax);
  }
}

__global__ void amax_kernel(const float* x, std::size_t n, RecipeTally* t) {
  unsigned m = 0;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const unsigned a = bits_of(x[i]) & 0x7FFFFFFFu;
    if (a < kInfBits && a > m) m = a;
  }
  m = warp_max(m);
  if (threadIdx.x % kWarp == 0 && m != 0) atomicMax(&t->amax_bits, m);
}

// current and delayed: y = x * s, dequantised q * fl32(1 / s); Inf and NaN pass through.
__global__ void tensor_kernel(const float* x, float* out, std::size_t n, RecipeParams p,
                              RecipeTally* t) {
  const float s = tensor_scale(p, float_of(t->amax_bits));
  const float inverse = div_rn(1.0f, s);
  ElementTally e;
  LaneCounts c;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float v = x[i];
    float result = v;
    if (finite_bits(v)) {
      ++c.values;
      result = quantize_finite(v, s, inverse, false, p.element, e);
    } else {
      ++c.nonfinite;
    }
    if (out != nullptr) out[i] = result;
  }
  flush(e, c, t);
}

// quantize_codes: tensor_kernel's rounding and counts, each element stored as its FP8 code at
// its place in the row-major [rows, cols] view or in its transpose.
template <Format F>
__global__ void tensor_codes_kernel(const float* x, std::uint8_t* codes, float* decode,
                                    std::size_t rows, std::size_t cols, bool transposed,
                                    RecipeParams p, RecipeTally* t) {
  const float s = tensor_scale(p, float_of(t->amax_bits));
  const float inverse = div_rn(1.0f, s);
  if (blockIdx.x == 0 && threadIdx.x == 0) *decode = inverse;
  ElementTally e;
  LaneCounts c;
  const std::size_t n = rows * cols;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float v = x[i];
    if (finite_bits(v)) {
      ++c.values;
    } else {
      ++c.nonfinite;
    }
    codes[transposed ? i % cols * rows + i / cols : i] = fp8_code<F>(v, s, inverse, p.element, e);
  }
  flush(e, c, t);
}

// tile, mx, nvfp4: a warp per block_rows x block_cols block of the [rows, cols] view, cut short
// at the right and bottom edges.
__global__ void block_kernel(const float* x, float* out, std::size_t rows, std::size_t cols,
                             RecipeParams p, RecipeTally* t) {
  __shared__ ull histogram[kHistogramBins];
  for (int i = threadIdx.x; i < kHistogramBins; i += blockDim.x) histogram[i] = 0;
  __syncthreads();

  const float tensor_decode =
      p.scaling == Scaling::kNVFP4 ? tensor_scale(p, float_of(t->amax_bits)) : 0.0f;
  const bool multiply = p.scaling == Scaling::kMX;  // x * 2^-k; tile and nvfp4 divide by d
  const auto br = static_cast<std::size_t>(p.block_rows);
  const auto bc = static_cast<std::size_t>(p.block_cols);
  const std::size_t across = (cols + bc - 1) / bc;
  const std::size_t blocks = (rows + br - 1) / br * across;
  const unsigned lane = threadIdx.x % kWarp;
  const std::size_t warps = static_cast<std::size_t>(gridDim.x) * blockDim.x / kWarp;
  ElementTally e;
  LaneCounts c;
  for (std::size_t b = (static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
       b < blocks; b += warps) {
    const std::size_t r0 = b / across * br, c0 = b % across * bc;
    const std::size_t nr = rows - r0 < br ? rows - r0 : br;
    const std::size_t nc = cols - c0 < bc ? cols - c0 : bc;
    const std::size_t count = nr * nc;
    unsigned m = 0;
    bool bad = false;
    for (std::size_t j = lane; j < count; j += kWarp) {
      const unsigned a = bits_of(x[(r0 + j / nc) * cols + c0 + j % nc]) & 0x7FFFFFFFu;
      if (a >= kInfBits) {
        bad = true;
        ++c.nonfinite;
      } else {
        ++c.values;
        m = a > m ? a : m;
      }
    }
    m = warp_max(m);
    const bool nonfinite = __any_sync(kFullWarp, bad) != 0;
    c.amax_bits = m > c.amax_bits ? m : c.amax_bits;
    const BlockScale s = block_scale(p, float_of(m), nonfinite, tensor_decode);
    const std::uint64_t saturated_before = e.saturated;
    for (std::size_t j = lane; j < count; j += kWarp) {
      const std::size_t i = (r0 + j / nc) * cols + c0 + j % nc;
      const float q = quantize_in_block(x[i], s, multiply, p.element, e);
      if (out != nullptr) out[i] = q;
    }
    const bool saturated = __any_sync(kFullWarp, e.saturated != saturated_before) != 0;
    if (lane == 0) {
      ++c.blocks;
      if (s.kind == BlockKind::kZero) ++c.zero_blocks;
      if (s.kind == BlockKind::kNaN) ++c.nan_blocks;
      if (saturated) ++c.saturated_blocks;
      if (s.kind == BlockKind::kScaled) {
        atomicAdd(&histogram[floor_log2_positive(s.dec) - kHistogramMinExponent], ull{1});
      }
    }
  }
  flush(e, c, t);
  __syncthreads();
  for (int i = threadIdx.x; i < kHistogramBins; i += blockDim.x) {
    if (histogram[i] != 0) atomicAdd(&t->histogram[i], histogram[i]);
  }
}

// The accumulators in stream-ordered device memory, zeroed on the stream.
class TallyBuffer {
 public:
  explicit TallyBuffer(cudaStream_t stream) : stream_(stream) {
    AMPSCOPE_CHECK_CUDA(
        cudaMallocAsync(reinterpret_cast<void**>(&t_), sizeof(RecipeTally), stream));
    AMPSCOPE_CHECK_CUDA(cudaMemsetAsync(t_, 0, sizeof(RecipeTally), stream));
  }
  ~TallyBuffer() { (void)cudaFreeAsync(t_, stream_); }
  TallyBuffer(const TallyBuffer&) = delete;
  TallyBuffer& operator=(const TallyBuffer&) = delete;
  RecipeTally* get() const { return t_; }

 private:
  RecipeTally* t_ = nullptr;
  cudaStream_t stream_;
};

void check_launch() { AMPSCOPE_CHECK_CUDA(cudaGetLastError()); }

RecipeCounts to_counts(RecipeCounts counts, const RecipeTally& t, const RecipeParams& p) {
  counts.values = t.values;
  counts.nonfinite = t.nonfinite;
  counts.underflow = t.underflow;
  counts.subnormal = t.subnormal;
  counts.saturated = t.saturated;
  counts.overflow = t.overflow;
  counts.signal_sq = t.signal_sq;
  counts.error_sq = t.error_sq;
  const float amax = float_of(t.amax_bits);
  counts.amax = amax;
  counts.tensor_scale = tensor_scale(p, amax);
  counts.blocks = t.blocks;
  counts.zero_blocks = t.zero_blocks;
  counts.saturated_blocks = t.saturated_blocks;
  counts.nan_blocks = t.nan_blocks;
  std::array<std::uint64_t, kHistogramBins> dense{};
  for (int i = 0; i < kHistogramBins; ++i) dense[static_cast<std::size_t>(i)] = t.histogram[i];
  counts.scale_histogram = BinadeHistogram::from_dense(dense);
  return counts;
}

}  // namespace
}  // namespace detail

namespace detail {
namespace {

// What fake_quantize and quantize_codes do first: the CPU function on no elements (its checks of
// the recipe, same messages, and the counts of an empty tensor, tensor_scale of amax 0, which
// the device results then fill in), the size check, and for the recipes that need it the amax
// pass into `tally`. Returns the empty tensor's counts.
RecipeCounts start(const float* x, std::size_t rows, std::size_t cols, const Recipe& recipe,
                   const char* what, const TallyBuffer& tally, cudaStream_t stream) {
  RecipeCounts empty = ::ampscope::fake_quantize(nullptr, nullptr, 0, 0, recipe);
  const std::size_t n = rows * cols;
  AMPSCOPE_CHECK(cols == 0 || n / cols == rows, what, ": ", rows, " x ", cols,
                 " elements overflow");
  if (n == 0) return empty;
  check_device_accessible(x, (std::string(what) + ": x").c_str());
  if (recipe.scaling != Scaling::kTile && recipe.scaling != Scaling::kMX) {
    amax_kernel<<<grid_blocks(n, kBlocksPerSm), kThreadsPerBlock, 0, stream>>>(x, n, tally.get());
    check_launch();
  }
  return empty;
}

// Waits for the stream and returns the device's counts.
RecipeCounts finish(RecipeCounts empty, const TallyBuffer& tally, const RecipeParams& p,
                    cudaStream_t stream) {
  RecipeTally host{};
  AMPSCOPE_CHECK_CUDA(
      cudaMemcpyAsync(&host, tally.get(), sizeof host, cudaMemcpyDeviceToHost, stream));
  AMPSCOPE_CHECK_CUDA(cudaStreamSynchronize(stream));
  return to_counts(std::move(empty), host, p);
}

}  // namespace
}  // namespace detail

void fake_quantize(const float* x, float* out, std::size_t rows, std::size_t cols,
                   const Recipe& recipe, RecipeCounts* counts, cudaStream_t stream) {
  using namespace detail;
  const NvtxRange range{"ampscope::cuda::fake_quantize"};
  const TallyBuffer tally(stream);
  RecipeCounts empty = start(x, rows, cols, recipe, "fake_quantize", tally, stream);
  const std::size_t n = rows * cols;
  if (n == 0) {
    if (counts != nullptr) *counts = std::move(empty);
    return;
  }
  if (out != nullptr) check_device_accessible(out, "fake_quantize: out");
  const RecipeParams p = recipe_params(recipe);
  if (is_block_recipe(recipe.scaling)) {
    const auto br = static_cast<std::size_t>(recipe.block_rows);
    const auto bc = static_cast<std::size_t>(recipe.block_cols);
    const std::size_t blocks = (rows + br - 1) / br * ((cols + bc - 1) / bc);
    block_kernel<<<grid_blocks(blocks * kWarp, kBlocksPerSm), kThreadsPerBlock, 0, stream>>>(
        x, out, rows, cols, p, tally.get());
  } else {
    tensor_kernel<<<grid_blocks(n, kBlocksPerSm), kThreadsPerBlock, 0, stream>>>(x, out, n, p,
                                                                                 tally.get());
  }
  check_launch();
  if (counts != nullptr) *counts = finish(std::move(empty), tally, p, stream);
}

bool has_fp8_codes(const Recipe& recipe) {
  return (recipe.scaling == Scaling::kCurrent || recipe.scaling == Scaling::kDelayed) &&
         (recipe.element == Format::kE4M3 || recipe.element == Format::kE5M2);
}

void quantize_codes(const float* x, std::uint8_t* codes, float* decode, std::size_t rows,
                    std::size_t cols, bool transposed, const Recipe& recipe, RecipeCounts* counts,
                    cudaStream_t stream) {
  using namespace detail;
  const NvtxRange range{"ampscope::cuda::quantize_codes"};
  AMPSCOPE_CHECK(has_fp8_codes(recipe), "quantize_codes: ", to_string(recipe),
                 " is not a per-tensor FP8 recipe");
  const TallyBuffer tally(stream);
  RecipeCounts empty = start(x, rows, cols, recipe, "quantize_codes", tally, stream);
  const RecipeParams p = recipe_params(recipe);
  check_device_accessible(decode, "quantize_codes: decode");
  const std::size_t n = rows * cols;
  if (n > 0) {
    check_device_accessible(codes, "quantize_codes: codes");
    const auto launch = [&](auto kernel) {
      kernel<<<grid_blocks(n, kBlocksPerSm), kThreadsPerBlock, 0, stream>>>(
          x, codes, decode, rows, cols, transposed, p, tally.get());
    };
    if (recipe.element == Format::kE4M3) {
      launch(tensor_codes_kernel<Format::kE4M3>);
    } else {
      launch(tensor_codes_kernel<Format::kE5M2>);
    }
    check_launch();
  } else {
    // No elements: the decode scale of an empty tensor (amax 0).
    const float inverse = 1.0f / static_cast<float>(empty.tensor_scale);
    AMPSCOPE_CHECK_CUDA(
        cudaMemcpyAsync(decode, &inverse, sizeof inverse, cudaMemcpyHostToDevice, stream));
    AMPSCOPE_CHECK_CUDA(cudaStreamSynchronize(stream));  // `inverse` is on this stack
  }
  if (counts != nullptr) *counts = finish(std::move(empty), tally, p, stream);
}

}  // namespace ampscope::cuda
