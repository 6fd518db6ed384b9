// LayerNorm on the device (layernorm.h has the contract; launchers in layernorm_cuda.h).
//   - forward: one warp per row; mean and variance by two butterfly reductions (the CPU's two
//     passes), then the normalised row.
//   - backward: one warp per row for dinp (two butterfly reductions), and the column sums for
//     dweight and dbias in two deterministic stages (nn_columns.cuh).
// Row reductions are in FP32 like the CPU's, in tree order instead of sequential order.
#include <cmath>
#include <cstdint>

#include "layers/layernorm/layernorm.h"
#include "layers/layernorm/layernorm_cuda.h"
#include "nn_columns.cuh"
#include "nn_common.cuh"
#include "nn_element.cuh"

namespace ampscope::cuda::nn {
namespace detail {
namespace {

using ::ampscope::trainer::layers::kLayerNormEps;

// One warp per row. out (N,C); mean, rstd (N).
__global__ void layernorm_forward_kernel(Array out, float* mean, float* rstd, ConstArray inp,
                                         ConstArray weight, ConstArray bias, std::int64_t N,
                                         std::int64_t C, Format compute) {
  const std::int64_t row =
      static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= N) return;  // uniform across the warp
  const std::int64_t base = row * C;
  float sum = 0.0f;
  for (std::int64_t c = lane; c < C; c += kWarpSize)
    sum += input(inp.data, inp.dtype, base + c, compute);
  const float m = warp_sum(sum) / static_cast<float>(C);
  float sq = 0.0f;
  for (std::int64_t c = lane; c < C; c += kWarpSize) {
    const float d = input(inp.data, inp.dtype, base + c, compute) - m;
    sq += d * d;
  }
  const float var = warp_sum(sq) / static_cast<float>(C);
  const float r = 1.0f / sqrtf(var + kLayerNormEps);
  for (std::int64_t c = lane; c < C; c += kWarpSize) {
    const float x = input(inp.data, inp.dtype, base + c, compute);
    const float w = input(weight.data, weight.dtype, c, compute);
    const float b = input(bias.data, bias.dtype, c, compute);
    commit(out.data, out.dtype, base + c, (x - m) * r * w + b, compute, false);
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

// One warp per row; dinp (N,C) accumulates.
__global__ void layernorm_backward_dinp_kernel(Array dinp, ConstArray dout, ConstArray inp,
                                               ConstArray weight, const float* mean,
                                               const float* rstd, std::int64_t N, std::int64_t C,
                                               Format compute) {
  const std::int64_t row =
      static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= N) return;
  const std::int64_t base = row * C;
  const float mu = mean[row], rs = rstd[row];
  float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
  for (std::int64_t c = lane; c < C; c += kWarpSize) {
    const float norm = (input(inp.data, inp.dtype, base + c, compute) - mu) * rs;
    const float dnorm = input(weight.data, weight.dtype, c, compute) *
                        input(dout.data, dout.dtype, base + c, compute);
    dnorm_sum += dnorm;
    dnorm_norm_sum += dnorm * norm;
  }
  const float dnorm_mean = warp_sum(dnorm_sum) / static_cast<float>(C);
  const float dnorm_norm_mean = warp_sum(dnorm_norm_sum) / static_cast<float>(C);
  for (std::int64_t c = lane; c < C; c += kWarpSize) {
    const float norm = (input(inp.data, inp.dtype, base + c, compute) - mu) * rs;
    const float dnorm = input(weight.data, weight.dtype, c, compute) *
                        input(dout.data, dout.dtype, base + c, compute);
    commit(dinp.data, dinp.dtype, base + c, (dnorm - dnorm_mean - norm * dnorm_norm_mean) * rs,
           compute, true);
  }
}

// Partial column sums of norm * dout (dweight) and dout (dbias) over kRowsPerChunk rows.
// partial_w, partial_b (chunks, C).
__global__ void layernorm_backward_columns_kernel(float* partial_w, float* partial_b,
                                                  ConstArray dout, ConstArray inp,
                                                  const float* mean, const float* rstd,
                                                  std::int64_t N, std::int64_t C, Format compute) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.y) * kRowsPerChunk;
  const std::int64_t last = first + kRowsPerChunk < N ? first + kRowsPerChunk : N;
  float dw = 0.0f, db = 0.0f;
  for (std::int64_t row = first; row < last; ++row) {
    const float norm = (input(inp.data, inp.dtype, row * C + c, compute) - mean[row]) * rstd[row];
    const float d = input(dout.data, dout.dtype, row * C + c, compute);
    db += d;
    dw += norm * d;
  }
  partial_w[blockIdx.y * C + c] = dw;
  partial_b[blockIdx.y * C + c] = db;
}

}  // namespace
}  // namespace detail

