// Causal attention from its definition (attention.h), one element at a time, sums in FP64
// rounded once to FP32: the oracle for the tuned CPU version.
#include <algorithm>
#include <cmath>
#include <vector>

#include "layers/attention/attention.h"

namespace ampscope::trainer::layers {

void attention_forward_reference(float* out, float* scores, float* probs, const float* qkv,
                                 std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH) {
  const std::int64_t hs = C / NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  auto q = [&](std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t d) {
    return static_cast<double>(qkv[(b * T + t) * 3 * C + h * hs + d]);
  };
  auto k = [&](std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t d) {
    return static_cast<double>(qkv[(b * T + t) * 3 * C + C + h * hs + d]);
  };
  auto v = [&](std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t d) {
    return static_cast<double>(qkv[(b * T + t) * 3 * C + 2 * C + h * hs + d]);
  };
  std::vector<double> p(static_cast<std::size_t>(T));
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < NH; ++h) {
      for (std::int64_t i = 0; i < T; ++i) {
        float* srow = scores + ((b * NH + h) * T + i) * T;
        float* prow = probs + ((b * NH + h) * T + i) * T;
        double mx = -INFINITY;
        for (std::int64_t j = 0; j < T; ++j) {
          double s = 0.0;
          for (std::int64_t d = 0; d < hs; ++d) s += q(b, i, h, d) * k(b, j, h, d);
          s = j <= i ? s * scale : 0.0;
          srow[j] = static_cast<float>(s);
          p[j] = s;
          if (j <= i) mx = std::max(mx, s);
        }
        double sum = 0.0;
        for (std::int64_t j = 0; j <= i; ++j) sum += std::exp(p[j] - mx);
        for (std::int64_t j = 0; j < T; ++j) {
          p[j] = j <= i ? std::exp(p[j] - mx) / sum : 0.0;
          prow[j] = static_cast<float>(p[j]);
        }
        for (std::int64_t d = 0; d < hs; ++d) {
          double o = 0.0;
          for (std::int64_t j = 0; j <= i; ++j) o += p[j] * v(b, j, h, d);
          out[(b * T + i) * C + h * hs + d] = static_cast<float>(o);
        }
      }
    }
  }
}

void attention_backward_reference(float* dqkv, const float* dout, const float* qkv,
                                  const float* probs, std::int64_t B, std::int64_t T,
                                  std::int64_t C, std::int64_t NH) {
  const std::int64_t hs = C / NH, C3 = 3 * C;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  std::vector<double> dq(static_cast<std::size_t>(B * T * C3), 0.0);
  std::vector<double> dp(static_cast<std::size_t>(T)), ds(static_cast<std::size_t>(T));
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < NH; ++h) {
      for (std::int64_t i = 0; i < T; ++i) {
        const float* prow = probs + ((b * NH + h) * T + i) * T;
        const float* g = dout + (b * T + i) * C + h * hs;
        // dP[i,j] = dout_i . v_j; dV_j += P[i,j] dout_i.
        double dot = 0.0;
        for (std::int64_t j = 0; j <= i; ++j) {
          const float* vj = qkv + (b * T + j) * C3 + 2 * C + h * hs;
          double s = 0.0;
          for (std::int64_t d = 0; d < hs; ++d) {
            s += static_cast<double>(g[d]) * vj[d];
            dq[static_cast<std::size_t>((b * T + j) * C3 + 2 * C + h * hs + d)] +=
                static_cast<double>(prow[j]) * g[d];
          }
          dp[j] = s;
          dot += prow[j] * s;
        }
        // dS = P (dP - sum_j P dP); dQ_i += dS k_j scale; dK_j += dS q_i scale.
        for (std::int64_t j = 0; j <= i; ++j) {
          ds[j] = prow[j] * (dp[j] - dot);
          const float* qi = qkv + (b * T + i) * C3 + h * hs;
          const float* kj = qkv + (b * T + j) * C3 + C + h * hs;
          for (std::int64_t d = 0; d < hs; ++d) {
            dq[static_cast<std::size_t>((b * T + i) * C3 + h * hs + d)] += ds[j] * kj[d] * scale;
            dq[static_cast<std::size_t>((b * T + j) * C3 + C + h * hs + d)] +=
                ds[j] * qi[d] * scale;
          }
        }
      }
    }
  }
  for (std::size_t i = 0; i < dq.size(); ++i) dqkv[i] = static_cast<float>(dq[i]);
}

}  // namespace ampscope::trainer::layers
