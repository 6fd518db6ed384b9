// Embedding, LayerNorm and cross-entropy on the device (ampscope/cuda/nn.h).
//
// Design, kernel by kernel:
//   - embedding_forward: one thread per output element (b, t, c); coalesced over c.
//   - embedding_backward: one block per output row (a token of the vocabulary, or a position).
//     A token row scans the batch's tokens in order and adds the dout rows that carry it, so
//     repeated tokens need no atomics and the sum has the CPU's order: bit-exact. A position
//     row adds its B dout rows in order. Every row is committed (a zero contribution included),
//     as the CPU does.
//   - layernorm_forward: one warp per row; mean and variance by two butterfly reductions (the
//     CPU's two passes), then the normalised row.
//   - layernorm_backward: one warp per row for dinp (two butterfly reductions), and the column
//     sums for dweight and dbias in two deterministic stages (nn_columns.cuh).
//   - cross_entropy_forward: one block per row (V may be large): block max, block sum of
//     exponentials, then probabilities and the row's loss.
//   - cross_entropy_backward: elementwise, bit-exact.
// Row reductions are in FP32 like the CPU's, in tree order instead of sequential order.
#include <cmath>
#include <cstdint>

#include "ampscope/cuda/nn.h"
#include "nn_columns.cuh"
#include "nn_common.cuh"
#include "nn_element.cuh"

namespace ampscope::cuda::nn {
namespace detail {
namespace {

constexpr float kLayerNormEps = 1e-5f;
constexpr int kWarpsPerBlock = kThreadsPerBlock / kWarpSize;

// out (B,T,C); tokens (B,T); wte (V,C); wpe (>= T, C).
__global__ void embedding_forward_kernel(Array out, const std::int32_t* tokens, ConstArray wte,
                                         ConstArray wpe, std::int64_t BT, std::int64_t T,
                                         std::int64_t C, std::int64_t V, DeviceError* error) {
  const std::int64_t n = BT * C;
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) {
    const std::int64_t bt = i / C, c = i % C;
    const std::int32_t tok = tokens[bt];
    if (tok < 0 || tok >= V) {
      if (c == 0) report(error, kTokenOutOfRange, bt, tok, V);
      store(out.data, out.dtype, i, NAN);
      continue;
    }
    const float v =
        load(wte.data, wte.dtype, tok * C + c) + load(wpe.data, wpe.dtype, (bt % T) * C + c);
    commit(out.data, out.dtype, i, v, out.dtype, false);
  }
}

// Rows [0, V) of the grid are dwte's, rows [V, V + max_t) dwpe's. dout (B,T,C).
__global__ void embedding_backward_kernel(Array dwte, Array dwpe, ConstArray dout,
                                          const std::int32_t* tokens, std::int64_t B,
                                          std::int64_t T, std::int64_t C, std::int64_t V) {
  const std::int64_t row = blockIdx.x;
  const bool token_row = row < V;
  const Array table = token_row ? dwte : dwpe;
  const std::int64_t r = token_row ? row : row - V;
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = 0.0f;
    if (token_row) {
      for (std::int64_t bt = 0; bt < B * T; ++bt) {
        if (tokens[bt] == r) acc += load(dout.data, dout.dtype, bt * C + c);
      }
    } else if (r < T) {
      for (std::int64_t b = 0; b < B; ++b) acc += load(dout.data, dout.dtype, (b * T + r) * C + c);
    }
    commit(table.data, table.dtype, r * C + c, acc, table.dtype, true);
  }
}

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

// One block per row. losses (N); probs, logits (N,V); targets (N).
__global__ void cross_entropy_forward_kernel(Array losses, Array probs, ConstArray logits,
                                             const std::int32_t* targets, std::int64_t V,
                                             Format compute, DeviceError* error) {
  __shared__ float shared[kWarpsPerBlock];
  const std::int64_t row = blockIdx.x;
  const std::int64_t base = row * V;
  float mx = -INFINITY;
  for (std::int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    const float x = input(logits.data, logits.dtype, base + j, compute);
    mx = (mx < x) ? x : mx;
  }
  mx = block_max(mx, shared);
  float sum = 0.0f;
  for (std::int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    sum += expf(input(logits.data, logits.dtype, base + j, compute) - mx);
  }
  const float log_sum = logf(block_sum(sum, shared));
  for (std::int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    const float x = input(logits.data, logits.dtype, base + j, compute);
    commit(probs.data, probs.dtype, base + j, expf(x - mx - log_sum), compute, false);
  }
  if (threadIdx.x == 0) {
    const std::int32_t t = targets[row];
    float loss = NAN;
    if (t < 0 || t >= V) {
      report(error, kTargetOutOfRange, row, t, V);
    } else {
      loss = log_sum + mx - input(logits.data, logits.dtype, base + t, compute);
    }
    commit(losses.data, losses.dtype, row, loss, compute, false);
  }
}

__global__ void cross_entropy_backward_kernel(Array dlogits, ConstArray probs,
                                              const std::int32_t* targets, std::int64_t N,
                                              std::int64_t V, float dloss, Format compute) {
  const std::int64_t n = N * V;
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) {
    const std::int64_t row = i / V, j = i % V;
    const float p = load(probs.data, probs.dtype, i);
    const float d = j == targets[row] ? (p - 1.0f) * dloss : p * dloss;
    commit(dlogits.data, dlogits.dtype, i, d, compute, false);
  }
}

