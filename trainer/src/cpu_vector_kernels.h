// The vector kernels of the CPU back end (cpu_backend.cc): the loops outside the matmuls --
// GELU, the softmax and cross-entropy exponentials, LayerNorm, AdamW and the elementwise ops.
//
// Each is written once on 16-lane GCC vector types (lowered to 1 zmm, 2 ymm or 4 xmm registers)
// and instantiated three times, for AVX-512, AVX2 and the x86-64 baseline; kernels_for() gives
// the table of one level. Sums accumulate per lane and are combined in lane order, so a kernel's
// result depends only on its inputs and the level. The AVX2 and AVX-512 instantiations may
// contract a * b + c into FMA (GCC's default for C++), so levels can differ by rounding; a
// machine always runs the same level, which is what bit-exact resume needs.
// Private to the back end; included by cpu_backend.cc only.
#pragma once

#include <xmmintrin.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "ampscope/cpu_features.h"

// The 16-lane helpers take and return vectors by value but are always inlined, so no call ABI
// is involved; GCC still notes the ABI of such functions (at the end of the file).
#pragma GCC diagnostic ignored "-Wpsabi"

namespace ampscope::trainer::detail {

namespace vk {

#define AMPSCOPE_VK inline __attribute__((always_inline))

using V = float __attribute__((vector_size(64)));
using VI = std::int32_t __attribute__((vector_size(64)));
using V4 = float __attribute__((vector_size(16)));
using V8 = float __attribute__((vector_size(32)));
using VD = double __attribute__((vector_size(64)));
constexpr std::size_t kLanes = 16;

AMPSCOPE_VK V load(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
AMPSCOPE_VK void store(float* p, V v) { std::memcpy(p, &v, sizeof v); }
AMPSCOPE_VK V splat(float x) { return V{} + x; }

AMPSCOPE_VK float hsum(V v) {
  float s = 0.0f;
  for (std::size_t l = 0; l < kLanes; ++l) s += v[l];
  return s;
}

AMPSCOPE_VK V vsqrt(V v) {
  V4 parts[4];
  std::memcpy(parts, &v, sizeof v);
  for (auto& p : parts) p = _mm_sqrt_ps(p);
  std::memcpy(&v, parts, sizeof v);
  return v;
}

// e^x (Cephes expf: x = k ln2 + r, a degree-6 polynomial in r; ~1 ulp). Below -87.34 the
// result is 0 (no subnormals), above 88 it is +Inf (callers stay far below), NaN stays NaN.
AMPSCOPE_VK V vexp(V x) {
  const VI under = x < -87.33654f;
  const VI over = x > 88.0f;
  V c = under ? splat(-87.33654f) : x;
  c = over ? splat(88.0f) : c;
  // Round to the nearest integer (ties to even) by adding and removing 1.5 * 2^23.
  V k = c * 1.44269504088896341f;
  k = (k + 12582912.0f) - 12582912.0f;
  V r = c - k * 0.693359375f;
  r = r - k * -2.12194440e-4f;
  V y = splat(1.9875691500e-4f);
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * (r * r) + r + 1.0f;
  const VI n = __builtin_convertvector(k, VI);
  V e = y * reinterpret_cast<V>((n + 127) << 23);
  e = under ? splat(0.0f) : e;
  return over ? splat(std::numeric_limits<float>::infinity()) : e;
}

// out[i] = f(i-th vectors of the inputs) over n elements; the tail goes through a zero-padded
// vector, so every element sees the same code.
template <class F>
AMPSCOPE_VK void map(std::size_t n, float* out, const F& f, const float* a,
                     const float* b = nullptr, const float* c = nullptr) {
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    store(out + i, f(load(a + i), b ? load(b + i) : V{}, c ? load(c + i) : V{}));
  }
  if (i == n) return;
  float pa[kLanes] = {}, pb[kLanes] = {}, pc[kLanes] = {}, po[kLanes];
  const std::size_t rest = (n - i) * sizeof(float);
  std::memcpy(pa, a + i, rest);
  if (b) std::memcpy(pb, b + i, rest);
  if (c) std::memcpy(pc, c + i, rest);
  store(po, f(load(pa), load(pb), load(pc)));
  std::memcpy(out + i, po, rest);
}

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)

// tanh(u) = 1 - 2 / (e^2u + 1): one exponential. Absolute error ~1e-7 near 0 (cancellation),
// which GELU's 0.5 x (1 + t) absorbs.
AMPSCOPE_VK V gelu_tanh(V v) {
  const V cube = splat(0.044715f) * v * v * v;
  const V u = kGeluScale * (v + cube);
  const V e = vexp(2.0f * (u > 40.0f ? splat(40.0f) : u));
  return 1.0f - 2.0f / (e + 1.0f);
}

AMPSCOPE_VK void gelu_forward(const float* x, float* out, std::size_t n) {
  const auto f = [](V v, V, V) __attribute__((always_inline)) {
    return 0.5f * v * (1.0f + gelu_tanh(v));
  };
  map(n, out, f, x);
}

AMPSCOPE_VK void gelu_backward(const float* x, const float* d, float* out, std::size_t n) {
  const auto f = [](V v, V g, V) __attribute__((always_inline)) {
    const V t = gelu_tanh(v);
    const V sech2 = 1.0f - t * t;
    const V grad =
        0.5f * (1.0f + t) + 0.5f * v * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * v * v);
    return grad * g;
  };
  map(n, out, f, x, d);
}

