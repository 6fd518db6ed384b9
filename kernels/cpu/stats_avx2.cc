// AVX2 statistics kernel (8 FP32 lanes; FP16 and BF16 widened to FP32 bits on load, which is
// exact), also the fused scale-and-measure kernel behind scale_and_compute_stats().
//
// Design: the tensor is cut into chunks of kChunk elements that stay in L1. Pass 1 over a chunk
// is branch-free and does what every element needs: |x| bits (kept in a buffer), the unsigned
// max and min-nonzero of |x| (over everything, specials included), the FP64 lane sums and sums
// of squares, and each lane's biased exponent packed to a byte. The chunk's max and min then
// decide everything else once per chunk instead of once per vector:
//   - a chunk whose max is Inf/NaN or whose min nonzero is an FP32 subnormal (rare) is read
//     again by a masked vector pass that classifies those lanes and redoes the sums;
//   - the exponent range [lo, hi] of the chunk's normal values bounds the histogram: bins in
//     that range are counted with byte compares over the exponent bytes (32 per instruction),
//     which avoids scalar increments that serialise on store-to-load forwarding; byte 0 is
//     counted too: in a chunk without subnormals it is exactly the zeros;
//   - a target threshold below the chunk's min or above its max needs no compare at all; the
//     others are counted by one compare per threshold over the |x| buffer;
//   - the chunk's FP64 sum is exact when [lo, hi] is narrow enough (chunk_sum_is_exact), and is
//     then added once into the exact accumulator; a wide chunk adds its values one by one.
// AVX2 has no unsigned 32-bit compares, but every quantity compared is |x| as bits (< 2^31) or a
// threshold <= 0x7F800001, so signed compares are exact; min and max use the unsigned forms.
// The tail (< 32 elements) goes through accumulate_one.
#include <immintrin.h>

#include <cstring>

#include "ampscope/convert.h"
#include "convert_internal.h"
#include "stats_internal.h"

namespace ampscope::detail {
namespace {

constexpr std::size_t kLanes = 8;
constexpr std::size_t kGroup = 32;  // elements per pass-1 step: 4 vectors, one 32-byte store
constexpr int kMaxCompareBins = 24;

AMPSCOPE_INLINE_AVX2 __m256i splat(std::uint32_t v) {
  return _mm256_set1_epi32(static_cast<int>(v));
}

template <Format kDtype>
AMPSCOPE_INLINE_AVX2 __m256i load_fp32_bits(const char* p) {
  if constexpr (kDtype == Format::kFP32) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  } else if constexpr (kDtype == Format::kBF16) {
    return _mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16);
  } else {
    return _mm256_castps_si256(
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
}

// x * factor in FP32, rounded to the storage type (nearest even, as convert_from_fp32 does) and
// stored back; returns the FP32 bits of what was stored.
template <Format kDtype>
AMPSCOPE_INLINE_AVX2 __m256i scale_and_store(char* p, __m256 factor) {
  const __m256 y = _mm256_mul_ps(_mm256_castsi256_ps(load_fp32_bits<kDtype>(p)), factor);
  if constexpr (kDtype == Format::kFP32) {
    _mm256_storeu_ps(reinterpret_cast<float*>(p), y);
    return _mm256_castps_si256(y);
  } else if constexpr (kDtype == Format::kFP16) {
    const __m128i h = _mm256_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), h);
    return _mm256_castps_si256(_mm256_cvtph_ps(h));
  } else {
    // BF16: round to nearest even on the bits; a NaN keeps its top payload bits, made quiet.
    const __m256i u = _mm256_castps_si256(y);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), splat(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, splat(0x7FFF)), lsb), 16);
    const __m256i is_nan =
        _mm256_cmpgt_epi32(_mm256_and_si256(u, splat(kAbsMask)), splat(kInfBits));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_srli_epi32(u, 16), splat(0x40)), is_nan);
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
    return _mm256_slli_epi32(r, 16);
  }
}

