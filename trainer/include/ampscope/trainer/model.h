// A GPT-style decoder with hand-written forward and backward passes:
//   token + position embeddings, n_layer blocks of
//     LayerNorm -> causal multi-head self-attention -> residual add,
//     LayerNorm -> GELU MLP (4C) -> residual add,
//   final LayerNorm, LM head tied to the token embedding, cross-entropy loss.
// Every operation goes through a Backend (backend.h); the PrecisionPolicy decides each tensor's
// storage and each operation's compute format, and the Fp32OverrideSet can move single layers
// to FP32 at a step boundary. In the FP8/FP4 modes the linear layers' GEMMs quantise their
// inputs by the mode's recipe (precision.h; the LM head stays BF16), unless the
// GemmPrecisionSet has moved the layer to BF16.
//
// Parameters, their gradients and the AdamW moments live in one buffer each (in the policy's
// param format); in AMP a second buffer holds the compute-format copy of every parameter that
// the forward pass reads (refreshed after each update).
// Thread safety: one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ampscope/trainer/backend.h"
#include "ampscope/trainer/data.h"
#include "ampscope/trainer/hooks.h"
#include "ampscope/trainer/precision.h"

namespace ampscope::trainer {

struct GptConfig {
  int vocab_size = 0;
  int context = 64;    // maximum sequence length (the position table's rows)
  int n_embd = 128;
  int n_head = 4;
  int n_layer = 4;
};
// Empty when valid, otherwise a one-line reason naming the field.
std::string validate(const GptConfig& config);

struct ParamInfo {
  std::string name;          // e.g. "h0.attn.qkv.weight"
  std::vector<std::int64_t> shape;
  std::int64_t offset = 0;   // elements from the start of the parameter buffer
  std::int64_t numel = 0;
  bool decay = false;        // weight decay applies (2-D weights)
};

// Fault injection into element 0 of a named tensor at a step (first micro-batch for activations
// and activation grads; after the last micro-batch's backward for weight grads). The value is
// NaN, +Inf, or for kOverflow twice the largest finite value of a format: for an activation,
// the run's compute format (Inf where the layer computing it stores 16 bits, finite where it
// runs in FP32); for a gradient, the format it is stored in (a loss-scale overflow).
// An injected activation is what its consumers read, also the attention scores and
// probabilities, which the softmax and the product read inside attention_forward.
struct Injection {
  enum class Kind { kNaN, kInf, kOverflow };
  Kind kind = Kind::kNaN;
  std::string tensor;  // activation name, or "<name>.grad" for its gradient
  std::int64_t step = 0;
};

// Everything the model needs to know about the step it runs in.
struct StepContext {
  std::int64_t step = 0;
  int micro_step = 0;
  float loss_scale = 1.0f;
  const Fp32OverrideSet* overrides = nullptr;
  // FP8/FP4 modes: layers moved to BF16 (null: none); fp8-delayed: the scales, and whether this
  // pass records its amaxes (training steps do, evaluation does not).
  const GemmPrecisionSet* gemm = nullptr;
  DelayedScaling* delayed = nullptr;
  bool record_amax = false;
  TensorObserver* observer = nullptr;  // null or not observing this step: no callbacks
  const std::vector<Injection>* injections = nullptr;
  int* order = nullptr;  // running execution-order index within the step
};

class Gpt {
 public:
  // Allocates parameters, gradients, moments and activations for batches of up to max_batch
  // sequences of config.context tokens. Throws ampscope::Error on an invalid config.
  Gpt(const GptConfig& config, PrecisionMode mode, Backend& backend, int max_batch);
  ~Gpt();
  Gpt(const Gpt&) = delete;
  Gpt& operator=(const Gpt&) = delete;

  // GPT-2 initialisation: N(0, 0.02), residual projections N(0, 0.02 / sqrt(2 n_layer)),
  // biases 0, LayerNorm weights 1.
  void init_weights(std::uint64_t seed);

