// Branch-free loops over bit patterns that GCC vectorises (this file is built with -O3, see
// agent/CMakeLists.txt). The loops are written once and compiled three times, for the x86-64
// baseline, AVX2 and AVX-512, in functions carrying the project's target attributes; the level
// is chosen with active_simd_level() (cpu_features.h), so AMPSCOPE_SIMD caps this pass like
// every other kernel. Each element is classified by its magnitude bits m = bits & ~sign:
//   m == 0            zero            m == inf_bits     +-Inf (by the sign bit)
//   m >  inf_bits     NaN             else              finite; max_abs = decode(max m)
// Counters have the width of the element inside blocks of 2^15 elements, so they never wrap.
#include "counts.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "ampscope/convert.h"
#include "ampscope/cpu_features.h"

namespace ampscope::agent {
namespace {

constexpr std::size_t kBlock = 32768;

struct BlockCounts {
  std::uint64_t zeros = 0, nan = 0, pos_inf = 0, neg_inf = 0;
  std::uint32_t max_bits = 0;
};

// Counters have the element's width (the vectoriser wants one lane type), which bounds a block
// to kBlock < 2^16 elements. Conditions become all-ones masks that are subtracted (or and-ed):
// GCC 12 vectorises that form, not a select or a bool added to a counter.
template <typename Word>
AMPSCOPE_ALWAYS_INLINE Word mask(bool b) {
  return static_cast<Word>(-static_cast<Word>(b));
}

// The exact classification of every element.
template <typename Word, Word kSign, Word kInf>
AMPSCOPE_ALWAYS_INLINE void count_block_exact(const Word* p, std::size_t n, BlockCounts& c) {
  using Signed = std::make_signed_t<Word>;
  Word zeros = 0, nan = 0, inf = 0, neg_inf = 0, max_m = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const Word w = p[i];
    const Word m = static_cast<Word>(w & static_cast<Word>(~kSign));
    zeros = static_cast<Word>(zeros - mask<Word>(m == 0));
    nan = static_cast<Word>(nan - mask<Word>(m > kInf));
    inf = static_cast<Word>(inf - mask<Word>(m == kInf));
    neg_inf = static_cast<Word>(neg_inf - mask<Word>(w == static_cast<Word>(kSign | kInf)));
    // m < 2^(bits-1), so the signed maximum is the same and exists in more instruction sets.
    max_m = static_cast<Word>(std::max(static_cast<Signed>(max_m),
                                       static_cast<Signed>(m & mask<Word>(m < kInf))));
  }
  c.zeros += zeros;
  c.nan += nan;
  c.pos_inf += static_cast<Word>(inf - neg_inf);
  c.neg_inf += neg_inf;
  c.max_bits = std::max<std::uint32_t>(c.max_bits, max_m);
}

// The common case first: zeros, the largest magnitude and whether anything is non-finite, in
// about half the work of the exact pass; only a block that holds a NaN or an Inf (rare, and
// then the step is escalated anyway) is classified again exactly.
template <typename Word, Word kSign, Word kInf>
AMPSCOPE_ALWAYS_INLINE void count_block(const Word* p, std::size_t n, BlockCounts& c) {
  using Signed = std::make_signed_t<Word>;
  Word zeros = 0, special = 0, max_m = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const Word m = static_cast<Word>(p[i] & static_cast<Word>(~kSign));
    zeros = static_cast<Word>(zeros - mask<Word>(m == 0));
    special = static_cast<Word>(special - mask<Word>(m >= kInf));
    max_m = static_cast<Word>(std::max(static_cast<Signed>(max_m), static_cast<Signed>(m)));
  }
  if (special != 0) {
    count_block_exact<Word, kSign, kInf>(p, n, c);
    return;
  }
  c.zeros += zeros;
  c.max_bits = std::max<std::uint32_t>(c.max_bits, max_m);
}

AMPSCOPE_ALWAYS_INLINE void count16_body(const std::uint16_t* p, std::size_t n,
                                         std::uint16_t inf_bits, BlockCounts& c) {
  for (std::size_t i = 0; i < n; i += kBlock) {
    const std::size_t len = std::min(kBlock, n - i);
    if (inf_bits == 0x7c00) {
      count_block<std::uint16_t, 0x8000, 0x7c00>(p + i, len, c);
    } else {
      count_block<std::uint16_t, 0x8000, 0x7f80>(p + i, len, c);
    }
  }
}

AMPSCOPE_ALWAYS_INLINE void count32_body(const std::uint32_t* p, std::size_t n, BlockCounts& c) {
  for (std::size_t i = 0; i < n; i += kBlock) {
    count_block<std::uint32_t, 0x80000000u, 0x7f800000u>(p + i, std::min(kBlock, n - i), c);
  }
}