AMPSCOPE_INLINE_AVX2 unsigned mask_of(__m256i m) {
  return static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(m)));
}

AMPSCOPE_INLINE_AVX2 std::uint32_t hmax_u32(__m256i v) {
  __m128i m = _mm_max_epu32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0x4E));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0xB1));
  return static_cast<std::uint32_t>(_mm_cvtsi128_si32(m));
}

AMPSCOPE_INLINE_AVX2 std::uint32_t hmin_u32(__m256i v) {
  __m128i m = _mm_min_epu32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  m = _mm_min_epu32(m, _mm_shuffle_epi32(m, 0x4E));
  m = _mm_min_epu32(m, _mm_shuffle_epi32(m, 0xB1));
  return static_cast<std::uint32_t>(_mm_cvtsi128_si32(m));
}

AMPSCOPE_INLINE_AVX2 std::uint64_t hsum_u32(__m256i v) {
  alignas(32) std::uint32_t l[kLanes];
  _mm256_store_si256(reinterpret_cast<__m256i*>(l), v);
  std::uint64_t s = 0;
  for (std::uint32_t x : l) s += x;
  return s;
}

// The exact sum of four doubles that are multiples of one quantum with a small total (the
// chunk_sum_is_exact condition), so the order does not matter.
AMPSCOPE_INLINE_AVX2 double hsum_pd(__m256d v) {
  alignas(32) double l[4];
  _mm256_store_pd(l, v);
  return (l[0] + l[1]) + (l[2] + l[3]);
}

// One chunk's FP64 accumulators: sums and sums of squares of the low and high four lanes.
struct Sums {
  __m256d s_lo, s_hi, q_lo, q_hi;
};

AMPSCOPE_INLINE_AVX2 void clear(Sums& t) {
  t.s_lo = t.s_hi = t.q_lo = t.q_hi = _mm256_setzero_pd();
}

// Adds two vectors of FP32 values. They are added to each other first (exact under the
// chunk_sum_is_exact condition, which covers every partial sum of the chunk), so each
// accumulator waits on one add per two vectors.
AMPSCOPE_INLINE_AVX2 void add_pair(Sums& t, __m256 f, __m256 g) {
  const __m256d f_lo = _mm256_cvtps_pd(_mm256_castps256_ps128(f));
  const __m256d f_hi = _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1));
  const __m256d g_lo = _mm256_cvtps_pd(_mm256_castps256_ps128(g));
  const __m256d g_hi = _mm256_cvtps_pd(_mm256_extractf128_ps(g, 1));
  t.s_lo = _mm256_add_pd(t.s_lo, _mm256_add_pd(f_lo, g_lo));
  t.s_hi = _mm256_add_pd(t.s_hi, _mm256_add_pd(f_hi, g_hi));
  t.q_lo = _mm256_add_pd(t.q_lo, _mm256_fmadd_pd(f_lo, f_lo, _mm256_mul_pd(g_lo, g_lo)));
  t.q_hi = _mm256_add_pd(t.q_hi, _mm256_fmadd_pd(f_hi, f_hi, _mm256_mul_pd(g_hi, g_hi)));
}

AMPSCOPE_INLINE_AVX2 double total_sum(const Sums& t) {
  return hsum_pd(_mm256_add_pd(t.s_lo, t.s_hi));
}

AMPSCOPE_INLINE_AVX2 double total_sum_sq(const Sums& t) {
  return hsum_pd(_mm256_add_pd(t.q_lo, t.q_hi));
}

// What pass 1 (and, for a rare chunk, the masked pass) learns about a chunk.
struct ChunkSummary {
  std::uint64_t zeros = 0;
  std::uint64_t nonfinite = 0;
  std::uint32_t max_all = 0;  // max |x| bits, specials included
  std::uint32_t min_nz = 0;   // min nonzero |x| bits, specials included; 0 when none
  std::uint32_t max_finite = 0;
  int lo = 1, hi = 0;  // biased exponent range of the normal finite values (empty: lo > hi)
};