void layernorm_forward(Array out, float* mean, float* rstd, ConstArray inp, ConstArray weight,
                       ConstArray bias, std::int64_t N, std::int64_t C, Format compute,
                       cudaStream_t stream) {
  using namespace detail;
  const NvtxRange range{"ampscope::cuda::nn::layernorm_forward"};
  AMPSCOPE_CHECK(N >= 0 && C >= 1, "layernorm_forward: bad shape N=", N, " C=", C);
  check_compute(compute, "layernorm_forward");
  check_array(out, N * C, "layernorm_forward: out");
  check_array(inp, N * C, "layernorm_forward: inp");
  check_array(weight, C, "layernorm_forward: weight");
  check_array(bias, C, "layernorm_forward: bias");
  check_array(ConstArray{mean, Format::kFP32}, N, "layernorm_forward: mean");
  check_array(ConstArray{rstd, Format::kFP32}, N, "layernorm_forward: rstd");
  if (N == 0) return;
  const std::int64_t blocks = (N + kWarpsPerBlock - 1) / kWarpsPerBlock;
  check_grid_rows(blocks, "layernorm_forward");
  layernorm_forward_kernel<<<static_cast<unsigned>(blocks), kThreadsPerBlock, 0, stream>>>(
      out, mean, rstd, inp, weight, bias, N, C, compute);
  check_launch();
}

void layernorm_backward(Array dinp, Array dweight, Array dbias, ConstArray dout, ConstArray inp,
                        ConstArray weight, const float* mean, const float* rstd, std::int64_t N,
                        std::int64_t C, Format compute, cudaStream_t stream) {
  using namespace detail;
  const NvtxRange range{"ampscope::cuda::nn::layernorm_backward"};
  AMPSCOPE_CHECK(N >= 0 && C >= 1, "layernorm_backward: bad shape N=", N, " C=", C);
  check_compute(compute, "layernorm_backward");
  check_array(dinp, N * C, "layernorm_backward: dinp");
  check_array(dweight, C, "layernorm_backward: dweight");
  check_array(dbias, C, "layernorm_backward: dbias");
  check_array(dout, N * C, "layernorm_backward: dout");
  check_array(inp, N * C, "layernorm_backward: inp");
  check_array(weight, C, "layernorm_backward: weight");
  check_array(ConstArray{mean, Format::kFP32}, N, "layernorm_backward: mean");
  check_array(ConstArray{rstd, Format::kFP32}, N, "layernorm_backward: rstd");
  if (N == 0) return;
  const std::int64_t blocks = (N + kWarpsPerBlock - 1) / kWarpsPerBlock;
  check_grid_rows(blocks, "layernorm_backward");
  AMPSCOPE_CHECK(row_chunks(N) <= 65535, "layernorm_backward: ", N, " rows exceed the grid");
  layernorm_backward_dinp_kernel<<<static_cast<unsigned>(blocks), kThreadsPerBlock, 0, stream>>>(
      dinp, dout, inp, weight, mean, rstd, N, C, compute);
  check_launch();
  const std::size_t partial_bytes =
      static_cast<std::size_t>(row_chunks(N)) * static_cast<std::size_t>(C) * sizeof(float);
  StreamScratch partial_w(partial_bytes, stream), partial_b(partial_bytes, stream);
  layernorm_backward_columns_kernel<<<column_partial_grid(N, C), kColumnThreads, 0, stream>>>(
      partial_w.as<float>(), partial_b.as<float>(), dout, inp, mean, rstd, N, C, compute);
  check_launch();
  finish_columns(dweight, partial_w.as<float>(), N, C, compute, stream);
  finish_columns(dbias, partial_b.as<float>(), N, C, compute, stream);
}

}  // namespace ampscope::cuda::nn
