// The compute back-end interface of the trainer.
//
// The model code (model.cc) never touches tensor memory: it allocates Buffers through a Backend
// and calls the Backend's operations on Tensor views of them. A Buffer may live on a device and
// an operation may run asynchronously on the back end's Stream, so the model reads values back
// only through copy_to_host(), which waits for the stream. The CPU back end (cpu_backend.cc)
// runs every operation on the calling thread; a CUDA back end adds files (a CudaBuffer, a
// CudaStream wrapping cudaStream_t, kernels) and a factory, without changing the model.
//
// Precision contract, shared by every operation that takes a `compute` format:
//   - inputs are read from their storage dtype and rounded to `compute` (an input stored in a
//     narrower format is already exact in it); arithmetic and accumulation are FP32;
//   - every result is rounded to `compute`, then stored in the output's dtype (rounding again
//     when that is narrower), round-to-nearest-even with overflow to Inf as on hardware;
//   - outputs marked "accumulate" get out = store(out + round(contribution)): the contribution
//     is rounded to `compute` first, the sum is formed in FP32 and stored in out's dtype.
//     The contribution is a whole call's (every term of the call summed before the add): the
//     model relies on it so that accumulation over micro-batches equals a sum over ranks.
// This is what autocast does on a GPU: an FP16 matmul rounds its inputs and its output to FP16,
// and the gradient of a tensor has that tensor's dtype.
//
// Thread safety: a Backend and its buffers are used by one training thread at a time.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ampscope/formats.h"
#include "ampscope/recipe.h"
#include "ampscope/tensor_stats.h"
#include "ampscope/trainer/loss_scaler.h"
#include "ampscope/vocabulary.h"

namespace ampscope::trainer {


// Owned storage. data() is a device address for device buffers; never dereference it on the
// host unless device() == Device::kCpu.
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual Device device() const = 0;
  virtual std::size_t bytes() const = 0;
  virtual void* data() = 0;
};

// An in-order execution queue. The CPU back end's stream runs work synchronously.
class Stream {
 public:
  virtual ~Stream() = default;
  virtual void synchronize() = 0;
  // cudaStream_t for a CUDA back end, nullptr for the CPU one.
  virtual void* native_handle() const = 0;
};

inline constexpr int kMaxRank = 4;

// A non-owning, dense, row-major view of a Buffer's memory with a storage dtype (FP32, FP16 or
// BF16; 16-bit tensors hold the bit patterns). Cheap to copy.
struct Tensor {
  void* data = nullptr;
  Format dtype = Format::kFP32;
  Device device = Device::kCpu;
  int rank = 0;
  std::array<std::int64_t, kMaxRank> dims{};

  Tensor() = default;
  Tensor(void* data, Format dtype, std::initializer_list<std::int64_t> shape,
         Device device = Device::kCpu);

  std::int64_t numel() const;
  std::size_t bytes() const { return static_cast<std::size_t>(numel()) * storage_bytes(dtype); }
  std::int64_t dim(int i) const { return dims[static_cast<std::size_t>(i)]; }
  bool empty() const { return data == nullptr; }
  // The same memory seen with another dtype (the caller guarantees the buffer is large enough).
  Tensor as(Format new_dtype) const;
};

// One element written into a result inside an operation, after the result is computed and
// before the rest of the operation reads it (fault injection into a tensor that the operation
// both writes and consumes). The value is rounded and stored like the element it replaces.
struct ElementFault {
  std::int64_t index = 0;  // element of the whole tensor, row-major
  float value = 0.0f;
};

// Faults attention_forward applies: in the scores before the softmax reads them, in the
// probabilities before the product reads them.
struct AttentionFaults {
  std::optional<ElementFault> scores;
  std::optional<ElementFault> probs;
};

// FP8/FP4 emulation of a linear layer (precision.h): an operand with a recipe is quantised ->
// dequantised by fake_quantize (ampscope/recipe.h) after it is read and rounded to `compute`,
// over its row-major [rows, cols] view, and the GEMM multiplies the dequantised values with
// FP32 accumulation. `counts`, when set, receives what that pass measured.
struct QuantizedOperand {
  Recipe recipe;
  RecipeCounts* counts = nullptr;
};
// Forward Y = X W^T: inp (N,C) and weight (OC,C), their recipes' blocks along C.
struct MatmulForwardRecipes {
  std::optional<QuantizedOperand> inp, weight;
};
// dinp = dout W: dout (N,OC) blocks along OC, weight (OC,C) blocks down its columns.
// dweight = dout^T inp: dout and inp blocks down their columns (over N).
// dout quantised under two equal recipes is quantised once (per-tensor recipes); dbias is the
// column sums of dout as read (not quantised).
struct MatmulBackwardRecipes {
  std::optional<QuantizedOperand> dgrad_dout, dgrad_weight, wgrad_dout, wgrad_inp;
};