// The masked pass for a chunk that holds a non-finite value or an FP32 subnormal: those lanes
// are classified (and subnormals get their bin and exact sums) by fix_up_rare_lanes, and the
// sums and the exponent range are redone over the normal finite lanes only.
template <Format kDtype>
AMPSCOPE_TARGET_AVX2 void rare_chunk(const char* p, std::size_t len, Sums& sums, ChunkSummary& c,
                                     StatsAccumulator& acc) {
  constexpr std::size_t elem = static_cast<std::size_t>(storage_bytes(kDtype));
  const __m256i abs_mask = splat(kAbsMask);
  const __m256i inf = splat(kInfBits);
  const __m256i min_normal = splat(kMinNormalBits);
  __m256i max_finite = _mm256_setzero_si256();
  __m256i normal_min = splat(0xFFFFFFFFu);
  __m256i normal_max = _mm256_setzero_si256();
  clear(sums);
  for (std::size_t i = 0; i < len; i += kLanes) {
    const __m256i bits = load_fp32_bits<kDtype>(p + i * elem);
    const __m256i a = _mm256_and_si256(bits, abs_mask);
    const __m256i finite = _mm256_cmpgt_epi32(inf, a);
    const __m256i normal =
        _mm256_and_si256(finite, _mm256_cmpgt_epi32(a, _mm256_sub_epi32(min_normal, splat(1))));
    const __m256i subnormal = _mm256_andnot_si256(_mm256_cmpeq_epi32(a, _mm256_setzero_si256()),
                                                  _mm256_cmpgt_epi32(min_normal, a));
    c.zeros += static_cast<unsigned>(
        __builtin_popcount(mask_of(_mm256_cmpeq_epi32(a, _mm256_setzero_si256()))));
    const unsigned nonfinite_m = mask_of(finite) ^ 0xFFu;
    const unsigned subnormal_m = mask_of(subnormal);
    if (nonfinite_m | subnormal_m) {
      alignas(32) std::uint32_t lanes[kLanes];
      _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), bits);
      fix_up_rare_lanes(lanes, nonfinite_m, subnormal_m, acc);
      c.nonfinite += static_cast<unsigned>(__builtin_popcount(nonfinite_m));
    }
    max_finite = _mm256_max_epu32(max_finite, _mm256_and_si256(a, finite));
    normal_min = _mm256_min_epu32(
        normal_min, _mm256_or_si256(a, _mm256_andnot_si256(normal, splat(0xFFFFFFFFu))));
    normal_max = _mm256_max_epu32(normal_max, _mm256_and_si256(a, normal));
    add_pair(sums, _mm256_and_ps(_mm256_castsi256_ps(bits), _mm256_castsi256_ps(normal)),
             _mm256_setzero_ps());
  }
  c.max_finite = hmax_u32(max_finite);
  const std::uint32_t nmin = hmin_u32(normal_min);
  const std::uint32_t nmax = hmax_u32(normal_max);
  if (nmax != 0) {
    c.lo = static_cast<int>(nmin >> 23);
    c.hi = static_cast<int>(nmax >> 23);
  }
}

