// Recipes and tensors for the device fake_quantize tests (recipe_host_model_test.cc on the host,
// recipe_test.cc on the device), chosen so that every rule of ampscope/recipe.h decides some
// element: every E4M3 and E2M1 code and the ties between neighbours, scaled; Inf and NaN blocks;
// zero blocks and -0; ragged edges along both axes; blocks running down the columns; FP32
// subnormals (a tile scale that rounds to 0, an nvfp4 block whose code rounds to 0); MX scales
// that round amax into saturation (floor) and an amax near FP32 max (ceil decodes to Inf).
#pragma once

#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "ampscope/convert.h"
#include "ampscope/recipe.h"

namespace ampscope::cuda::testing {

inline std::vector<std::string> recipe_case_texts() {
  return {"e4m3:current",
          "e5m2:current",
          "e4m3:current:margin=3",
          "e2m1:current",
          "e3m2:current",
          "e4m3:scale=112.5",
          "e5m2:scale=0.0009765625",
          "e4m3:scale=3e+30",
          "e4m3:tile=1x128",
          "e4m3:tile=128x128",
          "e5m2:tile=3x5",
          "e2m3:tile=7x1",
          "mxfp8_e4m3",
          "mxfp8_e5m2",
          "mxfp6_e3m2",
          "mxfp6_e2m3",
          "mxfp4",
          "mxfp8_e4m3:ceil",
          "mxfp4:ceil",
          "mxfp8_e4m3:block=32x1",
          "mxfp4:block=4x8:ceil",
          "nvfp4",
          "nvfp4:block=16x1",
          "nvfp4:block=3x7"};
}

// A gtest parameter name for a recipe's text ("mxfp4:ceil" -> "mxfp4_ceil").
inline std::string recipe_test_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string name = info.param;
  for (char& ch : name) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return name;
}

struct TensorCase {
  std::string name;
  std::size_t rows = 0, cols = 0;
  std::vector<float> values;
};

inline float bits_to_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Every finite code of `f`, each tie between neighbouring codes, scaled by 2^shift.
inline void append_codes_and_ties(std::vector<float>& v, Format f, int shift) {
  const int codes = 1 << format_info(f).total_bits;
  std::vector<float> magnitudes;
  for (int c = 0; c < codes / 2; ++c) {
    const float x = decode(static_cast<std::uint32_t>(c), f);
    if (std::isfinite(x)) magnitudes.push_back(x);
  }
  for (std::size_t i = 0; i < magnitudes.size(); ++i) {
    const float m = std::ldexp(magnitudes[i], shift);
    v.push_back(m);
    v.push_back(-m);
    if (i + 1 < magnitudes.size())
      v.push_back(std::ldexp((magnitudes[i] + magnitudes[i + 1]) / 2, shift));
  }
}

