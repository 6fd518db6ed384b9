// The GPT model: parameter layout, activation storage and the hand-written forward and backward
// passes, all through the Backend. Activation buffers are sized for FP32 so that a layer moved
// to FP32 by an override needs no reallocation; each step records the dtype it stored.
#include "ampscope/trainer/model.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <optional>
#include <sstream>
#include <string_view>

#include "ampscope/check.h"
#include "ampscope/convert.h"
#include "ampscope/trainer/rng.h"

namespace ampscope::trainer {

std::string validate(const GptConfig& c) {
  std::ostringstream os;
  if (c.vocab_size < 2) {
    os << "vocab_size must be >= 2, got " << c.vocab_size;
  } else if (c.context < 1) {
    os << "context must be >= 1, got " << c.context;
  } else if (c.n_embd < 1) {
    os << "n_embd must be >= 1, got " << c.n_embd;
  } else if (c.n_head < 1 || c.n_embd % c.n_head != 0) {
    os << "n_head must divide n_embd (" << c.n_embd << "), got " << c.n_head;
  } else if (c.n_layer < 1) {
    os << "n_layer must be >= 1, got " << c.n_layer;
  }
  return os.str();
}

// Per-block parameter indices, activation buffers and the views (with dtypes) of the last
// forward pass.
struct Gpt::Layer {
  std::string prefix;  // "h0"
  std::size_t ln1w, ln1b, qkvw, qkvb, projw, projb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb;
  std::unique_ptr<Buffer> ln1_b, ln1_mean_b, ln1_rstd_b, qkv_b, scores_b, probs_b, ctx_b, proj_b,
      res1_b, ln2_b, ln2_mean_b, ln2_rstd_b, fc_b, gelu_b, fcproj_b, res2_b;
  Tensor ln1, ln1_mean, ln1_rstd, qkv, scores, probs, ctx, proj, res1, ln2, ln2_mean, ln2_rstd, fc,
      gelu, fcproj, res2;
  Format c_qkv = Format::kFP32, c_core = Format::kFP32, c_softmax = Format::kFP32,
         c_proj = Format::kFP32, c_fc = Format::kFP32, c_gelu = Format::kFP32,
         c_fcproj = Format::kFP32;
};

struct Gpt::Activations {
  std::vector<Layer> layers;
  std::size_t wte = 0, wpe = 0, lnfw = 0, lnfb = 0;
  std::unique_ptr<Buffer> tokens_b, targets_b, encoded_b, lnf_b, lnf_mean_b, lnf_rstd_b, logits_b,
      ce_probs_b, losses_b;
  // Gradient buffers, reused across blocks.
  std::unique_ptr<Buffer> dres_b, dln_b, dqkv_b, dctx_b, dfc_b, dgelu_b, dlogits_b;
  // This micro-batch's gradient of the tied token embedding (param format, (V,C)); see backward.
  std::unique_ptr<Buffer> dwte_micro_b;
  Tensor encoded, lnf, lnf_mean, lnf_rstd, logits, ce_probs, losses;
  Format c_head = Format::kFP32;
  const std::int32_t* tokens = nullptr;
  const std::int32_t* targets = nullptr;
  std::vector<bool> in_matmul;  // per parameter: read by a matmul in the compute format
};

Tensor Gpt::act(const std::unique_ptr<Buffer>& buf, Format dtype,
                std::initializer_list<std::int64_t> shape) const {
  Tensor t(buf->data(), dtype, shape, backend_.device());
  AMPSCOPE_CHECK(t.bytes() <= buf->bytes(), "activation of ", t.bytes(), " bytes in a buffer of ",
                 buf->bytes());
  return t;
}

Gpt::Gpt(const GptConfig& config, PrecisionMode mode, Backend& backend, int max_batch)
    : config_(config),
      mode_(mode),
      policy_(PrecisionPolicy::for_mode(mode)),
      backend_(backend),
      max_batch_(max_batch),
      acts_(std::make_unique<Activations>()) {
  const std::string err = validate(config);
  AMPSCOPE_CHECK(err.empty(), "invalid model config: ", err);
  AMPSCOPE_CHECK(max_batch >= 1, "max_batch must be >= 1, got ", max_batch);
  const std::int64_t V = config.vocab_size, T = config.context, C = config.n_embd;
  auto add = [this](std::string name, std::vector<std::int64_t> shape, bool matmul) {
    ParamInfo p;
    p.name = std::move(name);
    p.numel = 1;
    for (auto d : shape) p.numel *= d;
    p.decay = shape.size() >= 2;
    p.shape = std::move(shape);
    p.offset = num_params_;
    num_params_ += p.numel;
    params_.push_back(std::move(p));
    acts_->in_matmul.push_back(matmul);
    return params_.size() - 1;
  };
  auto& a = *acts_;
  a.wte = add("wte", {V, C}, true);  // also the LM head
  a.wpe = add("wpe", {T, C}, false);
  for (int l = 0; l < config.n_layer; ++l) {
    Layer L;
    L.prefix = "h" + std::to_string(l);
    const std::string& p = L.prefix;
    L.ln1w = add(p + ".ln1.weight", {C}, false);
    L.ln1b = add(p + ".ln1.bias", {C}, false);
    L.qkvw = add(p + ".attn.qkv.weight", {3 * C, C}, true);
    L.qkvb = add(p + ".attn.qkv.bias", {3 * C}, true);
    L.projw = add(p + ".attn.proj.weight", {C, C}, true);
    L.projb = add(p + ".attn.proj.bias", {C}, true);
    L.ln2w = add(p + ".ln2.weight", {C}, false);
    L.ln2b = add(p + ".ln2.bias", {C}, false);
    L.fcw = add(p + ".mlp.fc.weight", {4 * C, C}, true);
    L.fcb = add(p + ".mlp.fc.bias", {4 * C}, true);
    L.fcprojw = add(p + ".mlp.proj.weight", {C, 4 * C}, true);
    L.fcprojb = add(p + ".mlp.proj.bias", {C}, true);
    a.layers.push_back(std::move(L));
  }
  a.lnfw = add("lnf.weight", {C}, false);
  a.lnfb = add("lnf.bias", {C}, false);

  const auto n = static_cast<std::size_t>(num_params_);
  const std::size_t pbytes = n * static_cast<std::size_t>(storage_bytes(policy_.param));
  params_mem_ = backend_.allocate(pbytes);
  grads_mem_ = backend_.allocate(pbytes);
  m_mem_ = backend_.allocate(pbytes);
  v_mem_ = backend_.allocate(pbytes);
  if (policy_.master_weights) {
    compute_mem_ = backend_.allocate(n * static_cast<std::size_t>(storage_bytes(policy_.compute)));
  }

  // Activations: FP32-sized so any layer can switch to FP32.
  const std::int64_t BT = static_cast<std::int64_t>(max_batch) * T;
  const std::int64_t NH = config.n_head;
  auto f32 = [this](std::int64_t elems) {
    return backend_.allocate(static_cast<std::size_t>(elems) * sizeof(float));
  };
  a.tokens_b = backend_.allocate(static_cast<std::size_t>(BT) * sizeof(std::int32_t));
  a.targets_b = backend_.allocate(static_cast<std::size_t>(BT) * sizeof(std::int32_t));
  a.encoded_b = f32(BT * C);
  for (auto& L : a.layers) {
    L.ln1_b = f32(BT * C);
    L.ln1_mean_b = f32(BT);
    L.ln1_rstd_b = f32(BT);
    L.qkv_b = f32(BT * 3 * C);
    L.scores_b = f32(BT * NH * T);
    L.probs_b = f32(BT * NH * T);
    L.ctx_b = f32(BT * C);
    L.proj_b = f32(BT * C);
    L.res1_b = f32(BT * C);
    L.ln2_b = f32(BT * C);
    L.ln2_mean_b = f32(BT);
    L.ln2_rstd_b = f32(BT);
    L.fc_b = f32(BT * 4 * C);
    L.gelu_b = f32(BT * 4 * C);
    L.fcproj_b = f32(BT * C);
    L.res2_b = f32(BT * C);
  }
  a.lnf_b = f32(BT * C);
  a.lnf_mean_b = f32(BT);
  a.lnf_rstd_b = f32(BT);
  a.logits_b = f32(BT * V);
  a.ce_probs_b = f32(BT * V);
  a.losses_b = f32(BT);
  a.dres_b = f32(BT * C);
  a.dln_b = f32(BT * C);
  a.dqkv_b = f32(BT * 3 * C);
  a.dctx_b = f32(BT * C);
  a.dfc_b = f32(BT * 4 * C);
  a.dgelu_b = f32(BT * 4 * C);
  a.dlogits_b = f32(BT * V);
  a.dwte_micro_b = backend_.allocate(static_cast<std::size_t>(V * C) *
                                     static_cast<std::size_t>(storage_bytes(policy_.param)));
}

Gpt::~Gpt() = default;

namespace {

// The FP32-capable layers of a block and the tensors each computes, as suffixes of the block's
// name ("h0"): its outputs (their gradients have the same names and dtypes: backend.h) and the
// weights and weight gradients of its parameters. The one definition that layer_names() and
// layer_of() read; forward() asks compute_for() with these layer names.
struct CapableLayer {
  std::string_view layer;
  std::array<std::string_view, 3> tensors;  // unused entries empty
};
constexpr std::array<CapableLayer, 6> kBlockLayers{{
    {".attn.qkv", {".attn.qkv", ".attn.qkv.weight", ".attn.qkv.bias"}},
    // Scores and context are its products; the probabilities are the softmax between them,
    // which follows the layer into FP32 (in pure fp16, the one mode where it is not FP32).
    {".attn.core", {".attn.scores", ".attn.probs", ".attn.context"}},
    {".attn.proj", {".attn.proj", ".attn.proj.weight", ".attn.proj.bias"}},
    {".mlp.fc", {".mlp.fc", ".mlp.fc.weight", ".mlp.fc.bias"}},
    {".mlp.gelu", {".mlp.gelu", "", ""}},
    {".mlp.proj", {".mlp.proj", ".mlp.proj.weight", ".mlp.proj.bias"}},
}};
// The LM head computes the logits and its share of the tied embedding's gradient; the table
// wte itself (read in FP32 by the embedding, its FP16 copy by the head) is no layer's.
constexpr std::string_view kHead = "lm_head";
constexpr std::array<std::string_view, 2> kHeadTensors = {"logits", "lm_head"};

}  // namespace

std::vector<std::string> Gpt::layer_names() const {
  std::vector<std::string> names;
  for (const auto& L : acts_->layers) {
    for (const CapableLayer& c : kBlockLayers) names.push_back(L.prefix + std::string(c.layer));
  }
  names.emplace_back(kHead);
  return names;
}

std::vector<std::string> Gpt::gemm_layers() const {
  std::vector<std::string> names;
  for (const auto& L : acts_->layers) {
    for (const char* s : {".attn.qkv", ".attn.proj", ".mlp.fc", ".mlp.proj"}) {
      names.push_back(L.prefix + s);
    }
  }
  return names;
}

std::string Gpt::layer_of(std::string_view tensor) const {
  for (std::string_view t : kHeadTensors) {
    if (tensor == t) return std::string(kHead);
  }
  const auto dot = tensor.find('.');
  if (dot == std::string_view::npos) return {};
  const std::string_view block = tensor.substr(0, dot), rest = tensor.substr(dot);
  const auto& layers = acts_->layers;
  if (std::none_of(layers.begin(), layers.end(),
                   [&](const Layer& L) { return L.prefix == block; })) {
    return {};
  }
  for (const CapableLayer& c : kBlockLayers) {
    for (std::string_view t : c.tensors) {
      if (!t.empty() && t == rest) return std::string(block) + std::string(c.layer);
    }
  }
  return {};
}

std::vector<std::string> Gpt::activation_names(const GptConfig& config) {
  std::vector<std::string> names = {"embed"};
  for (int l = 0; l < config.n_layer; ++l) {
    const std::string p = "h" + std::to_string(l);
    for (const char* s :
         {".ln1", ".attn.qkv", ".attn.scores", ".attn.probs", ".attn.context", ".attn.proj",
          ".res1", ".ln2", ".mlp.fc", ".mlp.gelu", ".mlp.proj", ".res2"}) {
      names.push_back(p + s);
    }
  }
  names.emplace_back("lnf");
  names.emplace_back("logits");
  return names;
}

std::vector<std::string> Gpt::injectable_tensors() const {
  std::vector<std::string> names = {"embed", "embed.grad"};
  for (const auto& L : acts_->layers) {
    for (const char* s : {".ln1", ".attn.qkv", ".attn.context", ".res1", ".ln2", ".mlp.fc",
                          ".mlp.gelu", ".res2"}) {
      names.push_back(L.prefix + s);
      names.push_back(L.prefix + s + ".grad");
    }
    for (const char* s : {".attn.scores", ".attn.probs", ".attn.proj", ".mlp.proj"}) {
      names.push_back(L.prefix + s);
    }
  }
  for (const char* s : {"lnf", "lnf.grad", "logits", "logits.grad"}) names.push_back(s);
  for (const auto& p : params_) names.push_back(p.name + ".grad");
  return names;
}

namespace {
Tensor slice(Buffer& buf, Format dtype, const ParamInfo& p, Device device) {
  Tensor t;
  t.data = static_cast<std::byte*>(buf.data()) + p.offset * storage_bytes(dtype);
  t.dtype = dtype;
  t.device = device;
  t.rank = static_cast<int>(p.shape.size());
  for (std::size_t i = 0; i < p.shape.size(); ++i) t.dims[i] = p.shape[i];
  return t;
}
Tensor whole(Buffer& buf, Format dtype, std::int64_t n, Device device) {
  return Tensor(buf.data(), dtype, {n}, device);
}
}  // namespace

Tensor Gpt::param_buffer() const {
  return whole(*params_mem_, policy_.param, num_params_, backend_.device());
}
Tensor Gpt::grad_buffer() const {
  return whole(*grads_mem_, policy_.param, num_params_, backend_.device());
}
Tensor Gpt::m_buffer() const {
  return whole(*m_mem_, policy_.param, num_params_, backend_.device());
}
Tensor Gpt::v_buffer() const {
  return whole(*v_mem_, policy_.param, num_params_, backend_.device());
}
Tensor Gpt::param(std::size_t i) const {
  return slice(*params_mem_, policy_.param, params_[i], backend_.device());
}
Tensor Gpt::grad(std::size_t i) const {
  return slice(*grads_mem_, policy_.param, params_[i], backend_.device());
}
Tensor Gpt::m(std::size_t i) const {
  return slice(*m_mem_, policy_.param, params_[i], backend_.device());
}
Tensor Gpt::v(std::size_t i) const {
  return slice(*v_mem_, policy_.param, params_[i], backend_.device());
}

std::vector<float> Gpt::host_values(const Tensor& t) const {
  std::vector<std::byte> raw(t.bytes());
  backend_.copy_to_host(raw.data(), t.data, raw.size());
  std::vector<float> out(static_cast<std::size_t>(t.numel()));
  convert_to_fp32(raw.data(), out.data(), out.size(), t.dtype);
  return out;
}

void Gpt::set_from_host(const Tensor& t, const std::vector<float>& values) {
  AMPSCOPE_CHECK(static_cast<std::int64_t>(values.size()) == t.numel(), "expected ", t.numel(),
                 " values, got ", values.size());
  std::vector<std::byte> raw(t.bytes());
  convert_from_fp32(values.data(), raw.data(), values.size(), t.dtype);
  backend_.copy_from_host(t.data, raw.data(), raw.size());
}

void Gpt::init_weights(std::uint64_t seed) {
  Rng rng(seed);
  std::vector<float> values(static_cast<std::size_t>(num_params_));
  const double proj_std = 0.02 / std::sqrt(2.0 * config_.n_layer);
  for (const auto& p : params_) {
    float* dst = values.data() + p.offset;
    const bool is_bias = p.name.ends_with(".bias");
    const bool is_ln_weight = p.name.ends_with(".weight") && p.shape.size() == 1;
    const bool is_residual_proj = p.name.ends_with("attn.proj.weight") ||
                                  p.name.ends_with("mlp.proj.weight");
    for (std::int64_t i = 0; i < p.numel; ++i) {
      if (is_bias) {
        dst[i] = 0.0f;
      } else if (is_ln_weight) {
        dst[i] = 1.0f;
      } else {
        dst[i] = static_cast<float>(rng.normal() * (is_residual_proj ? proj_std : 0.02));
      }
    }
  }
  set_from_host(param_buffer(), values);
  backend_.fill(m_buffer(), 0.0f);
  backend_.fill(v_buffer(), 0.0f);
  zero_grads();
  refresh_compute_weights();
}

void Gpt::zero_grads() { backend_.fill(grad_buffer(), 0.0f); }

void Gpt::refresh_compute_weights() {
  if (!policy_.master_weights) return;
  backend_.convert(whole(*compute_mem_, policy_.compute, num_params_, backend_.device()),
                   param_buffer());
}

Format Gpt::compute_for(const StepContext& ctx, const std::string& layer) const {
  if (policy_.compute == Format::kFP32) return Format::kFP32;
  if (ctx.overrides != nullptr && ctx.overrides->active(layer, ctx.step)) return Format::kFP32;
  return policy_.compute;
}

// A layer moved to FP32 computes everything in FP32, unquantised; one moved to BF16 computes as
// amp-bf16 does.
bool Gpt::quantize_gemm(const StepContext& ctx, const std::string& layer, Format compute) const {
  if (!policy_.scaled_gemms || compute == Format::kFP32) return false;
  return ctx.gemm == nullptr || !ctx.gemm->bf16(layer, ctx.step);
}

std::optional<Recipe> Gpt::recipe_for(const StepContext& ctx, const std::string& layer,
                                      GemmOperand operand, GemmUse use,
                                      int* delayed_index) const {
  *delayed_index = -1;
  std::optional<Recipe> r = gemm_recipe(mode_, operand, use);
  if (!r || r->scaling != Scaling::kDelayed) return r;
  AMPSCOPE_CHECK(ctx.delayed != nullptr, "fp8-delayed needs the run's DelayedScaling");
  *delayed_index = ctx.delayed->index(layer, operand);
  AMPSCOPE_CHECK(*delayed_index >= 0, "no amax history for ", layer, ".", operand_name(operand));
  const auto i = static_cast<std::size_t>(*delayed_index);
  r->scale = ctx.delayed->scale(i);  // the margin is in the scale
  return r;
}

void Gpt::report_quantized(const StepContext& ctx, const std::string& layer, GemmOperand operand,
                           GemmUse use, const RecipeCounts& counts, int delayed_index,
                           bool what_if, std::optional<double> loss_cost) const {
  if (delayed_index >= 0 && ctx.record_amax && use != GemmUse::kWgrad && !what_if) {
    ctx.delayed->record(static_cast<std::size_t>(delayed_index), counts.amax);
  }
  if (ctx.observer == nullptr) return;
  const std::string name = layer + "." + std::string(operand_name(operand));
  QuantizedGemmInput q;
  q.name = name;
  q.layer = layer;
  q.operand = operand;
  q.role = operand == GemmOperand::kInput    ? TensorRole::kActivation
           : operand == GemmOperand::kWeight ? TensorRole::kWeight
                                             : TensorRole::kActivationGrad;
  q.phase = use == GemmUse::kForward ? TensorPhase::kForward : TensorPhase::kBackward;
  q.use = use;
  q.recipe = counts.recipe;
  q.counts = counts;
  if (delayed_index >= 0) {
    q.amax_history = ctx.delayed->history(static_cast<std::size_t>(delayed_index)).history();
  }
  q.scale = operand == GemmOperand::kOutputGrad ? ctx.loss_scale : 1.0f;
  q.step = ctx.step;
  q.micro_step = ctx.micro_step;
  q.what_if = what_if;
  q.loss_cost = loss_cost;
  ctx.observer->on_quantized(q);
}

// What-if measurement (docs/trainer.md): a layer moved to BF16 computes exactly as amp-bf16
// does, and on observed steps each input its recipe would have quantised is counted against
// that recipe, the same reports the quantised path makes, marked what_if. A delayed history
// records nothing meanwhile: its scale stays the one the layer left with, which is the scale a
// move back would start from, and what is recorded does not depend on which steps were
// observed. Unobserved steps cost nothing.
bool Gpt::what_if_gemm(const StepContext& ctx, Format compute) const {
  return ctx.observer != nullptr && policy_.scaled_gemms && compute != Format::kFP32;
}

void Gpt::report_what_if(const StepContext& ctx, const std::string& layer, GemmOperand operand,
                         GemmUse use, const Tensor& t, Format compute,
                         std::optional<double> loss_cost) {
  int index = -1;
  const std::optional<Recipe> recipe = recipe_for(ctx, layer, operand, use, &index);
  AMPSCOPE_CHECK(recipe.has_value(), "no recipe for ", layer, ".", operand_name(operand));
  report_quantized(ctx, layer, operand, use, backend_.gemm_operand_counts(t, compute, *recipe),
                   index, true, loss_cost);
}

// Loss cost (docs/trainer.md, "Loss cost"). Both outputs come from the back end's own GEMMs,
// so that E is what the recipe changes in this layer's output and nothing else; dout is the
// gradient the backward reads, so the cost is of the network as it runs.
bool Gpt::measure_loss_cost(const StepContext& ctx, Format compute) const {
  // The steps and layers measured against the recipe (what_if_gemm's), every n-th step.
  return what_if_gemm(ctx, compute) && loss_cost_every_ > 0 && ctx.step % loss_cost_every_ == 0;
}

void Gpt::keep_output_error(const StepContext& ctx, const std::string& layer, const Tensor& out,
                            const Tensor& inp, const Tensor& weight, const Tensor& bias,
                            Format compute, bool quantized) {
  if (!loss_cost_other_ || loss_cost_other_->bytes() < out.bytes()) {
    loss_cost_other_ = backend_.allocate(out.bytes());
  }
  Tensor other = out;
  other.data = loss_cost_other_->data();
  if (quantized) {
    backend_.matmul_forward(other, inp, weight, bias, compute);
  } else {
    int ix = -1, iw = -1;  // counted nowhere and recording nothing: only the product is wanted
    MatmulForwardRecipes q;
    q.inp = QuantizedOperand{*recipe_for(ctx, layer, GemmOperand::kInput, GemmUse::kForward, &ix),
                             nullptr};
    q.weight = QuantizedOperand{
        *recipe_for(ctx, layer, GemmOperand::kWeight, GemmUse::kForward, &iw), nullptr};
    backend_.quantized_matmul_forward(other, inp, weight, bias, compute, q);
  }
  // out - other in FP32, in the back end: other negated (exact), then added.
  backend_.scale(other, -1.0f);
  const std::size_t bytes = static_cast<std::size_t>(out.numel()) * sizeof(float);
  auto it = std::find_if(output_errors_.begin(), output_errors_.end(),
                         [&](const OutputError& k) { return k.layer == layer; });
  if (it == output_errors_.end()) {
    it = output_errors_.insert(output_errors_.end(), OutputError{layer, nullptr});
  }
  if (!it->error || it->error->bytes() != bytes) it->error = backend_.allocate(bytes);
  it->sign = quantized ? 1.0 : -1.0;
  it->pending = true;
  Tensor e = out;
  e.data = it->error->data();
  e.dtype = Format::kFP32;
  backend_.add(e, out, other, Format::kFP32);
}

std::optional<double> Gpt::take_loss_cost(const std::string& layer, const Tensor& dout) {
  const auto it = std::find_if(output_errors_.begin(), output_errors_.end(),
                               [&](const OutputError& k) { return k.layer == layer; });
  if (it == output_errors_.end() || !it->pending) return std::nullopt;
  const auto n = static_cast<std::size_t>(dout.numel());
  AMPSCOPE_CHECK(it->error->bytes() == n * sizeof(float), "loss cost of ", layer, ": dout has ", n,
                 " elements, the output ", it->error->bytes() / sizeof(float));
  Tensor e = dout;
  e.data = it->error->data();
  e.dtype = Format::kFP32;
  if (!loss_cost_mem_) loss_cost_mem_ = backend_.allocate(sizeof(double));
  backend_.sum_products(static_cast<double*>(loss_cost_mem_->data()), dout, e);
  double sum = 0.0;
  backend_.copy_to_host(&sum, loss_cost_mem_->data(), sizeof sum);  // waits for the product
  sum *= it->sign;
  it->pending = false;
  const double cost = sum / static_cast<double>(dloss_);
  // A non-finite dout (an overflowed step the scaler skips) measures nothing.
  return std::isfinite(cost) ? std::optional<double>(cost) : std::nullopt;
}

void Gpt::linear_forward(const StepContext& ctx, const std::string& layer, const Tensor& out,
                         const Tensor& inp, const Tensor& weight, const Tensor& bias,
                         Format compute) {
  if (!quantize_gemm(ctx, layer, compute)) {
    backend_.matmul_forward(out, inp, weight, bias, compute);
    if (measure_loss_cost(ctx, compute)) {
      keep_output_error(ctx, layer, out, inp, weight, bias, compute, false);
    }
    if (what_if_gemm(ctx, compute)) {
      report_what_if(ctx, layer, GemmOperand::kInput, GemmUse::kForward, inp, compute);
      report_what_if(ctx, layer, GemmOperand::kWeight, GemmUse::kForward, weight, compute);
    }
    return;
  }
  int ix = -1, iw = -1;
  RecipeCounts cx, cw;
  MatmulForwardRecipes q;
  q.inp = QuantizedOperand{*recipe_for(ctx, layer, GemmOperand::kInput, GemmUse::kForward, &ix),
                           &cx};
  q.weight = QuantizedOperand{
      *recipe_for(ctx, layer, GemmOperand::kWeight, GemmUse::kForward, &iw), &cw};
  backend_.quantized_matmul_forward(out, inp, weight, bias, compute, q);
  if (measure_loss_cost(ctx, compute)) {
    keep_output_error(ctx, layer, out, inp, weight, bias, compute, true);
  }
  report_quantized(ctx, layer, GemmOperand::kInput, GemmUse::kForward, cx, ix);
  report_quantized(ctx, layer, GemmOperand::kWeight, GemmUse::kForward, cw, iw);
}

// Per-tensor recipes quantise the backward's operands as the forward did (the same scale: the
// same values), and dout once for both GEMMs: only dout is new, and only it is reported. Block
// recipes quantise each operand along the GEMM's own reduction axis: all four are reported.
void Gpt::linear_backward(const StepContext& ctx, const std::string& layer, const Tensor& dinp,
                          const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                          const Tensor& inp, const Tensor& weight, Format compute) {
  const bool blocks = gemm_block_length(mode_) > 0;
  if (!quantize_gemm(ctx, layer, compute)) {
    // The loss cost reads dout before the backward writes anything.
    const std::optional<double> cost = take_loss_cost(layer, dout);
    backend_.matmul_backward(dinp, dweight, dbias, dout, inp, weight, compute);
    if (what_if_gemm(ctx, compute)) {
      report_what_if(ctx, layer, GemmOperand::kOutputGrad, GemmUse::kDgrad, dout, compute, cost);
      if (!blocks) return;
      report_what_if(ctx, layer, GemmOperand::kWeight, GemmUse::kDgrad, weight, compute);
      report_what_if(ctx, layer, GemmOperand::kOutputGrad, GemmUse::kWgrad, dout, compute);
      report_what_if(ctx, layer, GemmOperand::kInput, GemmUse::kWgrad, inp, compute);
    }
    return;
  }
  int i_dd = -1, i_dw = -1, i_wd = -1, i_wx = -1;
  RecipeCounts c_dd, c_dw, c_wd, c_wx;
  MatmulBackwardRecipes q;
  q.dgrad_dout = QuantizedOperand{
      *recipe_for(ctx, layer, GemmOperand::kOutputGrad, GemmUse::kDgrad, &i_dd), &c_dd};
  q.dgrad_weight = QuantizedOperand{
      *recipe_for(ctx, layer, GemmOperand::kWeight, GemmUse::kDgrad, &i_dw), &c_dw};
  q.wgrad_dout = QuantizedOperand{
      *recipe_for(ctx, layer, GemmOperand::kOutputGrad, GemmUse::kWgrad, &i_wd), &c_wd};
  q.wgrad_inp = QuantizedOperand{
      *recipe_for(ctx, layer, GemmOperand::kInput, GemmUse::kWgrad, &i_wx), &c_wx};
  const std::optional<double> cost = take_loss_cost(layer, dout);
  backend_.quantized_matmul_backward(dinp, dweight, dbias, dout, inp, weight, compute, q);
  report_quantized(ctx, layer, GemmOperand::kOutputGrad, GemmUse::kDgrad, c_dd, i_dd, false,
                   cost);
  if (!blocks) return;
  report_quantized(ctx, layer, GemmOperand::kWeight, GemmUse::kDgrad, c_dw, i_dw);
  report_quantized(ctx, layer, GemmOperand::kOutputGrad, GemmUse::kWgrad, c_wd, i_wd);
  report_quantized(ctx, layer, GemmOperand::kInput, GemmUse::kWgrad, c_wx, i_wx);
}

namespace {

// Twice the largest finite value of `format`: stored in it, Inf (also for FP32, where the
// double does not fit a float).
float twice_max_finite(Format format) {
  const double v = 2.0 * format_info(format).max_finite;
  return v > std::numeric_limits<float>::max() ? std::numeric_limits<float>::infinity()
                                               : static_cast<float>(v);
}

}  // namespace

std::optional<float> Gpt::injection_due(const StepContext& ctx, const std::string& name,
                                        TensorRole role, TensorPhase phase, Format stored) const {
  if (ctx.injections == nullptr) return std::nullopt;
  const bool grad = role == TensorRole::kActivationGrad || role == TensorRole::kWeightGrad;
  const bool weight_grad_now = role == TensorRole::kWeightGrad && phase == TensorPhase::kBackward;
  const bool act_now = (role == TensorRole::kActivation || role == TensorRole::kActivationGrad) &&
                       ctx.micro_step == 0;
  if (!(weight_grad_now || act_now)) return std::nullopt;
  std::optional<float> value;
  for (const auto& inj : *ctx.injections) {
    if (inj.step != ctx.step) continue;
    const bool match = grad ? inj.tensor.size() == name.size() + 5 &&
                                  inj.tensor.starts_with(name) && inj.tensor.ends_with(".grad")
                            : inj.tensor == name;
    if (!match) continue;
    switch (inj.kind) {
      case Injection::Kind::kNaN:
        value = std::numeric_limits<float>::quiet_NaN();
        break;
      case Injection::Kind::kInf:
        value = std::numeric_limits<float>::infinity();
        break;
      case Injection::Kind::kOverflow:
        // A gradient overflows the format it is stored in (a loss scale too high); an
        // activation overflows the compute format, whatever its layer stores it in this step,
        // so that a layer moved to FP32 holds the same value finite.
        value = twice_max_finite(grad ? stored : policy_.compute);
        break;
    }
  }
  return value;
}

void Gpt::emit(const StepContext& ctx, const std::string& name, TensorRole role, TensorPhase phase,
               const Tensor& t, float scale, std::optional<Format> held) {
  if (const auto value = injection_due(ctx, name, role, phase, t.dtype)) {
    backend_.set_element(t, 0, *value);
  }
  show(ctx, name, role, phase, t, scale, held);
}

TensorView Gpt::view_of(const StepContext& ctx, const std::string& name, TensorRole role,
                        TensorPhase phase, const Tensor& t, float scale,
                        std::optional<Format> held) const {
  TensorView v;
  v.name = name;
  v.role = role;
  v.phase = phase;
  v.dtype = t.dtype;
  v.data = t.data;
  v.shape = std::span<const std::int64_t>(t.dims.data(), static_cast<std::size_t>(t.rank));
  v.device = t.device;
  v.stream = backend_.stream().native_handle();
  v.scale = scale;
  v.step = ctx.step;
  v.micro_step = ctx.micro_step;
  v.held = held;
  return v;
}

void Gpt::show(const StepContext& ctx, const std::string& name, TensorRole role, TensorPhase phase,
               const Tensor& t, float scale, std::optional<Format> held,
               const TensorStats* stats) {
  if (ctx.observer == nullptr) return;
  TensorView v = view_of(ctx, name, role, phase, t, scale, held);
  v.order = ctx.order != nullptr ? (*ctx.order)++ : 0;
  if (stats != nullptr) {
    ctx.observer->on_tensor_stats(v, *stats);
  } else {
    ctx.observer->on_tensor(v);
  }
}

void Gpt::emit_weights(const StepContext& ctx) {
  const auto& a = *acts_;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (policy_.master_weights) {
      emit(ctx, params_[i].name, TensorRole::kMasterWeight, TensorPhase::kStepStart, param(i), 1);
      if (a.in_matmul[i]) {
        emit(ctx, params_[i].name, TensorRole::kWeight, TensorPhase::kStepStart,
             slice(*compute_mem_, policy_.compute, params_[i], backend_.device()), 1);
      }
    } else {
      emit(ctx, params_[i].name, TensorRole::kWeight, TensorPhase::kStepStart, param(i), 1);
    }
  }
}

