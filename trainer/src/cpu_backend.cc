// The CPU back end. Tensors live in host memory in their storage dtype (FP32, or FP16/BF16 bit
// patterns). Each operation reads its inputs into FP32 working copies rounded to the compute
// format (no copy for FP32 tensors computed in FP32), does FP32 arithmetic (matmuls through
// OpenBLAS cblas_sgemm: FP16/BF16-rounded inputs, FP32 accumulation, which is what tensor
// cores do), rounds results to the compute format and stores them in the output's dtype with
// ampscope::convert_from_fp32 / round_through (round to nearest even, overflow to Inf).
// Working copies come from a pool so steady-state steps do not allocate.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "ampscope/check.h"
#include "ampscope/convert.h"
#include "ampscope/trainer/backend.h"

namespace ampscope::trainer {
namespace {

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


// Values of `t` as FP32, rounded to `compute`.
class In {
 public:
  In(const Tensor& t, Format compute, ScratchPool& pool) {
    const auto n = static_cast<std::size_t>(t.numel());
    const bool needs_round = compute != Format::kFP32 && compute != t.dtype;
    if (t.dtype == Format::kFP32 && !needs_round) {
      ptr_ = static_cast<const float*>(t.data);
      return;
    }
    scratch_ = std::make_unique<ScratchPool::Handle>(pool.get(n));
    float* s = scratch_->data();
    convert_to_fp32(t.data, s, n, t.dtype);
    if (needs_round) round_through(s, n, compute);
    ptr_ = s;
  }
  const float* get() const { return ptr_; }
  float operator[](std::size_t i) const { return ptr_[i]; }

 private:
  const float* ptr_ = nullptr;
  std::unique_ptr<ScratchPool::Handle> scratch_;
};

// An FP32 target for a result of `t`; commit() rounds it to `compute` and stores it in t.dtype.
// With accumulate, the FP32 target starts at zero and commit() adds it into t.
class Out {
 public:
  Out(const Tensor& t, Format compute, ScratchPool& pool, bool accumulate = false)
      : t_(t), compute_(compute), accumulate_(accumulate), n_(static_cast<std::size_t>(t.numel())) {
    if (t.dtype == Format::kFP32 && !accumulate) {
      ptr_ = static_cast<float*>(t.data);
    } else {
      scratch_ = std::make_unique<ScratchPool::Handle>(pool.get(n_));
      ptr_ = scratch_->data();
      if (accumulate) std::fill(ptr_, ptr_ + n_, 0.0f);
    }
    pool_ = &pool;
  }
  float* get() { return ptr_; }
  float& operator[](std::size_t i) { return ptr_[i]; }

  void commit() {
    if (compute_ != Format::kFP32) round_through(ptr_, n_, compute_);
    if (!accumulate_) {
      if (t_.dtype != Format::kFP32) convert_from_fp32(ptr_, t_.data, n_, t_.dtype);
      return;
    }
    if (t_.dtype == Format::kFP32) {
      auto* o = static_cast<float*>(t_.data);
      for (std::size_t i = 0; i < n_; ++i) o[i] += ptr_[i];
      return;
    }
    auto cur = pool_->get(n_);
    convert_to_fp32(t_.data, cur.data(), n_, t_.dtype);
    for (std::size_t i = 0; i < n_; ++i) cur.data()[i] += ptr_[i];
    convert_from_fp32(cur.data(), t_.data, n_, t_.dtype);
  }

