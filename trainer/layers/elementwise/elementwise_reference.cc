// Plain scalar versions of the elementwise kernels (elementwise.h), written from the
// definitions: the oracle the tests hold every SIMD level to.
#include <cmath>

#include "layers/elementwise/elementwise.h"

namespace ampscope::trainer::layers {

void add_reference(const float* a, const float* b, float* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void scale_reference(const float* x, float factor, float* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = x[i] * factor;
}

bool scale_and_check_reference(const float* x, float factor, float* out, std::size_t n) {
  bool bad = false;
  for (std::size_t i = 0; i < n; ++i) {
    bad = bad || !std::isfinite(x[i]);
    out[i] = x[i] * factor;
  }
  return bad;
}

double sum_squares_reference(const float* x, std::size_t n) {
  double s = 0.0;
  for (std::size_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

void add_column_sums_reference(const float* x, std::size_t rows, std::size_t cols, float* acc) {
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t j = 0; j < cols; ++j) acc[j] += x[r * cols + j];
  }
}

void exp_shifted_reference(const float* x, float shift1, float shift2, float* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = std::exp((x[i] - shift1) - shift2);
}

void adamw_reference(const float* g, const float* p, const float* m, const float* v, float* po,
                     float* mo, float* vo, std::size_t n, const AdamWScalars& s) {
  for (std::size_t i = 0; i < n; ++i) {
    const float mi = s.beta1 * m[i] + s.one_minus_beta1 * g[i];
    const float vi = s.beta2 * v[i] + s.one_minus_beta2 * g[i] * g[i];
    const float mhat = mi / s.bc1;
    const float vhat = vi / s.bc2;
    po[i] = p[i] * s.decay - s.lr * mhat / (std::sqrt(vhat) + s.eps);
    mo[i] = mi;
    vo[i] = vi;
  }
}

}  // namespace ampscope::trainer::layers
