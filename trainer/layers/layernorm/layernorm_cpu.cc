// LayerNorm's tuned CPU version (layernorm.h): row kernels written once on the 16-lane vector
// type and compiled per SIMD level (../vector.h), run over rows_per_task rows on the workers.
#include "layers/elementwise/elementwise.h"
#include "layers/layernorm/layernorm.h"
#include "layers/vector.h"

namespace ampscope::trainer::layers {
namespace {

using namespace vk;  // NOLINT: the kernels are written in the vector toolkit's vocabulary

AMPSCOPE_ALWAYS_INLINE void forward_rows(const float* x, const float* w, const float* b, float* out,
                                         float* mean, float* rstd, std::size_t rows,
                                         std::size_t C) {
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
    const float rs = 1.0f / std::sqrt(var + kLayerNormEps);
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
AMPSCOPE_ALWAYS_INLINE void backward_rows(const float* x, const float* w, const float* d,
                                          const float* mean, const float* rstd, float* dinp,
                                          float* dw_acc, float* db_acc, std::size_t rows,
                                          std::size_t C) {
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

}  // namespace

void layernorm_forward_cpu(const CpuExec& ex, const float* x, const float* weight,
                           const float* bias, float* out, float* mean, float* rstd, std::size_t N,
                           std::size_t C) {
  const auto rows = at_level<&forward_rows>(ex.level);
  for_rows(ex.workers, N, static_cast<std::int64_t>(C), [&](std::size_t r0, std::size_t r1) {
    rows(x + r0 * C, weight, bias, out + r0 * C, mean + r0, rstd + r0, r1 - r0, C);
  });
}

void layernorm_backward_cpu(const CpuExec& ex, const float* x, const float* weight,
                            const float* dout, const float* mean, const float* rstd, float* dinp,
                            float* dweight, float* dbias, std::size_t N, std::size_t C) {
  const auto rows = at_level<&backward_rows>(ex.level);
  const auto add = elementwise_kernels(ex.level).add;
  const std::size_t per = rows_per_task(static_cast<std::int64_t>(C));
  const std::size_t tasks = (N + per - 1) / per;
  // Each task sums its rows' dweight and dbias terms; the task sums are added in task order.
  auto partial = ex.scratch.get(tasks * 2 * C);
  std::fill_n(partial.data(), tasks * 2 * C, 0.0f);
  ex.workers.run(tasks, [&](std::size_t task, int) {
    const std::size_t r0 = task * per, r1 = std::min(N, r0 + per);
    float* pw = partial.data() + task * 2 * C;
    rows(x + r0 * C, weight, dout + r0 * C, mean + r0, rstd + r0, dinp + r0 * C, pw, pw + C,
         r1 - r0, C);
  });
  for (std::size_t task = 0; task < tasks; ++task) {
    const float* pw = partial.data() + task * 2 * C;
    add(dweight, pw, dweight, C);
    add(dbias, pw + C, dbias, C);
  }
}

}  // namespace ampscope::trainer::layers
