// The embedding on the device (embedding.h has the contract; launchers in embedding_cuda.h).
//   - forward: one thread per output element (b, t, c); coalesced over c.
//   - backward: one block per output row (a token of the vocabulary, or a position). A token
//     row scans the batch's tokens in order and adds the dout rows that carry it, so repeated
//     tokens need no atomics and the sum has the CPU's order: bit-exact. A position row adds its
//     B dout rows in order. Every row is committed (a zero contribution included), as the CPU
//     does.
#include <cmath>
#include <cstdint>

#include "layers/embedding/embedding_cuda.h"
#include "nn_common.cuh"
#include "nn_element.cuh"

namespace ampscope::cuda::nn {
namespace detail {
namespace {

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

}  // namespace ampscope::cuda::nn
