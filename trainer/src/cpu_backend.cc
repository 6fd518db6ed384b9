// The CPU back end. Tensors live in host memory in their storage dtype (FP32, or FP16/BF16 bit
// patterns). Each operation reads its inputs into FP32 working copies rounded to the compute
// format (no copy for FP32 tensors computed in FP32), does FP32 arithmetic (matmuls through
// OpenBLAS cblas_sgemm: FP16/BF16-rounded inputs, FP32 accumulation, which is what tensor
// cores do), rounds results to the compute format and stores them in the output's dtype with
// ampscope::convert_from_fp32 / round_through (round to nearest even, overflow to Inf).
// Working copies come from a pool so steady-state steps do not allocate.
//
// Speed (bench/trainer_bench.py measures it against PyTorch):
//   - Each layer's arithmetic is its tuned CPU version in trainer/layers/<layer>/ (vector
//     kernels of the SIMD level ampscope::active_simd_level() picks, AMPSCOPE_SIMD capping it);
//     this file reads the inputs, hands the layer FP32 arrays and stores the results.
//   - They run on the OpenBLAS thread count, on the process's one pool (ampscope/thread_pool.h):
//     the calling thread and the pool's workers claim fixed-size chunks, rows or heads. Task
//     boundaries and the order in which partial sums are combined depend only on the shapes,
//     so results do not depend on the thread count or on which thread ran what (resumed runs
//     stay bit-exact), and a worker the OS is slow to schedule costs nothing: the caller takes
//     its tasks.
//   - A 16-bit output computed in its own format is rounded once, by the store; an FP32
//     output computed in FP32 is written in place.
#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "ampscope/check.h"
#include "ampscope/convert.h"
#include "ampscope/cpu_features.h"
#include "ampscope/trainer/backend.h"
#include "layers/attention/attention.h"
#include "layers/cpu_exec.h"
#include "layers/cross_entropy/cross_entropy.h"
#include "layers/elementwise/elementwise.h"
#include "layers/embedding/embedding.h"
#include "layers/gelu/gelu.h"
#include "layers/layernorm/layernorm.h"
#include "layers/matmul/matmul.h"

namespace ampscope::trainer {
namespace {

using layers::for_chunks;
using layers::kChunk;
using layers::ScratchPool;
using layers::Workers;
using Kernels = layers::ElementwiseKernels;
// The optimizer's spelling of its scalars.
namespace vk {
using layers::AdamWScalars;
}

class CpuBuffer final : public Buffer {
 public:
  explicit CpuBuffer(std::size_t bytes) : bytes_(bytes) {
    // 64-byte alignment for the vector kernels; at least one line so data() is never null.
    const std::size_t rounded = std::max<std::size_t>(64, (bytes + 63) / 64 * 64);
    data_ = static_cast<std::byte*>(std::aligned_alloc(64, rounded));
    AMPSCOPE_CHECK(data_ != nullptr, "could not allocate ", bytes, " bytes");
    std::memset(data_, 0, rounded);
  }
  ~CpuBuffer() override { std::free(data_); }
  Device device() const override { return Device::kCpu; }
  std::size_t bytes() const override { return bytes_; }
  void* data() override { return data_; }

 private:
  std::size_t bytes_;
  std::byte* data_;
};

class CpuStream final : public Stream {
 public:
  void synchronize() override {}
  void* native_handle() const override { return nullptr; }
};

std::byte* at(void* base, std::size_t index, Format dtype) {
  return static_cast<std::byte*>(base) + index * static_cast<std::size_t>(storage_bytes(dtype));
}

// What an operation works with: scratch memory, the workers and the vector kernels.
struct Exec {
  ScratchPool& scratch;
  const Workers& workers;
  const Kernels& k;
};

// Values of `t` as FP32, rounded to `compute`.
class In {
 public:
  In(const Tensor& t, Format compute, Exec& ex) {
    const auto n = static_cast<std::size_t>(t.numel());
    const bool needs_round = compute != Format::kFP32 && compute != t.dtype;
    if (t.dtype == Format::kFP32 && !needs_round) {
      ptr_ = static_cast<const float*>(t.data);
      return;
    }
    scratch_ = std::make_unique<ScratchPool::Handle>(ex.scratch.get(n));
    float* s = scratch_->data();
    for_chunks(ex.workers, n, [&](std::size_t b, std::size_t e) {
      convert_to_fp32(at(t.data, b, t.dtype), s + b, e - b, t.dtype);
      if (needs_round) round_through(s + b, e - b, compute);
    });
    ptr_ = s;
  }
  const float* get() const { return ptr_; }
  float operator[](std::size_t i) const { return ptr_[i]; }

