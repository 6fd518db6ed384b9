// Random FP32 tensors for the trainer's layer tests: N(0, stddev^2) values from the trainer's
// own seeded generator, so every run sees the same numbers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ampscope/trainer/rng.h"

namespace ampscope::trainer::testing {

inline std::vector<float> randn(std::size_t n, std::uint64_t seed, double stddev = 1.0) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng.normal() * stddev);
  return v;
}

}  // namespace ampscope::trainer::testing
