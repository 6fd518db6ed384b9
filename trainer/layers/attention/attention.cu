// Causal attention on the device (attention.h has the contract; launchers in
// attention_cuda.h), built on cuBLASLt through ../matmul/gemm.cuh. q, k, v (and dout) are split
// into per-head contiguous arrays (B*NH, T, hs), so each product is one strided-batched call over
// all heads; the softmax and its backward run one warp per row (causal: entries past the
// diagonal are 0) and write the scores, the probabilities in the softmax format, and the
// compute-format copy that the next product reads.
#include <cmath>
#include <cstdint>

#include "layers/attention/attention_cuda.h"
#include "layers/matmul/gemm.cuh"
#include "nn_common.cuh"
#include "nn_element.cuh"

namespace ampscope::cuda::nn {
namespace detail {
namespace {

// Head layout: element i of a (B, NH, T, hs) array is (b, h, t, d); in a packed (B, T, width)
// array it sits at column col_offset + h*hs + d of row b*T + t.
struct HeadShape {
  std::int64_t T, NH, hs, width, col_offset;
  __device__ std::int64_t packed_index(std::int64_t i) const {
    const std::int64_t d = i % hs, t = (i / hs) % T, h = (i / (hs * T)) % NH, b = i / (hs * T * NH);
    return (b * T + t) * width + col_offset + h * hs + d;
  }
};

// dst (B,NH,T,hs) in compute storage = the heads of src (B,T,width), rounded to compute.
__global__ void split_heads_kernel(void* dst, Format compute, ConstArray src, HeadShape s,
                                   std::int64_t n) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) {
    store(dst, compute, i, load(src.data, src.dtype, s.packed_index(i)));
  }
}

// The heads of out (B,T,width) = acc (B,NH,T,hs), committed in compute (overwritten).
__global__ void merge_heads_kernel(Array out, const float* acc, HeadShape s, std::int64_t n,
                                   Format compute) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) {
    commit(out.data, out.dtype, s.packed_index(i), acc[i], compute, false);
  }
}

// One warp per row of the (B*NH*T, T) score matrix; row r is query position r % T.
// att: FP32 products alpha q k^T. Writes scores (compute, masked 0), probs (softmax format,
// stored in probs.dtype) and pm (probs rounded to compute, compute storage).
__global__ void attention_softmax_kernel(Array scores, Array probs, void* pm, const float* att,
                                         std::int64_t rows, std::int64_t T, Format compute,
                                         Format softmax) {
  const std::int64_t row =
      static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= rows) return;  // uniform across the warp
  const std::int64_t i = row % T, base = row * T;
  float mx = -INFINITY;
  for (std::int64_t j = lane; j <= i; j += kWarpSize) {
    const float s = round_to_format(att[base + j], compute);
    mx = (mx < s) ? s : mx;
  }
  mx = warp_max(mx);
  float sum = 0.0f;
  for (std::int64_t j = lane; j <= i; j += kWarpSize) {
    sum += expf(round_to_format(att[base + j], compute) - mx);
  }
  const float inv = 1.0f / warp_sum(sum);
  for (std::int64_t j = lane; j < T; j += kWarpSize) {
    float s = 0.0f, p = 0.0f;
    if (j <= i) {
      s = round_to_format(att[base + j], compute);
      p = expf(s - mx) * inv;
    }
    const float p_softmax = round_to_format(p, softmax);
    commit(scores.data, scores.dtype, base + j, s, compute, false);
    commit(probs.data, probs.dtype, base + j, p_softmax, softmax, false);
    store(pm, compute, base + j, p_softmax);
  }
}

// One warp per row. dp: FP32 products dout v^T. Writes ds (the scores' gradient, rounded to the
// softmax format and then to compute; compute storage) and pm (probs in compute storage).
__global__ void attention_softmax_backward_kernel(void* ds, void* pm, const float* dp,
                                                  ConstArray probs, std::int64_t rows,
                                                  std::int64_t T, Format compute, Format softmax) {
  const std::int64_t row =
      static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= rows) return;
  const std::int64_t i = row % T, base = row * T;
  float dot = 0.0f;
  for (std::int64_t j = lane; j <= i; j += kWarpSize) {
    dot +=
        input(probs.data, probs.dtype, base + j, softmax) * round_to_format(dp[base + j], compute);
  }
  dot = warp_sum(dot);
  for (std::int64_t j = lane; j < T; j += kWarpSize) {
    const float p = input(probs.data, probs.dtype, base + j, softmax);
    float g = 0.0f;
    if (j <= i) g = p * (round_to_format(dp[base + j], compute) - dot);
    store(ds, compute, base + j, round_to_format(g, softmax));
    store(pm, compute, base + j, p);
  }
}