 private:
  const float* ptr_ = nullptr;
  std::unique_ptr<ScratchPool::Handle> scratch_;
};

// An FP32 target for a result of `t`; commit() rounds it to `compute` and stores it in t.dtype.
//   kStore: the caller writes every element.
//   kAccumulate: the FP32 target starts at zero, the caller adds the contribution into it, and
//     commit() adds that into t (out = store(out + round(contribution))).
//   kAccumulateOnce: kAccumulate where the caller adds one term per element. For an FP32 t
//     computed in FP32, out + term is the same whether or not it goes through a zeroed
//     scratch, so the caller adds straight into t.
enum class OutMode { kStore, kAccumulate, kAccumulateOnce };

class Out {
 public:
  Out(const Tensor& t, Format compute, Exec& ex, OutMode mode = OutMode::kStore)
      : t_(t), compute_(compute), ex_(ex), n_(static_cast<std::size_t>(t.numel())) {
    const bool fp32_target = t.dtype == Format::kFP32;
    accumulate_ = mode != OutMode::kStore;
    if (fp32_target && (mode == OutMode::kStore ||
                        (mode == OutMode::kAccumulateOnce && compute == Format::kFP32))) {
      ptr_ = static_cast<float*>(t.data);
      direct_ = true;
      return;
    }
    scratch_ = std::make_unique<ScratchPool::Handle>(ex.scratch.get(n_));
    ptr_ = scratch_->data();
    if (accumulate_) {
      for_chunks(ex.workers, n_,
                 [&](std::size_t b, std::size_t e) { std::fill(ptr_ + b, ptr_ + e, 0.0f); });
    }
  }
  float* get() { return ptr_; }
  float& operator[](std::size_t i) { return ptr_[i]; }

  void commit() {
    // A store into t.dtype rounds as the compute format does when they are the same.
    const bool round = compute_ != Format::kFP32 && compute_ != t_.dtype;
    if (!accumulate_) {
      if (direct_) {
        if (round) {
          for_chunks(ex_.workers, n_, [&](std::size_t b, std::size_t e) {
            round_through(ptr_ + b, e - b, compute_);
          });
        }
        return;
      }
      for_chunks(ex_.workers, n_, [&](std::size_t b, std::size_t e) {
        if (round) round_through(ptr_ + b, e - b, compute_);
        convert_from_fp32(ptr_ + b, at(t_.data, b, t_.dtype), e - b, t_.dtype);
      });
      return;
    }
    if (direct_) return;
    const bool round_sum = compute_ != Format::kFP32;
    if (t_.dtype == Format::kFP32) {
      auto* o = static_cast<float*>(t_.data);
      for_chunks(ex_.workers, n_, [&](std::size_t b, std::size_t e) {
        if (round_sum) round_through(ptr_ + b, e - b, compute_);
        ex_.k.add(o + b, ptr_ + b, o + b, e - b);
      });
      return;
    }
    auto cur = ex_.scratch.get(n_);
    for_chunks(ex_.workers, n_, [&](std::size_t b, std::size_t e) {
      if (round_sum) round_through(ptr_ + b, e - b, compute_);
      float* c = cur.data() + b;
      convert_to_fp32(at(t_.data, b, t_.dtype), c, e - b, t_.dtype);
      ex_.k.add(c, ptr_ + b, c, e - b);
      convert_from_fp32(c, at(t_.data, b, t_.dtype), e - b, t_.dtype);
    });
  }