// out[i] = e^((x[i] - shift1) - shift2).
AMPSCOPE_VK void exp_shifted(const float* x, float shift1, float shift2, float* out,
                             std::size_t n) {
  const auto f = [=](V v, V, V) __attribute__((always_inline)) {
    return vexp((v - shift1) - shift2);
  };
  map(n, out, f, x);
}

AMPSCOPE_VK void add(const float* a, const float* b, float* out, std::size_t n) {
  const auto f = [](V x, V y, V) __attribute__((always_inline)) { return x + y; };
  map(n, out, f, a, b);
}

AMPSCOPE_VK void scale(const float* x, float factor, float* out, std::size_t n) {
  const auto f = [=](V v, V, V) __attribute__((always_inline)) { return v * factor; };
  map(n, out, f, x);
}

// out = x * factor; returns whether any x is NaN or Inf (x - x is NaN exactly for those).
AMPSCOPE_VK bool scale_and_check(const float* x, float factor, float* out, std::size_t n) {
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

AMPSCOPE_VK double sum_squares(const float* x, std::size_t n) {
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
AMPSCOPE_VK void add_column_sums(const float* x, std::size_t rows, std::size_t cols, float* acc) {
  for (std::size_t r = 0; r < rows; ++r) add(acc, x + r * cols, acc, cols);
}

AMPSCOPE_VK void layernorm_forward(const float* x, const float* w, const float* b, float* out,
                                   float* mean, float* rstd, std::size_t rows, std::size_t C) {
  for (std::size_t r = 0; r < rows; ++r) {
    const float* xr = x + r * C;
    V acc{};
    std::size_t c = 0;
    for (; c + kLanes <= C; c += kLanes) acc += load(xr + c);
    float m = hsum(acc);
    for (; c < C; ++c) m += xr[c];
    m /= static_cast<float>(C);
    acc = V{};
    for (c = 0; c + kLanes <= C; c += kLanes) {
      const V dv = load(xr + c) - m;
      acc += dv * dv;
    }
    float var = hsum(acc);
    for (; c < C; ++c) var += (xr[c] - m) * (xr[c] - m);
    var /= static_cast<float>(C);
    const float rs = 1.0f / std::sqrt(var + 1e-5f);
    const auto f = [=](V xv, V wv, V bv) __attribute__((always_inline)) {
      return (xv - m) * rs * wv + bv;
    };
    map(C, out + r * C, f, xr, w, b);
    mean[r] = m;
    rstd[r] = rs;
  }
}

// For each row: dinp += (dnorm - mean(dnorm) - norm * mean(dnorm * norm)) * rstd with
// dnorm = w * dout, and the row's dweight (norm * dout) and dbias (dout) terms added to dw_acc
// and db_acc, rows in order.
AMPSCOPE_VK void layernorm_backward(const float* x, const float* w, const float* d,
                                    const float* mean, const float* rstd, float* dinp,
                                    float* dw_acc, float* db_acc, std::size_t rows, std::size_t C) {
  for (std::size_t r = 0; r < rows; ++r) {
    const float* xr = x + r * C;
    const float* dr = d + r * C;
    float* dir = dinp + r * C;
    const float mu = mean[r], rs = rstd[r];
    V acc_d{}, acc_dn{};
    std::size_t c = 0;
    for (; c + kLanes <= C; c += kLanes) {
      const V norm = (load(xr + c) - mu) * rs;
      const V dnorm = load(w + c) * load(dr + c);
      acc_d += dnorm;
      acc_dn += dnorm * norm;
    }
    float dnorm_mean = hsum(acc_d), dnorm_norm_mean = hsum(acc_dn);
    for (; c < C; ++c) {
      const float norm = (xr[c] - mu) * rs;
      const float dnorm = w[c] * dr[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= static_cast<float>(C);
    dnorm_norm_mean /= static_cast<float>(C);
    for (c = 0; c + kLanes <= C; c += kLanes) {
      const V dv = load(dr + c);
      const V norm = (load(xr + c) - mu) * rs;
      const V dnorm = load(w + c) * dv;
      store(db_acc + c, load(db_acc + c) + dv);
      store(dw_acc + c, load(dw_acc + c) + norm * dv);
      store(dir + c, load(dir + c) + (dnorm - dnorm_mean - norm * dnorm_norm_mean) * rs);
    }
    for (; c < C; ++c) {
      const float norm = (xr[c] - mu) * rs;
      const float dnorm = w[c] * dr[c];
      db_acc[c] += dr[c];
      dw_acc[c] += norm * dr[c];
      dir[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * rs;
    }
  }
}

struct AdamWScalars {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, bc1, bc2, decay, lr, eps;
};

// PyTorch's AdamW update, the operations in the order of the scalar formula.
AMPSCOPE_VK void adamw(const float* g, const float* p, const float* m, const float* v, float* po,
                       float* mo, float* vo, std::size_t n, const AdamWScalars& s) {
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

#undef AMPSCOPE_VK

}  // namespace vk

// One instantiation of the vector kernels per SIMD level; Kernels holds the chosen level's.
struct Kernels {
  void (*gelu_forward)(const float*, float*, std::size_t);
  void (*gelu_backward)(const float*, const float*, float*, std::size_t);
  void (*exp_shifted)(const float*, float, float, float*, std::size_t);
  void (*add)(const float*, const float*, float*, std::size_t);
  void (*scale)(const float*, float, float*, std::size_t);
  bool (*scale_and_check)(const float*, float, float*, std::size_t);
  double (*sum_squares)(const float*, std::size_t);
  void (*add_column_sums)(const float*, std::size_t, std::size_t, float*);
  void (*layernorm_forward)(const float*, const float*, const float*, float*, float*, float*,
                            std::size_t, std::size_t);
  void (*layernorm_backward)(const float*, const float*, const float*, const float*, const float*,
                             float*, float*, float*, std::size_t, std::size_t);
  void (*adamw)(const float*, const float*, const float*, const float*, float*, float*, float*,
                std::size_t, const vk::AdamWScalars&);
};

#define AMPSCOPE_KERNEL_LEVEL(Name, ...)                                                          \
  struct Name {                                                                                   \
    __VA_ARGS__ static void gelu_forward(const float* x, float* o, std::size_t n) {               \
      vk::gelu_forward(x, o, n);                                                                  \
    }                                                                                             \
    __VA_ARGS__ static void gelu_backward(const float* x, const float* d, float* o,               \
                                          std::size_t n) {                                        \
      vk::gelu_backward(x, d, o, n);                                                              \
    }                                                                                             \
    __VA_ARGS__ static void exp_shifted(const float* x, float s1, float s2, float* o,             \
                                        std::size_t n) {                                          \
      vk::exp_shifted(x, s1, s2, o, n);                                                           \
    }                                                                                             \
    __VA_ARGS__ static void add(const float* a, const float* b, float* o, std::size_t n) {        \
      vk::add(a, b, o, n);                                                                        \
    }                                                                                             \
    __VA_ARGS__ static void scale(const float* x, float f, float* o, std::size_t n) {             \
      vk::scale(x, f, o, n);                                                                      \
    }                                                                                             \
    __VA_ARGS__ static bool scale_and_check(const float* x, float f, float* o, std::size_t n) {   \
      return vk::scale_and_check(x, f, o, n);                                                     \
    }                                                                                             \
    __VA_ARGS__ static double sum_squares(const float* x, std::size_t n) {                        \
      return vk::sum_squares(x, n);                                                               \
    }                                                                                             \
    __VA_ARGS__ static void add_column_sums(const float* x, std::size_t rows, std::size_t cols,   \
                                            float* acc) {                                         \
      vk::add_column_sums(x, rows, cols, acc);                                                    \
    }                                                                                             \
    __VA_ARGS__ static void layernorm_forward(const float* x, const float* w, const float* b,     \
                                              float* o, float* mean, float* rstd,                 \
                                              std::size_t rows, std::size_t C) {                  \
      vk::layernorm_forward(x, w, b, o, mean, rstd, rows, C);                                     \
    }                                                                                             \
    __VA_ARGS__ static void layernorm_backward(const float* x, const float* w, const float* d,    \
                                               const float* mean, const float* rstd, float* dinp, \
                                               float* dw, float* db, std::size_t rows,            \
                                               std::size_t C) {                                   \
      vk::layernorm_backward(x, w, d, mean, rstd, dinp, dw, db, rows, C);                         \
    }                                                                                             \
    __VA_ARGS__ static void adamw(const float* g, const float* p, const float* m, const float* v, \
                                  float* po, float* mo, float* vo, std::size_t n,                 \
                                  const vk::AdamWScalars& s) {                                    \
      vk::adamw(g, p, m, v, po, mo, vo, n, s);                                                    \
    }                                                                                             \
    static Kernels table() {                                                                      \
      return {gelu_forward,                                                                       \
              gelu_backward,                                                                      \
              exp_shifted,                                                                        \
              add,                                                                                \
              scale,                                                                              \
              scale_and_check,                                                                    \
              sum_squares,                                                                        \
              add_column_sums,                                                                    \
              layernorm_forward,                                                                  \
              layernorm_backward,                                                                 \
              adamw};                                                                             \
    }                                                                                             \
  };

AMPSCOPE_KERNEL_LEVEL(BaselineKernels)
AMPSCOPE_KERNEL_LEVEL(Avx2Kernels, __attribute__((target("avx2,fma"))))
AMPSCOPE_KERNEL_LEVEL(Avx512Kernels,
                      __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma"))))
#undef AMPSCOPE_KERNEL_LEVEL

inline Kernels kernels_for(SimdLevel level) {
  switch (level) {
    case SimdLevel::kAvx512:
      return Avx512Kernels::table();
    case SimdLevel::kAvx2:
      return Avx2Kernels::table();
    case SimdLevel::kScalar:
      break;
  }
  return BaselineKernels::table();
}

}  // namespace ampscope::trainer::detail
