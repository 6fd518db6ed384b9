// The CUDA back end against the CPU back end (the reference), operation by operation,
// parameterised over precision (backend_test_util.h: pure FP32/FP16/BF16 and AMP's mixed
// cases) x shape (1s, primes, sizes around the warp and block widths). Skips itself without a
// device.
//
// Two kinds of inputs:
//   - "grid" values (multiples of 1/8 in [-1, 1]) for the products: every FP32 sum of their
//     products is exact whatever the order, and with head sizes that are powers of 4 the
//     attention scale 1/sqrt(hs) is a power of two, so matmul results must match bit for bit.
//     That pins down layouts, transposes, batch strides, bias, rounding and accumulation.
//   - normal random values elsewhere, compared with the tolerance table of backend_test_util.h.
// Attention's softmax (exponentials, sums in another order) can move a probability by an ulp of
// its format; that feeds the next product, so attention outputs get 4x the table.
#include "cuda_backend.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "../../kernels/cuda/recipe_cases.h"  // same_counts
#include "ampscope/check.h"
#include "ampscope/cuda/device.h"
#include "ampscope/tensor_stats.h"
#include "ampscope/trainer/backend.h"
#include "ampscope/trainer/precision.h"
#include "backend_test_util.h"

namespace ampscope::trainer::testing {
namespace {

using ::ampscope::cuda::testing::same_counts;

constexpr const char* kNoDevice = "no CUDA driver or device on this machine";

struct Shape {
  const char* name;
  std::int64_t B, T, C, NH, V;
};
void PrintTo(const Shape& s, std::ostream* os) { *os << s.name; }

// Head sizes C/NH are powers of 4 (exact attention scale); T, C and V include 1, primes and
// values just off multiples of 32 and 256.
constexpr Shape kShapes[] = {
    {"b1_t1_c4_v3", 1, 1, 4, 1, 3},
    {"b2_t7_c48_v13", 2, 7, 48, 3, 13},
    {"b3_t33_c80_v37", 3, 33, 80, 5, 37},
    {"b2_t64_c256_v257", 2, 64, 256, 4, 257},
    {"b1_t127_c64_v1009", 1, 127, 64, 16, 1009},
};

std::vector<float> grid_values(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(-8, 8);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(dist(rng)) * 0.125f;
  return v;
}

Tensor view(void* data, Format f, const std::vector<std::int64_t>& shape, Device d) {
  Tensor t;
  t.data = data;
  t.dtype = f;
  t.device = d;
  t.rank = static_cast<int>(shape.size());
  for (std::size_t i = 0; i < shape.size(); ++i) t.dims[i] = shape[i];
  return t;
}

using Param = std::tuple<Precision, Shape>;

class CudaBackendTest : public ::testing::TestWithParam<Param> {
 protected:
  // The same values on both back ends: host memory for the CPU one, a device buffer for CUDA.
  struct Twin {
    Bits host;
    std::unique_ptr<Buffer> device;
    std::vector<std::int64_t> shape;
    Tensor cpu() { return view(host.data(), host.dtype, shape, Device::kCpu); }
    Tensor gpu() { return view(device->data(), host.dtype, shape, Device::kCuda); }
  };

  void SetUp() override {
    if (!cuda::cuda_device_available()) GTEST_SKIP() << kNoDevice;
    gpu_ = make_cuda_backend();
  }

  const Precision& p() const { return std::get<0>(GetParam()); }
  const Shape& s() const { return std::get<1>(GetParam()); }

  Twin twin(Bits bits, std::vector<std::int64_t> shape) {
    Twin t{std::move(bits), nullptr, std::move(shape)};
    t.device = gpu_->allocate(t.host.bytes.size());
    gpu_->copy_from_host(t.device->data(), t.host.data(), t.host.bytes.size());
    return t;
  }
  Twin random(Format f, std::vector<std::int64_t> shape, std::uint32_t seed, float scale = 1.0f) {
    return twin(random_bits(numel(shape), f, seed, scale), std::move(shape));
  }
  Twin grid(Format f, std::vector<std::int64_t> shape, std::uint32_t seed) {
    return twin(Bits::from(grid_values(numel(shape), seed), f), std::move(shape));
  }
  Twin zeros(Format f, std::vector<std::int64_t> shape) {
    return twin(Bits(f, numel(shape)), std::move(shape));
  }
  Bits download(Twin& t) {
    Bits out(t.host.dtype, t.host.size());
    gpu_->copy_to_host(out.data(), t.device->data(), out.bytes.size());
    return out;
  }
  // Tokens or targets in [0, V), on both back ends.
  struct Ids {
    std::vector<std::int32_t> host;
    std::unique_ptr<Buffer> device;
    const std::int32_t* gpu() const { return static_cast<const std::int32_t*>(device->data()); }
  };
  Ids ids(std::int64_t n, std::int64_t V, std::uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<std::int32_t> dist(0, static_cast<std::int32_t>(V - 1));
    Ids r;
    r.host.resize(static_cast<std::size_t>(n));
    for (auto& x : r.host) x = dist(rng);
    r.device = gpu_->allocate(r.host.size() * sizeof(std::int32_t));
    gpu_->copy_from_host(r.device->data(), r.host.data(), r.host.size() * sizeof(std::int32_t));
    return r;
  }

