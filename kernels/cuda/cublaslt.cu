// Row-major batched products through cuBLASLt (ampscope/cuda/cublaslt.h).
//
// Design: cuBLASLt is column-major, and a row-major matrix is its column-major transpose, so
// c = op(a) op(b) (row-major, m x n) is computed as c^T = op(b)^T op(a)^T (column-major, n x m):
// cuBLASLt's A is our b and its B is our a, each transposed exactly when ours is. Compute type
// CUBLAS_COMPUTE_32F (FP32 accumulation: tensor cores for FP16/BF16 operands, and no TF32 for
// FP32 operands, which must stay FP32 to match the CPU back end); scale type FP32; D is FP32.
// The heuristic query is slow next to a small matmul, so its answer is cached per problem. The
// preference states the real alignment of every pointer (cuBLASLt assumes 256 bytes unless
// told), so that views at any element offset get an algorithm that can read them.
#include <cublasLt.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <tuple>

#include "ampscope/check.h"
#include "ampscope/cuda/check.h"
#include "ampscope/cuda/cublaslt.h"
#include "runtime.cuh"

#define AMPSCOPE_CHECK_CUBLAS(expr)                                               \
  do {                                                                            \
    const cublasStatus_t ampscope_cublas_status_ = (expr);                        \
    AMPSCOPE_CHECK(ampscope_cublas_status_ == CUBLAS_STATUS_SUCCESS, #expr, ": ", \
                   cublasLtGetStatusString(ampscope_cublas_status_));             \
  } while (0)

namespace ampscope::cuda {
namespace {

constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;  // cuBLAS's own Hopper default

cudaDataType_t cuda_type(Format f) {
  switch (f) {
    case Format::kFP16:
      return CUDA_R_16F;
    case Format::kBF16:
      return CUDA_R_16BF;
    case Format::kE4M3:
      return CUDA_R_8F_E4M3;
    case Format::kE5M2:
      return CUDA_R_8F_E5M2;
    default:
      return CUDA_R_32F;
  }
}

bool is_fp8(Format f) { return f == Format::kE4M3 || f == Format::kE5M2; }

// The largest power of two (up to 256) that divides the address of every batch entry.
std::uint32_t alignment_of(const void* p, std::int64_t stride_elements, int element_bytes,
                           int batch) {
  std::uint64_t bits = reinterpret_cast<std::uintptr_t>(p) | 256u;
  if (batch > 1) bits |= static_cast<std::uint64_t>(stride_elements) * element_bytes;
  return static_cast<std::uint32_t>(bits & (~bits + 1));  // lowest set bit
}

using ProblemKey = std::tuple<std::int64_t, std::int64_t, std::int64_t, int, int, int, bool, bool,
                              std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                              std::int64_t, std::uint32_t, std::uint32_t, std::uint32_t>;

// RAII owners of the cuBLASLt descriptors of one call.
struct Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;  // cuBLASLt's A, B, D
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descriptors() {
    if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
    if (d != nullptr) cublasLtMatrixLayoutDestroy(d);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
};

void set_batch(cublasLtMatrixLayout_t layout, int batch, std::int64_t stride) {
  if (batch <= 1) return;
  const std::int32_t count = batch;
  AMPSCOPE_CHECK_CUBLAS(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                         &count, sizeof(count)));
  AMPSCOPE_CHECK_CUBLAS(cublasLtMatrixLayoutSetAttribute(
      layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
}

void check_args(const GemmArgs& g) {
  AMPSCOPE_CHECK(g.m >= 0 && g.n >= 0 && g.k >= 0, "gemm: negative shape ", g.m, "x", g.n, "x",
                 g.k);
  AMPSCOPE_CHECK(g.batch >= 1, "gemm: batch must be >= 1, found ", g.batch);
  if (is_fp8(g.operand)) {
    AMPSCOPE_CHECK(is_fp8(g.operand_b), "gemm: an FP8 a needs an FP8 b, found ",
                   format_name(g.operand_b));
    AMPSCOPE_CHECK(g.operand == Format::kE4M3 || g.operand_b == Format::kE4M3,
                   "gemm: FP8 operands cannot both be e5m2");
    AMPSCOPE_CHECK(!g.a_transposed && g.b_transposed,
                   "gemm: FP8 operands must be a (m, k) and b (n, k): a not transposed, b "
                   "transposed");
    AMPSCOPE_CHECK(g.k % 16 == 0 && g.lda % 16 == 0 && g.ldb % 16 == 0,
                   "gemm: FP8 products need k and the leading dimensions of a and b multiples of "
                   "16, found k ", g.k, ", lda ", g.lda, ", ldb ", g.ldb);
    AMPSCOPE_CHECK(g.a_scale != nullptr && g.b_scale != nullptr,
                   "gemm: FP8 operands need their decode scales");
    AMPSCOPE_CHECK(CublasLt::fp8_supported(),
                   "gemm: FP8 products need a device of compute capability 8.9 or later");
  } else {
    AMPSCOPE_CHECK(
        g.operand == Format::kFP32 || g.operand == Format::kFP16 || g.operand == Format::kBF16,
        "gemm: operands must be fp32, fp16, bf16, e4m3 or e5m2, found ", format_name(g.operand));
  }
  // Row-major leading dimensions: at least the stored row length.
  const std::int64_t a_cols = g.a_transposed ? g.m : g.k;
  const std::int64_t b_cols = g.b_transposed ? g.k : g.n;
  AMPSCOPE_CHECK(g.lda >= std::max<std::int64_t>(1, a_cols), "gemm: lda ", g.lda, " below ",
                 a_cols);
  AMPSCOPE_CHECK(g.ldb >= std::max<std::int64_t>(1, b_cols), "gemm: ldb ", g.ldb, " below ",
                 b_cols);
  AMPSCOPE_CHECK(g.ldc >= std::max<std::int64_t>(1, g.n), "gemm: ldc ", g.ldc, " below ", g.n);
  AMPSCOPE_CHECK(g.c != nullptr, "gemm: c is null");
  if (g.k > 0) AMPSCOPE_CHECK(g.a != nullptr && g.b != nullptr, "gemm: a or b is null");
}

}  // namespace

struct CublasLt::Impl {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::map<ProblemKey, cublasLtMatmulAlgo_t> algos;

