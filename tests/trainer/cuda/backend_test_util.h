// Helpers for the CUDA back-end tests: precision configurations, random tensors held as storage
// bits, a fixture that skips without a device, and comparison with a per-format tolerance.
//
// Tolerance table (|got - ref| <= rtol * |ref| + atol * max|ref| of the tensor), by the format
// the result is rounded to:
//   exact   elementwise operations (same expression, same rounding, no FMA): 0, 0
//   fp32    reductions in another order: rtol 1e-5, atol 1e-5 (sums of up to a few hundred
//           terms of similar magnitude lose a few units of 2^-24 each)
//   fp16    one FP32 ulp of difference before rounding can move the result by one FP16 ulp
//           (2^-10 relative at most); two ulps: rtol 2^-9, atol 2^-9
//   bf16    the same with BF16's 2^-7: rtol 2^-6, atol 2^-6
// Transcendentals: the device's expf/logf are within 2 ulps of the C library's; at FP32 that
// stays inside the fp32 row, rounded to FP16/BF16 inside theirs.
// NaN matches NaN (payloads differ by design: kernels/cuda/convert_element.cuh).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ampscope/convert.h"
#include "ampscope/formats.h"

namespace ampscope {
inline void PrintTo(Format f, std::ostream* os) { *os << format_name(f); }
}  // namespace ampscope

namespace ampscope::trainer::testing {

// The reference is the CPU back end's plain (x86-64 baseline) path, as STYLE.md asks: its
// AVX2/AVX-512 instantiations are compiled with FMA available, and GCC contracts a * b + c into
// an FMA in C++ even in ISO mode (-ffp-contract=fast is its C++ default), so they can differ
// from the plain code by an ulp. The device code is compiled without contraction (--fmad=false)
// and matches the plain path. AMPSCOPE_SIMD is read once, at the first dispatch, which comes
// after static initialisation.
inline const bool kPlainCpuReference = [] { return ::setenv("AMPSCOPE_SIMD", "scalar", 1) == 0; }();

// The formats of one operation: inputs stored in `in`, outputs in `out`, computed in `compute`.
struct Precision {
  const char* name;
  Format compute;
  Format in;
  Format out;
};
inline void PrintTo(const Precision& p, std::ostream* os) { *os << p.name; }

// FP32 throughout; pure FP16 and BF16; AMP's mixed cases (FP32 input rounded into a 16-bit
// compute format, 16-bit input read into FP32 compute).
inline const std::vector<Precision>& precisions() {
  static const std::vector<Precision> all = {
      {"fp32", Format::kFP32, Format::kFP32, Format::kFP32},
      {"fp16", Format::kFP16, Format::kFP16, Format::kFP16},
      {"bf16", Format::kBF16, Format::kBF16, Format::kBF16},
      {"fp32_in_fp16_compute", Format::kFP16, Format::kFP32, Format::kFP16},
      {"bf16_in_fp32_compute", Format::kFP32, Format::kBF16, Format::kFP32},
      {"fp32_in_bf16_compute_fp32_out", Format::kBF16, Format::kFP32, Format::kFP32},
  };
  return all;
}

struct Tolerance {
  double rtol = 0.0;
  double atol = 0.0;  // relative to the largest |ref| of the tensor
};
inline constexpr Tolerance kExact{0.0, 0.0};
inline Tolerance reduction_tolerance(Format rounded_to) {
  switch (rounded_to) {
    case Format::kFP16:
      return {0x1p-9, 0x1p-9};
    case Format::kBF16:
      return {0x1p-6, 0x1p-6};
    default:
      return {1e-5, 1e-5};
  }
}
// The looser of the two formats' tolerances (a result rounded to compute, then stored).
inline Tolerance reduction_tolerance(Format compute, Format stored) {
  const Tolerance a = reduction_tolerance(compute), b = reduction_tolerance(stored);
  return {std::max(a.rtol, b.rtol), std::max(a.atol, b.atol)};
}

// n elements of `dtype` storage as bytes.
struct Bits {
  Format dtype = Format::kFP32;
  std::vector<std::byte> bytes;

  Bits() = default;
  Bits(Format f, std::size_t n) : dtype(f), bytes(n * static_cast<std::size_t>(storage_bytes(f))) {}
  std::size_t size() const { return bytes.size() / static_cast<std::size_t>(storage_bytes(dtype)); }
  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }
  std::vector<float> values() const {
    std::vector<float> v(size());
    convert_to_fp32(bytes.data(), v.data(), v.size(), dtype);
    return v;
  }
  static Bits from(const std::vector<float>& v, Format f) {
    Bits b(f, v.size());
    convert_from_fp32(v.data(), b.data(), v.size(), f);
    return b;
  }
};

inline std::vector<float> random_values(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

inline Bits random_bits(std::size_t n, Format f, std::uint32_t seed, float scale = 1.0f) {
  return Bits::from(random_values(n, seed, scale), f);
}

// Checks every element; reports the first few mismatches with their index.
inline ::testing::AssertionResult close(const std::vector<float>& ref,
                                        const std::vector<float>& got, Tolerance tol) {
  if (ref.size() != got.size()) {
    return ::testing::AssertionFailure() << "sizes differ: " << ref.size() << " vs " << got.size();
  }
  double max_ref = 0.0;
  for (float r : ref) {
    if (std::isfinite(r)) max_ref = std::max(max_ref, std::fabs(static_cast<double>(r)));
  }
  int bad = 0;
  ::testing::AssertionResult result = ::testing::AssertionSuccess();
  std::string detail;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double r = ref[i], g = got[i];
    bool ok;
    if (std::isnan(r) || std::isnan(g)) {
      ok = std::isnan(r) && std::isnan(g);
    } else if (std::isinf(r) || std::isinf(g) || tol.rtol == 0.0) {
      ok = r == g;
    } else {
      ok = std::fabs(g - r) <= tol.rtol * std::fabs(r) + tol.atol * max_ref;
    }
    if (!ok && ++bad <= 5) {
      detail += " [" + std::to_string(i) + "] ref " + std::to_string(r) + " got " +
                std::to_string(g) + ";";
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << ref.size() << " elements differ (rtol " << tol.rtol << ", atol "
         << tol.atol << " x max|ref| " << max_ref << "):" << detail;
}

// Bit-for-bit, except that NaN matches any NaN.
inline ::testing::AssertionResult same_bits(const Bits& ref, const Bits& got) {
  if (ref.dtype != got.dtype || ref.bytes.size() != got.bytes.size()) {
    return ::testing::AssertionFailure() << "different formats or sizes";
  }
  const std::vector<float> r = ref.values(), g = got.values();
  const auto width = static_cast<std::size_t>(storage_bytes(ref.dtype));
  int bad = 0;
  std::string detail;
  for (std::size_t i = 0; i < r.size(); ++i) {
    const bool both_nan = std::isnan(r[i]) && std::isnan(g[i]);
    if (both_nan || std::memcmp(&ref.bytes[i * width], &got.bytes[i * width], width) == 0) continue;
    if (++bad <= 5) {
      detail += " [" + std::to_string(i) + "] ref " + std::to_string(r[i]) + " got " +
                std::to_string(g[i]) + ";";
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << r.size() << " elements differ:" << detail;
}

}  // namespace ampscope::trainer::testing