// count[k] = #{j < len : ebuf[j] == key[k]} for four keys, one pass over the exponent bytes
// (32 per compare; four named counters so that they stay in registers). A byte lane sees at most
// len / 32 <= 16 hits, so byte counters cannot wrap.
AMPSCOPE_TARGET_AVX2 void count_bytes4(const std::uint8_t* ebuf, std::size_t len, const int* key,
                                       std::uint64_t* count) {
  const __m256i zero = _mm256_setzero_si256();
  const __m256i k0 = _mm256_set1_epi8(static_cast<char>(key[0]));
  const __m256i k1 = _mm256_set1_epi8(static_cast<char>(key[1]));
  const __m256i k2 = _mm256_set1_epi8(static_cast<char>(key[2]));
  const __m256i k3 = _mm256_set1_epi8(static_cast<char>(key[3]));
  __m256i n0 = zero, n1 = zero, n2 = zero, n3 = zero;
  for (std::size_t j = 0; j < len; j += kGroup) {
    const __m256i b = _mm256_load_si256(reinterpret_cast<const __m256i*>(ebuf + j));
    n0 = _mm256_sub_epi8(n0, _mm256_cmpeq_epi8(b, k0));
    n1 = _mm256_sub_epi8(n1, _mm256_cmpeq_epi8(b, k1));
    n2 = _mm256_sub_epi8(n2, _mm256_cmpeq_epi8(b, k2));
    n3 = _mm256_sub_epi8(n3, _mm256_cmpeq_epi8(b, k3));
  }
  // sad against zero: four 64-bit sums of eight byte counters each; then the 64-bit lanes.
  const __m256i s01 =
      _mm256_add_epi64(_mm256_unpacklo_epi64(_mm256_sad_epu8(n0, zero), _mm256_sad_epu8(n1, zero)),
                       _mm256_unpackhi_epi64(_mm256_sad_epu8(n0, zero), _mm256_sad_epu8(n1, zero)));
  const __m256i s23 =
      _mm256_add_epi64(_mm256_unpacklo_epi64(_mm256_sad_epu8(n2, zero), _mm256_sad_epu8(n3, zero)),
                       _mm256_unpackhi_epi64(_mm256_sad_epu8(n2, zero), _mm256_sad_epu8(n3, zero)));
  alignas(32) std::uint64_t l01[4], l23[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(l01), s01);
  _mm256_store_si256(reinterpret_cast<__m256i*>(l23), s23);
  count[0] = l01[0] + l01[2];
  count[1] = l01[1] + l01[3];
  count[2] = l23[0] + l23[2];
  count[3] = l23[1] + l23[3];
}

// The histogram of one chunk's exponent bytes for bins lo..hi (in 1..254), and, when
// count_zero_byte, the number of 0 bytes (the zeros of a chunk without subnormals) returned.
// Wide ranges (adversarial data) are counted one byte at a time.
AMPSCOPE_TARGET_AVX2 std::uint64_t histogram_bytes(const std::uint8_t* ebuf, std::size_t len,
                                                   int lo, int hi, bool count_zero_byte,
                                                   StatsAccumulator& acc) {
  auto bin = [&](int b) -> std::uint64_t& {
    return acc.hist[static_cast<std::size_t>(b - 127 - kHistogramMinExponent)];
  };
  if (hi - lo >= kMaxCompareBins) {
    std::uint64_t zero_bytes = 0;
    for (std::size_t j = 0; j < len; ++j) {
      const int b = ebuf[j];
      zero_bytes += b == 0;
      if (b >= lo && b <= hi) ++bin(b);
    }
    return zero_bytes;
  }
  int keys[kMaxCompareBins + 1];
  int nkeys = 0;
  if (count_zero_byte) keys[nkeys++] = 0;
  for (int b = lo; b <= hi; ++b) keys[nkeys++] = b;
  std::uint64_t counts[kMaxCompareBins + 1];
  // Groups of four keys; the last group repeats its last key (counted twice, used once).
  for (int done = 0; done < nkeys; done += 4) {
    int group[4];
    for (int k = 0; k < 4; ++k) group[k] = keys[done + k < nkeys ? done + k : nkeys - 1];
    std::uint64_t got[4];
    count_bytes4(ebuf, len, group, got);
    for (int k = 0; k < 4 && done + k < nkeys; ++k) counts[done + k] = got[k];
  }
  int i = 0;
  std::uint64_t zero_bytes = 0;
  if (count_zero_byte) zero_bytes = counts[i++];
  for (int b = lo; b <= hi; ++b) bin(b) += counts[i++];
  return zero_bytes;
}