  ~Impl() {
    if (workspace != nullptr) (void)cudaFree(workspace);
    if (handle != nullptr) (void)cublasLtDestroy(handle);
  }
};

CublasLt::CublasLt() : impl_(std::make_unique<Impl>()) {
  AMPSCOPE_CHECK_CUBLAS(cublasLtCreate(&impl_->handle));
  AMPSCOPE_CHECK_CUDA(cudaMalloc(&impl_->workspace, kWorkspaceBytes));
}

CublasLt::~CublasLt() = default;

bool CublasLt::fp8_supported() {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    (void)cudaGetLastError();  // no device: nothing sticky
    return false;
  }
  return major > 8 || (major == 8 && minor >= 9);
}

bool CublasLt::fp8_shape_allowed(std::int64_t m, std::int64_t n, std::int64_t k) {
  return m > 0 && n > 0 && k > 0 && k % 16 == 0 && n % 16 == 0 && m % 16 == 0;
}

void CublasLt::gemm(const GemmArgs& g, cudaStream_t stream) {
  const detail::NvtxRange range{"ampscope::cuda::CublasLt::gemm"};
  check_args(g);
  if (g.m == 0 || g.n == 0) return;
  if (g.k == 0) {
    // An empty sum (cuBLASLt rejects k == 0): zeros, leaving the padding of rows (ldc > n) alone.
    for (int i = 0; i < g.batch; ++i) {
      AMPSCOPE_CHECK_CUDA(cudaMemset2DAsync(
          g.c + i * g.stride_c, static_cast<std::size_t>(g.ldc) * sizeof(float), 0,
          static_cast<std::size_t>(g.n) * sizeof(float), static_cast<std::size_t>(g.m), stream));
    }
    return;
  }

  const bool fp8 = is_fp8(g.operand);
  const Format b_format = fp8 ? g.operand_b : g.operand;
  const cudaDataType_t type = cuda_type(g.operand), type_b = cuda_type(b_format);
  const int bytes = storage_bytes(g.operand), bytes_b = storage_bytes(b_format);
  Descriptors d;
  AMPSCOPE_CHECK_CUBLAS(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // cuBLASLt's A is our b, its B our a (see the file comment).
  const cublasOperation_t trans_a = g.b_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t trans_b = g.a_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  AMPSCOPE_CHECK_CUBLAS(
      cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)));
  AMPSCOPE_CHECK_CUBLAS(
      cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)));
  if (fp8) {
    // cuBLASLt's A scale is our b's, its B scale our a's; FP32 accumulation throughout.
    const std::int8_t fast_accumulate = 0;
    AMPSCOPE_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(
        d.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &g.b_scale, sizeof(g.b_scale)));
    AMPSCOPE_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(
        d.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &g.a_scale, sizeof(g.a_scale)));
    AMPSCOPE_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(
        d.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accumulate, sizeof(fast_accumulate)));
  }
  // Column-major shapes of the stored matrices: b is (n, k), or (k, n) when transposed; a is
  // (k, m), or (m, k) when transposed; d is (n, m).
  const auto rows_a = static_cast<std::uint64_t>(g.b_transposed ? g.k : g.n);
  const auto cols_a = static_cast<std::uint64_t>(g.b_transposed ? g.n : g.k);
  const auto rows_b = static_cast<std::uint64_t>(g.a_transposed ? g.m : g.k);
  const auto cols_b = static_cast<std::uint64_t>(g.a_transposed ? g.k : g.m);
  AMPSCOPE_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&d.a, type_b, rows_a, cols_a, g.ldb));
  AMPSCOPE_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&d.b, type, rows_b, cols_b, g.lda));
  AMPSCOPE_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(
      &d.d, CUDA_R_32F, static_cast<std::uint64_t>(g.n), static_cast<std::uint64_t>(g.m), g.ldc));
  set_batch(d.a, g.batch, g.stride_b);
  set_batch(d.b, g.batch, g.stride_a);
  set_batch(d.d, g.batch, g.stride_c);

  const std::uint32_t align_a = alignment_of(g.b, g.stride_b, bytes_b, g.batch);
  const std::uint32_t align_b = alignment_of(g.a, g.stride_a, bytes, g.batch);
  const std::uint32_t align_d = alignment_of(g.c, g.stride_c, 4, g.batch);
  const ProblemKey key{g.m,
                       g.n,
                       g.k,
                       g.batch,
                       static_cast<int>(type),
                       static_cast<int>(type_b),
                       g.a_transposed,
                       g.b_transposed,
                       g.lda,
                       g.ldb,
                       g.ldc,
                       g.stride_a,
                       g.stride_b,
                       g.stride_c,
                       align_a,
                       align_b,
                       align_d};
  auto found = impl_->algos.find(key);
  if (found == impl_->algos.end()) {
    AMPSCOPE_CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&d.pref));
    const std::uint64_t workspace = kWorkspaceBytes;
    AMPSCOPE_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace)));
    AMPSCOPE_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a)));
    AMPSCOPE_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b)));
    AMPSCOPE_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d, sizeof(align_d)));
    AMPSCOPE_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof(align_d)));
    cublasLtMatmulHeuristicResult_t result{};
    int count = 0;
    AMPSCOPE_CHECK_CUBLAS(cublasLtMatmulAlgoGetHeuristic(impl_->handle, d.op, d.a, d.b, d.d, d.d,
                                                         d.pref, 1, &result, &count));
    AMPSCOPE_CHECK(count > 0, "cuBLASLt has no algorithm for a ", format_name(g.operand), " ", g.m,
                   "x", g.n, "x", g.k, " product (batch ", g.batch, ", alignments ", align_a, "/",
                   align_b, "/", align_d, " bytes)");
    found = impl_->algos.emplace(key, result.algo).first;
  }
  const float beta = 0.0f;
  AMPSCOPE_CHECK_CUBLAS(cublasLtMatmul(impl_->handle, d.op, &g.alpha, g.b, d.a, g.a, d.b, &beta,
                                       g.c, d.d, g.c, d.d, &found->second, impl_->workspace,
                                       kWorkspaceBytes, stream));
}

}  // namespace ampscope::cuda