inline std::vector<TensorCase> tensor_cases() {
  std::vector<TensorCase> cases;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  {
    // Codes and ties at several scales, in a prime-sized view.
    TensorCase c{"codes_and_ties", 59, 61, {}};
    for (int shift : {-3, 0, 5, -20}) {
      append_codes_and_ties(c.values, Format::kE4M3, shift);
      append_codes_and_ties(c.values, Format::kE2M1, shift);
      append_codes_and_ties(c.values, Format::kE5M2, shift - 8);
    }
    c.values.resize(c.rows * c.cols, 0.25f);
    cases.push_back(std::move(c));
  }
  {
    // Wide dynamic range: N(0,1) x 2^U(-30, 30), with Inf, NaN, zero rows and -0 sprinkled in.
    TensorCase c{"wide_with_specials", 130, 129, {}};
    std::mt19937 rng(11);
    std::normal_distribution<float> normal;
    std::uniform_int_distribution<int> binade(-30, 30);
    for (std::size_t i = 0; i < c.rows * c.cols; ++i) {
      c.values.push_back(std::ldexp(normal(rng), binade(rng)));
    }
    for (std::size_t col = 0; col < c.cols; ++col) c.values[5 * c.cols + col] = 0.0f;
    for (std::size_t col = 0; col < c.cols; ++col) c.values[6 * c.cols + col] = -0.0f;
    c.values[17] = kNaN;
    c.values[c.cols * 40 + 64] = kInf;
    c.values[c.cols * 90 + 3] = -kInf;
    c.values[c.rows * c.cols - 1] = bits_to_float(0x7FC12345u);  // NaN with a payload
    cases.push_back(std::move(c));
  }
  {
    // Scale edge cases, one row of 32-element groups each (and a ragged tail of 19).
    TensorCase c{"scale_edges", 1, 32 * 8 + 19, {}};
    auto group = [&](auto&& fill) {
      for (int i = 0; i < 32; ++i) c.values.push_back(fill(i));
    };
    // amax 511.99 x 2^k: MX floor gives amax / X just under 2^9, beyond E4M3's 448.
    group([](int i) { return (i % 2 ? -1.0f : 1.0f) * (511.99f - 16.0f * static_cast<float>(i)); });
    group([](int i) { return std::ldexp(1.999f - 0.05f * static_cast<float>(i), 60); });
    // FP32 subnormals: tile d rounds to 0 (-> 2^-149), nvfp4 codes round to 0.
    group([](int i) { return bits_to_float(static_cast<std::uint32_t>(1 + 3 * i)); });
    group([](int i) { return (i == 7) ? std::numeric_limits<float>::denorm_min() : 0.0f; });
    // An amax near FP32 max: mx:ceil rounds the scale up and decodes FP32 max to Inf.
    group([](int i) {
      return i == 0 ? std::numeric_limits<float>::max() : std::ldexp(1.0f, 90 + i);
    });
    group([](int) { return 0.0f; });
    group([](int i) { return i == 31 ? kNaN : 1.0f; });
    group([](int i) { return i == 0 ? -kInf : std::ldexp(1.0f, -i); });
    for (int i = 0; i < 19; ++i) c.values.push_back(std::ldexp(3.0f, -i));
    cases.push_back(std::move(c));
  }
  {
    // A column vector and a long row: blocks cut short along each axis.
    TensorCase col{"column", 77, 1, {}}, row{"row", 1, 1000, {}};
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    for (int i = 0; i < 77; ++i) col.values.push_back(normal(rng));
    for (int i = 0; i < 1000; ++i) row.values.push_back(normal(rng) * (i % 100 == 0 ? 1e4f : 1.0f));
    cases.push_back(std::move(col));
    cases.push_back(std::move(row));
  }
  return cases;
}

// Bit for bit (every NaN the same bits too: both sides write a quiet 0x7FC00000 for a NaN block
// and pass other NaNs through); reports the first few differences.
inline ::testing::AssertionResult same_values(const std::vector<float>& ref,
                                              const std::vector<float>& got) {
  int bad = 0;
  std::string detail;
  for (std::size_t i = 0; i < ref.size() && i < got.size(); ++i) {
    std::uint32_t a, b;
    std::memcpy(&a, &ref[i], sizeof a);
    std::memcpy(&b, &got[i], sizeof b);
    if (a != b && ++bad <= 5) {
      detail += " [" + std::to_string(i) + "] ref " + std::to_string(ref[i]) + " got " +
                std::to_string(got[i]) + ";";
    }
  }
  if (ref.size() == got.size() && bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << ref.size() << " values differ:" << detail;
}

// Every field equal, except signal_sq and error_sq within `sum_rtol` (0: equal).
inline ::testing::AssertionResult same_counts(const RecipeCounts& ref, const RecipeCounts& got,
                                              double sum_rtol) {
  RecipeCounts g = got;
  for (auto [r, x] : {std::pair{ref.signal_sq, &g.signal_sq}, {ref.error_sq, &g.error_sq}}) {
    if (std::fabs(*x - r) <= sum_rtol * std::fabs(r)) *x = r;
  }
  if (g == ref) return ::testing::AssertionSuccess();
  auto line = [](const RecipeCounts& c) {
    return "values " + std::to_string(c.values) + " nonfinite " + std::to_string(c.nonfinite) +
           " underflow " + std::to_string(c.underflow) + " subnormal " +
           std::to_string(c.subnormal) + " saturated " + std::to_string(c.saturated) +
           " overflow " + std::to_string(c.overflow) + " amax " + std::to_string(c.amax) +
           " signal_sq " + std::to_string(c.signal_sq) + " error_sq " + std::to_string(c.error_sq) +
           " tensor_scale " + std::to_string(c.tensor_scale) + " blocks " +
           std::to_string(c.blocks) + " zero " + std::to_string(c.zero_blocks) +
           " saturated_blocks " + std::to_string(c.saturated_blocks) + " nan_blocks " +
           std::to_string(c.nan_blocks) + " histogram bins " +
           std::to_string(c.scale_histogram.counts.size()) + " from 2^" +
           std::to_string(c.scale_histogram.min_exponent);
  };
  return ::testing::AssertionFailure()
         << "counts differ\n  ref " << line(ref) << "\n  got " << line(got);
}

}  // namespace ampscope::cuda::testing