  const GptConfig& config() const { return config_; }
  PrecisionMode mode() const { return mode_; }
  const PrecisionPolicy& policy() const { return policy_; }
  const std::vector<ParamInfo>& params() const { return params_; }
  std::int64_t num_parameters() const { return num_params_; }
  // Layers an Fp32OverrideSet may name.
  std::vector<std::string> layer_names() const;
  // The linear layers whose GEMMs the FP8/FP4 modes quantise, in execution order per block:
  // "h{i}.attn.qkv", "h{i}.attn.proj", "h{i}.mlp.fc", "h{i}.mlp.proj" (GemmPrecisionSet's).
  std::vector<std::string> gemm_layers() const;
  // The layer (one of layer_names()) whose FP32 override computes `tensor`, a name the model
  // shows its observer: an activation and the gradient of one (which has its dtype), a weight
  // or weight gradient of a matmul layer, or "lm_head"; empty for tensors no override changes
  // (LayerNorm outputs, the residual stream, the loss, wte, wpe, LayerNorm parameters) and for
  // names the model does not have. Reads only what the constructor set: safe from any thread.
  std::string layer_of(std::string_view tensor) const;
  // The activations the forward pass of a model of `config` shows its observer, in order.
  static std::vector<std::string> activation_names(const GptConfig& config);
  // Tensors an Injection may name: activations, and "<name>.grad" for activation and weight
  // gradients. ("lm_head", the LM head's share of wte's gradient, is not one: faults reach it
  // through logits.grad, and wte.grad is the tied gradient's.)
  std::vector<std::string> injectable_tensors() const;

  // Forward pass of one micro-batch (inputs/targets: (B,T), B <= max_batch, T == context).
  // Adds the mean loss over its B*T tokens (unscaled) to *loss_sum, one FP64 in the back end's
  // memory, and reads nothing back (the training step's path).
  void forward(const Batch& batch, const StepContext& ctx, double* loss_sum);
  // The same, returning the mean loss (one host read).
  double forward(const Batch& batch, const StepContext& ctx);
  // Backward pass of the last forward, accumulating into the gradients: each parameter's
  // gradient becomes store(gradient + this micro-batch's gradient), the latter formed in full
  // first, so that accumulation over micro-batches and a sum over ranks agree bit for bit. dloss
  // multiplies the gradient of the mean loss (loss scale, 1/(accum x ranks), shrink factor).
  // Shows activation gradients, and the LM head's share of wte's gradient as "lm_head" (a
  // weight gradient, every micro-batch: each one is rounded to the head's compute format on
  // its own).
  void backward(float dloss, const StepContext& ctx);
  // Emits the weight gradients to the observer and applies weight-grad injections (after the
  // last micro-batch of a step).
  void finish_backward(const StepContext& ctx);

  void zero_grads();
  // Copies master (param-format) values into the compute copy (AMP; no-op otherwise).
  void refresh_compute_weights();
  // Emits weights (and master weights) at the start of a step.
  void emit_weights(const StepContext& ctx);
  // Fused statistics of the weight gradients after unscaling: the back end's requests
  // (Backend::unscale_check_and_measure) for the gradients ctx.observer wants in full
  // (TensorObserver::stats_targets), each filling its parameter's entry of `stats`.
  struct UnscaledGradStats {
    std::vector<Backend::StatsRequest> requests;
    std::vector<TensorStats> stats;  // one per parameter
    std::vector<bool> requested;     // one per parameter
  };
  UnscaledGradStats request_unscaled_grad_stats(const StepContext& ctx) const;
  // Emits the weight gradients after unscaling; those `fused` measured go with their
  // statistics (TensorObserver::on_tensor_stats).
  void emit_unscaled_grads(const StepContext& ctx, const UnscaledGradStats* fused = nullptr);

  // Whole-buffer views (param format).
  Tensor param_buffer() const;
  Tensor grad_buffer() const;
  Tensor m_buffer() const;
  Tensor v_buffer() const;
  Tensor param(std::size_t i) const;
  Tensor grad(std::size_t i) const;
  Tensor m(std::size_t i) const;
  Tensor v(std::size_t i) const;
  // Per-token losses of the last forward (B*T host copy).
  std::vector<float> last_losses() const;
  // FP32 host copies (for checkpoints and tests).
  std::vector<float> host_values(const Tensor& t) const;
  void set_from_host(const Tensor& t, const std::vector<float>& values);

  Backend& backend() { return backend_; }

  // FP8/FP4 modes: on every n-th observed step (0: never), each scaled linear layer measures
  // what its recipe's rounding costs the loss, to first order: the forward's output under the
  // recipe minus the output unquantised (both computed, whichever of the two the layer runs),
  // dotted with the loss's gradient by that output in the backward; reported with the layer's
  // output-gradient quantiser (QuantizedGemmInput::loss_cost). One extra GEMM per layer on
  // those steps.
  void set_loss_cost_every(int n) { loss_cost_every_ = n; }