// count[k] = #{i < len : abuf[i] >= t[k]} for four thresholds (t[k] >= 1), one pass over abuf
// (four named counters so that they stay in registers).
AMPSCOPE_TARGET_AVX2 void count_at_least4(const std::uint32_t* abuf, std::size_t len,
                                          const std::uint32_t* t, std::uint64_t* count) {
  const __m256i b0 = splat(t[0] - 1), b1 = splat(t[1] - 1), b2 = splat(t[2] - 1),
                b3 = splat(t[3] - 1);
  __m256i n0 = _mm256_setzero_si256(), n1 = n0, n2 = n0, n3 = n0;
  for (std::size_t i = 0; i < len; i += kLanes) {
    const __m256i a = _mm256_load_si256(reinterpret_cast<const __m256i*>(abuf + i));
    n0 = _mm256_sub_epi32(n0, _mm256_cmpgt_epi32(a, b0));
    n1 = _mm256_sub_epi32(n1, _mm256_cmpgt_epi32(a, b1));
    n2 = _mm256_sub_epi32(n2, _mm256_cmpgt_epi32(a, b2));
    n3 = _mm256_sub_epi32(n3, _mm256_cmpgt_epi32(a, b3));
  }
  count[0] = hsum_u32(n0);
  count[1] = hsum_u32(n1);
  count[2] = hsum_u32(n2);
  count[3] = hsum_u32(n3);
}

// The target counts of one chunk from G(T) = #{finite nonzero |x| >= T}. Thresholds outside
// (min_nz, max_all] are answered from the summary; the others are counted over abuf (where
// non-finite lanes, |x| >= Inf >= every threshold, are counted too and taken off again).
AMPSCOPE_TARGET_AVX2 void count_targets(const std::uint32_t* abuf, std::size_t len,
                                        const ChunkSummary& c, std::span<const TargetThresholds> th,
                                        StatsAccumulator& acc) {
  const std::uint64_t nonzero_all = len - c.zeros;
  const std::uint64_t nonzero_finite = nonzero_all - c.nonfinite;
  constexpr std::size_t kMaxThresholds = 48;
  std::uint32_t need[kMaxThresholds];
  std::uint64_t got[kMaxThresholds];
  std::size_t needed = 0;
  // Thresholds of target i: ovf_lo, ufl_hi + 1, sub_hi + 1.
  auto threshold = [&](std::size_t i, int k) {
    return k == 0 ? th[i].ovf_lo : k == 1 ? th[i].ufl_hi + 1 : th[i].sub_hi + 1;
  };
  auto in_range = [&](std::uint32_t t) {
    return nonzero_all != 0 && t > c.min_nz && t <= c.max_all;
  };
  for (std::size_t i = 0; i < th.size(); ++i) {
    for (int k = 0; k < 3; ++k) {
      const std::uint32_t t = threshold(i, k);
      if (in_range(t) && needed < kMaxThresholds) need[needed++] = t;
    }
  }
  // Groups of four; the last group repeats its last threshold (counted twice, used once).
  for (std::size_t done = 0; done < needed; done += 4) {
    std::uint32_t group[4];
    for (std::size_t k = 0; k < 4; ++k) group[k] = need[done + k < needed ? done + k : needed - 1];
    std::uint64_t counts[4];
    count_at_least4(abuf, len, group, counts);
    for (std::size_t k = 0; k < 4 && done + k < needed; ++k) got[done + k] = counts[k];
  }
  auto g = [&](std::uint32_t t) -> std::uint64_t {
    if (nonzero_all == 0 || t > c.max_all) return 0;
    if (t <= c.min_nz) return nonzero_finite;
    for (std::size_t j = 0; j < needed; ++j) {
      if (need[j] == t) return got[j] - c.nonfinite;
    }
    std::uint64_t n = 0;  // more than kMaxThresholds distinct thresholds in range
    for (std::size_t i = 0; i < len; ++i) n += abuf[i] >= t;
    return n - c.nonfinite;
  };
  for (std::size_t i = 0; i < th.size(); ++i) {
    const std::uint64_t above_ufl = g(threshold(i, 1));
    acc.target_counts[i][0] += g(threshold(i, 0));
    acc.target_counts[i][1] += nonzero_finite - above_ufl;
    acc.target_counts[i][2] += above_ufl - g(threshold(i, 2));
  }
}

