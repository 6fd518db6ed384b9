// The read loop is compiled at -O3 (see CMakeLists.txt) so GCC vectorises the reduction, once
// per SIMD level in functions carrying the project's target attributes, and the level is chosen
// with active_simd_level() like every kernel's (cpu_features.h), so it runs as wide as the
// statistics kernels it is compared with. The sum is returned and checked by the caller, so the
// loads cannot be optimised away.
#include "memory_read.h"

#include <algorithm>
#include <stdexcept>
#include <thread>
#include <vector>

#include "ampscope/cpu_features.h"

namespace ampscope::bench {
namespace {

AMPSCOPE_ALWAYS_INLINE std::uint64_t sum_words_body(const std::uint64_t* words, std::size_t n) {
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i < n; ++i) sum += words[i];
  return sum;
}

std::uint64_t sum_words_scalar(const std::uint64_t* words, std::size_t n) {
  return sum_words_body(words, n);
}
AMPSCOPE_TARGET_AVX2 std::uint64_t sum_words_avx2(const std::uint64_t* words, std::size_t n) {
  return sum_words_body(words, n);
}
AMPSCOPE_TARGET_AVX512 std::uint64_t sum_words_avx512(const std::uint64_t* words,
                                                      std::size_t n) {
  return sum_words_body(words, n);
}

using SumWords = std::uint64_t (*)(const std::uint64_t*, std::size_t);

SumWords sum_words_for(SimdLevel level) {
  switch (level) {
    case SimdLevel::kAvx512:
      return sum_words_avx512;
    case SimdLevel::kAvx2:
      return sum_words_avx2;
    case SimdLevel::kScalar:
      break;
  }
  return sum_words_scalar;
}

}  // namespace

std::uint64_t read_sum_u64(const void* data, std::size_t bytes, int threads) {
  if (bytes % 8 != 0 || reinterpret_cast<std::uintptr_t>(data) % 8 != 0) {
    throw std::invalid_argument("read_sum_u64 needs an 8-byte aligned buffer of whole words");
  }
  const SumWords sum_words = sum_words_for(active_simd_level());
  const auto* words = static_cast<const std::uint64_t*>(data);
  const std::size_t n = bytes / 8;
  const std::size_t parts = static_cast<std::size_t>(std::max(1, threads));
  const std::size_t slice = n / parts;
  std::vector<std::uint64_t> partial(parts, 0);
  std::vector<std::thread> workers;
  workers.reserve(parts - 1);
  for (std::size_t t = 1; t < parts; ++t) {
    const std::size_t begin = t * slice;
    const std::size_t count = t + 1 == parts ? n - begin : slice;
    workers.emplace_back([&partial, sum_words, words, t, begin, count] {
      partial[t] = sum_words(words + begin, count);
    });
  }
  partial[0] = sum_words(words, parts == 1 ? n : slice);
  for (auto& w : workers) w.join();
  std::uint64_t sum = 0;
  for (const std::uint64_t p : partial) sum += p;
  return sum;
}

}  // namespace ampscope::bench
