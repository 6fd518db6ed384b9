// The CUDA back end (cuda_backend.h): the Backend interface mapped onto ampscope::cuda::nn.
// This file only adapts: it reads shapes from the Tensors exactly as the CPU back end does,
// checks that every tensor lives on the device, and forwards to the launchers, which check the
// rest. The precision contract is implemented once, in kernels/cuda (nn_element.cuh); each
// layer's kernels live with the layer (trainer/layers/<layer>/<layer>.cu).
#include "cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "ampscope/check.h"
#include "ampscope/cuda/check.h"
#include "ampscope/cuda/cublaslt.h"
#include "ampscope/cuda/device.h"
#include "ampscope/cuda/nn.h"
#include "ampscope/cuda/nn_optimizer.h"
#include "layers/attention/attention_cuda.h"
#include "layers/cross_entropy/cross_entropy_cuda.h"
#include "layers/elementwise/elementwise_cuda.h"
#include "layers/embedding/embedding_cuda.h"
#include "layers/gelu/gelu_cuda.h"
#include "layers/layernorm/layernorm_cuda.h"
#include "layers/matmul/matmul_cuda.h"

namespace ampscope::trainer {
namespace {

namespace nn = ::ampscope::cuda::nn;

// The stream, and the device word kernels report bad data in. Shared by the back end and its
// buffers, which may outlive it.
class DeviceQueue {
 public:
  explicit DeviceQueue(int device) : device_(device) {
    AMPSCOPE_CHECK_CUDA(cudaSetDevice(device));
    AMPSCOPE_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    AMPSCOPE_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&error_), sizeof(nn::DeviceError)));
    AMPSCOPE_CHECK_CUDA(
        cudaMallocHost(reinterpret_cast<void**>(&error_host_), sizeof(nn::DeviceError)));
    AMPSCOPE_CHECK_CUDA(cudaMemsetAsync(error_, 0, sizeof(nn::DeviceError), stream_));
    std::memset(error_host_, 0, sizeof(nn::DeviceError));
  }
  ~DeviceQueue() {
    (void)cudaStreamSynchronize(stream_);
    (void)cudaFreeHost(error_host_);
    (void)cudaFree(error_);
    (void)cudaStreamDestroy(stream_);
  }
  DeviceQueue(const DeviceQueue&) = delete;
  DeviceQueue& operator=(const DeviceQueue&) = delete;

  cudaStream_t stream() const { return stream_; }
  int device() const { return device_; }
  nn::DeviceError* error() const { return error_; }

  // Waits for the stream; throws what the kernels reported since the last wait, and any CUDA
  // error. The error word comes back in the same wait, not in a read of its own.
  void synchronize() {
    AMPSCOPE_CHECK_CUDA(cudaMemcpyAsync(error_host_, error_, sizeof(nn::DeviceError),
                                        cudaMemcpyDeviceToHost, stream_));
    AMPSCOPE_CHECK_CUDA(cudaStreamSynchronize(stream_));
    if (error_host_->code != 0) {
      const std::string what = nn::describe(*error_host_);
      std::memset(error_host_, 0, sizeof(nn::DeviceError));
      AMPSCOPE_CHECK_CUDA(cudaMemsetAsync(error_, 0, sizeof(nn::DeviceError), stream_));
      throw Error(what);
    }
  }

 private:
  int device_;
  cudaStream_t stream_ = nullptr;
  nn::DeviceError* error_ = nullptr;
  nn::DeviceError* error_host_ = nullptr;
};