 private:
  Tensor t_;
  Format compute_;
  Exec& ex_;
  std::size_t n_;
  bool accumulate_ = false;
  bool direct_ = false;
  float* ptr_ = nullptr;
  std::unique_ptr<ScratchPool::Handle> scratch_;
};

std::size_t size(std::int64_t n) { return static_cast<std::size_t>(n); }

void check_same_numel(const Tensor& a, const Tensor& b, const char* what) {
  AMPSCOPE_CHECK(a.numel() == b.numel(), what, ": expected ", a.numel(), " elements, found ",
                 b.numel());
}

layers::OperandRecipe operand(const std::optional<QuantizedOperand>& q) {
  if (!q) return {};
  return {&q->recipe, q->counts};
}

int resolve_threads(int requested) {
  if (requested > 0) openblas_set_num_threads(requested);
  return std::max(1, requested > 0 ? requested : openblas_get_num_threads());
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& options)
      : workers_(resolve_threads(options.blas_threads)),
        kernels_(layers::elementwise_kernels(active_simd_level())),
        ex_{pool_, workers_, kernels_},
        cpu_{pool_, workers_, active_simd_level()} {}

  Device device() const override { return Device::kCpu; }
  std::string name() const override { return "cpu"; }
  std::unique_ptr<Buffer> allocate(std::size_t bytes) override {
    return std::make_unique<CpuBuffer>(bytes);
  }
  Stream& stream() override { return stream_; }
  void copy_to_host(void* dst, const void* src, std::size_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, bytes);
  }
  void copy_from_host(void* dst, const void* src, std::size_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, bytes);
  }

  void fill(const Tensor& t, float value) override {
    const auto n = static_cast<std::size_t>(t.numel());
    if (t.dtype == Format::kFP32) {
      auto* p = static_cast<float*>(t.data);
      for_chunks(workers_, n,
                 [&](std::size_t b, std::size_t e) { std::fill(p + b, p + e, value); });
      return;
    }
    AMPSCOPE_CHECK(storage_bytes(t.dtype) == 2, "fill: tensors are FP32, FP16 or BF16, found ",
                   format_name(t.dtype));
    std::uint16_t bits = 0;
    convert_from_fp32(&value, &bits, 1, t.dtype);
    auto* p = static_cast<std::uint16_t*>(t.data);
    for_chunks(workers_, n, [&](std::size_t b, std::size_t e) { std::fill(p + b, p + e, bits); });
  }

  void convert(const Tensor& dst, const Tensor& src) override {
    check_same_numel(dst, src, "convert");
    const auto n = static_cast<std::size_t>(dst.numel());
    if (src.dtype == Format::kFP32) {
      const auto* s = static_cast<const float*>(src.data);
      for_chunks(workers_, n, [&](std::size_t b, std::size_t e) {
        convert_from_fp32(s + b, at(dst.data, b, dst.dtype), e - b, dst.dtype);
      });
      return;
    }
    In in(src, Format::kFP32, ex_);
    for_chunks(workers_, n, [&](std::size_t b, std::size_t e) {
      convert_from_fp32(in.get() + b, at(dst.data, b, dst.dtype), e - b, dst.dtype);
    });
  }

  void add(const Tensor& out, const Tensor& a, const Tensor& b, Format compute) override {
    check_same_numel(out, a, "add");
    check_same_numel(out, b, "add");
    In x(a, compute, ex_), y(b, compute, ex_);
    Out o(out, compute, ex_);
    const auto n = static_cast<std::size_t>(out.numel());
    for_chunks(workers_, n, [&](std::size_t lo, std::size_t hi) {
      kernels_.add(x.get() + lo, y.get() + lo, o.get() + lo, hi - lo);
    });
    o.commit();
  }

  void set_element(const Tensor& t, std::int64_t index, float value) override {
    AMPSCOPE_CHECK(index >= 0 && index < t.numel(), "index ", index, " outside [0, ", t.numel(),
                   ")");
    convert_from_fp32(&value, at(t.data, static_cast<std::size_t>(index), t.dtype), 1, t.dtype);
  }

  void embedding_forward(const Tensor& out, const std::int32_t* tokens, const Tensor& wte,
                         const Tensor& wpe) override {
    const std::int64_t B = out.dim(0), T = out.dim(1), C = out.dim(2), V = wte.dim(0);
    AMPSCOPE_CHECK(wte.dim(1) == C && wpe.dim(1) == C && wpe.dim(0) >= T,
                   "embedding tables do not match the output shape");
    for (std::int64_t bt = 0; bt < B * T; ++bt) {
      AMPSCOPE_CHECK(tokens[bt] >= 0 && tokens[bt] < V, "token ", tokens[bt],
                     " outside the vocabulary of ", V);
    }
    In e(wte, Format::kFP32, ex_), p(wpe, Format::kFP32, ex_);
    Out o(out, out.dtype, ex_);
    layers::embedding_forward_cpu(cpu_, o.get(), tokens, e.get(), p.get(), size(B), size(T),
                                  size(C));
    o.commit();
  }

  void embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                          const std::int32_t* tokens) override {
    const std::int64_t B = dout.dim(0), T = dout.dim(1), C = dout.dim(2);
    In d(dout, Format::kFP32, ex_);
    Out we(dwte, dwte.dtype, ex_, OutMode::kAccumulate);
    Out pe(dwpe, dwpe.dtype, ex_, OutMode::kAccumulate);
    layers::embedding_backward_cpu(cpu_, we.get(), pe.get(), d.get(), tokens, size(B), size(T),
                                   size(C));
    we.commit();
    pe.commit();
  }

  void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                         const Tensor& inp, const Tensor& weight, const Tensor& bias,
                         Format compute) override {
    const std::int64_t C = inp.dim(inp.rank - 1), N = inp.numel() / C;
    check_same_numel(out, inp, "layernorm_forward");
    In x(inp, compute, ex_), w(weight, compute, ex_), b(bias, compute, ex_);
    Out o(out, compute, ex_);
    layers::layernorm_forward_cpu(cpu_, x.get(), w.get(), b.get(), o.get(),
                                  static_cast<float*>(mean.data), static_cast<float*>(rstd.data),
                                  size(N), size(C));
    o.commit();
  }

  void layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                          const Tensor& dout, const Tensor& inp, const Tensor& weight,
                          const Tensor& mean, const Tensor& rstd, Format compute) override {
    const std::int64_t C = inp.dim(inp.rank - 1), N = inp.numel() / C;
    In x(inp, compute, ex_), w(weight, compute, ex_), d(dout, compute, ex_);
    Out di(dinp, compute, ex_, OutMode::kAccumulateOnce);
    Out dw(dweight, compute, ex_, OutMode::kAccumulate),
        db(dbias, compute, ex_, OutMode::kAccumulate);
    layers::layernorm_backward_cpu(
        cpu_, x.get(), w.get(), d.get(), static_cast<const float*>(mean.data),
        static_cast<const float*>(rstd.data), di.get(), dw.get(), db.get(), size(N), size(C));
    di.commit();
    dw.commit();
    db.commit();
  }

  void matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight,
                      const Tensor& bias, Format compute) override {
    quantized_matmul_forward(out, inp, weight, bias, compute, {});
  }

  void matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                       const Tensor& dout, const Tensor& inp, const Tensor& weight,
                       Format compute) override {
    quantized_matmul_backward(dinp, dweight, dbias, dout, inp, weight, compute, {});
  }

  // The FP8/FP4 emulation: the operands read and rounded to `compute` as above, then
  // fake_quantize'd by the layer (layers/matmul) before the same sgemm.
  bool supports_gemm_recipes() const override { return true; }

  void quantized_matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight,
                                const Tensor& bias, Format compute,
                                const MatmulForwardRecipes& q) override {
    const std::int64_t C = inp.dim(inp.rank - 1), N = inp.numel() / C, OC = weight.dim(0);
    AMPSCOPE_CHECK(weight.dim(1) == C, "matmul weight has ", weight.dim(1), " columns, input ", C);
    AMPSCOPE_CHECK(out.numel() == N * OC, "matmul output has ", out.numel(), " elements, expected ",
                   N * OC);
    In x(inp, compute, ex_), w(weight, compute, ex_);
    std::optional<In> b;
    if (!bias.empty()) b.emplace(bias, compute, ex_);
    Out o(out, compute, ex_);
    layers::matmul_forward_quantized_cpu(cpu_, o.get(), x.get(), w.get(), b ? b->get() : nullptr,
                                         size(N), size(C), size(OC), operand(q.inp),
                                         operand(q.weight));
    o.commit();
  }

  void quantized_matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                                 const Tensor& dout, const Tensor& inp, const Tensor& weight,
                                 Format compute, const MatmulBackwardRecipes& q) override {
    const std::int64_t C = inp.dim(inp.rank - 1), N = inp.numel() / C, OC = weight.dim(0);
    In d(dout, compute, ex_), x(inp, compute, ex_);
    std::optional<In> w;
    std::optional<Out> di, db;
    if (!dinp.empty()) {
      w.emplace(weight, compute, ex_);
      di.emplace(dinp, compute, ex_);
    }
    Out dw(dweight, compute, ex_, OutMode::kAccumulate);
    if (!dbias.empty()) db.emplace(dbias, compute, ex_, OutMode::kAccumulate);
    const layers::BackwardRecipes recipes{operand(q.dgrad_dout), operand(q.dgrad_weight),
                                          operand(q.wgrad_dout), operand(q.wgrad_inp)};
    layers::matmul_backward_quantized_cpu(cpu_, di ? di->get() : nullptr, dw.get(),
                                          db ? db->get() : nullptr, d.get(), x.get(),
                                          w ? w->get() : nullptr, size(N), size(C), size(OC),
                                          recipes);
    if (di) di->commit();
    dw.commit();
    if (db) db->commit();
  }

  RecipeCounts gemm_operand_counts(const Tensor& operand, Format compute,
                                   const Recipe& recipe) override {
    const std::int64_t cols = operand.dim(operand.rank - 1);
    const In x(operand, compute, ex_);
    return recipe_counts(x.get(), size(operand.numel()), Format::kFP32, size(cols), recipe);
  }

  void attention_forward(const Tensor& out, const Tensor& scores, const Tensor& probs,
                         const Tensor& qkv, int n_head, Format compute, Format softmax,
                         const AttentionFaults& faults) override {
    const std::int64_t B = qkv.dim(0), T = qkv.dim(1), C = qkv.dim(2) / 3, NH = n_head;
    AMPSCOPE_CHECK(C % NH == 0, "channels ", C, " not divisible by ", NH, " heads");
    for (const auto* f : {&faults.scores, &faults.probs}) {
      AMPSCOPE_CHECK(!*f || ((*f)->index >= 0 && (*f)->index < B * NH * T * T), "fault index ",
                     (*f)->index, " outside [0, ", B * NH * T * T, ")");
    }
    In x(qkv, compute, ex_);
    Out s(scores, compute, ex_);
    Out p(probs, softmax, ex_);
    Out o(out, compute, ex_);
    layers::attention_forward_cpu(cpu_, o.get(), s.get(), p.get(), x.get(), B, T, C, NH, compute,
                                  softmax, faults);
    s.commit();
    p.commit();
    o.commit();
  }

  void attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                          const Tensor& probs, int n_head, Format compute,
                          Format softmax) override {
    const std::int64_t B = qkv.dim(0), T = qkv.dim(1), C = qkv.dim(2) / 3;
    In x(qkv, compute, ex_), d(dout, compute, ex_), p(probs, softmax, ex_);
    Out dx(dqkv, compute, ex_);
    layers::attention_backward_cpu(cpu_, dx.get(), d.get(), x.get(), p.get(), B, T, C, n_head,
                                   compute, softmax);
    dx.commit();
  }

  void gelu_forward(const Tensor& out, const Tensor& inp, Format compute) override {
    check_same_numel(out, inp, "gelu_forward");
    In x(inp, compute, ex_);
    Out o(out, compute, ex_);
    layers::gelu_forward_cpu(cpu_, x.get(), o.get(), size(inp.numel()));
    o.commit();
  }

  void gelu_backward(const Tensor& dinp, const Tensor& dout, const Tensor& inp,
                     Format compute) override {
    In x(inp, compute, ex_), d(dout, compute, ex_);
    Out di(dinp, compute, ex_);
    layers::gelu_backward_cpu(cpu_, x.get(), d.get(), di.get(), size(inp.numel()));
    di.commit();
  }

  void cross_entropy_forward(const Tensor& losses, const Tensor& probs, const Tensor& logits,
                             const std::int32_t* targets, Format compute) override {
    const std::int64_t V = logits.dim(logits.rank - 1), N = logits.numel() / V;
    for (std::int64_t i = 0; i < N; ++i) {
      AMPSCOPE_CHECK(targets[i] >= 0 && targets[i] < V, "target ", targets[i],
                     " outside the vocabulary of ", V);
    }
    In x(logits, compute, ex_);
    Out p(probs, compute, ex_);
    Out l(losses, compute, ex_);
    layers::cross_entropy_forward_cpu(cpu_, l.get(), p.get(), x.get(), targets, size(N), size(V));
    p.commit();
    l.commit();
  }

  void cross_entropy_backward(const Tensor& dlogits, const Tensor& probs,
                              const std::int32_t* targets, float dloss, Format compute) override {
    const std::int64_t V = probs.dim(probs.rank - 1), N = probs.numel() / V;
    In p(probs, Format::kFP32, ex_);
    Out d(dlogits, compute, ex_);
    layers::cross_entropy_backward_cpu(cpu_, d.get(), p.get(), targets, dloss, size(N), size(V));
    d.commit();
  }

  void unscale_and_check(const Tensor& grads, float inv_scale, const Tensor& found_inf) override {
    In g(grads, Format::kFP32, ex_);
    Out o(grads, Format::kFP32, ex_);
    const auto n = static_cast<std::size_t>(grads.numel());
    std::atomic<bool> bad{false};
    for_chunks(workers_, n, [&](std::size_t b, std::size_t e) {
      if (kernels_.scale_and_check(g.get() + b, inv_scale, o.get() + b, e - b)) {
        bad.store(true, std::memory_order_relaxed);
      }
    });
    o.commit();
    if (bad.load()) *static_cast<float*>(found_inf.data) = 1.0f;
  }

  // Each requested part through scale_and_compute_stats (one read and one write), the rest
  // through unscale_and_check. With 0 <= inv_scale <= 1 no finite gradient becomes non-finite
  // and every non-finite one stays so (Inf * 0 is NaN), so the statistics of the unscaled
  // values say whether the input held one: found_inf exactly as unscale_and_check sets it.
  // Another factor (a loss scale below 1) could overflow a finite value: then the plain pass
  // checks, and the statistics are taken after it.
  void unscale_check_and_measure(const Tensor& grads, float inv_scale, const Tensor& found_inf,
                                 std::span<const StatsRequest> requests) override {
    std::vector<const StatsRequest*> parts;
    for (const StatsRequest& r : requests) {
      AMPSCOPE_CHECK(r.out != nullptr && r.offset >= 0 && r.numel >= 0 &&
                         r.offset + r.numel <= grads.numel(),
                     "unscale_check_and_measure: a request outside the ", grads.numel(),
                     " gradients");
      parts.push_back(&r);
    }
    std::sort(parts.begin(), parts.end(),
              [](const StatsRequest* a, const StatsRequest* b) { return a->offset < b->offset; });
    StatsOptions options;
    options.max_threads = workers_.threads();
    auto part = [&](std::int64_t begin, std::int64_t end) {
      return Tensor(at(grads.data, static_cast<std::size_t>(begin), grads.dtype), grads.dtype,
                    {end - begin}, grads.device);
    };
    if (!(inv_scale >= 0.0f && inv_scale <= 1.0f)) {
      unscale_and_check(grads, inv_scale, found_inf);
      for (const StatsRequest* r : parts) {
        *r->out = compute_stats(part(r->offset, r->offset + r->numel).data,
                                static_cast<std::size_t>(r->numel), grads.dtype, r->targets,
                                options);
      }
      return;
    }
    // The gaps through the plain pass; the parts large enough for the statistics to spread
    // over the workers one at a time, the others spread over the workers one part per task.
    std::int64_t done = 0;
    std::vector<const StatsRequest*> large, small;
    for (const StatsRequest* r : parts) {
      AMPSCOPE_CHECK(r->offset >= done, "unscale_check_and_measure: requests overlap at element ",
                     r->offset);
      if (r->offset > done) unscale_and_check(part(done, r->offset), inv_scale, found_inf);
      done = r->offset + r->numel;
      const bool spreads = static_cast<std::size_t>(r->numel) >= options.parallel_threshold;
      (spreads ? large : small).push_back(r);
    }
    if (done < grads.numel()) unscale_and_check(part(done, grads.numel()), inv_scale, found_inf);
    auto measure = [&](const StatsRequest& r, const StatsOptions& o) {
      *r.out = scale_and_compute_stats(part(r.offset, r.offset + r.numel).data,
                                       static_cast<std::size_t>(r.numel), grads.dtype, inv_scale,
                                       r.targets, o);
    };
    for (const StatsRequest* r : large) measure(*r, options);
    StatsOptions one_thread = options;
    one_thread.max_threads = 1;
    workers_.run(small.size(), [&](std::size_t i, int) { measure(*small[i], one_thread); });
    for (const StatsRequest* r : parts) {
      if (r->out->nonfinite() > 0) *static_cast<float*>(found_inf.data) = 1.0f;
    }
  }

  void sum_squares(const Tensor& sum_sq, const Tensor& x) override {
    In g(x, Format::kFP32, ex_);
    const auto n = static_cast<std::size_t>(x.numel());
    // FP64 sums per chunk, added in chunk order.
    std::vector<double> partial((n + kChunk - 1) / kChunk, 0.0);
    for_chunks(workers_, n, [&](std::size_t b, std::size_t e) {
      partial[b / kChunk] = kernels_.sum_squares(g.get() + b, e - b);
    });
    double acc = 0.0;
    for (double s : partial) acc += s;
    *static_cast<float*>(sum_sq.data) = static_cast<float>(acc);
  }

  void update_loss_scale(LossScaleState* state, const Tensor& found_inf,
                         const LossScaleRule& rule) override {
    update_loss_scale_state(*state, rule, *static_cast<const float*>(found_inf.data) != 0.0f);
  }

  void accumulate_mean(double* acc, const Tensor& x) override {
    AMPSCOPE_CHECK(x.numel() >= 1, "accumulate_mean: x is empty");
    In g(x, Format::kFP32, ex_);
    double sum = 0.0;
    for (std::int64_t i = 0; i < x.numel(); ++i) sum += g.get()[i];
    *acc += sum / static_cast<double>(x.numel());
  }

  void sum_products(double* out, const Tensor& a, const Tensor& b) override {
    check_same_numel(a, b, "sum_products");
    In x(a, Format::kFP32, ex_), y(b, Format::kFP32, ex_);
    double sum = 0.0;
    for (std::int64_t i = 0; i < a.numel(); ++i) {
      sum += static_cast<double>(x.get()[i]) * static_cast<double>(y.get()[i]);
    }
    *out = sum;
  }

  void scale(const Tensor& x, float factor) override {
    In g(x, Format::kFP32, ex_);
    Out o(x, Format::kFP32, ex_);
    for_chunks(workers_, static_cast<std::size_t>(x.numel()), [&](std::size_t b, std::size_t e) {
      kernels_.scale(g.get() + b, factor, o.get() + b, e - b);
    });
    o.commit();
  }

  void adamw(const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,
             const AdamWParams& hp) override {
    check_same_numel(params, grads, "adamw");
    check_same_numel(params, m, "adamw");
    check_same_numel(params, v, "adamw");
    In g(grads, Format::kFP32, ex_), pin(params, Format::kFP32, ex_), min(m, Format::kFP32, ex_),
        vin(v, Format::kFP32, ex_);
    Out po(params, Format::kFP32, ex_), mo(m, Format::kFP32, ex_), vo(v, Format::kFP32, ex_);
    vk::AdamWScalars s;
    s.beta1 = hp.beta1;
    s.one_minus_beta1 = 1.0f - hp.beta1;
    s.beta2 = hp.beta2;
    s.one_minus_beta2 = 1.0f - hp.beta2;
    s.bc1 = 1.0f - std::pow(hp.beta1, static_cast<float>(hp.step));
    s.bc2 = 1.0f - std::pow(hp.beta2, static_cast<float>(hp.step));
    s.decay = 1.0f - hp.lr * hp.weight_decay;
    s.lr = hp.lr;
    s.eps = hp.eps;
    for_chunks(workers_, static_cast<std::size_t>(params.numel()),
               [&](std::size_t b, std::size_t e) {
                 kernels_.adamw(g.get() + b, pin.get() + b, min.get() + b, vin.get() + b,
                                po.get() + b, mo.get() + b, vo.get() + b, e - b, s);
               });
    po.commit();
    mo.commit();
    vo.commit();
  }

 private:
  CpuStream stream_;
  ScratchPool pool_;
  Workers workers_;
  Kernels kernels_;
  Exec ex_;
  layers::CpuExec cpu_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

}  // namespace ampscope::trainer
