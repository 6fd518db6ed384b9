// AVX-512 statistics kernel (16 FP32 lanes; FP16 and BF16 are widened to FP32 on load, which is
// exact). Design:
//   - The common case, finite normal values, is branch-free: masks from integer compares on
//     |x| bits give zeros, extrema, the target ranges (one compare per threshold, popcount of the
//     mask) and the FP64 sums (lanes widened to double, FMA for the squares). The sums are kept
//     per chunk: a chunk whose exponent range passes chunk_sum_is_exact adds its FP64 sums into
//     the exact accumulators once; a wider one adds its normal values one by one.
//   - The binade histogram is the expensive part. For a normal FP32 value the binade is its
//     biased exponent byte minus 127, so the kernel narrows each lane's exponent to a byte into a
//     small buffer and histograms the buffer with scalar increments into four interleaved tables
//     (consecutive equal bins would otherwise serialise on store-to-load forwarding). Bytes 0
//     (zero, subnormal) and 255 (Inf, NaN) are ignored when the tables are folded.
//   - Rare lanes take a scalar fix-up, decided per vector by one mask test: non-finite lanes are
//     classified, FP32/BF16-subnormal lanes get their binade from the fraction. FP16 subnormals
//     are normal once widened, so FP16 gradients never take this path.
// The tail (< 16 elements) goes through accumulate_one, the scalar fast path.
// GCC 12 warns on the intentionally undefined pass-through operand inside its own AVX-512
// intrinsic headers (_mm512_undefined_*); the warning is about the header, not this code.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstring>

#include "stats_internal.h"

