// The CPU back end. Tensors live in host memory in their storage dtype (FP32, or FP16/BF16 bit
// patterns). Each operation reads its inputs into FP32 working copies rounded to the compute
// format (no copy for FP32 tensors computed in FP32), does FP32 arithmetic (matmuls through
// OpenBLAS cblas_sgemm: FP16/BF16-rounded inputs, FP32 accumulation, which is what tensor
// cores do), rounds results to the compute format and stores them in the output's dtype with
// ampscope::convert_from_fp32 / round_through (round to nearest even, overflow to Inf).
// Working copies come from a pool so steady-state steps do not allocate.
//
// Speed (bench/trainer_bench.py measures it against PyTorch):
//   - The loops outside the matmuls are vector kernels (cpu_vector_kernels.h) of the SIMD level
//     ampscope::active_simd_level() picks (AMPSCOPE_SIMD caps it).
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
#include "ampscope/thread_pool.h"
#include "ampscope/trainer/backend.h"
#include "cpu_vector_kernels.h"

namespace ampscope::trainer {
namespace {

using detail::Kernels;
namespace vk = detail::vk;

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

// Reusable FP32 working buffers; a handle returns its vector to the pool when it goes away.
// Used from the calling thread only: parallel tasks get their scratch before they start.
class ScratchPool {
 public:
  class Handle {
   public:
    Handle(ScratchPool* pool, std::vector<float> v) : pool_(pool), v_(std::move(v)) {}
    Handle(Handle&& o) noexcept : pool_(o.pool_), v_(std::move(o.v_)) { o.pool_ = nullptr; }
    Handle& operator=(Handle&&) = delete;
    ~Handle() {
      if (pool_ != nullptr) pool_->free_.push_back(std::move(v_));
    }
    float* data() { return v_.data(); }

   private:
    ScratchPool* pool_;
    std::vector<float> v_;
  };

  Handle get(std::size_t n) {
    // Best fit among the free vectors, else a new one.
    std::size_t best = free_.size();
    for (std::size_t i = 0; i < free_.size(); ++i) {
      if (free_[i].size() >= n && (best == free_.size() || free_[i].size() < free_[best].size())) {
        best = i;
      }
    }
    std::vector<float> v;
    if (best < free_.size()) {
      v = std::move(free_[best]);
      free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(best));
    } else {
      v.resize(std::max<std::size_t>(n, 1));
    }
    return Handle(this, std::move(v));
  }

 private:
  std::vector<std::vector<float>> free_;
};

// The back end's share of the process's pool: parallel work on at most its thread count.
// run(count, fn) calls fn(task, slot) with slot < threads() (ampscope::parallel_for).
class Workers {
 public:
  explicit Workers(int threads) : threads_(threads) {}
  int threads() const { return threads_; }
  template <class Fn>
  void run(std::size_t count, const Fn& fn) const {
    parallel_for(count, threads_, fn);
  }