namespace {
// The format of the two in which a value overflows first.
Format narrower(Format a, Format b) {
  return format_info(a).max_finite <= format_info(b).max_finite ? a : b;
}
}  // namespace

// What both back ends do (cpu_backend.cc: Out::commit with OutMode::kAccumulate; kernels/cuda:
// commit() in nn_element.cuh, used by linear_backward's epilogue and finish_columns):
//  - a matmul layer's weight and bias gradients: each backward call rounds its contribution to
//    the layer's compute format at this step (FP32 when the layer is overridden), then adds it
//    to the gradient buffer in FP32, so the values pass through that format;
//  - LayerNorm weights and biases (contributions formed in the fp32_ops format), wpe and the
//    tied wte (embedding backward in the buffer's format): the buffer's format. wte's total
//    also holds the LM head's share, rounded to the head's compute format; that share is shown
//    on its own ("lm_head", in backward()), so the total is where it really is: the buffer.
// A 16-bit gradient buffer (pure fp16) is narrower than any of them.
// With --accum > 1 (and after unscaling, the sum over ranks) the values shown are a sum of
// rounded pieces and can exceed what any one piece reached: reporting the sum against the
// pieces' format is conservative (it can only ask for a lower scale).
Format Gpt::grad_held(const StepContext& ctx, std::size_t i) const {
  const auto& a = *acts_;
  const std::string layer = layer_of(params_[i].name);
  Format formed = policy_.fp32_ops;                      // LayerNorm weights and biases
  if (!layer.empty()) formed = compute_for(ctx, layer);  // matmul weights and biases
  if (i == a.wte || i == a.wpe) formed = policy_.param;  // embedding backward
  return narrower(formed, policy_.param);
}

