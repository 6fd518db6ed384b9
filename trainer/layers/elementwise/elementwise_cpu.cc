// The elementwise vector kernels (elementwise.h), written once on the 16-lane vector type and
// compiled for each SIMD level (../vector.h).
#include "layers/elementwise/elementwise.h"
#include "layers/vector.h"

namespace ampscope::trainer::layers {
namespace {

using namespace vk;  // NOLINT: the kernels are written in the vector toolkit's vocabulary

// out[i] = e^((x[i] - shift1) - shift2).
AMPSCOPE_ALWAYS_INLINE void exp_shifted(const float* x, float shift1, float shift2, float* out,
                                        std::size_t n) {
  const auto f = [=](V v, V, V) __attribute__((always_inline)) {
    return vexp((v - shift1) - shift2);
  };
  map(n, out, f, x);
}

AMPSCOPE_ALWAYS_INLINE void add(const float* a, const float* b, float* out, std::size_t n) {
  const auto f = [](V x, V y, V) __attribute__((always_inline)) { return x + y; };
  map(n, out, f, a, b);
}

AMPSCOPE_ALWAYS_INLINE void scale(const float* x, float factor, float* out, std::size_t n) {
  const auto f = [=](V v, V, V) __attribute__((always_inline)) { return v * factor; };
  map(n, out, f, x);
}

// out = x * factor; returns whether any x is NaN or Inf (x - x is NaN exactly for those).
AMPSCOPE_ALWAYS_INLINE bool scale_and_check(const float* x, float factor, float* out,
                                            std::size_t n) {
  VI bad{};
  const auto f = [&](V v, V, V) __attribute__((always_inline)) {
    bad |= (v - v) != 0.0f;
    return v * factor;
  };
  map(n, out, f, x);
  for (std::size_t l = 0; l < kLanes; ++l) {
    if (bad[l] != 0) return true;
  }
  return false;
}

AMPSCOPE_ALWAYS_INLINE double sum_squares(const float* x, std::size_t n) {
  VD acc{};
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    V8 v;
    std::memcpy(&v, x + i, sizeof v);
    const VD d = __builtin_convertvector(v, VD);
    acc += d * d;
  }
  double s = 0.0;
  for (std::size_t l = 0; l < 8; ++l) s += acc[l];
  for (; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

// acc[j] += sum over rows of x[r * cols + j], rows in order.
AMPSCOPE_ALWAYS_INLINE void add_column_sums(const float* x, std::size_t rows, std::size_t cols,
                                            float* acc) {
  for (std::size_t r = 0; r < rows; ++r) add(acc, x + r * cols, acc, cols);
}

// PyTorch's AdamW update, the operations in the order of the scalar formula.
AMPSCOPE_ALWAYS_INLINE void adamw(const float* g, const float* p, const float* m, const float* v,
                                  float* po, float* mo, float* vo, std::size_t n,
                                  const AdamWScalars& s) {
  auto step = [&](std::size_t i) __attribute__((always_inline)) {
    const V gi = load(g + i);
    const V mi = s.beta1 * load(m + i) + s.one_minus_beta1 * gi;
    const V vi = s.beta2 * load(v + i) + s.one_minus_beta2 * gi * gi;
    const V mhat = mi / s.bc1;
    const V vhat = vi / s.bc2;
    store(po + i, load(p + i) * s.decay - s.lr * mhat / (vsqrt(vhat) + s.eps));
    store(mo + i, mi);
    store(vo + i, vi);
  };
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) step(i);
  for (; i < n; ++i) {
    const float gi = g[i];
    const float mi = s.beta1 * m[i] + s.one_minus_beta1 * gi;
    const float vi = s.beta2 * v[i] + s.one_minus_beta2 * gi * gi;
    const float mhat = mi / s.bc1;
    const float vhat = vi / s.bc2;
    po[i] = p[i] * s.decay - s.lr * mhat / (std::sqrt(vhat) + s.eps);
    mo[i] = mi;
    vo[i] = vi;
  }
}

template <SimdLevel L>
const ElementwiseKernels kTable{
    at_level<&add>(L),         at_level<&scale>(L),           at_level<&scale_and_check>(L),
    at_level<&sum_squares>(L), at_level<&add_column_sums>(L), at_level<&exp_shifted>(L),
    at_level<&adamw>(L)};

}  // namespace

const ElementwiseKernels& elementwise_kernels(SimdLevel level) {
  switch (level) {
    case SimdLevel::kAvx512:
      return kTable<SimdLevel::kAvx512>;
    case SimdLevel::kAvx2:
      return kTable<SimdLevel::kAvx2>;
    case SimdLevel::kScalar:
      break;
  }
  return kTable<SimdLevel::kScalar>;
}

}  // namespace ampscope::trainer::layers