 private:
  struct Activations;
  struct Layer;
  // Applies the injections due for `name` at this point (injection_due), then shows the tensor.
  void emit(const StepContext& ctx, const std::string& name, TensorRole role, TensorPhase phase,
            const Tensor& t, float scale, std::optional<Format> held = std::nullopt);
  // Shows the tensor to the observer (if any) without injecting; with `stats`, through
  // on_tensor_stats.
  void show(const StepContext& ctx, const std::string& name, TensorRole role, TensorPhase phase,
            const Tensor& t, float scale, std::optional<Format> held,
            const TensorStats* stats = nullptr);
  // The observer's view of `t` (order not assigned).
  TensorView view_of(const StepContext& ctx, const std::string& name, TensorRole role,
                     TensorPhase phase, const Tensor& t, float scale,
                     std::optional<Format> held) const;
  // The value the last injection due for `name` (shown in `role` and `phase`, stored in
  // `stored`) writes into element 0 now; nullopt when none is due.
  std::optional<float> injection_due(const StepContext& ctx, const std::string& name,
                                     TensorRole role, TensorPhase phase, Format stored) const;
  Format compute_for(const StepContext& ctx, const std::string& layer) const;
  // A linear layer's forward and backward: through the mode's recipe when quantize_gemm says
  // so (reporting to the observer and recording delayed amaxes), else the plain matmul.
  bool quantize_gemm(const StepContext& ctx, const std::string& layer, Format compute) const;
  void linear_forward(const StepContext& ctx, const std::string& layer, const Tensor& out,
                      const Tensor& inp, const Tensor& weight, const Tensor& bias,
                      Format compute);
  void linear_backward(const StepContext& ctx, const std::string& layer, const Tensor& dinp,
                       const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                       const Tensor& inp, const Tensor& weight, Format compute);
  // The recipe of (layer, operand) in `use`, with fp8-delayed's scale; -1 or the input's
  // DelayedScaling index in *delayed_index.
  std::optional<Recipe> recipe_for(const StepContext& ctx, const std::string& layer,
                                   GemmOperand operand, GemmUse use, int* delayed_index) const;
  // what_if: counted, not applied (the layer runs BF16); such a report records no amax.
  void report_quantized(const StepContext& ctx, const std::string& layer, GemmOperand operand,
                        GemmUse use, const RecipeCounts& counts, int delayed_index,
                        bool what_if = false,
                        std::optional<double> loss_cost = std::nullopt) const;
  // Loss cost (set_loss_cost_every): whether this step measures it; the forward keeps the
  // layer's output error (FP32, in the back end's memory), the backward dots it with
  // dout / dloss (Backend::sum_products) and forgets it.
  bool measure_loss_cost(const StepContext& ctx, Format compute) const;
  void keep_output_error(const StepContext& ctx, const std::string& layer, const Tensor& out,
                         const Tensor& inp, const Tensor& weight, const Tensor& bias,
                         Format compute, bool quantized);
  std::optional<double> take_loss_cost(const std::string& layer, const Tensor& dout);
  // Whether a layer that quantize_gemm() leaves unquantised is measured against its recipe
  // anyway: it runs BF16 by the GemmPrecisionSet (not FP32) and the observer watches the step.
  bool what_if_gemm(const StepContext& ctx, Format compute) const;
  // The what-if report of `t`, (layer, operand) as the GEMM `use` reads it.
  void report_what_if(const StepContext& ctx, const std::string& layer, GemmOperand operand,
                      GemmUse use, const Tensor& t, Format compute,
                      std::optional<double> loss_cost = std::nullopt);
  // Where parameter i's gradient can overflow at this step (TensorView::held).
  Format grad_held(const StepContext& ctx, std::size_t i) const;
  Tensor act(const std::unique_ptr<Buffer>& buf, Format dtype,
             std::initializer_list<std::int64_t> shape) const;

  GptConfig config_;
  PrecisionMode mode_;
  PrecisionPolicy policy_;
  Backend& backend_;
  int max_batch_;
  std::vector<ParamInfo> params_;
  std::int64_t num_params_ = 0;
  std::unique_ptr<Buffer> params_mem_, compute_mem_, grads_mem_, m_mem_, v_mem_;
  std::unique_ptr<Buffer> loss_mem_;  // one FP64: the returning forward's loss
  std::unique_ptr<Activations> acts_;
  int cur_batch_ = 0;
  int loss_cost_every_ = 0;
  float dloss_ = 1.0f;  // the running backward's
  // A layer's output error as kept for its backward: out - other (FP32), whose sign makes it
  // recipe minus unquantised. One per layer measured so far, its buffer kept from one measured
  // step to the next (a steady-state step allocates nothing: on CUDA a free would synchronise).
  struct OutputError {
    std::string layer;
    std::unique_ptr<Buffer> error;
    double sign = 1.0;
    bool pending = false;  // kept by this micro-step's forward, not yet taken by its backward
  };
  std::vector<OutputError> output_errors_;
  std::unique_ptr<Buffer> loss_cost_other_;  // the other output, the largest layer's size
  std::unique_ptr<Buffer> loss_cost_mem_;    // one FP64: sum_products' result
};

}  // namespace ampscope::trainer