 private:
  int threads_;
};

// Elements per parallel task of the elementwise passes (64 KiB of FP32): large enough to
// amortise a task, small enough to keep a task's arrays in L2 and both cores busy.
constexpr std::size_t kChunk = 16384;

// fn(begin, end) over [0, n) in kChunk pieces on the workers.
template <class Fn>
void for_chunks(const Workers& workers, std::size_t n, const Fn& fn) {
  const std::size_t tasks = (n + kChunk - 1) / kChunk;
  workers.run(tasks, [&](std::size_t t, int) { fn(t * kChunk, std::min(n, (t + 1) * kChunk)); });
}

// Rows per task for row-wise work on rows of `width` elements.
std::size_t rows_per_task(std::int64_t width) {
  return std::max<std::size_t>(1,
                               kChunk / static_cast<std::size_t>(std::max<std::int64_t>(width, 1)));
}

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

void check_same_numel(const Tensor& a, const Tensor& b, const char* what) {
  AMPSCOPE_CHECK(a.numel() == b.numel(), what, ": expected ", a.numel(), " elements, found ",
                 b.numel());
}

int resolve_threads(int requested) {
  if (requested > 0) openblas_set_num_threads(requested);
  return std::max(1, requested > 0 ? requested : openblas_get_num_threads());
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& options)
      : workers_(resolve_threads(options.blas_threads)),
        kernels_(detail::kernels_for(active_simd_level())),
        ex_{pool_, workers_, kernels_} {}

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
    const std::size_t rows = rows_per_task(C);
    const auto N = static_cast<std::size_t>(B * T);
    workers_.run((N + rows - 1) / rows, [&](std::size_t task, int) {
      for (std::size_t bt = task * rows; bt < std::min(N, (task + 1) * rows); ++bt) {
        kernels_.add(e.get() + tokens[bt] * C, p.get() + static_cast<std::int64_t>(bt) % T * C,
                     o.get() + bt * C, static_cast<std::size_t>(C));
      }
    });
    o.commit();
  }

  void embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                          const std::int32_t* tokens) override {
    const std::int64_t B = dout.dim(0), T = dout.dim(1), C = dout.dim(2);
    In d(dout, Format::kFP32, ex_);
    Out we(dwte, dwte.dtype, ex_, OutMode::kAccumulate);
    Out pe(dwpe, dwpe.dtype, ex_, OutMode::kAccumulate);
    const auto uc = static_cast<std::size_t>(C);
    // Rows of the same token or position add up in token order, on this thread.
    for (std::int64_t bt = 0; bt < B * T; ++bt) {
      const float* dr = d.get() + bt * C;
      float* wr = we.get() + tokens[bt] * C;
      float* pr = pe.get() + (bt % T) * C;
      kernels_.add(wr, dr, wr, uc);
      kernels_.add(pr, dr, pr, uc);
    }
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
    auto* mu = static_cast<float*>(mean.data);
    auto* rs = static_cast<float*>(rstd.data);
    const std::size_t rows = rows_per_task(C);
    const auto uc = static_cast<std::size_t>(C), un = static_cast<std::size_t>(N);
    workers_.run((un + rows - 1) / rows, [&](std::size_t task, int) {
      const std::size_t r0 = task * rows, r1 = std::min(un, r0 + rows);
      kernels_.layernorm_forward(x.get() + r0 * uc, w.get(), b.get(), o.get() + r0 * uc, mu + r0,
                                 rs + r0, r1 - r0, uc);
    });
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
    const auto* mu = static_cast<const float*>(mean.data);
    const auto* rs = static_cast<const float*>(rstd.data);
    const std::size_t rows = rows_per_task(C);
    const auto uc = static_cast<std::size_t>(C), un = static_cast<std::size_t>(N);
    const std::size_t tasks = (un + rows - 1) / rows;
    // Each task sums its rows' dweight and dbias terms; the task sums are added in task order.
    auto partial = pool_.get(tasks * 2 * uc);
    std::fill_n(partial.data(), tasks * 2 * uc, 0.0f);
    workers_.run(tasks, [&](std::size_t task, int) {
      const std::size_t r0 = task * rows, r1 = std::min(un, r0 + rows);
      float* pw = partial.data() + task * 2 * uc;
      kernels_.layernorm_backward(x.get() + r0 * uc, w.get(), d.get() + r0 * uc, mu + r0, rs + r0,
                                  di.get() + r0 * uc, pw, pw + uc, r1 - r0, uc);
    });
    for (std::size_t task = 0; task < tasks; ++task) {
      const float* pw = partial.data() + task * 2 * uc;
      kernels_.add(dw.get(), pw, dw.get(), uc);
      kernels_.add(db.get(), pw + uc, db.get(), uc);
    }
    di.commit();
    dw.commit();
    db.commit();
  }

  void matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight,
                      const Tensor& bias, Format compute) override {
    const std::int64_t C = inp.dim(inp.rank - 1), N = inp.numel() / C, OC = weight.dim(0);
    AMPSCOPE_CHECK(weight.dim(1) == C, "matmul weight has ", weight.dim(1), " columns, input ", C);
    AMPSCOPE_CHECK(out.numel() == N * OC, "matmul output has ", out.numel(), " elements, expected ",
                   N * OC);
    In x(inp, compute, ex_), w(weight, compute, ex_);
    Out o(out, compute, ex_);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(N), int(OC), int(C), 1.0f, x.get(),
                int(C), w.get(), int(C), 0.0f, o.get(), int(OC));
    if (!bias.empty()) {
      In b(bias, compute, ex_);
      const std::size_t rows = rows_per_task(OC);
      const auto uoc = static_cast<std::size_t>(OC), un = static_cast<std::size_t>(N);
      workers_.run((un + rows - 1) / rows, [&](std::size_t task, int) {
        for (std::size_t i = task * rows; i < std::min(un, (task + 1) * rows); ++i) {
          kernels_.add(o.get() + i * uoc, b.get(), o.get() + i * uoc, uoc);
        }
      });
    }
    o.commit();
  }

  void matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                       const Tensor& dout, const Tensor& inp, const Tensor& weight,
                       Format compute) override {
    const std::int64_t C = inp.dim(inp.rank - 1), N = inp.numel() / C, OC = weight.dim(0);
    In d(dout, compute, ex_);
    if (!dinp.empty()) {
      In w(weight, compute, ex_);
      Out di(dinp, compute, ex_);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(N), int(C), int(OC), 1.0f, d.get(),
                  int(OC), w.get(), int(C), 0.0f, di.get(), int(C));
      di.commit();
    }
    {
      In x(inp, compute, ex_);
      Out dw(dweight, compute, ex_, OutMode::kAccumulate);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(OC), int(C), int(N), 1.0f, d.get(),
                  int(OC), x.get(), int(C), 0.0f, dw.get(), int(C));
      dw.commit();
    }
    if (!dbias.empty()) {
      Out db(dbias, compute, ex_, OutMode::kAccumulate);
      kernels_.add_column_sums(d.get(), static_cast<std::size_t>(N), static_cast<std::size_t>(OC),
                               db.get());
      db.commit();
    }
  }

  void attention_forward(const Tensor& out, const Tensor& scores, const Tensor& probs,
                         const Tensor& qkv, int n_head, Format compute, Format softmax,
                         const AttentionFaults& faults) override {
    const std::int64_t B = qkv.dim(0), T = qkv.dim(1), C3 = qkv.dim(2), C = C3 / 3, NH = n_head,
                       hs = C / NH;
    AMPSCOPE_CHECK(C % NH == 0, "channels ", C, " not divisible by ", NH, " heads");
    for (const auto* f : {&faults.scores, &faults.probs}) {
      AMPSCOPE_CHECK(!*f || ((*f)->index >= 0 && (*f)->index < B * NH * T * T), "fault index ",
                     (*f)->index, " outside [0, ", B * NH * T * T, ")");
    }
    const float alpha = 1.0f / std::sqrt(static_cast<float>(hs));
    In x(qkv, compute, ex_);
    Out s(scores, compute, ex_);
    Out p(probs, softmax, ex_);
    Out o(out, compute, ex_);
    const bool round_p = compute != Format::kFP32 && compute != softmax;
    const auto TT = static_cast<std::size_t>(T * T);
    auto pc = pool_.get(TT * static_cast<std::size_t>(workers_.threads()));
    for_heads(B * NH, T * T * hs, [&](std::size_t task, int slot) {
      const auto b = static_cast<std::int64_t>(task) / NH, h = static_cast<std::int64_t>(task) % NH;
      const float* q = x.get() + b * T * C3 + h * hs;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* sr = s.get() + (b * NH + h) * T * T;
      float* pr = p.get() + (b * NH + h) * T * T;
      // A fault in this head's (T,T) block, before the rounding that every element gets.
      const auto inject = [&](const std::optional<ElementFault>& f, float* block) {
        const std::int64_t at = f ? f->index - (b * NH + h) * T * T : -1;
        if (at >= 0 && at < T * T) block[at] = f->value;
      };
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(T), int(T), int(hs), alpha, q,
                  int(C3), k, int(C3), 0.0f, sr, int(T));
      for (std::int64_t i = 0; i < T; ++i) std::fill(sr + i * T + i + 1, sr + (i + 1) * T, 0.0f);
      inject(faults.scores, sr);
      // The stored scores are what the softmax reads.
      if (compute != Format::kFP32) round_through(sr, TT, compute);
      for (std::int64_t i = 0; i < T; ++i) {
        const float* srow = sr + i * T;
        float* prow = pr + i * T;
        float mx = -INFINITY;
        for (std::int64_t j = 0; j <= i; ++j) mx = std::max(mx, srow[j]);
        kernels_.exp_shifted(srow, mx, 0.0f, prow, static_cast<std::size_t>(i + 1));
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
                  int(T), v, int(C3), 0.0f, o.get() + b * T * C + h * hs, int(C));
    });
    s.commit();
    p.commit();
    o.commit();
  }

  void attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                          const Tensor& probs, int n_head, Format compute,
                          Format softmax) override {
    const std::int64_t B = qkv.dim(0), T = qkv.dim(1), C3 = qkv.dim(2), C = C3 / 3, NH = n_head,
                       hs = C / NH;
    const float alpha = 1.0f / std::sqrt(static_cast<float>(hs));
    In x(qkv, compute, ex_), d(dout, compute, ex_), p(probs, softmax, ex_);
    Out dx(dqkv, compute, ex_);
    const auto TT = static_cast<std::size_t>(T * T);
    auto scratch = pool_.get(3 * TT * static_cast<std::size_t>(workers_.threads()));
    const bool round_p = compute != Format::kFP32 && compute != softmax;
    for_heads(B * NH, T * T * hs, [&](std::size_t task, int slot) {
      const auto b = static_cast<std::int64_t>(task) / NH, h = static_cast<std::int64_t>(task) % NH;
      float* dp = scratch.data() + static_cast<std::size_t>(slot) * 3 * TT;
      float* ds = dp + TT;
      float* pc = ds + TT;
      const float* q = x.get() + b * T * C3 + h * hs;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* dq = dx.get() + b * T * C3 + h * hs;
      float* dk = dq + C;
      float* dv = dq + 2 * C;
      const float* dctx = d.get() + b * T * C + h * hs;
      const float* pr = p.get() + (b * NH + h) * T * T;
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
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(T), int(hs), int(T), 1.0f, pm,
                  int(T), dctx, int(C), 0.0f, dv, int(C3));
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
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(T), int(hs), int(T), alpha, ds,
                  int(T), q, int(C3), 0.0f, dk, int(C3));
    });
    dx.commit();
  }

  void gelu_forward(const Tensor& out, const Tensor& inp, Format compute) override {
    check_same_numel(out, inp, "gelu_forward");
    In x(inp, compute, ex_);
    Out o(out, compute, ex_);
    for_chunks(workers_, static_cast<std::size_t>(inp.numel()), [&](std::size_t b, std::size_t e) {
      kernels_.gelu_forward(x.get() + b, o.get() + b, e - b);
    });
    o.commit();
  }

  void gelu_backward(const Tensor& dinp, const Tensor& dout, const Tensor& inp,
                     Format compute) override {
    In x(inp, compute, ex_), d(dout, compute, ex_);
    Out di(dinp, compute, ex_);
    for_chunks(workers_, static_cast<std::size_t>(inp.numel()), [&](std::size_t b, std::size_t e) {
      kernels_.gelu_backward(x.get() + b, d.get() + b, di.get() + b, e - b);
    });
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
    const std::size_t rows = rows_per_task(V);
    const auto uv = static_cast<std::size_t>(V), un = static_cast<std::size_t>(N);
    workers_.run((un + rows - 1) / rows, [&](std::size_t task, int) {
      for (std::size_t i = task * rows; i < std::min(un, (task + 1) * rows); ++i) {
        const float* xr = x.get() + i * uv;
        float* pr = p.get() + i * uv;
        float mx = -INFINITY;
        for (std::size_t j = 0; j < uv; ++j) mx = std::max(mx, xr[j]);
        kernels_.exp_shifted(xr, mx, 0.0f, pr, uv);
        float sum = 0.0f;
        for (std::size_t j = 0; j < uv; ++j) sum += pr[j];
        const float log_sum = std::log(sum);
        kernels_.exp_shifted(xr, mx, log_sum, pr, uv);
        l[i] = log_sum + mx - xr[targets[i]];
      }
    });
    p.commit();
    l.commit();
  }

  void cross_entropy_backward(const Tensor& dlogits, const Tensor& probs,
                              const std::int32_t* targets, float dloss, Format compute) override {
    const std::int64_t V = probs.dim(probs.rank - 1), N = probs.numel() / V;
    In p(probs, Format::kFP32, ex_);
    Out d(dlogits, compute, ex_);
    const std::size_t rows = rows_per_task(V);
    const auto uv = static_cast<std::size_t>(V), un = static_cast<std::size_t>(N);
    workers_.run((un + rows - 1) / rows, [&](std::size_t task, int) {
      for (std::size_t i = task * rows; i < std::min(un, (task + 1) * rows); ++i) {
        const float* pr = p.get() + i * uv;
        float* dr = d.get() + i * uv;
        kernels_.scale(pr, dloss, dr, uv);
        dr[targets[i]] = (pr[targets[i]] - 1.0f) * dloss;
      }
    });
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
  // fn(task, slot) for each (sequence, head). Heads run in parallel while OpenBLAS runs each of
  // their products on one thread (it threads an sgemm above m*n*k = 65536 * 4, its default
  // GEMM_MULTITHREAD_THRESHOLD); larger heads run one after another with each product on
  // OpenBLAS's threads, rather than two levels of threads competing for the cores.
  template <class Fn>
  void for_heads(std::int64_t heads, std::int64_t product_mnk, const Fn& fn) {
    const auto count = static_cast<std::size_t>(heads);
    if (product_mnk <= 65536 * 4) {
      workers_.run(count, fn);
      return;
    }
    for (std::size_t i = 0; i < count; ++i) fn(i, 0);
  }

  CpuStream stream_;
  ScratchPool pool_;
  Workers workers_;
  Kernels kernels_;
  Exec ex_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

}  // namespace ampscope::trainer
