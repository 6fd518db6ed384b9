// The trainer kernels' element code (kernels/cuda/nn_element.cuh) compiled for the host, where
// the toolkit defines the conversion intrinsics in portable C++ and expf/sqrtf are the C
// library's (the CPU back end's). Each function below is the body of one device kernel run over
// host arrays, so the precision contract (input rounding, commit, accumulate), GELU, AdamW,
// unscale and the loss-scale rule are checked against the CPU back end on a machine without a
// GPU. The device tests then check the same code on the hardware, where only expf/logf differ.
#pragma once

#include <cstdint>

#include "ampscope/cuda/nn_optimizer.h"
#include "ampscope/formats.h"

namespace ampscope::trainer::testing {

float host_round_to_format(float x, Format f);
// out (n) = in (n) + ... as the device kernels compute them; arrays hold storage bit patterns.
void host_convert(void* dst, Format dst_dtype, const void* src, Format src_dtype, std::int64_t n);
void host_add(void* out, Format out_dtype, const void* a, Format a_dtype, const void* b,
              Format b_dtype, std::int64_t n, Format compute);
void host_gelu_forward(void* out, Format out_dtype, const void* inp, Format inp_dtype,
                       std::int64_t n, Format compute);
void host_gelu_backward(void* dinp, Format dinp_dtype, const void* dout, Format dout_dtype,
                        const void* inp, Format inp_dtype, std::int64_t n, Format compute);
void host_cross_entropy_backward(void* dlogits, Format dlogits_dtype, const float* probs,
                                 const std::int32_t* targets, std::int64_t N, std::int64_t V,
                                 float dloss, Format compute);
// Returns whether a non-finite gradient was seen.
bool host_unscale(void* grads, Format dtype, std::int64_t n, float inv_scale);
void host_adamw(void* params, void* grads, void* m, void* v, Format dtype, std::int64_t n,
                const cuda::nn::AdamWArgs& args);
// The accumulate path of every gradient output: out = store(out + round(contribution)).
void host_commit_accumulate(void* out, Format out_dtype, const float* contribution, std::int64_t n,
                            Format compute);
void host_update_loss_scale(LossScaleState& state, const LossScaleRule& rule,
                            bool found_inf);
float host_inverse_scale(float scale);

}  // namespace ampscope::trainer::testing