// Pass 1's per-chunk state (registers once inlined).
struct Pass1 {
  Sums sums;
  __m256i max_all;
  __m256i min_nz_minus_one;
};

// Pass 1 for the vector at element i of the chunk, except the sums: returns its FP32 bits; its
// exponents (one per 32-bit lane) go to *e for the byte pack.
template <Format kDtype, bool kScale>
AMPSCOPE_INLINE_AVX2 __m256i pass1_step(char* p, std::size_t i, __m256 scale, std::uint32_t* abuf,
                                        Pass1& s, __m256i* e) {
  char* q = p + i * static_cast<std::size_t>(storage_bytes(kDtype));
  __m256i bits;
  if constexpr (kScale) {
    bits = scale_and_store<kDtype>(q, scale);
  } else {
    bits = load_fp32_bits<kDtype>(q);
  }
  const __m256i a = _mm256_and_si256(bits, splat(kAbsMask));
  _mm256_store_si256(reinterpret_cast<__m256i*>(abuf + i), a);
  s.max_all = _mm256_max_epu32(s.max_all, a);
  s.min_nz_minus_one =
      _mm256_min_epu32(s.min_nz_minus_one, _mm256_add_epi32(a, splat(0xFFFFFFFFu)));
  *e = _mm256_srli_epi32(a, 23);
  return bits;
}