struct AttentionShape {
  std::int64_t B, T, C, NH, hs;
  std::int64_t heads() const { return B * NH; }
  std::int64_t head_elements() const { return B * T * C; }  // (B, NH, T, hs)
  std::int64_t score_elements() const { return B * NH * T * T; }
};

AttentionShape attention_shape(std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH,
                               const char* what) {
  AMPSCOPE_CHECK(B >= 0 && T >= 1 && C >= 1 && NH >= 1, what, ": bad shape B=", B, " T=", T,
                 " C=", C, " NH=", NH);
  AMPSCOPE_CHECK(C % NH == 0, what, ": channels ", C, " not divisible by ", NH, " heads");
  AMPSCOPE_CHECK(B * NH <= (std::int64_t{1} << 31) - 1, what, ": ", B * NH, " heads in a batch");
  return {B, T, C, NH, C / NH};
}

void split_heads(void* dst, Format compute, ConstArray src, const AttentionShape& a,
                 std::int64_t width, std::int64_t col_offset, cudaStream_t stream) {
  const std::int64_t n = a.head_elements();
  split_heads_kernel<<<elementwise_blocks(n), kThreadsPerBlock, 0, stream>>>(
      dst, compute, src, HeadShape{a.T, a.NH, a.hs, width, col_offset}, n);
  check_launch();
}

void merge_heads(Array out, const float* acc, const AttentionShape& a, std::int64_t width,
                 std::int64_t col_offset, Format compute, cudaStream_t stream) {
  const std::int64_t n = a.head_elements();
  merge_heads_kernel<<<elementwise_blocks(n), kThreadsPerBlock, 0, stream>>>(
      out, acc, HeadShape{a.T, a.NH, a.hs, width, col_offset}, n, compute);
  check_launch();
}

// A strided-batched product over the B*NH heads: c = alpha op(a) op(b), each (T, *) per head.
GemmArgs head_gemm(const AttentionShape& s, Format compute, std::int64_t m, std::int64_t n,
                   std::int64_t k) {
  return gemm_args(compute, m, n, k, static_cast<int>(s.heads()));
}

unsigned row_blocks(std::int64_t rows) {
  return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

}  // namespace
}  // namespace detail

void attention_forward(CublasLt& blas, Array out, Array scores, Array probs, ConstArray qkv,
                       std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH,
                       Format compute, Format softmax, cudaStream_t stream) {
  using namespace detail;
  const NvtxRange range{"ampscope::cuda::nn::attention_forward"};
  const AttentionShape a = attention_shape(B, T, C, NH, "attention_forward");
  check_compute(compute, "attention_forward");
  check_compute(softmax, "attention_forward (softmax)");
  check_array(out, a.head_elements(), "attention_forward: out");
  check_array(scores, a.score_elements(), "attention_forward: scores");
  check_array(probs, a.score_elements(), "attention_forward: probs");
  check_array(qkv, 3 * a.head_elements(), "attention_forward: qkv");
  if (B == 0) return;
  const float alpha = 1.0f / std::sqrt(static_cast<float>(a.hs));
  const std::int64_t head = T * a.hs, square = T * T;
  StreamScratch q(bytes_of(a.head_elements(), compute), stream),
      k(bytes_of(a.head_elements(), compute), stream),
      v(bytes_of(a.head_elements(), compute), stream);
  split_heads(q.get(), compute, qkv, a, 3 * C, 0, stream);
  split_heads(k.get(), compute, qkv, a, 3 * C, C, stream);
  split_heads(v.get(), compute, qkv, a, 3 * C, 2 * C, stream);

  // att (T,T) = alpha q (T,hs) k^T, per head.
  StreamScratch att(bytes_of(a.score_elements(), Format::kFP32), stream);
  GemmArgs g = head_gemm(a, compute, T, T, a.hs);
  g.alpha = alpha;
  set_a(g, q.get(), false, a.hs, head);
  set_b(g, k.get(), true, a.hs, head);
  set_c(g, att.as<float>(), T, square);
  blas.gemm(g, stream);

  StreamScratch pm(bytes_of(a.score_elements(), compute), stream);
  const std::int64_t rows = a.heads() * T;
  attention_softmax_kernel<<<row_blocks(rows), kThreadsPerBlock, 0, stream>>>(
      scores, probs, pm.get(), att.as<float>(), rows, T, compute, softmax);
  check_launch();

  // ctx (T,hs) = probs (T,T) v (T,hs), per head.
  StreamScratch ctx(bytes_of(a.head_elements(), Format::kFP32), stream);
  g = head_gemm(a, compute, T, a.hs, T);
  set_a(g, pm.get(), false, T, square);
  set_b(g, v.get(), false, a.hs, head);
  set_c(g, ctx.as<float>(), a.hs, head);
  blas.gemm(g, stream);
  merge_heads(out, ctx.as<float>(), a, C, 0, compute, stream);
}

