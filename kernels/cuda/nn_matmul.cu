// Linear layers and causal attention on the device (ampscope/cuda/nn.h), built on cuBLASLt.
//
// Design: every product follows the same three steps, which are the precision contract:
//   1. operands in the compute format: an input already stored in it (and 16-byte aligned, so
//      tensor-core algorithms can read it) is used in place; any other input is rounded into a
//      scratch copy (the CPU back end's In);
//   2. cuBLASLt with FP32 accumulation into an FP32 scratch result;
//   3. an epilogue kernel adds the (rounded) bias, rounds to the compute format and stores or
//      accumulates into the output (the CPU back end's Out::commit).
// Linear backward: dinp = dout W, dW += dout^T x, and dbias += column sums of dout
// (nn_columns.cuh). Attention: q, k, v (and dout) are split into per-head contiguous arrays
// (B*NH, T, hs), so each product is one strided-batched call over all heads; the softmax and its
// backward run one warp per row (causal: entries past the diagonal are 0) and write the scores,
// the probabilities in the softmax format, and the compute-format copy that the next product
// reads.
#include <cmath>
#include <cstdint>
#include <memory>

#include "ampscope/cuda/nn.h"
#include "nn_columns.cuh"
#include "nn_common.cuh"
#include "nn_element.cuh"

namespace ampscope::cuda::nn {
namespace detail {
namespace {

constexpr std::size_t kOperandAlignment = 16;
constexpr int kWarpsPerBlock = kThreadsPerBlock / kWarpSize;

std::size_t bytes_of(std::int64_t n, Format f) {
  return static_cast<std::size_t>(n) * static_cast<std::size_t>(storage_bytes(f));
}

// An input (n elements) as an operand in `compute` storage.
class Operand {
 public:
  Operand(ConstArray x, std::int64_t n, Format compute, cudaStream_t stream) {
    if (x.dtype == compute && ::ampscope::cuda::detail::is_aligned(x.data, kOperandAlignment)) {
      data_ = x.data;
      return;
    }
    scratch_ = std::make_unique<StreamScratch>(bytes_of(n, compute), stream);
    convert(Array{scratch_->get(), compute}, x, n, stream);  // rounds to compute
    data_ = scratch_->get();
  }
  const void* get() const { return data_; }

 private:
  const void* data_ = nullptr;
  std::unique_ptr<StreamScratch> scratch_;
};

// out (M,N) = acc (M,N) [+ bias (N)], rounded to compute, stored or accumulated.
__global__ void epilogue_kernel(Array out, const float* acc, ConstArray bias, std::int64_t M,
                                std::int64_t N, Format compute, bool accumulate) {
  const std::int64_t n = M * N;
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) {
    float v = acc[i];
    if (bias.data != nullptr) v += input(bias.data, bias.dtype, i % N, compute);
    commit(out.data, out.dtype, i, v, compute, accumulate);
  }
}

void epilogue(Array out, const float* acc, ConstArray bias, std::int64_t M, std::int64_t N,
              Format compute, bool accumulate, cudaStream_t stream) {
  if (M * N == 0) return;
  epilogue_kernel<<<elementwise_blocks(M * N), kThreadsPerBlock, 0, stream>>>(out, acc, bias, M, N,
                                                                              compute, accumulate);
  check_launch();
}

// Partial column sums of dout (N,OC), rounded to compute: partial (chunks, OC).
__global__ void bias_columns_kernel(float* partial, ConstArray dout, std::int64_t N,
                                    std::int64_t OC, Format compute) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= OC) return;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.y) * kRowsPerChunk;
  const std::int64_t last = first + kRowsPerChunk < N ? first + kRowsPerChunk : N;
  float acc = 0.0f;
  for (std::int64_t row = first; row < last; ++row) {
    acc += input(dout.data, dout.dtype, row * OC + c, compute);
  }
  partial[blockIdx.y * OC + c] = acc;
}

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
  GemmArgs g;
  g.m = m;
  g.n = n;
  g.k = k;
  g.batch = static_cast<int>(s.heads());
  g.operand = compute;
  return g;
}

void set_a(GemmArgs& g, const void* a, bool transposed, std::int64_t ld, std::int64_t stride) {
  g.a = a;
  g.a_transposed = transposed;
  g.lda = ld;
  g.stride_a = stride;
}
void set_b(GemmArgs& g, const void* b, bool transposed, std::int64_t ld, std::int64_t stride) {
  g.b = b;
  g.b_transposed = transposed;
  g.ldb = ld;
  g.stride_b = stride;
}
void set_c(GemmArgs& g, float* c, std::int64_t ld, std::int64_t stride) {
  g.c = c;
  g.ldc = ld;
  g.stride_c = stride;
}