class CudaBuffer final : public Buffer {
 public:
  CudaBuffer(std::size_t bytes, std::shared_ptr<DeviceQueue> queue)
      : bytes_(bytes), queue_(std::move(queue)) {
    // At least 256 bytes so data() is never null (cudaMalloc aligns to 256).
    const std::size_t allocated = std::max<std::size_t>(bytes, 256);
    AMPSCOPE_CHECK_CUDA(cudaMalloc(&data_, allocated));
    AMPSCOPE_CHECK_CUDA(cudaMemsetAsync(data_, 0, allocated, queue_->stream()));
  }
  ~CudaBuffer() override {
    // Work still queued may read or write this memory.
    (void)cudaStreamSynchronize(queue_->stream());
    (void)cudaFree(data_);
  }
  Device device() const override { return Device::kCuda; }
  std::size_t bytes() const override { return bytes_; }
  void* data() override { return data_; }

 private:
  std::size_t bytes_;
  std::shared_ptr<DeviceQueue> queue_;
  void* data_ = nullptr;
};

class CudaStream final : public Stream {
 public:
  explicit CudaStream(std::shared_ptr<DeviceQueue> queue) : queue_(std::move(queue)) {}
  void synchronize() override { queue_->synchronize(); }
  void* native_handle() const override { return queue_->stream(); }

 private:
  std::shared_ptr<DeviceQueue> queue_;
};

void check_on_device(const Tensor& t, const char* what) {
  AMPSCOPE_CHECK(t.device == Device::kCuda, what, " is on ", device_name(t.device),
                 ", the CUDA back end needs device tensors");
}

nn::Array array(const Tensor& t, const char* what) {
  check_on_device(t, what);
  return {t.data, t.dtype};
}

// An optional tensor (empty(): absent) as an array with null data.
nn::Array optional_array(const Tensor& t, const char* what) {
  if (t.empty()) return {nullptr, t.dtype};
  return array(t, what);
}

float* scalar(const Tensor& t, const char* what) {
  check_on_device(t, what);
  AMPSCOPE_CHECK(t.dtype == Format::kFP32 && t.numel() >= 1, what,
                 " must be an FP32 scalar, found ", format_name(t.dtype), " with ", t.numel(),
                 " elements");
  return static_cast<float*>(t.data);
}

void check_same_numel(const Tensor& a, const Tensor& b, const char* what) {
  AMPSCOPE_CHECK(a.numel() == b.numel(), what, ": expected ", a.numel(), " elements, found ",
                 b.numel());
}

std::int64_t last_dim(const Tensor& t) { return t.dim(t.rank - 1); }