 private:
  Tensor t_;
  Format compute_;
  bool accumulate_;
  std::size_t n_;
  float* ptr_ = nullptr;
  std::unique_ptr<ScratchPool::Handle> scratch_;
  ScratchPool* pool_ = nullptr;
};

void check_same_numel(const Tensor& a, const Tensor& b, const char* what) {
  AMPSCOPE_CHECK(a.numel() == b.numel(), what, ": expected ", a.numel(), " elements, found ",
                 b.numel());
}

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)

// tanh through one expf: glibc's expf is several times faster than tanhf, and GELU dominated
// the profile. Absolute error ~1e-7 near 0 (cancellation), which GELU's 0.5 x (1 + t) absorbs.
inline float fast_tanh(float u) {
  const float e = std::exp(2.0f * std::min(u, 40.0f));
  return 1.0f - 2.0f / (e + 1.0f);
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& options) {
    if (options.blas_threads > 0) openblas_set_num_threads(options.blas_threads);
  }

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
      std::fill_n(static_cast<float*>(t.data), n, value);
      return;
    }
    auto s = pool_.get(n);
    std::fill_n(s.data(), n, value);
    convert_from_fp32(s.data(), t.data, n, t.dtype);
  }

  void convert(const Tensor& dst, const Tensor& src) override {
    check_same_numel(dst, src, "convert");
    In in(src, Format::kFP32, pool_);
    convert_from_fp32(in.get(), dst.data, static_cast<std::size_t>(dst.numel()), dst.dtype);
  }

  void add(const Tensor& out, const Tensor& a, const Tensor& b, Format compute) override {
    check_same_numel(out, a, "add");
    check_same_numel(out, b, "add");
    In x(a, compute, pool_), y(b, compute, pool_);
    Out o(out, compute, pool_);
    const auto n = static_cast<std::size_t>(out.numel());
    for (std::size_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
    o.commit();
  }

  void set_element(const Tensor& t, std::int64_t index, float value) override {
    AMPSCOPE_CHECK(index >= 0 && index < t.numel(), "index ", index, " outside [0, ", t.numel(),
                   ")");
    convert_from_fp32(&value,
                      static_cast<std::byte*>(t.data) + index * storage_bytes(t.dtype), 1,
                      t.dtype);
  }

  void embedding_forward(const Tensor& out, const std::int32_t* tokens, const Tensor& wte,
                         const Tensor& wpe) override {
    const std::int64_t B = out.dim(0), T = out.dim(1), C = out.dim(2), V = wte.dim(0);
    AMPSCOPE_CHECK(wte.dim(1) == C && wpe.dim(1) == C && wpe.dim(0) >= T,
                   "embedding tables do not match the output shape");
    In e(wte, Format::kFP32, pool_), p(wpe, Format::kFP32, pool_);
    Out o(out, out.dtype, pool_);
    for (std::int64_t bt = 0; bt < B * T; ++bt) {
      const std::int32_t tok = tokens[bt];
      AMPSCOPE_CHECK(tok >= 0 && tok < V, "token ", tok, " outside the vocabulary of ", V);
      const float* er = e.get() + tok * C;
      const float* pr = p.get() + (bt % T) * C;
      float* orow = o.get() + bt * C;
      for (std::int64_t c = 0; c < C; ++c) orow[c] = er[c] + pr[c];
    }
    o.commit();
  }

  void embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                          const std::int32_t* tokens) override {
    const std::int64_t B = dout.dim(0), T = dout.dim(1), C = dout.dim(2);
    In d(dout, Format::kFP32, pool_);
    Out we(dwte, dwte.dtype, pool_, /*accumulate=*/true);
    Out pe(dwpe, dwpe.dtype, pool_, /*accumulate=*/true);
    for (std::int64_t bt = 0; bt < B * T; ++bt) {
      const float* dr = d.get() + bt * C;
      float* wr = we.get() + tokens[bt] * C;
      float* pr = pe.get() + (bt % T) * C;
      for (std::int64_t c = 0; c < C; ++c) {
        wr[c] += dr[c];
        pr[c] += dr[c];
      }
    }
    we.commit();
    pe.commit();
  }

  void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                         const Tensor& inp, const Tensor& weight, const Tensor& bias,
                         Format compute) override {
    const std::int64_t C = inp.dim(inp.rank - 1), N = inp.numel() / C;
    check_same_numel(out, inp, "layernorm_forward");
    In x(inp, compute, pool_), w(weight, compute, pool_), b(bias, compute, pool_);
    Out o(out, compute, pool_);
    auto* mu = static_cast<float*>(mean.data);
    auto* rs = static_cast<float*>(rstd.data);
    for (std::int64_t i = 0; i < N; ++i) {
      const float* xr = x.get() + i * C;
      float m = 0.0f;
      for (std::int64_t c = 0; c < C; ++c) m += xr[c];
      m /= static_cast<float>(C);
      float var = 0.0f;
      for (std::int64_t c = 0; c < C; ++c) var += (xr[c] - m) * (xr[c] - m);
      var /= static_cast<float>(C);
      const float r = 1.0f / std::sqrt(var + 1e-5f);
      float* orow = o.get() + i * C;
      for (std::int64_t c = 0; c < C; ++c) orow[c] = (xr[c] - m) * r * w[c] + b[c];
      mu[i] = m;
      rs[i] = r;
    }
    o.commit();
  }

  void layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                          const Tensor& dout, const Tensor& inp, const Tensor& weight,
                          const Tensor& mean, const Tensor& rstd, Format compute) override {
    const std::int64_t C = inp.dim(inp.rank - 1), N = inp.numel() / C;
    In x(inp, compute, pool_), w(weight, compute, pool_), d(dout, compute, pool_);
    Out di(dinp, compute, pool_, true), dw(dweight, compute, pool_, true),
        db(dbias, compute, pool_, true);
    const auto* mu = static_cast<const float*>(mean.data);
    const auto* rs = static_cast<const float*>(rstd.data);
    for (std::int64_t i = 0; i < N; ++i) {
      const float* xr = x.get() + i * C;
      const float* dr = d.get() + i * C;
      float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
      for (std::int64_t c = 0; c < C; ++c) {
        const float norm = (xr[c] - mu[i]) * rs[i];
        const float dnorm = w[c] * dr[c];
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * norm;
      }
      dnorm_mean /= static_cast<float>(C);
      dnorm_norm_mean /= static_cast<float>(C);
      float* dir = di.get() + i * C;
      for (std::int64_t c = 0; c < C; ++c) {
        const float norm = (xr[c] - mu[i]) * rs[i];
        const float dnorm = w[c] * dr[c];
        db[c] += dr[c];
        dw[c] += norm * dr[c];
        dir[c] = (dnorm - dnorm_mean - norm * dnorm_norm_mean) * rs[i];
      }
    }
    di.commit();
    dw.commit();
    db.commit();
  }

  void matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight,
                      const Tensor& bias, Format compute) override {
    const std::int64_t C = inp.dim(inp.rank - 1), N = inp.numel() / C, OC = weight.dim(0);
    AMPSCOPE_CHECK(weight.dim(1) == C, "matmul weight has ", weight.dim(1), " columns, input ",
                   C);
    AMPSCOPE_CHECK(out.numel() == N * OC, "matmul output has ", out.numel(), " elements, expected ",
                   N * OC);
    In x(inp, compute, pool_), w(weight, compute, pool_);
    Out o(out, compute, pool_);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(N), int(OC), int(C), 1.0f, x.get(),
                int(C), w.get(), int(C), 0.0f, o.get(), int(OC));
    if (!bias.empty()) {
      In b(bias, compute, pool_);
      for (std::int64_t i = 0; i < N; ++i) {
        float* orow = o.get() + i * OC;
        for (std::int64_t j = 0; j < OC; ++j) orow[j] += b[j];
      }
    }
    o.commit();
  }

  void matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                       const Tensor& dout, const Tensor& inp, const Tensor& weight,
                       Format compute) override {
    const std::int64_t C = inp.dim(inp.rank - 1), N = inp.numel() / C, OC = weight.dim(0);
    In d(dout, compute, pool_);
    if (!dinp.empty()) {
      In w(weight, compute, pool_);
      Out di(dinp, compute, pool_);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(N), int(C), int(OC), 1.0f,
                  d.get(), int(OC), w.get(), int(C), 0.0f, di.get(), int(C));
      di.commit();
    }
    {
      In x(inp, compute, pool_);
      Out dw(dweight, compute, pool_, true);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(OC), int(C), int(N), 1.0f,
                  d.get(), int(OC), x.get(), int(C), 0.0f, dw.get(), int(C));
      dw.commit();
    }
    if (!dbias.empty()) {
      Out db(dbias, compute, pool_, true);
      for (std::int64_t i = 0; i < N; ++i) {
        const float* dr = d.get() + i * OC;
        for (std::int64_t j = 0; j < OC; ++j) db[j] += dr[j];
      }
      db.commit();
    }
  }

  void attention_forward(const Tensor& out, const Tensor& scores, const Tensor& probs,
                         const Tensor& qkv, int n_head, Format compute, Format softmax) override {
    const std::int64_t B = qkv.dim(0), T = qkv.dim(1), C3 = qkv.dim(2), C = C3 / 3,
                       NH = n_head, hs = C / NH;
    AMPSCOPE_CHECK(C % NH == 0, "channels ", C, " not divisible by ", NH, " heads");
    const float alpha = 1.0f / std::sqrt(static_cast<float>(hs));
    In x(qkv, compute, pool_);
    Out s(scores, compute, pool_);
    Out p(probs, softmax, pool_);
    Out o(out, compute, pool_);
    const bool round_p = compute != Format::kFP32 && compute != softmax;
    auto pc = pool_.get(static_cast<std::size_t>(T * T));
    for (std::int64_t b = 0; b < B; ++b) {
      for (std::int64_t h = 0; h < NH; ++h) {
        const float* q = x.get() + b * T * C3 + h * hs;
        const float* k = q + C;
        const float* v = q + 2 * C;
        float* sr = s.get() + (b * NH + h) * T * T;
        float* pr = p.get() + (b * NH + h) * T * T;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(T), int(T), int(hs), alpha, q,
                    int(C3), k, int(C3), 0.0f, sr, int(T));
        for (std::int64_t i = 0; i < T; ++i) {
          float* srow = sr + i * T;
          for (std::int64_t j = i + 1; j < T; ++j) srow[j] = 0.0f;
          // The stored scores are what the softmax reads.
          if (compute != Format::kFP32) round_through(srow, static_cast<std::size_t>(i + 1), compute);
          float mx = -INFINITY;
          for (std::int64_t j = 0; j <= i; ++j) mx = std::max(mx, srow[j]);
          float sum = 0.0f;
          float* prow = pr + i * T;
          for (std::int64_t j = 0; j <= i; ++j) {
            prow[j] = std::exp(srow[j] - mx);
            sum += prow[j];
          }
          const float inv = 1.0f / sum;
          for (std::int64_t j = 0; j <= i; ++j) prow[j] *= inv;
          for (std::int64_t j = i + 1; j < T; ++j) prow[j] = 0.0f;
        }
        // The product reads probs rounded to the softmax format, then to compute.
        if (softmax != Format::kFP32) round_through(pr, static_cast<std::size_t>(T * T), softmax);
        const float* pm = pr;
        if (round_p) {
          std::copy_n(pr, T * T, pc.data());
          round_through(pc.data(), static_cast<std::size_t>(T * T), compute);
          pm = pc.data();
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(T), int(hs), int(T), 1.0f, pm,
                    int(T), v, int(C3), 0.0f, o.get() + b * T * C + h * hs, int(C));
      }
    }
    s.commit();
    p.commit();
    o.commit();
  }

  void attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                          const Tensor& probs, int n_head, Format compute,
                          Format softmax) override {
    const std::int64_t B = qkv.dim(0), T = qkv.dim(1), C3 = qkv.dim(2), C = C3 / 3,
                       NH = n_head, hs = C / NH;
    const float alpha = 1.0f / std::sqrt(static_cast<float>(hs));
    In x(qkv, compute, pool_), d(dout, compute, pool_), p(probs, softmax, pool_);
    Out dx(dqkv, compute, pool_);
    const auto TT = static_cast<std::size_t>(T * T);
    auto dp = pool_.get(TT), ds = pool_.get(TT), pc = pool_.get(TT);
    const bool round_p = compute != Format::kFP32 && compute != softmax;
    for (std::int64_t b = 0; b < B; ++b) {
      for (std::int64_t h = 0; h < NH; ++h) {
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
          std::copy_n(pr, TT, pc.data());
          round_through(pc.data(), TT, compute);
          pm = pc.data();
        }
        // dP = dctx v^T, dV = P^T dctx (in compute).
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(T), int(T), int(hs), 1.0f, dctx,
                    int(C), v, int(C3), 0.0f, dp.data(), int(T));
        if (compute != Format::kFP32) round_through(dp.data(), TT, compute);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(T), int(hs), int(T), 1.0f, pm,
                    int(T), dctx, int(C), 0.0f, dv, int(C3));
        // Softmax backward in the softmax format; the result is the gradient of the scores,
        // which are stored in compute.
        for (std::int64_t i = 0; i < T; ++i) {
          const float* prow = pr + i * T;
          const float* dprow = dp.data() + i * T;
          float* dsrow = ds.data() + i * T;
          float dot = 0.0f;
          for (std::int64_t j = 0; j <= i; ++j) dot += prow[j] * dprow[j];
          for (std::int64_t j = 0; j <= i; ++j) dsrow[j] = prow[j] * (dprow[j] - dot);
          for (std::int64_t j = i + 1; j < T; ++j) dsrow[j] = 0.0f;
        }
        if (softmax != Format::kFP32) round_through(ds.data(), TT, softmax);
        if (compute != Format::kFP32) round_through(ds.data(), TT, compute);
        // dQ = alpha dS k, dK = alpha dS^T q.
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(T), int(hs), int(T), alpha,
                    ds.data(), int(T), k, int(C3), 0.0f, dq, int(C3));
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(T), int(hs), int(T), alpha,
                    ds.data(), int(T), q, int(C3), 0.0f, dk, int(C3));
      }
    }
    dx.commit();
  }

  void gelu_forward(const Tensor& out, const Tensor& inp, Format compute) override {
    check_same_numel(out, inp, "gelu_forward");
    In x(inp, compute, pool_);
    Out o(out, compute, pool_);
    const auto n = static_cast<std::size_t>(inp.numel());
    for (std::size_t i = 0; i < n; ++i) {
      const float v = x[i];
      const float cube = 0.044715f * v * v * v;
      o[i] = 0.5f * v * (1.0f + fast_tanh(kGeluScale * (v + cube)));
    }
    o.commit();
  }

  void gelu_backward(const Tensor& dinp, const Tensor& dout, const Tensor& inp,
                     Format compute) override {
    In x(inp, compute, pool_), d(dout, compute, pool_);
    Out di(dinp, compute, pool_);
    const auto n = static_cast<std::size_t>(inp.numel());
    for (std::size_t i = 0; i < n; ++i) {
      const float v = x[i];
      const float cube = 0.044715f * v * v * v;
      const float t = fast_tanh(kGeluScale * (v + cube));
      const float sech2 = 1.0f - t * t;
      const float grad =
          0.5f * (1.0f + t) + 0.5f * v * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * v * v);
      di[i] = grad * d[i];
    }
    di.commit();
  }

  void cross_entropy_forward(const Tensor& losses, const Tensor& probs, const Tensor& logits,
                             const std::int32_t* targets, Format compute) override {
    const std::int64_t V = logits.dim(logits.rank - 1), N = logits.numel() / V;
    In x(logits, compute, pool_);
    Out p(probs, compute, pool_);
    Out l(losses, compute, pool_);
    for (std::int64_t i = 0; i < N; ++i) {
      const float* xr = x.get() + i * V;
      float* pr = p.get() + i * V;
      float mx = -INFINITY;
      for (std::int64_t j = 0; j < V; ++j) mx = std::max(mx, xr[j]);
      float sum = 0.0f;
      for (std::int64_t j = 0; j < V; ++j) sum += std::exp(xr[j] - mx);
      const float log_sum = std::log(sum);
      for (std::int64_t j = 0; j < V; ++j) pr[j] = std::exp(xr[j] - mx - log_sum);
      const std::int32_t t = targets[i];
      AMPSCOPE_CHECK(t >= 0 && t < V, "target ", t, " outside the vocabulary of ", V);
      l[static_cast<std::size_t>(i)] = log_sum + mx - xr[t];
    }
    p.commit();
    l.commit();
  }

  void cross_entropy_backward(const Tensor& dlogits, const Tensor& probs,
                              const std::int32_t* targets, float dloss, Format compute) override {
    const std::int64_t V = probs.dim(probs.rank - 1), N = probs.numel() / V;
    In p(probs, Format::kFP32, pool_);
    Out d(dlogits, compute, pool_);
    for (std::int64_t i = 0; i < N; ++i) {
      const float* pr = p.get() + i * V;
      float* dr = d.get() + i * V;
      for (std::int64_t j = 0; j < V; ++j) dr[j] = pr[j] * dloss;
      dr[targets[i]] = (pr[targets[i]] - 1.0f) * dloss;
    }
    d.commit();
  }

  void unscale_and_check(const Tensor& grads, float inv_scale, const Tensor& found_inf) override {
    In g(grads, Format::kFP32, pool_);
    Out o(grads, Format::kFP32, pool_);
    const auto n = static_cast<std::size_t>(grads.numel());
    bool bad = false;
    for (std::size_t i = 0; i < n; ++i) {
      const float v = g[i];
      bad |= !std::isfinite(v);
      o[i] = v * inv_scale;
    }
    o.commit();
    if (bad) *static_cast<float*>(found_inf.data) = 1.0f;
  }

  void sum_squares(const Tensor& sum_sq, const Tensor& x) override {
    In g(x, Format::kFP32, pool_);
    const auto n = static_cast<std::size_t>(x.numel());
    double acc = 0.0;
    for (std::size_t i = 0; i < n; ++i) acc += static_cast<double>(g[i]) * g[i];
    *static_cast<float*>(sum_sq.data) = static_cast<float>(acc);
  }

  void scale(const Tensor& x, float factor) override {
    In g(x, Format::kFP32, pool_);
    Out o(x, Format::kFP32, pool_);
    const auto n = static_cast<std::size_t>(x.numel());
    for (std::size_t i = 0; i < n; ++i) o[i] = g[i] * factor;
    o.commit();
  }

  void adamw(const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,
             const AdamWParams& hp) override {
    check_same_numel(params, grads, "adamw");
    check_same_numel(params, m, "adamw");
    check_same_numel(params, v, "adamw");
    In g(grads, Format::kFP32, pool_), pin(params, Format::kFP32, pool_),
        min(m, Format::kFP32, pool_), vin(v, Format::kFP32, pool_);
    Out po(params, Format::kFP32, pool_), mo(m, Format::kFP32, pool_),
        vo(v, Format::kFP32, pool_);
    const auto n = static_cast<std::size_t>(params.numel());
    const float bc1 = 1.0f - std::pow(hp.beta1, static_cast<float>(hp.step));
    const float bc2 = 1.0f - std::pow(hp.beta2, static_cast<float>(hp.step));
    const float decay = 1.0f - hp.lr * hp.weight_decay;
    for (std::size_t i = 0; i < n; ++i) {
      const float gi = g[i];
      const float mi = hp.beta1 * min[i] + (1.0f - hp.beta1) * gi;
      const float vi = hp.beta2 * vin[i] + (1.0f - hp.beta2) * gi * gi;
      const float mhat = mi / bc1;
      const float vhat = vi / bc2;
      po[i] = pin[i] * decay - hp.lr * mhat / (std::sqrt(vhat) + hp.eps);
      mo[i] = mi;
      vo[i] = vi;
    }
    po.commit();
    mo.commit();
    vo.commit();
  }

 private:
  CpuStream stream_;
  ScratchPool pool_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

}  // namespace ampscope::trainer