void Gpt::finish_backward(const StepContext& ctx) {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    emit(ctx, params_[i].name, TensorRole::kWeightGrad, TensorPhase::kBackward, grad(i),
         ctx.loss_scale, grad_held(ctx, i));
  }
}

Gpt::UnscaledGradStats Gpt::request_unscaled_grad_stats(const StepContext& ctx) const {
  UnscaledGradStats fused;
  if (ctx.observer == nullptr) return fused;
  fused.stats.resize(params_.size());
  fused.requested.assign(params_.size(), false);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const TensorView meta = view_of(ctx, params_[i].name, TensorRole::kWeightGrad,
                                    TensorPhase::kAfterUnscale, grad(i), 1, grad_held(ctx, i));
    auto targets = ctx.observer->stats_targets(meta);
    if (!targets) continue;
    fused.requested[i] = true;
    fused.requests.push_back({params_[i].offset, grad(i).numel(), std::move(*targets),
                              &fused.stats[i]});
  }
  return fused;
}

// The same held as in the backward phase: the unscaled values were held at the step's scale.
// No injection happens after unscaling, so the statistics of the unscale pass are final.
void Gpt::emit_unscaled_grads(const StepContext& ctx, const UnscaledGradStats* fused) {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const bool measured = fused != nullptr && i < fused->requested.size() && fused->requested[i];
    show(ctx, params_[i].name, TensorRole::kWeightGrad, TensorPhase::kAfterUnscale, grad(i), 1,
         grad_held(ctx, i), measured ? &fused->stats[i] : nullptr);
  }
}

