// LayerNorm from its definition (layernorm.h), one element at a time, sums in FP64 rounded once
// to FP32: the oracle for the vector and CUDA versions.
#include <cmath>
#include <vector>

#include "layers/layernorm/layernorm.h"

namespace ampscope::trainer::layers {

void layernorm_forward_reference(const float* x, const float* weight, const float* bias, float* out,
                                 float* mean, float* rstd, std::size_t N, std::size_t C) {
  for (std::size_t r = 0; r < N; ++r) {
    const float* xr = x + r * C;
    double m = 0.0;
    for (std::size_t c = 0; c < C; ++c) m += xr[c];
    m /= static_cast<double>(C);
    double var = 0.0;
    for (std::size_t c = 0; c < C; ++c) var += (xr[c] - m) * (xr[c] - m);
    var /= static_cast<double>(C);
    const double rs = 1.0 / std::sqrt(var + kLayerNormEps);
    for (std::size_t c = 0; c < C; ++c) {
      out[r * C + c] = static_cast<float>((xr[c] - m) * rs * weight[c] + bias[c]);
    }
    mean[r] = static_cast<float>(m);
    rstd[r] = static_cast<float>(rs);
  }
}

void layernorm_backward_reference(const float* x, const float* weight, const float* dout,
                                  const float* mean, const float* rstd, float* dinp, float* dweight,
                                  float* dbias, std::size_t N, std::size_t C) {
  std::vector<double> dw(C, 0.0), db(C, 0.0);
  for (std::size_t r = 0; r < N; ++r) {
    const float* xr = x + r * C;
    const float* dr = dout + r * C;
    double dnorm_mean = 0.0, dnorm_norm_mean = 0.0;
    for (std::size_t c = 0; c < C; ++c) {
      const double norm = (xr[c] - static_cast<double>(mean[r])) * rstd[r];
      const double dnorm = static_cast<double>(weight[c]) * dr[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= static_cast<double>(C);
    dnorm_norm_mean /= static_cast<double>(C);
    for (std::size_t c = 0; c < C; ++c) {
      const double norm = (xr[c] - static_cast<double>(mean[r])) * rstd[r];
      const double dnorm = static_cast<double>(weight[c]) * dr[c];
      dinp[r * C + c] +=
          static_cast<float>((dnorm - dnorm_mean - norm * dnorm_norm_mean) * rstd[r]);
      dw[c] += norm * dr[c];
      db[c] += dr[c];
    }
  }
  for (std::size_t c = 0; c < C; ++c) {
    dweight[c] += static_cast<float>(dw[c]);
    dbias[c] += static_cast<float>(db[c]);
  }
}

}  // namespace ampscope::trainer::layers