void attention_backward(CublasLt& blas, Array dqkv, ConstArray dout, ConstArray qkv,
                        ConstArray probs, std::int64_t B, std::int64_t T, std::int64_t C,
                        std::int64_t NH, Format compute, Format softmax, cudaStream_t stream) {
  using namespace detail;
  const NvtxRange range{"ampscope::cuda::nn::attention_backward"};
  const AttentionShape a = attention_shape(B, T, C, NH, "attention_backward");
  check_compute(compute, "attention_backward");
  check_compute(softmax, "attention_backward (softmax)");
  check_array(dqkv, 3 * a.head_elements(), "attention_backward: dqkv");
  check_array(dout, a.head_elements(), "attention_backward: dout");
  check_array(qkv, 3 * a.head_elements(), "attention_backward: qkv");
  check_array(probs, a.score_elements(), "attention_backward: probs");
  if (B == 0) return;
  const float alpha = 1.0f / std::sqrt(static_cast<float>(a.hs));
  const std::int64_t head = T * a.hs, square = T * T;
  const std::size_t head_bytes = bytes_of(a.head_elements(), compute);
  StreamScratch q(head_bytes, stream), k(head_bytes, stream), v(head_bytes, stream),
      dctx(head_bytes, stream);
  split_heads(q.get(), compute, qkv, a, 3 * C, 0, stream);
  split_heads(k.get(), compute, qkv, a, 3 * C, C, stream);
  split_heads(v.get(), compute, qkv, a, 3 * C, 2 * C, stream);
  split_heads(dctx.get(), compute, dout, a, C, 0, stream);

  // dp (T,T) = dctx (T,hs) v^T.
  StreamScratch dp(bytes_of(a.score_elements(), Format::kFP32), stream);
  GemmArgs g = head_gemm(a, compute, T, T, a.hs);
  set_a(g, dctx.get(), false, a.hs, head);
  set_b(g, v.get(), true, a.hs, head);
  set_c(g, dp.as<float>(), T, square);
  blas.gemm(g, stream);

  StreamScratch ds(bytes_of(a.score_elements(), compute), stream),
      pm(bytes_of(a.score_elements(), compute), stream);
  const std::int64_t rows = a.heads() * T;
  attention_softmax_backward_kernel<<<row_blocks(rows), kThreadsPerBlock, 0, stream>>>(
      ds.get(), pm.get(), dp.as<float>(), probs, rows, T, compute, softmax);
  check_launch();

  const std::size_t acc_bytes = bytes_of(a.head_elements(), Format::kFP32);
  StreamScratch dq(acc_bytes, stream), dk(acc_bytes, stream), dv(acc_bytes, stream);
  // dv (T,hs) = probs^T (T,T) dctx (T,hs).
  g = head_gemm(a, compute, T, a.hs, T);
  set_a(g, pm.get(), true, T, square);
  set_b(g, dctx.get(), false, a.hs, head);
  set_c(g, dv.as<float>(), a.hs, head);
  blas.gemm(g, stream);
  // dq (T,hs) = alpha ds (T,T) k (T,hs).
  g = head_gemm(a, compute, T, a.hs, T);
  g.alpha = alpha;
  set_a(g, ds.get(), false, T, square);
  set_b(g, k.get(), false, a.hs, head);
  set_c(g, dq.as<float>(), a.hs, head);
  blas.gemm(g, stream);
  // dk (T,hs) = alpha ds^T (T,T) q (T,hs).
  g = head_gemm(a, compute, T, a.hs, T);
  g.alpha = alpha;
  set_a(g, ds.get(), true, T, square);
  set_b(g, q.get(), false, a.hs, head);
  set_c(g, dk.as<float>(), a.hs, head);
  blas.gemm(g, stream);

  merge_heads(dqkv, dq.as<float>(), a, 3 * C, 0, compute, stream);
  merge_heads(dqkv, dk.as<float>(), a, 3 * C, C, compute, stream);
  merge_heads(dqkv, dv.as<float>(), a, 3 * C, 2 * C, compute, stream);
}

}  // namespace ampscope::cuda::nn