void check_grid_rows(std::int64_t rows, const char* what) {
  AMPSCOPE_CHECK(rows <= (std::int64_t{1} << 31) - 1, what, ": ", rows, " rows exceed the grid");
}

}  // namespace
}  // namespace detail

void embedding_forward(Array out, const std::int32_t* tokens, ConstArray wte, ConstArray wpe,
                       std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t V,
                       DeviceError* error, cudaStream_t stream) {
  using namespace detail;
  const NvtxRange range{"ampscope::cuda::nn::embedding_forward"};
  AMPSCOPE_CHECK(B >= 0 && T >= 1 && C >= 1 && V >= 1, "embedding_forward: bad shape B=", B,
                 " T=", T, " C=", C, " V=", V);
  check_array(out, B * T * C, "embedding_forward: out");
  check_array(wte, V * C, "embedding_forward: wte");
  check_array(wpe, T * C, "embedding_forward: wpe");
  if (B == 0) return;
  ::ampscope::cuda::detail::check_device_accessible(tokens, "embedding_forward: tokens");
  embedding_forward_kernel<<<elementwise_blocks(B * T * C), kThreadsPerBlock, 0, stream>>>(
      out, tokens, wte, wpe, B * T, T, C, V, error);
  check_launch();
}

void embedding_backward(Array dwte, Array dwpe, ConstArray dout, const std::int32_t* tokens,
                        std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t V,
                        std::int64_t max_t, cudaStream_t stream) {
  using namespace detail;
  const NvtxRange range{"ampscope::cuda::nn::embedding_backward"};
  AMPSCOPE_CHECK(B >= 0 && T >= 1 && C >= 1 && V >= 1 && max_t >= T,
                 "embedding_backward: bad shape B=", B, " T=", T, " C=", C, " V=", V,
                 " max_t=", max_t);
  check_array(dwte, V * C, "embedding_backward: dwte");
  check_array(dwpe, max_t * C, "embedding_backward: dwpe");
  check_array(dout, B * T * C, "embedding_backward: dout");
  check_grid_rows(V + max_t, "embedding_backward");
  if (B > 0)
    ::ampscope::cuda::detail::check_device_accessible(tokens, "embedding_backward: tokens");
  embedding_backward_kernel<<<static_cast<unsigned>(V + max_t), kThreadsPerBlock, 0, stream>>>(
      dwte, dwpe, dout, tokens, B, T, C, V);
  check_launch();
}

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

void cross_entropy_forward(Array losses, Array probs, ConstArray logits,
                           const std::int32_t* targets, std::int64_t N, std::int64_t V,
                           Format compute, DeviceError* error, cudaStream_t stream) {
  using namespace detail;
  const NvtxRange range{"ampscope::cuda::nn::cross_entropy_forward"};
  AMPSCOPE_CHECK(N >= 0 && V >= 1, "cross_entropy_forward: bad shape N=", N, " V=", V);
  check_compute(compute, "cross_entropy_forward");
  check_array(losses, N, "cross_entropy_forward: losses");
  check_array(probs, N * V, "cross_entropy_forward: probs");
  check_array(logits, N * V, "cross_entropy_forward: logits");
  if (N == 0) return;
  check_grid_rows(N, "cross_entropy_forward");
  ::ampscope::cuda::detail::check_device_accessible(targets, "cross_entropy_forward: targets");
  cross_entropy_forward_kernel<<<static_cast<unsigned>(N), kThreadsPerBlock, 0, stream>>>(
      losses, probs, logits, targets, V, compute, error);
  check_launch();
}

void cross_entropy_backward(Array dlogits, ConstArray probs, const std::int32_t* targets,
                            std::int64_t N, std::int64_t V, float dloss, Format compute,
                            cudaStream_t stream) {
  using namespace detail;
  const NvtxRange range{"ampscope::cuda::nn::cross_entropy_backward"};
  AMPSCOPE_CHECK(N >= 0 && V >= 1, "cross_entropy_backward: bad shape N=", N, " V=", V);
  check_compute(compute, "cross_entropy_backward");
  check_array(dlogits, N * V, "cross_entropy_backward: dlogits");
  check_array(probs, N * V, "cross_entropy_backward: probs");
  if (N == 0) return;
  ::ampscope::cuda::detail::check_device_accessible(targets, "cross_entropy_backward: targets");
  cross_entropy_backward_kernel<<<elementwise_blocks(N * V), kThreadsPerBlock, 0, stream>>>(
      dlogits, probs, targets, N, V, dloss, compute);
  check_launch();
}

}  // namespace ampscope::cuda::nn
