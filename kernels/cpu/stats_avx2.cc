// AVX2 statistics kernel (8 FP32 lanes), the same design as stats_avx512.cc for CPUs without
// AVX-512. AVX2 has no unsigned compares, but every quantity compared is |x| as bits (< 2^31)
// or a threshold <= 0x7F800000, so signed 32-bit compares are exact. Masks come from
// movemask; the exponent bytes are packed with two saturating packs.
#include <immintrin.h>

#include "stats_internal.h"

namespace ampscope::detail {
namespace {

constexpr std::size_t kLanes = 8;

AMPSCOPE_TARGET_AVX2 inline __m256i load_fp32_bits(const char* p, Format dtype) {
  switch (dtype) {
    case Format::kFP32:
      return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    case Format::kBF16:
      return _mm256_slli_epi32(
          _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16);
    default:
      return _mm256_castps_si256(
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
}

AMPSCOPE_TARGET_AVX2 inline unsigned mask_of(__m256i m) {
  return static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(m)));
}

AMPSCOPE_TARGET_AVX2 void fix_up_rare(__m256i bits, unsigned nonfinite, unsigned subnormal,
                                  StatsAccumulator& acc) {
  alignas(64) std::uint32_t lanes[kLanes];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), bits);
  fix_up_rare_lanes(lanes, nonfinite, subnormal, acc);
}

