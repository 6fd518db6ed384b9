// The read loop is compiled at -O3 (see CMakeLists.txt) so GCC vectorises the reduction, and is
// cloned for AVX-512 and AVX2 with run-time selection (target_clones, an ifunc) so it runs as
// wide as the CPU allows while the binary stays on the x86-64 baseline. The sum is returned and
// checked by the caller, so the loads cannot be optimised away.
#include "memory_read.h"

#include <algorithm>
#include <stdexcept>
#include <thread>
#include <vector>

namespace ampscope::bench {
namespace {

__attribute__((target_clones("avx512f", "avx2", "default"), noinline)) std::uint64_t sum_words(
    const std::uint64_t* words, std::size_t n) {
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i < n; ++i) sum += words[i];
  return sum;
}

}  // namespace

std::uint64_t read_sum_u64(const void* data, std::size_t bytes, int threads) {
  if (bytes % 8 != 0 || reinterpret_cast<std::uintptr_t>(data) % 8 != 0) {
    throw std::invalid_argument("read_sum_u64 needs an 8-byte aligned buffer of whole words");
  }
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
    workers.emplace_back(
        [&partial, words, t, begin, count] { partial[t] = sum_words(words + begin, count); });
  }
  partial[0] = sum_words(words, parts == 1 ? n : slice);
  for (auto& w : workers) w.join();
  std::uint64_t sum = 0;
  for (const std::uint64_t p : partial) sum += p;
  return sum;
}

}  // namespace ampscope::bench