struct AdamWParams {
  float lr = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  std::int64_t step = 1;  // 1-based count of applied updates, for bias correction
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual Device device() const = 0;
  virtual std::string name() const = 0;
  // Zero-filled storage of `bytes` bytes on this back end's device.
  virtual std::unique_ptr<Buffer> allocate(std::size_t bytes) = 0;
  virtual Stream& stream() = 0;
  // Host <-> back-end copies. copy_to_host waits for the work queued before it.
  virtual void copy_to_host(void* dst, const void* src, std::size_t bytes) = 0;
  virtual void copy_from_host(void* dst, const void* src, std::size_t bytes) = 0;

  // ---- Elementwise -----------------------------------------------------------------------
  virtual void fill(const Tensor& t, float value) = 0;
  // dst = src converted to dst.dtype (same numel).
  virtual void convert(const Tensor& dst, const Tensor& src) = 0;
  // out = a + b (same numel).
  virtual void add(const Tensor& out, const Tensor& a, const Tensor& b, Format compute) = 0;
  // t[index] = value, stored in t.dtype (fault injection).
  virtual void set_element(const Tensor& t, std::int64_t index, float value) = 0;

  // ---- Layers (shapes in comments; B batch, T time, C channels, V vocabulary) -------------
  // out (B,T,C) = wte[tokens] + wpe[t], computed in out.dtype. tokens (B,T) on the device.
  virtual void embedding_forward(const Tensor& out, const std::int32_t* tokens, const Tensor& wte,
                                 const Tensor& wpe) = 0;
  // dwte (V,C), dwpe (maxT,C): accumulate. dout (B,T,C).
  virtual void embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                                  const std::int32_t* tokens) = 0;
  // out (N,C); mean, rstd (N) FP32; weight, bias (C).
  virtual void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                                 const Tensor& inp, const Tensor& weight, const Tensor& bias,
                                 Format compute) = 0;
  // dinp (N,C), dweight, dbias (C): accumulate.
  virtual void layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                                  const Tensor& dout, const Tensor& inp, const Tensor& weight,
                                  const Tensor& mean, const Tensor& rstd, Format compute) = 0;
  // out (N,OC) = inp (N,C) x weight (OC,C)^T + bias (OC, optional: empty()).
  virtual void matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight,
                              const Tensor& bias, Format compute) = 0;
  // dinp (N,C) overwritten (optional); dweight (OC,C), dbias (OC, optional) accumulate.
  virtual void matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                               const Tensor& dout, const Tensor& inp, const Tensor& weight,
                               Format compute) = 0;
  // matmul_forward / matmul_backward with the operands quantised by their recipes (FP8/FP4
  // modes). A back end that cannot says so with supports_gemm_recipes() false, and these throw
  // ampscope::Error (the trainer refuses such modes at start).
  virtual bool supports_gemm_recipes() const { return false; }
  virtual void quantized_matmul_forward(const Tensor& out, const Tensor& inp,
                                        const Tensor& weight, const Tensor& bias, Format compute,
                                        const MatmulForwardRecipes& recipes);
  virtual void quantized_matmul_backward(const Tensor& dinp, const Tensor& dweight,
                                         const Tensor& dbias, const Tensor& dout,
                                         const Tensor& inp, const Tensor& weight, Format compute,
                                         const MatmulBackwardRecipes& recipes);
  // What `recipe` would count on a GEMM operand without quantising anything (the what-if
  // measurement of a linear layer moved to BF16): `operand` read and rounded to `compute` as
  // the quantised GEMMs read it, its row-major [rows, last dim] view counted by recipe_counts.
  // Equal to the counts quantized_matmul_* would return for the operand under that recipe.
  // Default: through a host copy (any back end); the CPU's reads the operand in place.
  virtual RecipeCounts gemm_operand_counts(const Tensor& operand, Format compute,
                                           const Recipe& recipe);
  // Causal multi-head attention on qkv (B,T,3C) packed [q|k|v], n_head heads:
  // scores (B,NH,T,T) = q k^T / sqrt(hs) (masked positions hold 0), probs (B,NH,T,T) =
  // softmax(scores) computed in `softmax` and stored in probs.dtype, out (B,T,C) = probs v.
  // The two products run in `compute`. `faults` (usually none) land where the softmax and the
  // second product see them.
  virtual void attention_forward(const Tensor& out, const Tensor& scores, const Tensor& probs,
                                 const Tensor& qkv, int n_head, Format compute, Format softmax,
                                 const AttentionFaults& faults) = 0;
  // dqkv (B,T,3C) overwritten; dout (B,T,C).
  virtual void attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                  const Tensor& probs, int n_head, Format compute,
                                  Format softmax) = 0;
  // GELU, tanh approximation (GPT-2).
  virtual void gelu_forward(const Tensor& out, const Tensor& inp, Format compute) = 0;
  virtual void gelu_backward(const Tensor& dinp, const Tensor& dout, const Tensor& inp,
                             Format compute) = 0;
  // losses (B,T), probs (B,T,V) = softmax(logits (B,T,V)), targets (B,T) on the device.
  virtual void cross_entropy_forward(const Tensor& losses, const Tensor& probs,
                                     const Tensor& logits, const std::int32_t* targets,
                                     Format compute) = 0;
  // dlogits (B,T,V) = (probs - onehot(targets)) * dloss, overwritten.
  virtual void cross_entropy_backward(const Tensor& dlogits, const Tensor& probs,
                                      const std::int32_t* targets, float dloss,
                                      Format compute) = 0;

  // ---- Optimizer side. Scalars are 1-element FP32 tensors on the device ------------------
  // grads *= inv_scale in place (computed in FP32, stored in grads.dtype); found_inf is set to
  // 1 when any element of grads is NaN or Inf (it is never cleared here).
  virtual void unscale_and_check(const Tensor& grads, float inv_scale,
                                 const Tensor& found_inf) = 0;
  // Fused statistics: unscale_and_check (the same values, the same found_inf), also computing
  // in the same pass the statistics of the unscaled values of each requested part of grads:
  // compute_stats() of the part as stored in grads.dtype (ampscope/tensor_stats.h), counts and
  // histogram bit for bit, counting the request's targets. Parts must be disjoint. The results
  // are in *out, in host memory, when the call returns (the CUDA back end waits for its
  // stream). With no requests it is unscale_and_check.
  struct StatsRequest {
    std::int64_t offset = 0;  // the part's first element in grads
    std::int64_t numel = 0;
    std::vector<TargetSpec> targets;
    TensorStats* out = nullptr;
  };
  virtual void unscale_check_and_measure(const Tensor& grads, float inv_scale,
                                         const Tensor& found_inf,
                                         std::span<const StatsRequest> requests) = 0;
  // sum_sq = sum of squares of x, accumulated in FP64, stored as FP32.
  virtual void sum_squares(const Tensor& sum_sq, const Tensor& x) = 0;
  // *state (in this back end's memory) updated once by `rule` (ampscope/loss_scale.h:
  // GradScaler or Megatron semantics, products in FP64 stored in FP32) from found_inf (nonzero:
  // found). No host read: the trainer brings the result back with the step's one read.
  virtual void update_loss_scale(LossScaleState* state, const Tensor& found_inf,
                                 const LossScaleRule& rule) = 0;
  // *acc (one FP64 in this back end's memory) += mean of x, the sum taken in FP64 (the CPU
  // in element order; the device in fixed blocks). The trainer adds each micro-batch's loss
  // this way so that a step reads it back together with found_inf and the norm.
  virtual void accumulate_mean(double* acc, const Tensor& x) = 0;
  // *out (one FP64 in this back end's memory) = sum of a[i] x b[i] (same numel), the values as
  // stored, products and sum in FP64 (the CPU in element order; the device in fixed blocks): the
  // model's loss cost, dout dotted with its output error, without a host copy of either.
  virtual void sum_products(double* out, const Tensor& a, const Tensor& b) = 0;
  // x *= factor (computed in FP32, stored in x.dtype).
  virtual void scale(const Tensor& x, float factor) = 0;
  // PyTorch AdamW (decoupled weight decay, bias-corrected) on params, grads, m, v of equal
  // numel. Arithmetic in FP32; results stored in each tensor's dtype.
  virtual void adamw(const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,
                     const AdamWParams& hp) = 0;
};

struct CpuBackendOptions {
  // Threads for OpenBLAS; 0 leaves OpenBLAS's own default (OPENBLAS_NUM_THREADS or all cores).
  int blas_threads = 0;
};

// The CPU back end: OpenBLAS sgemm on inputs rounded to the compute format, FP32 accumulation.
std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& options = {});

}  // namespace ampscope::trainer
