// Attention's tuned CPU version (attention.h): per (sequence, head), OpenBLAS sgemm for the two
// products, the causal softmax with the elementwise group's vector exponential, and the
// rounding the precision contract asks for between the steps.
#include <cblas.h>

#include <algorithm>
#include <cmath>

#include "ampscope/convert.h"
#include "layers/attention/attention.h"
#include "layers/elementwise/elementwise.h"

namespace ampscope::trainer::layers {
namespace {

// fn(task, slot) for each (sequence, head). Heads run in parallel while OpenBLAS runs each of
// their products on one thread (it threads an sgemm above m*n*k = 65536 * 4, its default
// GEMM_MULTITHREAD_THRESHOLD); larger heads run one after another with each product on
// OpenBLAS's threads, rather than two levels of threads competing for the cores.
template <class Fn>
void for_heads(const Workers& workers, std::int64_t heads, std::int64_t product_mnk, const Fn& fn) {
  const auto count = static_cast<std::size_t>(heads);
  if (product_mnk <= 65536 * 4) {
    workers.run(count, fn);
    return;
  }
  for (std::size_t i = 0; i < count; ++i) fn(i, 0);
}

}  // namespace

void attention_forward_cpu(const CpuExec& ex, float* out, float* scores, float* probs,
                           const float* qkv, std::int64_t B, std::int64_t T, std::int64_t C,
                           std::int64_t NH, Format compute, Format softmax,
                           const AttentionFaults& faults) {
  const std::int64_t C3 = 3 * C, hs = C / NH;
  const float alpha = 1.0f / std::sqrt(static_cast<float>(hs));
  const auto exp_shifted = elementwise_kernels(ex.level).exp_shifted;
  const bool round_p = compute != Format::kFP32 && compute != softmax;
  const auto TT = static_cast<std::size_t>(T * T);
  auto pc = ex.scratch.get(TT * static_cast<std::size_t>(ex.workers.threads()));
  for_heads(ex.workers, B * NH, T * T * hs, [&](std::size_t task, int slot) {
    const auto b = static_cast<std::int64_t>(task) / NH, h = static_cast<std::int64_t>(task) % NH;
    const float* q = qkv + b * T * C3 + h * hs;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* sr = scores + (b * NH + h) * T * T;
    float* pr = probs + (b * NH + h) * T * T;
    // A fault in this head's (T,T) block, before the rounding that every element gets.
    const auto inject = [&](const std::optional<ElementFault>& f, float* block) {
      const std::int64_t at = f ? f->index - (b * NH + h) * T * T : -1;
      if (at >= 0 && at < T * T) block[at] = f->value;
    };
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(T), int(T), int(hs), alpha, q, int(C3),
                k, int(C3), 0.0f, sr, int(T));
    for (std::int64_t i = 0; i < T; ++i) std::fill(sr + i * T + i + 1, sr + (i + 1) * T, 0.0f);
    inject(faults.scores, sr);
    // The stored scores are what the softmax reads.
    if (compute != Format::kFP32) round_through(sr, TT, compute);
    for (std::int64_t i = 0; i < T; ++i) {
      const float* srow = sr + i * T;
      float* prow = pr + i * T;
      float mx = -INFINITY;
      for (std::int64_t j = 0; j <= i; ++j) mx = std::max(mx, srow[j]);
      exp_shifted(srow, mx, 0.0f, prow, static_cast<std::size_t>(i + 1));
      float sum = 0.0f;
      for (std::int64_t j = 0; j <= i; ++j) sum += prow[j];
      const float inv = 1.0f / sum;
      for (std::int64_t j = 0; j <= i; ++j) prow[j] *= inv;
      std::fill(prow + i + 1, prow + T, 0.0f);
    }
    inject(faults.probs, pr);
    // The product reads probs rounded to the softmax format, then to compute.
    if (softmax != Format::kFP32) round_through(pr, TT, softmax);
    const float* pm = pr;
    if (round_p) {
      float* own = pc.data() + static_cast<std::size_t>(slot) * TT;
      std::copy_n(pr, TT, own);
      round_through(own, TT, compute);
      pm = own;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(T), int(hs), int(T), 1.0f, pm,
                int(T), v, int(C3), 0.0f, out + b * T * C + h * hs, int(C));
  });
}

void attention_backward_cpu(const CpuExec& ex, float* dqkv, const float* dout, const float* qkv,
                            const float* probs, std::int64_t B, std::int64_t T, std::int64_t C,
                            std::int64_t NH, Format compute, Format softmax) {
  const std::int64_t C3 = 3 * C, hs = C / NH;
  const float alpha = 1.0f / std::sqrt(static_cast<float>(hs));
  const auto TT = static_cast<std::size_t>(T * T);
  auto scratch = ex.scratch.get(3 * TT * static_cast<std::size_t>(ex.workers.threads()));
  const bool round_p = compute != Format::kFP32 && compute != softmax;
  for_heads(ex.workers, B * NH, T * T * hs, [&](std::size_t task, int slot) {
    const auto b = static_cast<std::int64_t>(task) / NH, h = static_cast<std::int64_t>(task) % NH;
    float* dp = scratch.data() + static_cast<std::size_t>(slot) * 3 * TT;
    float* ds = dp + TT;
    float* pc = ds + TT;
    const float* q = qkv + b * T * C3 + h * hs;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* dq = dqkv + b * T * C3 + h * hs;
    float* dk = dq + C;
    float* dv = dq + 2 * C;
    const float* dctx = dout + b * T * C + h * hs;
    const float* pr = probs + (b * NH + h) * T * T;
    const float* pm = pr;
    if (round_p) {
      std::copy_n(pr, TT, pc);
      round_through(pc, TT, compute);
      pm = pc;
    }
    // dP = dctx v^T, dV = P^T dctx (in compute).
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(T), int(T), int(hs), 1.0f, dctx,
                int(C), v, int(C3), 0.0f, dp, int(T));
    if (compute != Format::kFP32) round_through(dp, TT, compute);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(T), int(hs), int(T), 1.0f, pm, int(T),
                dctx, int(C), 0.0f, dv, int(C3));
    // Softmax backward in the softmax format; the result is the gradient of the scores,
    // which are stored in compute.
    for (std::int64_t i = 0; i < T; ++i) {
      const float* prow = pr + i * T;
      const float* dprow = dp + i * T;
      float* dsrow = ds + i * T;
      float dot = 0.0f;
      for (std::int64_t j = 0; j <= i; ++j) dot += prow[j] * dprow[j];
      for (std::int64_t j = 0; j <= i; ++j) dsrow[j] = prow[j] * (dprow[j] - dot);
      std::fill(dsrow + i + 1, dsrow + T, 0.0f);
    }
    if (softmax != Format::kFP32) round_through(ds, TT, softmax);
    if (compute != Format::kFP32) round_through(ds, TT, compute);
    // dQ = alpha dS k, dK = alpha dS^T q.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(T), int(hs), int(T), alpha, ds,
                int(T), k, int(C3), 0.0f, dq, int(C3));
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(T), int(hs), int(T), alpha, ds, int(T),
                q, int(C3), 0.0f, dk, int(C3));
  });
}

}  // namespace ampscope::trainer::layers