unsigned row_blocks(std::int64_t rows) {
  return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

}  // namespace
}  // namespace detail

void linear_forward(CublasLt& blas, Array out, ConstArray inp, ConstArray weight, ConstArray bias,
                    std::int64_t N, std::int64_t C, std::int64_t OC, Format compute,
                    cudaStream_t stream) {
  using namespace detail;
  const NvtxRange range{"ampscope::cuda::nn::linear_forward"};
  AMPSCOPE_CHECK(N >= 0 && C >= 1 && OC >= 1, "linear_forward: bad shape N=", N, " C=", C,
                 " OC=", OC);
  check_compute(compute, "linear_forward");
  check_array(out, N * OC, "linear_forward: out");
  check_array(inp, N * C, "linear_forward: inp");
  check_array(weight, OC * C, "linear_forward: weight");
  if (bias.data != nullptr) check_array(bias, OC, "linear_forward: bias");
  if (N == 0) return;
  Operand x(inp, N * C, compute, stream), w(weight, OC * C, compute, stream);
  StreamScratch acc(bytes_of(N * OC, Format::kFP32), stream);
  GemmArgs g;
  g.m = N;
  g.n = OC;
  g.k = C;
  g.operand = compute;
  set_a(g, x.get(), false, C, 0);
  set_b(g, w.get(), true, C, 0);
  set_c(g, acc.as<float>(), OC, 0);
  blas.gemm(g, stream);
  epilogue(out, acc.as<float>(), bias, N, OC, compute, false, stream);
}

void linear_backward(CublasLt& blas, Array dinp, Array dweight, Array dbias, ConstArray dout,
                     ConstArray inp, ConstArray weight, std::int64_t N, std::int64_t C,
                     std::int64_t OC, Format compute, cudaStream_t stream) {
  using namespace detail;
  const NvtxRange range{"ampscope::cuda::nn::linear_backward"};
  AMPSCOPE_CHECK(N >= 0 && C >= 1 && OC >= 1, "linear_backward: bad shape N=", N, " C=", C,
                 " OC=", OC);
  check_compute(compute, "linear_backward");
  if (dinp.data != nullptr) check_array(dinp, N * C, "linear_backward: dinp");
  check_array(dweight, OC * C, "linear_backward: dweight");
  if (dbias.data != nullptr) check_array(dbias, OC, "linear_backward: dbias");
  check_array(dout, N * OC, "linear_backward: dout");
  check_array(inp, N * C, "linear_backward: inp");
  check_array(weight, OC * C, "linear_backward: weight");
  AMPSCOPE_CHECK(row_chunks(N) <= 65535, "linear_backward: ", N, " rows exceed the grid");
  Operand d(dout, N * OC, compute, stream);
  if (dinp.data != nullptr && N > 0) {
    // dinp (N,C) = dout (N,OC) x weight (OC,C).
    Operand w(weight, OC * C, compute, stream);
    StreamScratch acc(bytes_of(N * C, Format::kFP32), stream);
    GemmArgs g;
    g.m = N;
    g.n = C;
    g.k = OC;
    g.operand = compute;
    set_a(g, d.get(), false, OC, 0);
    set_b(g, w.get(), false, C, 0);
    set_c(g, acc.as<float>(), C, 0);
    blas.gemm(g, stream);
    epilogue(dinp, acc.as<float>(), ConstArray{}, N, C, compute, false, stream);
  }
  {
    // dweight (OC,C) += dout^T (OC,N) x inp (N,C).
    Operand x(inp, N * C, compute, stream);
    StreamScratch acc(bytes_of(OC * C, Format::kFP32), stream);
    GemmArgs g;
    g.m = OC;
    g.n = C;
    g.k = N;
    g.operand = compute;
    set_a(g, d.get(), true, OC, 0);
    set_b(g, x.get(), false, C, 0);
    set_c(g, acc.as<float>(), C, 0);
    blas.gemm(g, stream);
    epilogue(dweight, acc.as<float>(), ConstArray{}, OC, C, compute, true, stream);
  }
  if (dbias.data != nullptr) {
    StreamScratch partial(bytes_of(static_cast<std::int64_t>(row_chunks(N)) * OC, Format::kFP32),
                          stream);
    if (N > 0) {
      bias_columns_kernel<<<column_partial_grid(N, OC), kColumnThreads, 0, stream>>>(
          partial.as<float>(), dout, N, OC, compute);
      check_launch();
    }
    finish_columns(dbias, partial.as<float>(), N, OC, compute, stream);
  }
}

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
