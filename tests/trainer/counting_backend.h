// A Backend that forwards every call to another one and counts the device-to-host reads
// (copy_to_host), to check how often a training step waits for the device.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "ampscope/trainer/backend.h"

namespace ampscope::trainer::testing {

class CountingBackend final : public Backend {
 public:
  explicit CountingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}

  // Reads since construction or the last reset.
  int host_reads() const { return reads_; }
  void reset() { reads_ = 0; }

  Device device() const override { return inner_->device(); }
  std::string name() const override { return inner_->name(); }
  std::unique_ptr<Buffer> allocate(std::size_t bytes) override { return inner_->allocate(bytes); }
  Stream& stream() override { return inner_->stream(); }
  void copy_to_host(void* dst, const void* src, std::size_t bytes) override {
    ++reads_;
    inner_->copy_to_host(dst, src, bytes);
  }
  void copy_from_host(void* dst, const void* src, std::size_t bytes) override {
    inner_->copy_from_host(dst, src, bytes);
  }
  void fill(const Tensor& t, float value) override { inner_->fill(t, value); }
  void convert(const Tensor& dst, const Tensor& src) override { inner_->convert(dst, src); }
  void add(const Tensor& out, const Tensor& a, const Tensor& b, Format compute) override {
    inner_->add(out, a, b, compute);
  }
  void set_element(const Tensor& t, std::int64_t index, float value) override {
    inner_->set_element(t, index, value);
  }
  void embedding_forward(const Tensor& out, const std::int32_t* tokens, const Tensor& wte,
                         const Tensor& wpe) override {
    inner_->embedding_forward(out, tokens, wte, wpe);
  }
  void embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                          const std::int32_t* tokens) override {
    inner_->embedding_backward(dwte, dwpe, dout, tokens);
  }
  void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                         const Tensor& inp, const Tensor& weight, const Tensor& bias,
                         Format compute) override {
    inner_->layernorm_forward(out, mean, rstd, inp, weight, bias, compute);
  }
  void layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                          const Tensor& dout, const Tensor& inp, const Tensor& weight,
                          const Tensor& mean, const Tensor& rstd, Format compute) override {
    inner_->layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, compute);
  }
  void matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight,
                      const Tensor& bias, Format compute) override {
    inner_->matmul_forward(out, inp, weight, bias, compute);
  }
  void matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                       const Tensor& dout, const Tensor& inp, const Tensor& weight,
                       Format compute) override {
    inner_->matmul_backward(dinp, dweight, dbias, dout, inp, weight, compute);
  }
  void attention_forward(const Tensor& out, const Tensor& scores, const Tensor& probs,
                         const Tensor& qkv, int n_head, Format compute, Format softmax,
                         const AttentionFaults& faults) override {
    inner_->attention_forward(out, scores, probs, qkv, n_head, compute, softmax, faults);
  }
  void attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                          const Tensor& probs, int n_head, Format compute,
                          Format softmax) override {
    inner_->attention_backward(dqkv, dout, qkv, probs, n_head, compute, softmax);
  }
  void gelu_forward(const Tensor& out, const Tensor& inp, Format compute) override {
    inner_->gelu_forward(out, inp, compute);
  }
  void gelu_backward(const Tensor& dinp, const Tensor& dout, const Tensor& inp,
                     Format compute) override {
    inner_->gelu_backward(dinp, dout, inp, compute);
  }
  void cross_entropy_forward(const Tensor& losses, const Tensor& probs, const Tensor& logits,
                             const std::int32_t* targets, Format compute) override {
    inner_->cross_entropy_forward(losses, probs, logits, targets, compute);
  }
  void cross_entropy_backward(const Tensor& dlogits, const Tensor& probs,
                              const std::int32_t* targets, float dloss, Format compute) override {
    inner_->cross_entropy_backward(dlogits, probs, targets, dloss, compute);
  }
  void unscale_and_check(const Tensor& grads, float inv_scale, const Tensor& found_inf) override {
    inner_->unscale_and_check(grads, inv_scale, found_inf);
  }
  void unscale_check_and_measure(const Tensor& grads, float inv_scale, const Tensor& found_inf,
                                 std::span<const StatsRequest> requests) override {
    inner_->unscale_check_and_measure(grads, inv_scale, found_inf, requests);
  }
  void sum_squares(const Tensor& sum_sq, const Tensor& x) override {
    inner_->sum_squares(sum_sq, x);
  }
  void update_loss_scale(LossScaleState* state, const Tensor& found_inf,
                         const LossScaleRule& rule) override {
    inner_->update_loss_scale(state, found_inf, rule);
  }
  void accumulate_mean(double* acc, const Tensor& x) override { inner_->accumulate_mean(acc, x); }
  void sum_products(double* out, const Tensor& a, const Tensor& b) override {
    inner_->sum_products(out, a, b);
  }
  void scale(const Tensor& x, float factor) override { inner_->scale(x, factor); }
  void adamw(const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,
             const AdamWParams& hp) override {
    inner_->adamw(params, grads, m, v, hp);
  }

 private:
  std::unique_ptr<Backend> inner_;
  int reads_ = 0;
};

}  // namespace ampscope::trainer::testing