template <Format kDtype, bool kScale>
AMPSCOPE_TARGET_AVX2 void run(char* data, std::size_t n, float factor,
                              std::span<const TargetThresholds> th, StatsAccumulator& acc) {
  constexpr std::size_t elem = static_cast<std::size_t>(storage_bytes(kDtype));
  const __m256 scale = _mm256_set1_ps(factor);
  alignas(32) std::uint32_t abuf[kChunk];
  alignas(32) std::uint8_t ebuf[kChunk];
  const std::size_t full = n - n % kGroup;

  for (std::size_t chunk = 0; chunk < full; chunk += kChunk) {
    const std::size_t len = chunk + kChunk < full ? kChunk : full - chunk;
    char* p = data + chunk * elem;
    Pass1 pass;
    clear(pass.sums);
    pass.max_all = _mm256_setzero_si256();
    pass.min_nz_minus_one = splat(0xFFFFFFFFu);
    for (std::size_t i = 0; i < len; i += kGroup) {
      // Exponents packed to bytes as they come, in a lane order of their own (the packs work
      // within 128-bit halves); the histogram does not care about order.
      __m256i e0, e1, e2, e3;
      const __m256i b0 = pass1_step<kDtype, kScale>(p, i, scale, abuf, pass, &e0);
      const __m256i b1 = pass1_step<kDtype, kScale>(p, i + kLanes, scale, abuf, pass, &e1);
      add_pair(pass.sums, _mm256_castsi256_ps(b0), _mm256_castsi256_ps(b1));
      const __m256i e01 = _mm256_packus_epi32(e0, e1);
      const __m256i b2 = pass1_step<kDtype, kScale>(p, i + 2 * kLanes, scale, abuf, pass, &e2);
      const __m256i b3 = pass1_step<kDtype, kScale>(p, i + 3 * kLanes, scale, abuf, pass, &e3);
      add_pair(pass.sums, _mm256_castsi256_ps(b2), _mm256_castsi256_ps(b3));
      const __m256i e8 = _mm256_packus_epi16(e01, _mm256_packus_epi32(e2, e3));
      _mm256_store_si256(reinterpret_cast<__m256i*>(ebuf + i), e8);
    }
    ChunkSummary c;
    Sums& sums = pass.sums;
    c.max_all = hmax_u32(pass.max_all);
    c.min_nz = hmin_u32(pass.min_nz_minus_one) + 1;  // wraps to 0 when every element is zero
    const bool any_nonzero = c.max_all != 0;
    const bool rare = c.max_all >= kInfBits || (any_nonzero && c.min_nz < kMinNormalBits);
    if (rare) [[unlikely]] {
      rare_chunk<kDtype>(p, len, sums, c, acc);
    } else {
      c.max_finite = c.max_all;
      if (any_nonzero) {
        c.lo = static_cast<int>(c.min_nz >> 23);
        c.hi = static_cast<int>(c.max_all >> 23);
      }
    }
    // Without subnormals, exponent byte 0 is exactly the zeros (a rare chunk counted them).
    const std::uint64_t zero_bytes =
        any_nonzero ? histogram_bytes(ebuf, len, c.lo, c.hi, !rare, acc) : len;
    if (!rare) c.zeros = zero_bytes;
    acc.zeros += c.zeros;
    acc.max_abs_bits = c.max_finite > acc.max_abs_bits ? c.max_finite : acc.max_abs_bits;
    if (any_nonzero && c.min_nz < kInfBits && c.min_nz < acc.min_abs_bits) {
      acc.min_abs_bits = c.min_nz;
    }
    if (c.lo <= c.hi) {
      if (chunk_sum_is_exact(kDtype, c.lo, c.hi, len)) {
        acc.sum.add(total_sum(sums));
        acc.sum_sq.add(total_sum_sq(sums));
      } else {
        add_normal_values_exactly(p, len, kDtype, acc);
      }
    }
    if (!th.empty()) count_targets(abuf, len, c, th, acc);
  }
  if constexpr (kScale) {
    for (std::size_t i = full; i < n; ++i) {
      char* q = data + i * elem;
      float x;
      if constexpr (kDtype == Format::kFP32) {
        std::memcpy(&x, q, 4);
        x *= factor;
        std::memcpy(q, &x, 4);
      } else {
        std::uint16_t h;
        std::memcpy(&h, q, 2);
        h = static_cast<std::uint16_t>(encode(decode(h, kDtype) * factor, kDtype));
        std::memcpy(q, &h, 2);
      }
    }
  }
  finish_scalar(data, n, full, kDtype, th, th.size(), acc);
}

template <bool kScale>
void run_dtype(char* data, std::size_t n, Format dtype, float factor,
               std::span<const TargetThresholds> th, StatsAccumulator& acc) {
  acc.numel += n;
  switch (dtype) {
    case Format::kFP32:
      return run<Format::kFP32, kScale>(data, n, factor, th, acc);
    case Format::kBF16:
      return run<Format::kBF16, kScale>(data, n, factor, th, acc);
    default:
      return run<Format::kFP16, kScale>(data, n, factor, th, acc);
  }
}

}  // namespace

void stats_kernel_avx2(const void* data, std::size_t n, Format dtype,
                       std::span<const TargetThresholds> th, StatsAccumulator& acc) {
  // The read-only instantiation never writes: the cast only shares the code with the fused one.
  run_dtype<false>(static_cast<char*>(const_cast<void*>(data)), n, dtype, 1.0f, th, acc);
}

void scale_stats_kernel_avx2(void* data, std::size_t n, Format dtype, float factor,
                             std::span<const TargetThresholds> th, StatsAccumulator& acc) {
  const ScopedDefaultMxcsr ieee;
  run_dtype<true>(static_cast<char*>(data), n, dtype, factor, th, acc);
}

}  // namespace ampscope::detail