double Gpt::forward(const Batch& batch, const StepContext& ctx) {
  if (!loss_mem_) loss_mem_ = backend_.allocate(sizeof(double));
  auto* loss = static_cast<double*>(loss_mem_->data());
  const double zero = 0.0;
  backend_.copy_from_host(loss, &zero, sizeof(zero));
  forward(batch, ctx, loss);
  double mean = 0.0;
  backend_.copy_to_host(&mean, loss, sizeof(mean));
  return mean;
}

void Gpt::forward(const Batch& batch, const StepContext& ctx, double* loss_sum) {
  auto& a = *acts_;
  const std::int64_t B = batch.batch, T = batch.context, C = config_.n_embd,
                     V = config_.vocab_size;
  AMPSCOPE_CHECK(B >= 1 && B <= max_batch_, "batch of ", B, " outside [1, ", max_batch_, "]");
  AMPSCOPE_CHECK(T == config_.context, "sequence length ", T, ", model context ",
                 config_.context);
  cur_batch_ = static_cast<int>(B);
  // A forward whose backward did not run (an evaluation) leaves its errors untaken.
  for (OutputError& k : output_errors_) k.pending = false;
  const auto bt_bytes = static_cast<std::size_t>(B * T) * sizeof(std::int32_t);
  backend_.copy_from_host(a.tokens_b->data(), batch.inputs.data(), bt_bytes);
  backend_.copy_from_host(a.targets_b->data(), batch.targets.data(), bt_bytes);
  a.tokens = static_cast<const std::int32_t*>(a.tokens_b->data());
  a.targets = static_cast<const std::int32_t*>(a.targets_b->data());
  const PrecisionPolicy& pp = policy_;
  auto weight = [&](std::size_t i, Format c) {
    if (!pp.master_weights || c == Format::kFP32) return param(i);
    return slice(*compute_mem_, pp.compute, params_[i], backend_.device());
  };
  auto fwd = [&](const std::string& name, const Tensor& t) {
    emit(ctx, name, TensorRole::kActivation, TensorPhase::kForward, t, 1.0f);
  };

  a.encoded = act(a.encoded_b, pp.residual, {B, T, C});
  backend_.embedding_forward(a.encoded, a.tokens, param(a.wte), param(a.wpe));
  fwd("embed", a.encoded);
  Tensor x = a.encoded;
  for (auto& L : a.layers) {
    const std::string& p = L.prefix;
    L.ln1 = act(L.ln1_b, pp.fp32_ops, {B, T, C});
    L.ln1_mean = act(L.ln1_mean_b, Format::kFP32, {B, T});
    L.ln1_rstd = act(L.ln1_rstd_b, Format::kFP32, {B, T});
    backend_.layernorm_forward(L.ln1, L.ln1_mean, L.ln1_rstd, x, param(L.ln1w), param(L.ln1b),
                               pp.fp32_ops);
    fwd(p + ".ln1", L.ln1);

    L.c_qkv = compute_for(ctx, p + ".attn.qkv");
    L.qkv = act(L.qkv_b, L.c_qkv, {B, T, 3 * C});
    linear_forward(ctx, p + ".attn.qkv", L.qkv, L.ln1, weight(L.qkvw, L.c_qkv),
                   weight(L.qkvb, L.c_qkv), L.c_qkv);
    fwd(p + ".attn.qkv", L.qkv);

    L.c_core = compute_for(ctx, p + ".attn.core");
    L.c_softmax = L.c_core == Format::kFP32 ? Format::kFP32 : pp.fp32_ops;
    const std::int64_t NH = config_.n_head;
    L.scores = act(L.scores_b, L.c_core, {B, NH, T, T});
    L.probs = act(L.probs_b, L.c_softmax, {B, NH, T, T});
    L.ctx = act(L.ctx_b, L.c_core, {B, T, C});
    // Scores and probabilities are read inside attention_forward (by the softmax, by the
    // product): an injection into them lands there, so that what follows sees it. Element 0 of
    // the scores is query 0 attending key 0 (sequence 0, head 0), the one key the causal mask
    // leaves that query: a finite score gives probability exactly 1 there, whatever its value,
    // so an overflow injected into an FP32 layer changes nothing else, while in FP16 it is
    // stored as Inf and the softmax turns the row into NaN.
    const std::string scores_name = p + ".attn.scores", probs_name = p + ".attn.probs";
    AttentionFaults faults;
    if (auto v = injection_due(ctx, scores_name, TensorRole::kActivation, TensorPhase::kForward,
                               L.scores.dtype)) {
      faults.scores = ElementFault{0, *v};
    }
    if (auto v = injection_due(ctx, probs_name, TensorRole::kActivation, TensorPhase::kForward,
                               L.probs.dtype)) {
      faults.probs = ElementFault{0, *v};
    }
    backend_.attention_forward(L.ctx, L.scores, L.probs, L.qkv, config_.n_head, L.c_core,
                               L.c_softmax, faults);
    show(ctx, scores_name, TensorRole::kActivation, TensorPhase::kForward, L.scores, 1.0f, {});
    show(ctx, probs_name, TensorRole::kActivation, TensorPhase::kForward, L.probs, 1.0f, {});
    fwd(p + ".attn.context", L.ctx);

    L.c_proj = compute_for(ctx, p + ".attn.proj");
    L.proj = act(L.proj_b, L.c_proj, {B, T, C});
    linear_forward(ctx, p + ".attn.proj", L.proj, L.ctx, weight(L.projw, L.c_proj),
                   weight(L.projb, L.c_proj), L.c_proj);
    fwd(p + ".attn.proj", L.proj);

    L.res1 = act(L.res1_b, pp.residual, {B, T, C});
    backend_.add(L.res1, x, L.proj, pp.residual);
    fwd(p + ".res1", L.res1);

    L.ln2 = act(L.ln2_b, pp.fp32_ops, {B, T, C});
    L.ln2_mean = act(L.ln2_mean_b, Format::kFP32, {B, T});
    L.ln2_rstd = act(L.ln2_rstd_b, Format::kFP32, {B, T});
    backend_.layernorm_forward(L.ln2, L.ln2_mean, L.ln2_rstd, L.res1, param(L.ln2w),
                               param(L.ln2b), pp.fp32_ops);
    fwd(p + ".ln2", L.ln2);

    L.c_fc = compute_for(ctx, p + ".mlp.fc");
    L.fc = act(L.fc_b, L.c_fc, {B, T, 4 * C});
    linear_forward(ctx, p + ".mlp.fc", L.fc, L.ln2, weight(L.fcw, L.c_fc), weight(L.fcb, L.c_fc),
                   L.c_fc);
    fwd(p + ".mlp.fc", L.fc);

    L.c_gelu = compute_for(ctx, p + ".mlp.gelu");
    L.gelu = act(L.gelu_b, L.c_gelu, {B, T, 4 * C});
    backend_.gelu_forward(L.gelu, L.fc, L.c_gelu);
    fwd(p + ".mlp.gelu", L.gelu);

    L.c_fcproj = compute_for(ctx, p + ".mlp.proj");
    L.fcproj = act(L.fcproj_b, L.c_fcproj, {B, T, C});
    linear_forward(ctx, p + ".mlp.proj", L.fcproj, L.gelu, weight(L.fcprojw, L.c_fcproj),
                   weight(L.fcprojb, L.c_fcproj), L.c_fcproj);
    fwd(p + ".mlp.proj", L.fcproj);

    L.res2 = act(L.res2_b, pp.residual, {B, T, C});
    backend_.add(L.res2, L.res1, L.fcproj, pp.residual);
    fwd(p + ".res2", L.res2);
    x = L.res2;
  }
  a.lnf = act(a.lnf_b, pp.fp32_ops, {B, T, C});
  a.lnf_mean = act(a.lnf_mean_b, Format::kFP32, {B, T});
  a.lnf_rstd = act(a.lnf_rstd_b, Format::kFP32, {B, T});
  backend_.layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, x, param(a.lnfw), param(a.lnfb),
                             pp.fp32_ops);
  fwd("lnf", a.lnf);

  a.c_head = compute_for(ctx, "lm_head");
  a.logits = act(a.logits_b, a.c_head, {B, T, V});
  backend_.matmul_forward(a.logits, a.lnf, weight(a.wte, a.c_head), Tensor{}, a.c_head);
  fwd("logits", a.logits);

  a.ce_probs = act(a.ce_probs_b, pp.fp32_ops, {B, T, V});
  a.losses = act(a.losses_b, pp.fp32_ops, {B, T});
  backend_.cross_entropy_forward(a.losses, a.ce_probs, a.logits, a.targets, pp.fp32_ops);
  emit(ctx, "loss", TensorRole::kLoss, TensorPhase::kForward, a.losses, 1.0f);
  backend_.accumulate_mean(loss_sum, a.losses);
}