namespace ampscope::detail {
namespace {

constexpr std::size_t kLanes = 16;

template <Format kDtype>
AMPSCOPE_TARGET_AVX512 inline __m512i load_fp32_bits(const char* p) {
  if constexpr (kDtype == Format::kFP32) {
    return _mm512_loadu_si512(p);
  } else if constexpr (kDtype == Format::kBF16) {
    return _mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16);
  } else {
    return _mm512_castps_si512(
        _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
  }
}

AMPSCOPE_TARGET_AVX512 void fix_up_rare(__m512i bits, __mmask16 nonfinite, __mmask16 subnormal,
                                    StatsAccumulator& acc) {
  alignas(64) std::uint32_t lanes[kLanes];
  _mm512_store_si512(lanes, bits);
  fix_up_rare_lanes(lanes, nonfinite, subnormal, acc);
}

// Histogram of one chunk's exponent bytes (nb a multiple of 16, at most kChunk). Values within a
// chunk usually span few binades, so the bins from the lowest to the highest byte present are
// counted with byte compares: per bin and 64 bytes one compare and one masked subtract into
// byte counters (a byte lane sees at most kChunk / 64 = 8 hits). That avoids the scalar
// increments' store-to-load-forwarding chains when neighbours share a bin. Wide chunks
// (adversarial data) fall back to the scalar tables.
// Returns the range [lo, hi] of the bytes present other than 0 and 255 (lo > hi: none), which
// is the biased exponent range of the chunk's finite normal values.
AMPSCOPE_TARGET_AVX512 void histogram_chunk(std::uint8_t* ebuf, std::size_t nb,
                                            ByteHistogram& tables, int& range_lo,
                                            int& range_hi) {
  constexpr int kMaxCompareBins = 24;
  const std::size_t padded = (nb + 63) & ~std::size_t{63};
  std::memset(ebuf + nb, 0, padded - nb);  // byte 0 (zero/subnormal) is never folded
  const __m512i one = _mm512_set1_epi8(1);
  __m512i lo_v = _mm512_set1_epi8(-1);
  __m512i hi_v = _mm512_setzero_si512();
  for (std::size_t j = 0; j < padded; j += 64) {
    const __m512i b = _mm512_load_si512(ebuf + j);
    lo_v = _mm512_min_epu8(lo_v, _mm512_sub_epi8(b, one));  // 0 wraps to 255: ignored
    hi_v = _mm512_max_epu8(hi_v, _mm512_add_epi8(b, one));  // 255 wraps to 0: ignored
  }
  alignas(64) std::uint8_t lo_b[64], hi_b[64];
  _mm512_store_si512(lo_b, lo_v);
  _mm512_store_si512(hi_b, hi_v);
  int lo = 255, hi = 0;
  for (int l = 0; l < 64; ++l) {
    lo = lo_b[l] + 1 < lo ? lo_b[l] + 1 : lo;
    hi = hi_b[l] - 1 > hi ? hi_b[l] - 1 : hi;
  }
  range_lo = lo;
  range_hi = hi;
  if (lo > hi) return;  // only zeros, subnormals and non-finite values
  if (hi - lo >= kMaxCompareBins) {
    tables.add(ebuf, nb);
    return;
  }
  const __m512i minus_one = _mm512_set1_epi8(-1);
  for (int bin = lo; bin <= hi; ++bin) {
    const __m512i key = _mm512_set1_epi8(static_cast<char>(bin));
    __m512i counts = _mm512_setzero_si512();
    for (std::size_t j = 0; j < padded; j += 64) {
      const __mmask64 m = _mm512_cmpeq_epi8_mask(_mm512_load_si512(ebuf + j), key);
      counts = _mm512_mask_sub_epi8(counts, m, counts, minus_one);
    }
    const __m512i sums = _mm512_sad_epu8(counts, _mm512_setzero_si512());
    tables.t[0][bin] += static_cast<std::uint32_t>(_mm512_reduce_add_epi64(sums));
  }
}

// NT targets are counted in vector registers (per-lane uint32 counters, flushed every chunk):
// a masked subtract per range instead of mask -> popcount -> memory add. NT and the storage type
// are template parameters so the target loop unrolls into registers and the loop has no switch.
template <int NT, Format kDtype>
AMPSCOPE_TARGET_AVX512 void run(const char* data, std::size_t n, std::span<const TargetThresholds> th,
                            StatsAccumulator& acc) {
  constexpr Format dtype = kDtype;
  constexpr std::size_t elem = static_cast<std::size_t>(storage_bytes(kDtype));
  const __m512i abs_mask = _mm512_set1_epi32(static_cast<int>(kAbsMask));
  const __m512i inf = _mm512_set1_epi32(static_cast<int>(kInfBits));
  const __m512i min_normal = _mm512_set1_epi32(static_cast<int>(kMinNormalBits));
  const __m512i minus_one = _mm512_set1_epi32(-1);
  __m512i max_abs = _mm512_setzero_si512();
  __m512i min_abs = minus_one;
  __m512i ovf_lo[NT > 0 ? NT : 1], ufl_hi[NT > 0 ? NT : 1], sub_hi[NT > 0 ? NT : 1];
  for (int t = 0; t < NT; ++t) {
    ovf_lo[t] = _mm512_set1_epi32(static_cast<int>(th[t].ovf_lo));
    ufl_hi[t] = _mm512_set1_epi32(static_cast<int>(th[t].ufl_hi));
    sub_hi[t] = _mm512_set1_epi32(static_cast<int>(th[t].sub_hi));
  }

  ByteHistogram bytes_hist;
  bytes_hist.clear();
  alignas(64) std::uint8_t ebuf[kChunk + 64];
  const std::size_t full = n - n % kLanes;
  std::size_t since_fold = 0;

  for (std::size_t chunk = 0; chunk < full; chunk += kChunk) {
    const std::size_t chunk_end = chunk + kChunk < full ? chunk + kChunk : full;
    __m512d sum[2] = {_mm512_setzero_pd(), _mm512_setzero_pd()};
    __m512d sum_sq[2] = {_mm512_setzero_pd(), _mm512_setzero_pd()};
    // Per-lane counters for this chunk: zeros, then (overflow, underflow, <= sub_hi) per target.
    __m512i zeros = _mm512_setzero_si512();
    __m512i cnt[NT > 0 ? NT : 1][3];
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t) cnt[t][0] = cnt[t][1] = cnt[t][2] = _mm512_setzero_si512();
    std::size_t nb = 0;
    for (std::size_t i = chunk; i < chunk_end; i += kLanes, nb += kLanes) {
      const __m512i bits = load_fp32_bits<kDtype>(data + i * elem);
      const __m512i a = _mm512_and_si512(bits, abs_mask);
      const __mmask16 finite = _mm512_cmplt_epu32_mask(a, inf);
      const __mmask16 nonzero = _mm512_test_epi32_mask(a, a);
      const __mmask16 subnormal = _mm512_mask_cmplt_epu32_mask(nonzero, a, min_normal);
      zeros = _mm512_mask_sub_epi32(zeros, static_cast<__mmask16>(~nonzero), zeros, minus_one);
      if (static_cast<__mmask16>(~finite) | subnormal) [[unlikely]] {
        fix_up_rare(bits, static_cast<__mmask16>(~finite), subnormal, acc);
      }
      max_abs = _mm512_mask_max_epu32(max_abs, finite, max_abs, a);
      min_abs = _mm512_mask_min_epu32(min_abs, finite & nonzero, min_abs, a);
      // FP32 subnormals are summed exactly in the fix-up (a DAZ-proof conversion).
      const __m512 f = _mm512_maskz_mov_ps(finite & ~subnormal, _mm512_castsi512_ps(bits));
      const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(f));
      const __m512d hi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(f, 1));
      sum[0] = _mm512_add_pd(sum[0], lo);
      sum[1] = _mm512_add_pd(sum[1], hi);
      sum_sq[0] = _mm512_fmadd_pd(lo, lo, sum_sq[0]);
      sum_sq[1] = _mm512_fmadd_pd(hi, hi, sum_sq[1]);
      _mm_store_si128(reinterpret_cast<__m128i*>(ebuf + nb),
                      _mm512_cvtepi32_epi8(_mm512_srli_epi32(a, 23)));
#pragma GCC unroll 4
      for (int t = 0; t < NT; ++t) {
        const __mmask16 o = _mm512_mask_cmpge_epu32_mask(finite, a, ovf_lo[t]);
        const __mmask16 u = _mm512_mask_cmple_epu32_mask(nonzero, a, ufl_hi[t]);
        const __mmask16 le = _mm512_mask_cmple_epu32_mask(nonzero, a, sub_hi[t]);
        cnt[t][0] = _mm512_mask_sub_epi32(cnt[t][0], o, cnt[t][0], minus_one);
        cnt[t][1] = _mm512_mask_sub_epi32(cnt[t][1], u, cnt[t][1], minus_one);
        cnt[t][2] = _mm512_mask_sub_epi32(cnt[t][2], le, cnt[t][2], minus_one);
      }
    }
    acc.zeros += static_cast<std::uint32_t>(_mm512_reduce_add_epi32(zeros));
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t) {
      const auto o = static_cast<std::uint32_t>(_mm512_reduce_add_epi32(cnt[t][0]));
      const auto u = static_cast<std::uint32_t>(_mm512_reduce_add_epi32(cnt[t][1]));
      const auto le = static_cast<std::uint32_t>(_mm512_reduce_add_epi32(cnt[t][2]));
      acc.target_counts[static_cast<std::size_t>(t)][0] += o;
      acc.target_counts[static_cast<std::size_t>(t)][1] += u;
      acc.target_counts[static_cast<std::size_t>(t)][2] += le - u;  // ufl_hi < a <= sub_hi
    }
    int lo = 1, hi = 0;
    histogram_chunk(ebuf, nb, bytes_hist, lo, hi);
    if (lo <= hi) {
      if (chunk_sum_is_exact(dtype, lo, hi, nb)) {
        acc.sum.add(_mm512_reduce_add_pd(_mm512_add_pd(sum[0], sum[1])));
        acc.sum_sq.add(_mm512_reduce_add_pd(_mm512_add_pd(sum_sq[0], sum_sq[1])));
      } else {
        add_normal_values_exactly(data + chunk * elem, nb, dtype, acc);
      }
    }
    since_fold += nb;
    if (since_fold >= kFoldEvery) {
      bytes_hist.fold_into(acc);
      since_fold = 0;
    }
  }
  bytes_hist.fold_into(acc);

  alignas(64) std::uint32_t mx[kLanes], mn[kLanes];
  _mm512_store_si512(mx, max_abs);
  _mm512_store_si512(mn, min_abs);
  for (std::size_t l = 0; l < kLanes; ++l) {
    acc.max_abs_bits = mx[l] > acc.max_abs_bits ? mx[l] : acc.max_abs_bits;
    acc.min_abs_bits = mn[l] < acc.min_abs_bits ? mn[l] : acc.min_abs_bits;
  }
  finish_scalar(data, n, full, dtype, th, NT, acc);
}

template <Format kDtype>
void dispatch_targets(const char* p, std::size_t n, std::span<const TargetThresholds> th,
                      StatsAccumulator& acc) {
  switch (th.size() < kMaxVecTargets ? th.size() : kMaxVecTargets) {
    case 0: return run<0, kDtype>(p, n, th, acc);
    case 1: return run<1, kDtype>(p, n, th, acc);
    case 2: return run<2, kDtype>(p, n, th, acc);
    case 3: return run<3, kDtype>(p, n, th, acc);
    default: return run<4, kDtype>(p, n, th, acc);
  }
}

}  // namespace

void stats_kernel_avx512(const void* data, std::size_t n, Format dtype,
                         std::span<const TargetThresholds> th, StatsAccumulator& acc) {
  acc.numel += n;
  const char* p = static_cast<const char*>(data);
  switch (dtype) {
    case Format::kFP32:
      return dispatch_targets<Format::kFP32>(p, n, th, acc);
    case Format::kBF16:
      return dispatch_targets<Format::kBF16>(p, n, th, acc);
    default:
      return dispatch_targets<Format::kFP16>(p, n, th, acc);
  }
}

}  // namespace ampscope::detail
