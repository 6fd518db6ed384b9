// Host instantiation of the trainer kernels' element code (see nn_host_model.h): each loop is
// the body of the device kernel of the same name in kernels/cuda, over host arrays. Host code
// only: no kernels, no CUDA runtime calls.
#include "layers/gelu/gelu_element.cuh"
#include "nn_element.cuh"
#include "nn_host_model.h"

namespace ampscope::trainer::testing {

namespace d = ::ampscope::cuda::nn::detail;

float host_round_to_format(float x, Format f) { return d::round_to_format(x, f); }

void host_convert(void* dst, Format dst_dtype, const void* src, Format src_dtype, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) d::store(dst, dst_dtype, i, d::load(src, src_dtype, i));
}

void host_add(void* out, Format out_dtype, const void* a, Format a_dtype, const void* b,
              Format b_dtype, std::int64_t n, Format compute) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float x = d::input(a, a_dtype, i, compute);
    const float y = d::input(b, b_dtype, i, compute);
    d::commit(out, out_dtype, i, x + y, compute, false);
  }
}

void host_gelu_forward(void* out, Format out_dtype, const void* inp, Format inp_dtype,
                       std::int64_t n, Format compute) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = d::input(inp, inp_dtype, i, compute);
    d::commit(out, out_dtype, i, d::gelu_forward_element(v), compute, false);
  }
}

void host_gelu_backward(void* dinp, Format dinp_dtype, const void* dout, Format dout_dtype,
                        const void* inp, Format inp_dtype, std::int64_t n, Format compute) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = d::input(inp, inp_dtype, i, compute);
    const float g = d::input(dout, dout_dtype, i, compute);
    d::commit(dinp, dinp_dtype, i, d::gelu_backward_element(v, g), compute, false);
  }
}

void host_cross_entropy_backward(void* dlogits, Format dlogits_dtype, const float* probs,
                                 const std::int32_t* targets, std::int64_t N, std::int64_t V,
                                 float dloss, Format compute) {
  for (std::int64_t i = 0; i < N * V; ++i) {
    const std::int64_t row = i / V, j = i % V;
    const float p = d::load(probs, Format::kFP32, i);
    const float g = j == targets[row] ? (p - 1.0f) * dloss : p * dloss;
    d::commit(dlogits, dlogits_dtype, i, g, compute, false);
  }
}

bool host_unscale(void* grads, Format dtype, std::int64_t n, float inv_scale) {
  int bad = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const float g = d::load(grads, dtype, i);
    bad |= d::is_finite(g) ? 0 : 1;
    d::store(grads, dtype, i, g * inv_scale);
  }
  return bad != 0;
}

void host_adamw(void* params, void* grads, void* m, void* v, Format dtype, std::int64_t n,
                const cuda::nn::AdamWArgs& args) {
  const d::AdamWStep step = d::adamw_step(args);
  for (std::int64_t i = 0; i < n; ++i) {
    float p = d::load(params, dtype, i), mi = d::load(m, dtype, i), vi = d::load(v, dtype, i);
    d::adamw_element(p, mi, vi, d::load(grads, dtype, i), step);
    d::store(params, dtype, i, p);
    d::store(m, dtype, i, mi);
    d::store(v, dtype, i, vi);
  }
}

void host_commit_accumulate(void* out, Format out_dtype, const float* contribution, std::int64_t n,
                            Format compute) {
  for (std::int64_t i = 0; i < n; ++i) d::commit(out, out_dtype, i, contribution[i], compute, true);
}

void host_update_loss_scale(LossScaleState& state, const LossScaleRule& rule,
                            bool found_inf) {
  d::update_loss_scale_state(state, rule, found_inf);
}

float host_inverse_scale(float scale) { return d::inverse_scale(scale); }

}  // namespace ampscope::trainer::testing