void Gpt::backward(float dloss, const StepContext& ctx) {
  auto& a = *acts_;
  dloss_ = dloss;
  const PrecisionPolicy& pp = policy_;
  const std::int64_t B = cur_batch_, T = config_.context, C = config_.n_embd,
                     V = config_.vocab_size;
  auto weight = [&](std::size_t i, Format c) {
    if (!pp.master_weights || c == Format::kFP32) return param(i);
    return slice(*compute_mem_, pp.compute, params_[i], backend_.device());
  };
  auto bwd = [&](const std::string& name, const Tensor& t) {
    emit(ctx, name, TensorRole::kActivationGrad, TensorPhase::kBackward, t, ctx.loss_scale);
  };

  // The mean over B*T tokens: each token's loss gradient carries dloss / (B*T).
  const float per_token = dloss / static_cast<float>(B * T);
  Tensor dlogits = act(a.dlogits_b, a.logits.dtype, {B, T, V});
  backend_.cross_entropy_backward(dlogits, a.ce_probs, a.targets, per_token, pp.fp32_ops);
  bwd("logits", dlogits);

  // The tied token embedding is the one parameter with two contributions per backward (the LM
  // head's matmul, the embedding). They are summed in a buffer of their own, which is then added
  // to the accumulated gradient, so that every parameter's gradient grows by exactly one term
  // per micro-batch: the order of a sum over ranks, and accumulating A micro-batches on one rank
  // gives the same bits as A ranks with one each (docs/multi-rank.md).
  const Tensor dwte(a.dwte_micro_b->data(), policy_.param, {V, C}, backend_.device());
  backend_.fill(dwte, 0.0f);
  Tensor dlnf = act(a.dln_b, a.lnf.dtype, {B, T, C});
  backend_.matmul_backward(dlnf, dwte, Tensor{}, dlogits, a.lnf, weight(a.wte, a.c_head),
                           a.c_head);
  // dwte was zeroed, so it now holds exactly the LM head's share of wte's gradient, rounded to
  // the head's compute format: the part of the tied gradient that can overflow FP16 (wte's
  // total is shown as held in its FP32 buffer). Shown every micro-batch, each rounded on its
  // own; read only, and not injectable (injection_due is not asked).
  show(ctx, std::string(kHead), TensorRole::kWeightGrad, TensorPhase::kBackward, dwte,
       ctx.loss_scale, narrower(a.c_head, dwte.dtype));
  bwd("lnf", dlnf);

  Tensor dres = act(a.dres_b, pp.residual, {B, T, C});
  backend_.fill(dres, 0.0f);
  const Tensor& x_last = a.layers.back().res2;
  backend_.layernorm_backward(dres, grad(a.lnfw), grad(a.lnfb), dlnf, x_last, param(a.lnfw),
                              a.lnf_mean, a.lnf_rstd, pp.fp32_ops);
  bwd(a.layers.back().prefix + ".res2", dres);

  for (std::size_t li = a.layers.size(); li-- > 0;) {
    Layer& L = a.layers[li];
    const std::string& p = L.prefix;
    const Tensor& x_in = li == 0 ? a.encoded : a.layers[li - 1].res2;

    Tensor dgelu = act(a.dgelu_b, L.gelu.dtype, {B, T, 4 * C});
    linear_backward(ctx, p + ".mlp.proj", dgelu, grad(L.fcprojw), grad(L.fcprojb), dres, L.gelu,
                    weight(L.fcprojw, L.c_fcproj), L.c_fcproj);
    bwd(p + ".mlp.gelu", dgelu);

    Tensor dfc = act(a.dfc_b, L.fc.dtype, {B, T, 4 * C});
    backend_.gelu_backward(dfc, dgelu, L.fc, L.c_gelu);
    bwd(p + ".mlp.fc", dfc);

    Tensor dln2 = act(a.dln_b, L.ln2.dtype, {B, T, C});
    linear_backward(ctx, p + ".mlp.fc", dln2, grad(L.fcw), grad(L.fcb), dfc, L.ln2,
                    weight(L.fcw, L.c_fc), L.c_fc);
    bwd(p + ".ln2", dln2);

    backend_.layernorm_backward(dres, grad(L.ln2w), grad(L.ln2b), dln2, L.res1, param(L.ln2w),
                                L.ln2_mean, L.ln2_rstd, pp.fp32_ops);
    bwd(p + ".res1", dres);

    Tensor dctx = act(a.dctx_b, L.ctx.dtype, {B, T, C});
    linear_backward(ctx, p + ".attn.proj", dctx, grad(L.projw), grad(L.projb), dres, L.ctx,
                    weight(L.projw, L.c_proj), L.c_proj);
    bwd(p + ".attn.context", dctx);

    Tensor dqkv = act(a.dqkv_b, L.qkv.dtype, {B, T, 3 * C});
    backend_.attention_backward(dqkv, dctx, L.qkv, L.probs, config_.n_head, L.c_core,
                                L.c_softmax);
    bwd(p + ".attn.qkv", dqkv);

    Tensor dln1 = act(a.dln_b, L.ln1.dtype, {B, T, C});
    linear_backward(ctx, p + ".attn.qkv", dln1, grad(L.qkvw), grad(L.qkvb), dqkv, L.ln1,
                    weight(L.qkvw, L.c_qkv), L.c_qkv);
    bwd(p + ".ln1", dln1);

    backend_.layernorm_backward(dres, grad(L.ln1w), grad(L.ln1b), dln1, x_in, param(L.ln1w),
                                L.ln1_mean, L.ln1_rstd, pp.fp32_ops);
    bwd(li == 0 ? std::string("embed") : a.layers[li - 1].prefix + ".res2", dres);
  }
  backend_.embedding_backward(dwte, grad(a.wpe), dres, a.tokens);
  backend_.add(grad(a.wte), grad(a.wte), dwte, Format::kFP32);
}

std::vector<float> Gpt::last_losses() const { return host_values(acts_->losses); }

}  // namespace ampscope::trainer