  static std::size_t numel(const std::vector<std::int64_t>& shape) {
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    return static_cast<std::size_t>(n);
  }

  Tolerance table() const { return reduction_tolerance(p().compute, p().out); }

  std::unique_ptr<Backend> cpu_ = make_cpu_backend({.blas_threads = 1});
  std::unique_ptr<Backend> gpu_;
};

TEST_P(CudaBackendTest, FillMatchesCpu) {
  const std::int64_t n = s().B * s().T * s().C;
  for (float value : {0.0f, -1.5f, 70000.0f, 1.0f + 0x1p-12f}) {
    Twin t = random(p().out, {n}, 1);
    cpu_->fill(t.cpu(), value);
    gpu_->fill(t.gpu(), value);
    EXPECT_TRUE(same_bits(t.host, download(t))) << value;
  }
}

TEST_P(CudaBackendTest, ConvertMatchesCpu) {
  const std::int64_t n = s().B * s().T * s().C;
  Twin src = random(p().in, {n}, 2, 1000.0f), dst = zeros(p().out, {n});
  cpu_->convert(dst.cpu(), src.cpu());
  gpu_->convert(dst.gpu(), src.gpu());
  EXPECT_TRUE(same_bits(dst.host, download(dst)));
}

TEST_P(CudaBackendTest, AddMatchesCpu) {
  const std::int64_t n = s().B * s().T * s().C;
  Twin a = random(p().in, {n}, 3, 100.0f), b = random(p().in, {n}, 4), out = zeros(p().out, {n});
  cpu_->add(out.cpu(), a.cpu(), b.cpu(), p().compute);
  gpu_->add(out.gpu(), a.gpu(), b.gpu(), p().compute);
  EXPECT_TRUE(same_bits(out.host, download(out)));
}

TEST_P(CudaBackendTest, SetElementMatchesCpu) {
  const std::int64_t n = s().B * s().T * s().C;
  Twin t = random(p().out, {n}, 5);
  for (float value : {NAN, INFINITY, 131072.0f}) {
    cpu_->set_element(t.cpu(), n - 1, value);
    gpu_->set_element(t.gpu(), n - 1, value);
    EXPECT_TRUE(same_bits(t.host, download(t))) << value;
  }
}

TEST_P(CudaBackendTest, GeluMatchesCpu) {
  const std::int64_t n = s().B * s().T * 4 * s().C;
  Twin inp = random(p().in, {n}, 6, 3.0f), dout = random(p().in, {n}, 7);
  Twin out = zeros(p().out, {n}), dinp = zeros(p().out, {n});
  cpu_->gelu_forward(out.cpu(), inp.cpu(), p().compute);
  gpu_->gelu_forward(out.gpu(), inp.gpu(), p().compute);
  EXPECT_TRUE(close(out.host.values(), download(out).values(), table()));
  cpu_->gelu_backward(dinp.cpu(), dout.cpu(), inp.cpu(), p().compute);
  gpu_->gelu_backward(dinp.gpu(), dout.gpu(), inp.gpu(), p().compute);
  EXPECT_TRUE(close(dinp.host.values(), download(dinp).values(), table()));
}

TEST_P(CudaBackendTest, EmbeddingMatchesCpu) {
  const auto [name, B, T, C, NH, V] = s();
  (void)name;
  (void)NH;
  Twin wte = random(p().in, {V, C}, 8), wpe = random(p().in, {T + 3, C}, 9);
  Ids tokens = ids(B * T, V, 10);
  Twin out = zeros(p().out, {B, T, C});
  cpu_->embedding_forward(out.cpu(), tokens.host.data(), wte.cpu(), wpe.cpu());
  gpu_->embedding_forward(out.gpu(), tokens.gpu(), wte.gpu(), wpe.gpu());
  EXPECT_TRUE(same_bits(out.host, download(out)));

  // Gradients accumulate into what is there.
  Twin dout = random(p().in, {B, T, C}, 11);
  Twin dwte = random(p().out, {V, C}, 12), dwpe = random(p().out, {T + 3, C}, 13);
  cpu_->embedding_backward(dwte.cpu(), dwpe.cpu(), dout.cpu(), tokens.host.data());
  gpu_->embedding_backward(dwte.gpu(), dwpe.gpu(), dout.gpu(), tokens.gpu());
  EXPECT_TRUE(close(dwte.host.values(), download(dwte).values(), table()));
  EXPECT_TRUE(close(dwpe.host.values(), download(dwpe).values(), table()));
}

TEST_P(CudaBackendTest, EmbeddingReportsATokenOutsideTheVocabulary) {
  const auto [name, B, T, C, NH, V] = s();
  (void)name;
  (void)NH;
  Twin wte = random(p().in, {V, C}, 14), wpe = random(p().in, {T, C}, 15);
  Ids tokens = ids(B * T, V, 16);
  tokens.host.back() = static_cast<std::int32_t>(V);
  gpu_->copy_from_host(tokens.device->data(), tokens.host.data(),
                       tokens.host.size() * sizeof(std::int32_t));
  Twin out = zeros(p().out, {B, T, C});
  gpu_->embedding_forward(out.gpu(), tokens.gpu(), wte.gpu(), wpe.gpu());
  EXPECT_THROW(gpu_->stream().synchronize(), ::ampscope::Error);
  // Reported once; the back end stays usable.
  EXPECT_NO_THROW(gpu_->stream().synchronize());
}

TEST_P(CudaBackendTest, LayerNormMatchesCpu) {
  const std::int64_t N = s().B * s().T, C = s().C;
  Twin inp = random(p().in, {N, C}, 17, 2.0f), w = random(p().in, {C}, 18),
       b = random(p().in, {C}, 19);
  Twin out = zeros(p().out, {N, C}), mean = zeros(Format::kFP32, {N}),
       rstd = zeros(Format::kFP32, {N});
  cpu_->layernorm_forward(out.cpu(), mean.cpu(), rstd.cpu(), inp.cpu(), w.cpu(), b.cpu(),
                          p().compute);
  gpu_->layernorm_forward(out.gpu(), mean.gpu(), rstd.gpu(), inp.gpu(), w.gpu(), b.gpu(),
                          p().compute);
  EXPECT_TRUE(close(out.host.values(), download(out).values(), table()));
  EXPECT_TRUE(
      close(mean.host.values(), download(mean).values(), reduction_tolerance(Format::kFP32)));
  EXPECT_TRUE(
      close(rstd.host.values(), download(rstd).values(), reduction_tolerance(Format::kFP32)));

  // Backward from the CPU's statistics on both sides, into accumulating gradients.
  gpu_->copy_from_host(mean.device->data(), mean.host.data(), mean.host.bytes.size());
  gpu_->copy_from_host(rstd.device->data(), rstd.host.data(), rstd.host.bytes.size());
  Twin dout = random(p().in, {N, C}, 20);
  Twin dinp = random(p().out, {N, C}, 21), dw = random(p().out, {C}, 22),
       db = random(p().out, {C}, 23);
  cpu_->layernorm_backward(dinp.cpu(), dw.cpu(), db.cpu(), dout.cpu(), inp.cpu(), w.cpu(),
                           mean.cpu(), rstd.cpu(), p().compute);
  gpu_->layernorm_backward(dinp.gpu(), dw.gpu(), db.gpu(), dout.gpu(), inp.gpu(), w.gpu(),
                           mean.gpu(), rstd.gpu(), p().compute);
  EXPECT_TRUE(close(dinp.host.values(), download(dinp).values(), table()));
  EXPECT_TRUE(close(dw.host.values(), download(dw).values(), table()));
  EXPECT_TRUE(close(db.host.values(), download(db).values(), table()));
}

// Exact products (grid inputs): the GPU's bits must equal the CPU's.
TEST_P(CudaBackendTest, MatmulForwardIsBitExactOnExactProducts) {
  const std::int64_t N = s().B * s().T, C = s().C;
  for (std::int64_t OC : {3 * C, s().V}) {
    Twin inp = grid(p().in, {N, C}, 24), w = grid(p().in, {OC, C}, 25), b = grid(p().in, {OC}, 26);
    Twin out = zeros(p().out, {N, OC}), out_nb = zeros(p().out, {N, OC});
    cpu_->matmul_forward(out.cpu(), inp.cpu(), w.cpu(), b.cpu(), p().compute);
    gpu_->matmul_forward(out.gpu(), inp.gpu(), w.gpu(), b.gpu(), p().compute);
    EXPECT_TRUE(same_bits(out.host, download(out))) << "OC " << OC;
    cpu_->matmul_forward(out_nb.cpu(), inp.cpu(), w.cpu(), Tensor{}, p().compute);
    gpu_->matmul_forward(out_nb.gpu(), inp.gpu(), w.gpu(), Tensor{}, p().compute);
    EXPECT_TRUE(same_bits(out_nb.host, download(out_nb))) << "OC " << OC << " without bias";
  }
}

TEST_P(CudaBackendTest, MatmulBackwardIsBitExactOnExactProducts) {
  const std::int64_t N = s().B * s().T, C = s().C, OC = s().V;
  Twin inp = grid(p().in, {N, C}, 27), w = grid(p().in, {OC, C}, 28),
       dout = grid(p().in, {N, OC}, 29);
  Twin dinp = zeros(p().out, {N, C});
  // Gradients accumulate: start from grid values so the sums stay exact.
  Twin dw = grid(p().out, {OC, C}, 30), db = grid(p().out, {OC}, 31);
  cpu_->matmul_backward(dinp.cpu(), dw.cpu(), db.cpu(), dout.cpu(), inp.cpu(), w.cpu(),
                        p().compute);
  gpu_->matmul_backward(dinp.gpu(), dw.gpu(), db.gpu(), dout.gpu(), inp.gpu(), w.gpu(),
                        p().compute);
  EXPECT_TRUE(same_bits(dinp.host, download(dinp)));
  EXPECT_TRUE(same_bits(dw.host, download(dw)));
  EXPECT_TRUE(same_bits(db.host, download(db)));
  // Without dinp and dbias (the LM head's call).
  cpu_->matmul_backward(Tensor{}, dw.cpu(), Tensor{}, dout.cpu(), inp.cpu(), w.cpu(), p().compute);
  gpu_->matmul_backward(Tensor{}, dw.gpu(), Tensor{}, dout.gpu(), inp.gpu(), w.gpu(), p().compute);
  EXPECT_TRUE(same_bits(dw.host, download(dw)));
}

TEST_P(CudaBackendTest, MatmulMatchesCpuOnRandomValues) {
  const std::int64_t N = s().B * s().T, C = s().C, OC = 4 * C;
  Twin inp = random(p().in, {N, C}, 32), w = random(p().in, {OC, C}, 33, 0.1f),
       b = random(p().in, {OC}, 34);
  Twin out = zeros(p().out, {N, OC});
  cpu_->matmul_forward(out.cpu(), inp.cpu(), w.cpu(), b.cpu(), p().compute);
  gpu_->matmul_forward(out.gpu(), inp.gpu(), w.gpu(), b.gpu(), p().compute);
  EXPECT_TRUE(close(out.host.values(), download(out).values(), table()));
  Twin dout = random(p().in, {N, OC}, 35), dinp = zeros(p().out, {N, C});
  Twin dw = random(p().out, {OC, C}, 36), db = random(p().out, {OC}, 37);
  cpu_->matmul_backward(dinp.cpu(), dw.cpu(), db.cpu(), dout.cpu(), inp.cpu(), w.cpu(),
                        p().compute);
  gpu_->matmul_backward(dinp.gpu(), dw.gpu(), db.gpu(), dout.gpu(), inp.gpu(), w.gpu(),
                        p().compute);
  EXPECT_TRUE(close(dinp.host.values(), download(dinp).values(), table()));
  EXPECT_TRUE(close(dw.host.values(), download(dw).values(), table()));
  EXPECT_TRUE(close(db.host.values(), download(db).values(), table()));
}

// The FP8/FP4 modes' quantised linear layer, each mode with its recipes (gemm_recipe). The
// operands are quantised bit for bit as the CPU does them (ampscope/cuda/recipe.h), so the counts
// are equal (FP64 squared sums within 1e-9 relative: another summation order) and the products
// differ by FP32 summation order only: the table's tolerance.
constexpr PrecisionMode kScaledModes[] = {PrecisionMode::kFP8Delayed, PrecisionMode::kFP8Current,
                                          PrecisionMode::kMXFP8, PrecisionMode::kNVFP4};
constexpr double kRecipeSumRtol = 1e-9;

// An operand's recipe under `mode`, with a delayed scale that is not 1 (the trainer's comes from
// an amax history); null counts: the caller sets them.
std::optional<QuantizedOperand> recipe_for(PrecisionMode mode, GemmOperand operand, GemmUse use) {
  std::optional<Recipe> r = gemm_recipe(mode, operand, use);
  if (!r) return std::nullopt;
  if (r->scaling == Scaling::kDelayed) r->scale = operand == GemmOperand::kWeight ? 96.0f : 3.5f;
  return QuantizedOperand{*r, nullptr};
}

TEST_P(CudaBackendTest, QuantizedMatmulForwardMatchesCpu) {
  const std::int64_t N = s().B * s().T, C = s().C, OC = s().V;
  Twin inp = random(p().in, {N, C}, 41), w = random(p().in, {OC, C}, 42, 0.1f),
       b = random(p().in, {OC}, 43);
  ASSERT_TRUE(gpu_->supports_gemm_recipes());
  for (const PrecisionMode mode : kScaledModes) {
    SCOPED_TRACE(precision_name(mode));
    Twin out = zeros(p().out, {N, OC});
    RecipeCounts cpu_counts[2], gpu_counts[2];
    auto recipes = [&](RecipeCounts* counts) {
      MatmulForwardRecipes r{recipe_for(mode, GemmOperand::kInput, GemmUse::kForward),
                             recipe_for(mode, GemmOperand::kWeight, GemmUse::kForward)};
      r.inp->counts = &counts[0];
      r.weight->counts = &counts[1];
      return r;
    };
    cpu_->quantized_matmul_forward(out.cpu(), inp.cpu(), w.cpu(), b.cpu(), p().compute,
                                   recipes(cpu_counts));
    gpu_->quantized_matmul_forward(out.gpu(), inp.gpu(), w.gpu(), b.gpu(), p().compute,
                                   recipes(gpu_counts));
    EXPECT_TRUE(close(out.host.values(), download(out).values(), table()));
    for (int i = 0; i < 2; ++i) {
      EXPECT_TRUE(same_counts(cpu_counts[i], gpu_counts[i], kRecipeSumRtol)) << "operand " << i;
      EXPECT_EQ(gpu_counts[i].values, static_cast<std::uint64_t>(i == 0 ? N * C : OC * C));
    }
    // The what-if count of an operand (no GEMM) equals the quantised pass's.
    const MatmulForwardRecipes r = recipes(cpu_counts);
    EXPECT_TRUE(same_counts(cpu_counts[0],
                            gpu_->gemm_operand_counts(inp.gpu(), p().compute, r.inp->recipe),
                            kRecipeSumRtol));
    EXPECT_TRUE(same_counts(cpu_counts[1],
                            gpu_->gemm_operand_counts(w.gpu(), p().compute, r.weight->recipe),
                            kRecipeSumRtol));
  }
}

TEST_P(CudaBackendTest, QuantizedMatmulBackwardMatchesCpu) {
  const std::int64_t N = s().B * s().T, C = s().C, OC = s().V;
  Twin inp = random(p().in, {N, C}, 51), w = random(p().in, {OC, C}, 52, 0.1f),
       dout = random(p().in, {N, OC}, 53, 1e-3f);
  for (const PrecisionMode mode : kScaledModes) {
    SCOPED_TRACE(precision_name(mode));
    Twin dinp = zeros(p().out, {N, C});
    // Gradients accumulate onto what is there.
    Twin dw = random(p().out, {OC, C}, 55, 1e-3f), db = random(p().out, {OC}, 56, 1e-3f);
    // dgrad_dout, dgrad_weight, wgrad_dout, wgrad_inp; every mode quantises all four.
    RecipeCounts cpu_counts[4], gpu_counts[4];
    auto recipes = [&](RecipeCounts* counts) {
      MatmulBackwardRecipes r{recipe_for(mode, GemmOperand::kOutputGrad, GemmUse::kDgrad),
                              recipe_for(mode, GemmOperand::kWeight, GemmUse::kDgrad),
                              recipe_for(mode, GemmOperand::kOutputGrad, GemmUse::kWgrad),
                              recipe_for(mode, GemmOperand::kInput, GemmUse::kWgrad)};
      r.dgrad_dout->counts = &counts[0];
      r.dgrad_weight->counts = &counts[1];
      r.wgrad_dout->counts = &counts[2];
      r.wgrad_inp->counts = &counts[3];
      return r;
    };
    cpu_->quantized_matmul_backward(dinp.cpu(), dw.cpu(), db.cpu(), dout.cpu(), inp.cpu(), w.cpu(),
                                    p().compute, recipes(cpu_counts));
    gpu_->quantized_matmul_backward(dinp.gpu(), dw.gpu(), db.gpu(), dout.gpu(), inp.gpu(), w.gpu(),
                                    p().compute, recipes(gpu_counts));
    EXPECT_TRUE(close(dinp.host.values(), download(dinp).values(), table()));
    EXPECT_TRUE(close(dw.host.values(), download(dw).values(), table()));
    EXPECT_TRUE(close(db.host.values(), download(db).values(), table()));
    for (int i = 0; i < 4; ++i) {
      EXPECT_TRUE(same_counts(cpu_counts[i], gpu_counts[i], kRecipeSumRtol)) << "operand " << i;
    }

    // Without dinp and dbias (the LM head's call), dout's counts asked for by wgrad only: under
    // equal recipes the one pass's counts must still reach it.
    RecipeCounts cpu_rest[4], gpu_rest[4], cpu_wgrad, gpu_wgrad;
    MatmulBackwardRecipes rc = recipes(cpu_rest), rg = recipes(gpu_rest);
    rc.dgrad_dout->counts = rg.dgrad_dout->counts = nullptr;
    rc.wgrad_dout->counts = &cpu_wgrad;
    rg.wgrad_dout->counts = &gpu_wgrad;
    cpu_->quantized_matmul_backward(Tensor{}, dw.cpu(), Tensor{}, dout.cpu(), inp.cpu(), w.cpu(),
                                    p().compute, rc);
    gpu_->quantized_matmul_backward(Tensor{}, dw.gpu(), Tensor{}, dout.gpu(), inp.gpu(), w.gpu(),
                                    p().compute, rg);
    EXPECT_TRUE(close(dw.host.values(), download(dw).values(), table()));
    EXPECT_TRUE(same_counts(cpu_wgrad, gpu_wgrad, kRecipeSumRtol));
    EXPECT_EQ(gpu_wgrad.values, static_cast<std::uint64_t>(N * OC));
  }
}

TEST_P(CudaBackendTest, AttentionMatchesCpu) {
  const auto [name, B, T, C, NH, V] = s();
  (void)name;
  (void)V;
  const Format compute = p().compute;
  // AMP's softmax runs in FP32; the pure 16-bit modes run it in their own format.
  for (Format softmax : {Format::kFP32, compute}) {
    Twin qkv = grid(p().in, {B, T, 3 * C}, 38);
    Twin out = zeros(compute, {B, T, C}), scores = zeros(compute, {B, NH, T, T}),
         probs = zeros(softmax, {B, NH, T, T});
    cpu_->attention_forward(out.cpu(), scores.cpu(), probs.cpu(), qkv.cpu(), int(NH), compute,
                            softmax, {});
    gpu_->attention_forward(out.gpu(), scores.gpu(), probs.gpu(), qkv.gpu(), int(NH), compute,
                            softmax, {});
    Tolerance t = reduction_tolerance(compute, softmax);
    t.rtol *= 4;
    t.atol *= 4;
    EXPECT_TRUE(same_bits(scores.host, download(scores))) << format_name(softmax);
    EXPECT_TRUE(close(probs.host.values(), download(probs).values(), t)) << format_name(softmax);
    EXPECT_TRUE(close(out.host.values(), download(out).values(), t)) << format_name(softmax);

    // Backward from the CPU's probabilities on both sides.
    gpu_->copy_from_host(probs.device->data(), probs.host.data(), probs.host.bytes.size());
    Twin dout = grid(compute, {B, T, C}, 39), dqkv = zeros(compute, {B, T, 3 * C});
    cpu_->attention_backward(dqkv.cpu(), dout.cpu(), qkv.cpu(), probs.cpu(), int(NH), compute,
                             softmax);
    gpu_->attention_backward(dqkv.gpu(), dout.gpu(), qkv.gpu(), probs.gpu(), int(NH), compute,
                             softmax);
    EXPECT_TRUE(close(dqkv.host.values(), download(dqkv).values(), t)) << format_name(softmax);
  }
}

// With faults the device runs attention on the host through the CPU back end: the same bits.
TEST_P(CudaBackendTest, AttentionWithFaultsMatchesCpuBitForBit) {
  const auto [name, B, T, C, NH, V] = s();
  (void)name;
  (void)V;
  const Format compute = p().compute;
  AttentionFaults faults;
  faults.scores = ElementFault{0, 131008.0f};
  faults.probs = ElementFault{B * NH * T * T - 1, 0.5f};
  Twin qkv = grid(p().in, {B, T, 3 * C}, 42);
  Twin out = zeros(compute, {B, T, C}), scores = zeros(compute, {B, NH, T, T}),
       probs = zeros(Format::kFP32, {B, NH, T, T});
  cpu_->attention_forward(out.cpu(), scores.cpu(), probs.cpu(), qkv.cpu(), int(NH), compute,
                          Format::kFP32, faults);
  gpu_->attention_forward(out.gpu(), scores.gpu(), probs.gpu(), qkv.gpu(), int(NH), compute,
                          Format::kFP32, faults);
  EXPECT_TRUE(same_bits(scores.host, download(scores)));
  EXPECT_TRUE(same_bits(probs.host, download(probs)));
  EXPECT_TRUE(same_bits(out.host, download(out)));
}

TEST_P(CudaBackendTest, CrossEntropyMatchesCpu) {
  const std::int64_t N = s().B * s().T, V = s().V;
  Twin logits = random(p().in, {N, V}, 40, 3.0f);
  Ids targets = ids(N, V, 41);
  Twin losses = zeros(p().out, {N}), probs = zeros(p().out, {N, V});
  cpu_->cross_entropy_forward(losses.cpu(), probs.cpu(), logits.cpu(), targets.host.data(),
                              p().compute);
  gpu_->cross_entropy_forward(losses.gpu(), probs.gpu(), logits.gpu(), targets.gpu(), p().compute);
  EXPECT_TRUE(close(losses.host.values(), download(losses).values(), table()));
  EXPECT_TRUE(close(probs.host.values(), download(probs).values(), table()));

  // Backward from the CPU's probabilities: elementwise, so bit-exact.
  gpu_->copy_from_host(probs.device->data(), probs.host.data(), probs.host.bytes.size());
  Twin dlogits = zeros(p().out, {N, V});
  const float dloss = 65536.0f / static_cast<float>(N);
  cpu_->cross_entropy_backward(dlogits.cpu(), probs.cpu(), targets.host.data(), dloss, p().compute);
  gpu_->cross_entropy_backward(dlogits.gpu(), probs.gpu(), targets.gpu(), dloss, p().compute);
  EXPECT_TRUE(same_bits(dlogits.host, download(dlogits)));
}

TEST_P(CudaBackendTest, OptimizerStepMatchesCpu) {
  const std::int64_t n = s().B * s().T * s().C + s().V;
  const Format f = p().out;  // parameters, gradients and moments share the parameter format
  std::vector<float> g = random_values(static_cast<std::size_t>(n), 42, 4096.0f);
  Twin grads = twin(Bits::from(g, f), {n});
  Twin found = zeros(Format::kFP32, {1}), sum_sq = zeros(Format::kFP32, {1});
  const float inv = static_cast<float>(1.0 / 4096.0);
  cpu_->unscale_and_check(grads.cpu(), inv, found.cpu());
  gpu_->unscale_and_check(grads.gpu(), inv, found.gpu());
  EXPECT_TRUE(same_bits(grads.host, download(grads)));
  EXPECT_TRUE(same_bits(found.host, download(found)));
  cpu_->sum_squares(sum_sq.cpu(), grads.cpu());
  gpu_->sum_squares(sum_sq.gpu(), grads.gpu());
  EXPECT_TRUE(close(sum_sq.host.values(), download(sum_sq).values(), {1e-6, 0.0}));
  // The loss path: acc += mean(x), FP64 sums (a different order on the device).
  auto cpu_acc = cpu_->allocate(sizeof(double));
  auto gpu_acc = gpu_->allocate(sizeof(double));
  for (int i = 0; i < 2; ++i) {
    cpu_->accumulate_mean(static_cast<double*>(cpu_acc->data()), grads.cpu());
    gpu_->accumulate_mean(static_cast<double*>(gpu_acc->data()), grads.gpu());
  }
  double cpu_mean = 0.0, gpu_mean = 0.0;
  cpu_->copy_to_host(&cpu_mean, cpu_acc->data(), sizeof(double));
  gpu_->copy_to_host(&gpu_mean, gpu_acc->data(), sizeof(double));
  EXPECT_NE(cpu_mean, 0.0);
  EXPECT_NEAR(gpu_mean, cpu_mean, 1e-9 * std::abs(cpu_mean) + 1e-12);
  // The loss cost's dot product: sum of a x b in FP64, against itself with the other operand.
  Twin other = random(f, {n}, 44, 1.0f);
  cpu_->sum_products(static_cast<double*>(cpu_acc->data()), grads.cpu(), other.cpu());
  gpu_->sum_products(static_cast<double*>(gpu_acc->data()), grads.gpu(), other.gpu());
  double cpu_dot = 0.0, gpu_dot = 0.0, magnitude = 0.0;
  cpu_->copy_to_host(&cpu_dot, cpu_acc->data(), sizeof(double));
  gpu_->copy_to_host(&gpu_dot, gpu_acc->data(), sizeof(double));
  const std::vector<float> gv = grads.host.values(), ov = other.host.values();
  for (std::size_t i = 0; i < gv.size(); ++i) magnitude += std::abs(double(gv[i]) * ov[i]);
  EXPECT_GT(magnitude, 0.0);
  EXPECT_NEAR(gpu_dot, cpu_dot, 1e-12 * magnitude);
  cpu_->scale(grads.cpu(), 0.37f);
  gpu_->scale(grads.gpu(), 0.37f);
  EXPECT_TRUE(same_bits(grads.host, download(grads)));

  Twin params = random(f, {n}, 43, 0.1f), m = zeros(f, {n}), v = zeros(f, {n});
  for (std::int64_t step = 1; step <= 3; ++step) {
    AdamWParams hp;
    hp.lr = 1e-3f;
    hp.weight_decay = 0.1f;
    hp.step = step;
    cpu_->adamw(params.cpu(), grads.cpu(), m.cpu(), v.cpu(), hp);
    gpu_->adamw(params.gpu(), grads.gpu(), m.gpu(), v.gpu(), hp);
  }
  EXPECT_TRUE(same_bits(params.host, download(params)));
  EXPECT_TRUE(same_bits(m.host, download(m)));
  EXPECT_TRUE(same_bits(v.host, download(v)));

  // A non-finite gradient sets found_inf on both.
  cpu_->set_element(grads.cpu(), n / 2, INFINITY);
  gpu_->set_element(grads.gpu(), n / 2, INFINITY);
  cpu_->unscale_and_check(grads.cpu(), inv, found.cpu());
  gpu_->unscale_and_check(grads.gpu(), inv, found.gpu());
  EXPECT_EQ(download(found).values()[0], 1.0f);
  EXPECT_TRUE(same_bits(found.host, download(found)));
}

// Fused statistics through the back ends: the same unscaled values and found_inf, and the
// requested parts' statistics equal (counts, histogram, targets, extrema, sum; sum_sq within a
// few ulps), with a gap between the parts and two target lists (two launches on the device).
TEST_P(CudaBackendTest, FusedUnscaleMatchesCpu) {
  const std::int64_t n = s().B * s().T * s().C + s().V;
  const Format f = p().out;
  std::vector<float> g = random_values(static_cast<std::size_t>(n), 44, 4096.0f);
  g[3] = NAN;
  Twin grads = twin(Bits::from(g, f), {n});
  Twin found = zeros(Format::kFP32, {1});
  const std::vector<TargetSpec> a = {{Format::kFP16, 12}}, b = {{Format::kE4M3, 0}};
  std::vector<TensorStats> cpu_stats(3), gpu_stats(3);
  auto requests = [&](std::vector<TensorStats>& out) {
    return std::vector<Backend::StatsRequest>{{0, n / 3, a, &out[0]},
                                              {n / 3 + 5, n / 3, b, &out[1]},
                                              {2 * (n / 3) + 5, n - 2 * (n / 3) - 5, a, &out[2]}};
  };
  const float inv = static_cast<float>(1.0 / 4096.0);
  cpu_->unscale_check_and_measure(grads.cpu(), inv, found.cpu(), requests(cpu_stats));
  gpu_->unscale_check_and_measure(grads.gpu(), inv, found.gpu(), requests(gpu_stats));
  EXPECT_TRUE(same_bits(grads.host, download(grads)));
  EXPECT_TRUE(same_bits(found.host, download(found)));
  EXPECT_EQ(download(found).values()[0], 1.0f);
  for (std::size_t i = 0; i < cpu_stats.size(); ++i) {
    const TensorStats &c = cpu_stats[i], &d = gpu_stats[i];
    EXPECT_EQ(d.numel, c.numel) << i;
    EXPECT_EQ(d.zeros, c.zeros) << i;
    EXPECT_EQ(d.nan, c.nan) << i;
    EXPECT_EQ(d.max_abs, c.max_abs) << i;
    EXPECT_EQ(d.min_abs_nonzero, c.min_abs_nonzero) << i;
    EXPECT_EQ(d.histogram, c.histogram) << i;
    EXPECT_EQ(d.targets, c.targets) << i;
    EXPECT_EQ(d.sum, c.sum) << i;
    EXPECT_NEAR(d.sum_sq, c.sum_sq, 16 * 0x1p-53 * c.sum_sq) << i;
  }
}

// The scale update the trainer runs on the back end: the device follows the CPU back end (the
// loss_scaler.cc rules) bit for bit over a found_inf sequence, for both dynamic rules.
TEST_P(CudaBackendTest, LossScaleUpdateMatchesCpu) {
  if (p().out != Format::kFP32 || s().B != 1) GTEST_SKIP() << "one shape/precision suffices";
  for (ScalerConfig config :
       {ScalerConfig::pytorch_defaults(), ScalerConfig::megatron_defaults()}) {
    config.growth_interval = 3;
    Twin found = zeros(Format::kFP32, {1});
    auto gpu_state = gpu_->allocate(sizeof(LossScaleState));
    LossScaleState cpu_state{config.init_scale, config.hysteresis, 0};
    gpu_->copy_from_host(gpu_state->data(), &cpu_state, sizeof(cpu_state));
    for (const bool inf : {false, false, false, true, false, true, true, false, false, false}) {
      const float flag = inf ? 1.0f : 0.0f;
      cpu_->fill(found.cpu(), flag);
      gpu_->fill(found.gpu(), flag);
      cpu_->update_loss_scale(&cpu_state, found.cpu(), config);
      gpu_->update_loss_scale(static_cast<LossScaleState*>(gpu_state->data()), found.gpu(), config);
      LossScaleState back;
      gpu_->copy_to_host(&back, gpu_state->data(), sizeof(back));
      EXPECT_EQ(back.scale, cpu_state.scale);
      EXPECT_EQ(back.hysteresis_tracker, cpu_state.hysteresis_tracker);
      EXPECT_EQ(back.growth_tracker, cpu_state.growth_tracker);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(PrecisionsAndShapes, CudaBackendTest,
                         ::testing::Combine(::testing::ValuesIn(precisions()),
                                            ::testing::ValuesIn(kShapes)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param).name) + "_" +
                                  std::get<1>(info.param).name;
                         });

TEST(CudaBackendDeviceTest, ReportsWhyItCannotRunOrNamesTheDevice) {
  const std::string why = cuda_backend_unavailable_reason();
  if (!cuda::cuda_device_available()) {
    EXPECT_FALSE(why.empty());
    EXPECT_THROW(make_cuda_backend(), ::ampscope::Error);
    GTEST_SKIP() << kNoDevice;
  }
  EXPECT_EQ(why, "");
  auto be = make_cuda_backend();
  EXPECT_EQ(be->device(), Device::kCuda);
  EXPECT_EQ(be->name().rfind("cuda:0 (", 0), 0u) << be->name();
  EXPECT_NE(be->stream().native_handle(), nullptr);
  EXPECT_FALSE(cuda_backend_unavailable_reason({.device = 1 << 20}).empty());
}

}  // namespace
}  // namespace ampscope::trainer::testing