AMPSCOPE_TARGET_AVX2 void run(const char* data, std::size_t n, Format dtype,
                          std::span<const TargetThresholds> th, StatsAccumulator& acc) {
  const std::size_t elem = static_cast<std::size_t>(storage_bytes(dtype));
  const __m256i abs_mask = _mm256_set1_epi32(static_cast<int>(kAbsMask));
  const __m256i inf = _mm256_set1_epi32(static_cast<int>(kInfBits));
  const __m256i min_normal = _mm256_set1_epi32(static_cast<int>(kMinNormalBits));
  const __m256i zero = _mm256_setzero_si256();
  __m256i max_abs = zero;
  __m256i min_abs = _mm256_set1_epi32(0x7FFFFFFF);  // signed max; finite |x| is always below
  __m256d sum[2] = {_mm256_setzero_pd(), _mm256_setzero_pd()};
  __m256d sum_sq[2] = {_mm256_setzero_pd(), _mm256_setzero_pd()};

  __m256i ovf_lo[kMaxVecTargets], ufl_hi[kMaxVecTargets], sub_hi[kMaxVecTargets];
  const std::size_t nt = th.size() < kMaxVecTargets ? th.size() : kMaxVecTargets;
  for (std::size_t t = 0; t < nt; ++t) {
    ovf_lo[t] = _mm256_set1_epi32(static_cast<int>(th[t].ovf_lo));
    ufl_hi[t] = _mm256_set1_epi32(static_cast<int>(th[t].ufl_hi));
    sub_hi[t] = _mm256_set1_epi32(static_cast<int>(th[t].sub_hi));
  }

  ByteHistogram bytes_hist;
  bytes_hist.clear();
  alignas(32) std::uint8_t ebuf[kChunk];
  std::uint64_t zeros = 0;
  const std::size_t full = n - n % kLanes;
  std::size_t since_fold = 0;

  for (std::size_t chunk = 0; chunk < full; chunk += kChunk) {
    const std::size_t chunk_end = chunk + kChunk < full ? chunk + kChunk : full;
    std::size_t nb = 0;
    for (std::size_t i = chunk; i < chunk_end; i += kLanes, nb += kLanes) {
      const __m256i bits = load_fp32_bits(data + i * elem, dtype);
      const __m256i a = _mm256_and_si256(bits, abs_mask);
      const __m256i finite = _mm256_cmpgt_epi32(inf, a);
      const __m256i is_zero = _mm256_cmpeq_epi32(a, zero);
      const __m256i good = _mm256_andnot_si256(is_zero, finite);
      const __m256i subnormal = _mm256_andnot_si256(is_zero, _mm256_cmpgt_epi32(min_normal, a));
      const unsigned finite_m = mask_of(finite);
      const unsigned subnormal_m = mask_of(subnormal);
      zeros += static_cast<unsigned>(__builtin_popcount(mask_of(is_zero)));
      if ((finite_m ^ 0xFFu) | subnormal_m) [[unlikely]] {
        fix_up_rare(bits, finite_m ^ 0xFFu, subnormal_m, acc);
      }
      max_abs = _mm256_max_epi32(max_abs, _mm256_and_si256(a, finite));
      min_abs = _mm256_min_epi32(min_abs, _mm256_blendv_epi8(min_abs, a, good));
      // FP32 subnormals are summed exactly in the fix-up (a DAZ-proof conversion).
      const __m256 f = _mm256_and_ps(_mm256_castsi256_ps(bits),
                                     _mm256_castsi256_ps(_mm256_andnot_si256(subnormal, finite)));
      const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(f));
      const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1));
      sum[0] = _mm256_add_pd(sum[0], lo);
      sum[1] = _mm256_add_pd(sum[1], hi);
      sum_sq[0] = _mm256_fmadd_pd(lo, lo, sum_sq[0]);
      sum_sq[1] = _mm256_fmadd_pd(hi, hi, sum_sq[1]);
      // Exponents 0..255 per 32-bit lane -> bytes: the packs work within 128-bit halves, so
      // bytes 0..3 of each half hold lanes 0..3 and 4..7.
      const __m256i e = _mm256_srli_epi32(a, 23);
      const __m256i e16 = _mm256_packus_epi32(e, e);
      const __m256i e8 = _mm256_packus_epi16(e16, e16);
      const int lo4 = _mm_cvtsi128_si32(_mm256_castsi256_si128(e8));
      const int hi4 = _mm_cvtsi128_si32(_mm256_extracti128_si256(e8, 1));
      __builtin_memcpy(ebuf + nb, &lo4, 4);
      __builtin_memcpy(ebuf + nb + 4, &hi4, 4);
      const __m256i nonzero = _mm256_xor_si256(is_zero, _mm256_set1_epi32(-1));
      for (std::size_t t = 0; t < nt; ++t) {
        // a >= ovf_lo  <=>  !(ovf_lo > a)
        const unsigned o = finite_m & ~mask_of(_mm256_cmpgt_epi32(ovf_lo[t], a)) & 0xFFu;
        const unsigned u = mask_of(_mm256_andnot_si256(_mm256_cmpgt_epi32(a, ufl_hi[t]), nonzero));
        const unsigned sn = mask_of(
            _mm256_andnot_si256(_mm256_cmpgt_epi32(a, sub_hi[t]), _mm256_cmpgt_epi32(a, ufl_hi[t])));
        acc.target_counts[t][0] += static_cast<unsigned>(__builtin_popcount(o));
        acc.target_counts[t][1] += static_cast<unsigned>(__builtin_popcount(u));
        acc.target_counts[t][2] += static_cast<unsigned>(__builtin_popcount(sn));
      }
    }
    bytes_hist.add(ebuf, nb);
    since_fold += nb;
    if (since_fold >= kFoldEvery) {
      bytes_hist.fold_into(acc);
      since_fold = 0;
    }
  }
  bytes_hist.fold_into(acc);

  alignas(32) std::uint32_t mx[kLanes], mn[kLanes];
  _mm256_store_si256(reinterpret_cast<__m256i*>(mx), max_abs);
  _mm256_store_si256(reinterpret_cast<__m256i*>(mn), min_abs);
  for (std::size_t l = 0; l < kLanes; ++l) {
    acc.max_abs_bits = mx[l] > acc.max_abs_bits ? mx[l] : acc.max_abs_bits;
    // 0x7FFFFFFF is the lane's "none seen" value (no finite magnitude has those bits).
    if (mn[l] != 0x7FFFFFFFu && mn[l] < acc.min_abs_bits) acc.min_abs_bits = mn[l];
  }
  alignas(32) double s[4], q[4];
  _mm256_store_pd(s, _mm256_add_pd(sum[0], sum[1]));
  _mm256_store_pd(q, _mm256_add_pd(sum_sq[0], sum_sq[1]));
  acc.sum += (s[0] + s[1]) + (s[2] + s[3]);
  acc.sum_sq += (q[0] + q[1]) + (q[2] + q[3]);
  acc.zeros += zeros;
  finish_scalar(data, n, full, dtype, th, nt, acc);
}

}  // namespace

void stats_kernel_avx2(const void* data, std::size_t n, Format dtype,
                       std::span<const TargetThresholds> th, StatsAccumulator& acc) {
  acc.numel += n;
  run(static_cast<const char*>(data), n, dtype, th, acc);
}

}  // namespace ampscope::detail