// One pair of entry points per level: the same loops, vectorised for that level.
struct CountKernels {
  void (*count16)(const std::uint16_t*, std::size_t, std::uint16_t, BlockCounts&);
  void (*count32)(const std::uint32_t*, std::size_t, BlockCounts&);
};

void count16_scalar(const std::uint16_t* p, std::size_t n, std::uint16_t inf, BlockCounts& c) {
  count16_body(p, n, inf, c);
}
void count32_scalar(const std::uint32_t* p, std::size_t n, BlockCounts& c) {
  count32_body(p, n, c);
}
AMPSCOPE_TARGET_AVX2 void count16_avx2(const std::uint16_t* p, std::size_t n, std::uint16_t inf,
                                       BlockCounts& c) {
  count16_body(p, n, inf, c);
}
AMPSCOPE_TARGET_AVX2 void count32_avx2(const std::uint32_t* p, std::size_t n, BlockCounts& c) {
  count32_body(p, n, c);
}
AMPSCOPE_TARGET_AVX512 void count16_avx512(const std::uint16_t* p, std::size_t n,
                                           std::uint16_t inf, BlockCounts& c) {
  count16_body(p, n, inf, c);
}
AMPSCOPE_TARGET_AVX512 void count32_avx512(const std::uint32_t* p, std::size_t n,
                                           BlockCounts& c) {
  count32_body(p, n, c);
}

CountKernels kernels_for(SimdLevel level) {
  switch (clamp_simd_level(level)) {
    case SimdLevel::kAvx512:
      return {count16_avx512, count32_avx512};
    case SimdLevel::kAvx2:
      return {count16_avx2, count32_avx2};
    case SimdLevel::kScalar:
      break;
  }
  return {count16_scalar, count32_scalar};
}

// Reads an unaligned buffer through aligned words: the kernels accept any alignment, and so
// does this (a copy of the few leading bytes is not worth a second code path).
template <typename Word>
bool aligned(const void* data) {
  return reinterpret_cast<std::uintptr_t>(data) % alignof(Word) == 0;
}

}  // namespace

bool count_nonfinite(const void* data, std::size_t n, Format dtype, TensorStats* out) {
  return count_nonfinite(data, n, dtype, active_simd_level(), out);
}

bool count_nonfinite(const void* data, std::size_t n, Format dtype, SimdLevel level,
                     TensorStats* out) {
  *out = TensorStats{};
  if (!is_stats_storage_format(dtype)) return false;
  if (storage_bytes(dtype) == 1) {
    // FP8: compute_stats reads the 256 byte patterns in one table pass, as cheap as a count.
    const TensorStats full = compute_stats(data, n, dtype);
    out->numel = full.numel;
    out->zeros = full.zeros;
    out->nan = full.nan;
    out->pos_inf = full.pos_inf;
    out->neg_inf = full.neg_inf;
    out->max_abs = full.max_abs;
    return true;
  }
  out->numel = n;
  if (n == 0) return true;
  const CountKernels k = kernels_for(level);
  BlockCounts c;
  double max_abs = 0.0;
  if (dtype == Format::kFP32) {
    if (aligned<std::uint32_t>(data)) {
      k.count32(static_cast<const std::uint32_t*>(data), n, c);
    } else {
      std::uint32_t w[256];
      const auto* bytes = static_cast<const unsigned char*>(data);
      for (std::size_t i = 0; i < n; i += 256) {
        const std::size_t len = std::min<std::size_t>(256, n - i);
        std::memcpy(w, bytes + i * 4, len * 4);
        k.count32(w, len, c);
      }
    }
    float f;
    std::memcpy(&f, &c.max_bits, sizeof(f));
    max_abs = f;
  } else {
    const std::uint16_t inf_bits = dtype == Format::kFP16 ? 0x7c00 : 0x7f80;
    if (aligned<std::uint16_t>(data)) {
      k.count16(static_cast<const std::uint16_t*>(data), n, inf_bits, c);
    } else {
      std::uint16_t w[512];
      const auto* bytes = static_cast<const unsigned char*>(data);
      for (std::size_t i = 0; i < n; i += 512) {
        const std::size_t len = std::min<std::size_t>(512, n - i);
        std::memcpy(w, bytes + i * 2, len * 2);
        k.count16(w, len, inf_bits, c);
      }
    }
    max_abs = static_cast<double>(decode(static_cast<std::uint16_t>(c.max_bits), dtype));
  }
  out->zeros = c.zeros;
  out->nan = c.nan;
  out->pos_inf = c.pos_inf;
  out->neg_inf = c.neg_inf;
  out->max_abs = max_abs;
  return true;
}

}  // namespace ampscope::agent