layers::OperandRecipe operand(const std::optional<QuantizedOperand>& q) {
  if (!q) return {};
  return {&q->recipe, q->counts};
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaBackendOptions& options)
      : queue_(std::make_shared<DeviceQueue>(options.device)),
        stream_(queue_),
        fp8_gemms_(options.fp8_gemms) {
    cudaDeviceProp prop{};
    AMPSCOPE_CHECK_CUDA(cudaGetDeviceProperties(&prop, options.device));
    name_ = "cuda:" + std::to_string(options.device) + " (" + prop.name + ", sm_" +
            std::to_string(prop.major) + std::to_string(prop.minor) + ")";
    // Keep what the launchers' scratch (cudaMallocAsync) frees in the pool instead of giving it
    // back to the driver at every synchronisation: steady-state steps then allocate nothing.
    cudaMemPool_t pool = nullptr;
    AMPSCOPE_CHECK_CUDA(cudaDeviceGetDefaultMemPool(&pool, options.device));
    std::uint64_t keep = std::numeric_limits<std::uint64_t>::max();
    AMPSCOPE_CHECK_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    blas_ = std::make_unique<cuda::CublasLt>();
  }

  Device device() const override { return Device::kCuda; }
  std::string name() const override { return name_; }
  std::unique_ptr<Buffer> allocate(std::size_t bytes) override {
    return std::make_unique<CudaBuffer>(bytes, queue_);
  }
  Stream& stream() override { return stream_; }

  void copy_to_host(void* dst, const void* src, std::size_t bytes) override {
    if (bytes > 0) {
      AMPSCOPE_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s()));
    }
    queue_->synchronize();
  }
  void copy_from_host(void* dst, const void* src, std::size_t bytes) override {
    // From pageable memory the call returns once `src` has been staged, so the caller may reuse
    // it at once; the transfer itself stays ordered on the stream.
    if (bytes > 0) {
      AMPSCOPE_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s()));
    }
  }

  void fill(const Tensor& t, float value) override {
    nn::fill(array(t, "fill"), t.numel(), value, s());
  }

  void convert(const Tensor& dst, const Tensor& src) override {
    check_same_numel(dst, src, "convert");
    nn::convert(array(dst, "convert: dst"), array(src, "convert: src"), dst.numel(), s());
  }

  void add(const Tensor& out, const Tensor& a, const Tensor& b, Format compute) override {
    check_same_numel(out, a, "add");
    check_same_numel(out, b, "add");
    nn::add(array(out, "add: out"), array(a, "add: a"), array(b, "add: b"), out.numel(), compute,
            s());
  }

  void set_element(const Tensor& t, std::int64_t index, float value) override {
    AMPSCOPE_CHECK(index >= 0 && index < t.numel(), "index ", index, " outside [0, ", t.numel(),
                   ")");
    nn::set_element(array(t, "set_element"), index, value, s());
  }

  void embedding_forward(const Tensor& out, const std::int32_t* tokens, const Tensor& wte,
                         const Tensor& wpe) override {
    const std::int64_t B = out.dim(0), T = out.dim(1), C = out.dim(2), V = wte.dim(0);
    AMPSCOPE_CHECK(wte.dim(1) == C && wpe.dim(1) == C && wpe.dim(0) >= T,
                   "embedding tables do not match the output shape");
    nn::embedding_forward(array(out, "embedding: out"), tokens, array(wte, "embedding: wte"),
                          array(wpe, "embedding: wpe"), B, T, C, V, queue_->error(), s());
  }

  void embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                          const std::int32_t* tokens) override {
    const std::int64_t B = dout.dim(0), T = dout.dim(1), C = dout.dim(2);
    AMPSCOPE_CHECK(dwte.dim(1) == C && dwpe.dim(1) == C && dwpe.dim(0) >= T,
                   "embedding gradients do not match dout's shape");
    nn::embedding_backward(array(dwte, "embedding: dwte"), array(dwpe, "embedding: dwpe"),
                           array(dout, "embedding: dout"), tokens, B, T, C, dwte.dim(0),
                           dwpe.dim(0), s());
  }

  void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                         const Tensor& inp, const Tensor& weight, const Tensor& bias,
                         Format compute) override {
    const std::int64_t C = last_dim(inp), N = inp.numel() / C;
    check_same_numel(out, inp, "layernorm_forward");
    nn::layernorm_forward(array(out, "layernorm: out"), fp32(mean, N, "layernorm: mean"),
                          fp32(rstd, N, "layernorm: rstd"), array(inp, "layernorm: inp"),
                          array(weight, "layernorm: weight"), array(bias, "layernorm: bias"), N, C,
                          compute, s());
  }

  void layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                          const Tensor& dout, const Tensor& inp, const Tensor& weight,
                          const Tensor& mean, const Tensor& rstd, Format compute) override {
    const std::int64_t C = last_dim(inp), N = inp.numel() / C;
    check_same_numel(dinp, inp, "layernorm_backward");
    check_same_numel(dout, inp, "layernorm_backward");
    nn::layernorm_backward(array(dinp, "layernorm: dinp"), array(dweight, "layernorm: dweight"),
                           array(dbias, "layernorm: dbias"), array(dout, "layernorm: dout"),
                           array(inp, "layernorm: inp"), array(weight, "layernorm: weight"),
                           fp32(mean, N, "layernorm: mean"), fp32(rstd, N, "layernorm: rstd"), N, C,
                           compute, s());
  }

  void matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight,
                      const Tensor& bias, Format compute) override {
    const std::int64_t C = last_dim(inp), N = inp.numel() / C, OC = weight.dim(0);
    AMPSCOPE_CHECK(weight.dim(1) == C, "matmul weight has ", weight.dim(1), " columns, input ", C);
    AMPSCOPE_CHECK(out.numel() == N * OC, "matmul output has ", out.numel(), " elements, expected ",
                   N * OC);
    nn::linear_forward(*blas_, array(out, "matmul: out"), array(inp, "matmul: inp"),
                       array(weight, "matmul: weight"), optional_array(bias, "matmul: bias"), N, C,
                       OC, compute, s());
  }

  void matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                       const Tensor& dout, const Tensor& inp, const Tensor& weight,
                       Format compute) override {
    const std::int64_t C = last_dim(inp), N = inp.numel() / C, OC = weight.dim(0);
    AMPSCOPE_CHECK(weight.dim(1) == C, "matmul weight has ", weight.dim(1), " columns, input ", C);
    AMPSCOPE_CHECK(dout.numel() == N * OC, "matmul dout has ", dout.numel(), " elements, expected ",
                   N * OC);
    nn::linear_backward(*blas_, optional_array(dinp, "matmul: dinp"),
                        array(dweight, "matmul: dweight"), optional_array(dbias, "matmul: dbias"),
                        array(dout, "matmul: dout"), array(inp, "matmul: inp"),
                        array(weight, "matmul: weight"), N, C, OC, compute, s());
  }

  // The FP8/FP4 emulation: the operands quantised on the device by ampscope/cuda/recipe.h's
  // fake_quantize (bit for bit the CPU's), then an FP32 cuBLASLt GEMM (layers/matmul); per-tensor
  // FP8 recipes as real FP8 GEMMs where allowed (CudaBackendOptions::fp8_gemms). Counts asked
  // for come back at once (the launcher waits for the stream), as the CPU's do.
  bool supports_gemm_recipes() const override { return true; }

  void quantized_matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight,
                                const Tensor& bias, Format compute,
                                const MatmulForwardRecipes& q) override {
    if (!q.inp && !q.weight) {
      matmul_forward(out, inp, weight, bias, compute);
      return;
    }
    const std::int64_t C = last_dim(inp), N = inp.numel() / C, OC = weight.dim(0);
    AMPSCOPE_CHECK(weight.dim(1) == C, "matmul weight has ", weight.dim(1), " columns, input ", C);
    AMPSCOPE_CHECK(out.numel() == N * OC, "matmul output has ", out.numel(), " elements, expected ",
                   N * OC);
    nn::linear_forward_quantized(*blas_, array(out, "matmul: out"), array(inp, "matmul: inp"),
                                 array(weight, "matmul: weight"),
                                 optional_array(bias, "matmul: bias"), N, C, OC, compute,
                                 operand(q.inp), operand(q.weight), fp8_gemms_, s());
  }

  void quantized_matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                                 const Tensor& dout, const Tensor& inp, const Tensor& weight,
                                 Format compute, const MatmulBackwardRecipes& q) override {
    if (!q.dgrad_dout && !q.dgrad_weight && !q.wgrad_dout && !q.wgrad_inp) {
      matmul_backward(dinp, dweight, dbias, dout, inp, weight, compute);
      return;
    }
    const std::int64_t C = last_dim(inp), N = inp.numel() / C, OC = weight.dim(0);
    AMPSCOPE_CHECK(weight.dim(1) == C, "matmul weight has ", weight.dim(1), " columns, input ", C);
    AMPSCOPE_CHECK(dout.numel() == N * OC, "matmul dout has ", dout.numel(), " elements, expected ",
                   N * OC);
    const layers::BackwardRecipes recipes{operand(q.dgrad_dout), operand(q.dgrad_weight),
                                          operand(q.wgrad_dout), operand(q.wgrad_inp)};
    nn::linear_backward_quantized(
        *blas_, optional_array(dinp, "matmul: dinp"), array(dweight, "matmul: dweight"),
        optional_array(dbias, "matmul: dbias"), array(dout, "matmul: dout"),
        array(inp, "matmul: inp"), array(weight, "matmul: weight"), N, C, OC, compute, recipes,
        fp8_gemms_, s());
  }

  // Counted on the device (the operand is not copied to the host), as the quantised pass does.
  RecipeCounts gemm_operand_counts(const Tensor& operand, Format compute,
                                   const Recipe& recipe) override {
    AMPSCOPE_CHECK(operand.rank >= 1 && operand.numel() > 0, "a GEMM operand needs elements");
    const std::int64_t cols = last_dim(operand);
    return nn::operand_recipe_counts(array(operand, "gemm_operand_counts: operand"),
                                     operand.numel() / cols, cols, compute, recipe, s());
  }

  void attention_forward(const Tensor& out, const Tensor& scores, const Tensor& probs,
                         const Tensor& qkv, int n_head, Format compute, Format softmax,
                         const AttentionFaults& faults) override {
    if (faults.scores || faults.probs) {
      attention_on_host(out, scores, probs, qkv, n_head, compute, softmax, faults);
      return;
    }
    const std::int64_t B = qkv.dim(0), T = qkv.dim(1), C = qkv.dim(2) / 3;
    nn::attention_forward(*blas_, array(out, "attention: out"), array(scores, "attention: scores"),
                          array(probs, "attention: probs"), array(qkv, "attention: qkv"), B, T, C,
                          n_head, compute, softmax, s());
  }

  void attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                          const Tensor& probs, int n_head, Format compute,
                          Format softmax) override {
    const std::int64_t B = qkv.dim(0), T = qkv.dim(1), C = qkv.dim(2) / 3;
    nn::attention_backward(*blas_, array(dqkv, "attention: dqkv"), array(dout, "attention: dout"),
                           array(qkv, "attention: qkv"), array(probs, "attention: probs"), B, T, C,
                           n_head, compute, softmax, s());
  }

  void gelu_forward(const Tensor& out, const Tensor& inp, Format compute) override {
    check_same_numel(out, inp, "gelu_forward");
    nn::gelu_forward(array(out, "gelu: out"), array(inp, "gelu: inp"), inp.numel(), compute, s());
  }

  void gelu_backward(const Tensor& dinp, const Tensor& dout, const Tensor& inp,
                     Format compute) override {
    check_same_numel(dinp, inp, "gelu_backward");
    check_same_numel(dout, inp, "gelu_backward");
    nn::gelu_backward(array(dinp, "gelu: dinp"), array(dout, "gelu: dout"), array(inp, "gelu: inp"),
                      inp.numel(), compute, s());
  }

  void cross_entropy_forward(const Tensor& losses, const Tensor& probs, const Tensor& logits,
                             const std::int32_t* targets, Format compute) override {
    const std::int64_t V = last_dim(logits), N = logits.numel() / V;
    check_same_numel(probs, logits, "cross_entropy_forward");
    AMPSCOPE_CHECK(losses.numel() == N, "cross_entropy_forward: ", losses.numel(), " losses for ",
                   N, " rows");
    nn::cross_entropy_forward(
        array(losses, "cross_entropy: losses"), array(probs, "cross_entropy: probs"),
        array(logits, "cross_entropy: logits"), targets, N, V, compute, queue_->error(), s());
  }

  void cross_entropy_backward(const Tensor& dlogits, const Tensor& probs,
                              const std::int32_t* targets, float dloss, Format compute) override {
    const std::int64_t V = last_dim(probs), N = probs.numel() / V;
    check_same_numel(dlogits, probs, "cross_entropy_backward");
    nn::cross_entropy_backward(array(dlogits, "cross_entropy: dlogits"),
                               array(probs, "cross_entropy: probs"), targets, N, V, dloss, compute,
                               s());
  }

  void unscale_and_check(const Tensor& grads, float inv_scale, const Tensor& found_inf) override {
    // The model keeps every gradient in one buffer, so this is the multi-tensor launch with one
    // entry: one kernel over all gradients.
    const nn::GradientTensor all{array(grads, "unscale: grads").data, grads.dtype, grads.numel()};
    nn::unscale_and_check(std::span(&all, 1), inv_scale, scalar(found_inf, "found_inf"), s());
  }

  // One multi-tensor launch per distinct target list (the agent asks one for every gradient):
  // the requested parts are measured, the gaps between them unscaled by the first launch. The
  // results come back with the launch's event: this call waits for the unscale kernel (the
  // step reads found_inf back right after it anyway).
  void unscale_check_and_measure(const Tensor& grads, float inv_scale, const Tensor& found_inf,
                                 std::span<const StatsRequest> requests) override {
    if (requests.empty()) return unscale_and_check(grads, inv_scale, found_inf);
    void* base = array(grads, "unscale: grads").data;
    auto part = [&](std::int64_t begin, std::int64_t numel, int slot) {
      return nn::GradientTensor{
          static_cast<std::byte*>(base) + begin * storage_bytes(grads.dtype), grads.dtype,
          numel, slot};
    };
    std::vector<const StatsRequest*> sorted;
    for (const StatsRequest& r : requests) {
      AMPSCOPE_CHECK(r.out != nullptr && r.offset >= 0 && r.numel >= 0 &&
                         r.offset + r.numel <= grads.numel(),
                     "unscale_check_and_measure: a request outside the ", grads.numel(),
                     " gradients");
      sorted.push_back(&r);
    }
    std::sort(sorted.begin(), sorted.end(),
              [](const StatsRequest* a, const StatsRequest* b) { return a->offset < b->offset; });
    std::vector<bool> done(sorted.size(), false);
    bool first = true;
    for (std::size_t g = 0; g < sorted.size(); ++g) {
      if (done[g]) continue;
      const std::vector<TargetSpec>& targets = sorted[g]->targets;
      std::vector<nn::GradientTensor> launch;
      std::vector<const StatsRequest*> measured;
      std::int64_t pos = 0;
      for (std::size_t i = 0; i < sorted.size(); ++i) {
        const StatsRequest& r = *sorted[i];
        AMPSCOPE_CHECK(r.offset >= pos || !first, "unscale_check_and_measure: requests overlap "
                       "at element ", r.offset);
        if (first && r.offset > pos) launch.push_back(part(pos, r.offset - pos, -1));
        pos = std::max(pos, r.offset + r.numel);
        if (done[i] || r.targets != targets) continue;
        done[i] = true;
        launch.push_back(part(r.offset, r.numel, static_cast<int>(measured.size())));
        measured.push_back(&r);
      }
      if (first && pos < grads.numel()) launch.push_back(part(pos, grads.numel() - pos, -1));
      first = false;
      const int capacity = static_cast<int>(measured.size());
      if (!grad_stats_ || grad_stats_->capacity() < capacity) {
        grad_stats_ = std::make_unique<nn::GradientStats>(std::max(capacity, 64));
      }
      nn::unscale_check_and_measure(launch, inv_scale, scalar(found_inf, "found_inf"), targets,
                                    *grad_stats_, s());
      std::vector<TensorStats> results = grad_stats_->wait();
      for (std::size_t k = 0; k < measured.size(); ++k) *measured[k]->out = std::move(results[k]);
    }
  }

  void sum_squares(const Tensor& sum_sq, const Tensor& x) override {
    nn::sum_squares(scalar(sum_sq, "sum_sq"), array(x, "sum_squares: x"), x.numel(), s());
  }

  void update_loss_scale(LossScaleState* state, const Tensor& found_inf,
                         const LossScaleRule& rule) override {
    nn::update_loss_scale(state, scalar(found_inf, "found_inf"), rule, s());
  }

  void accumulate_mean(double* acc, const Tensor& x) override {
    nn::accumulate_mean(acc, array(x, "accumulate_mean: x"), x.numel(), s());
  }

  void sum_products(double* out, const Tensor& a, const Tensor& b) override {
    check_same_numel(a, b, "sum_products");
    nn::sum_products(out, array(a, "sum_products: a"), array(b, "sum_products: b"), a.numel(),
                     s());
  }

  void scale(const Tensor& x, float factor) override {
    nn::scale(array(x, "scale: x"), x.numel(), factor, s());
  }

  void adamw(const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,
             const AdamWParams& hp) override {
    check_same_numel(params, grads, "adamw");
    check_same_numel(params, m, "adamw");
    check_same_numel(params, v, "adamw");
    nn::AdamWArgs args;
    args.lr = hp.lr;
    args.beta1 = hp.beta1;
    args.beta2 = hp.beta2;
    args.eps = hp.eps;
    args.weight_decay = hp.weight_decay;
    args.step = hp.step;
    nn::adamw(array(params, "adamw: params"), array(grads, "adamw: grads"), array(m, "adamw: m"),
              array(v, "adamw: v"), params.numel(), args, s());
  }

 private:
  cudaStream_t s() const { return queue_->stream(); }

  // One launcher computes the scores, the softmax and the product on the device, so a fault
  // cannot land between them there: a call with faults (fault injection only) runs on the host
  // through the CPU back end, the reference the kernels are tested against, and its results are
  // copied back.
  void attention_on_host(const Tensor& out, const Tensor& scores, const Tensor& probs,
                         const Tensor& qkv, int n_head, Format compute, Format softmax,
                         const AttentionFaults& faults) {
    if (!host_) host_ = make_cpu_backend();
    struct Staged {
      Tensor device, host;
      std::unique_ptr<Buffer> memory;
    };
    auto stage = [&](const Tensor& t, const char* what) {
      check_on_device(t, what);
      Staged st{t, t, host_->allocate(t.bytes())};
      st.host.data = st.memory->data();
      st.host.device = Device::kCpu;
      return st;
    };
    Staged o = stage(out, "attention: out"), sc = stage(scores, "attention: scores"),
           pr = stage(probs, "attention: probs"), in = stage(qkv, "attention: qkv");
    copy_to_host(in.host.data, in.device.data, in.host.bytes());
    host_->attention_forward(o.host, sc.host, pr.host, in.host, n_head, compute, softmax, faults);
    // copy_from_host has read its source when it returns: the host buffers may go.
    for (const Staged* st : {&o, &sc, &pr}) {
      copy_from_host(st->device.data, st->host.data, st->host.bytes());
    }
  }

  static float* fp32(const Tensor& t, std::int64_t n, const char* what) {
    check_on_device(t, what);
    AMPSCOPE_CHECK(t.dtype == Format::kFP32 && t.numel() == n, what, ": expected ", n,
                   " FP32 elements, found ", t.numel(), " ", format_name(t.dtype));
    return static_cast<float*>(t.data);
  }

  std::shared_ptr<DeviceQueue> queue_;
  CudaStream stream_;
  bool fp8_gemms_;  // CudaBackendOptions::fp8_gemms
  std::unique_ptr<cuda::CublasLt> blas_;
  std::string name_;
  std::unique_ptr<Backend> host_;  // the CPU back end, for attention_on_host; made on first use
  std::unique_ptr<nn::GradientStats> grad_stats_;  // fused statistics; made on first use
};

}  // namespace

std::string cuda_backend_unavailable_reason(const CudaBackendOptions& options) {
  if (!cuda::cuda_device_available()) return "no CUDA driver or device on this machine";
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || options.device < 0 || options.device >= count) {
    return "no CUDA device " + std::to_string(options.device) + " (found " + std::to_string(count) +
           ")";
  }
  return {};
}

std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& options) {
  if (std::string why = cuda_backend_unavailable_reason(options); !why.empty()) throw Error(why);
  return std::make_unique<CudaBackend>(options);
}

}  // namespace ampscope::trainer
