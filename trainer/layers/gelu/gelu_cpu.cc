// GELU's tuned CPU version (gelu.h): the vector kernels, written once on the 16-lane vector type
// and compiled per SIMD level (../vector.h), run over kChunk pieces on the workers.
#include "layers/gelu/gelu.h"
#include "layers/vector.h"

namespace ampscope::trainer::layers {
namespace {

using namespace vk;  // NOLINT: the kernels are written in the vector toolkit's vocabulary

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)

// tanh(u) = 1 - 2 / (e^2u + 1): one exponential. Absolute error ~1e-7 near 0 (cancellation),
// which GELU's 0.5 x (1 + t) absorbs.
AMPSCOPE_ALWAYS_INLINE V gelu_tanh(V v) {
  const V cube = splat(0.044715f) * v * v * v;
  const V u = kGeluScale * (v + cube);
  const V e = vexp(2.0f * (u > 40.0f ? splat(40.0f) : u));
  return 1.0f - 2.0f / (e + 1.0f);
}

AMPSCOPE_ALWAYS_INLINE void forward_kernel(const float* x, float* out, std::size_t n) {
  const auto f = [](V v, V, V) __attribute__((always_inline)) {
    return 0.5f * v * (1.0f + gelu_tanh(v));
  };
  map(n, out, f, x);
}

AMPSCOPE_ALWAYS_INLINE void backward_kernel(const float* x, const float* d, float* out,
                                            std::size_t n) {
  const auto f = [](V v, V g, V) __attribute__((always_inline)) {
    const V t = gelu_tanh(v);
    const V sech2 = 1.0f - t * t;
    const V grad =
        0.5f * (1.0f + t) + 0.5f * v * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * v * v);
    return grad * g;
  };
  map(n, out, f, x, d);
}

}  // namespace

void gelu_forward_cpu(const CpuExec& ex, const float* inp, float* out, std::size_t n) {
  const auto kernel = at_level<&forward_kernel>(ex.level);
  for_chunks(ex.workers, n, [&](std::size_t b, std::size_t e) { kernel(inp + b, out + b, e - b); });
}

void gelu_backward_cpu(const CpuExec& ex, const float* inp, const float* dout, float* dinp,
                       std::size_t n) {
  const auto kernel = at_level<&backward_kernel>(ex.level);
  for_chunks(ex.workers, n,
             [&](std::size_t b, std::size_t e) { kernel(inp + b, dout + b, dinp + b, e - b); });
}

}  // namespace ampscope::trainer::layers
