#include "gradient_data.h"

#include <algorithm>
#include <limits>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "ampscope/convert.h"

namespace ampscope::bench {
namespace {

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Fills chunk `c` (its first `count` elements) in FP32.
void generate_chunk(std::size_t c, std::size_t count, const GradientSpec& spec, float* out) {
  std::mt19937_64 rng(splitmix64(spec.seed ^ splitmix64(c)));
  std::normal_distribution<float> normal(0.0f, static_cast<float>(spec.stddev));
  for (std::size_t i = 0; i < count; ++i) out[i] = normal(rng);
  for (std::size_t i = 512; i < count; i += 1024) out[i] = 0.0f;
  struct Special {
    std::size_t offset;
    float value;
  };
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const Special specials[] = {
      {17, std::numeric_limits<float>::quiet_NaN()}, {4242, kInf}, {9999, -kInf}, {31337, 1e5f}};
  for (const Special& s : specials) {
    if (s.offset < count) out[s.offset] = s.value;
  }
}

}  // namespace

void fill_gradients(void* out, std::size_t n, Format storage, const GradientSpec& spec,
                    int threads) {
  if (!is_stats_storage_format(storage)) {
    throw std::invalid_argument("gradients are generated as fp32, fp16 or bf16");
  }
  const std::size_t elem = static_cast<std::size_t>(storage_bytes(storage));
  const std::size_t chunks = (n + kGradientChunk - 1) / kGradientChunk;
  const std::size_t parts = static_cast<std::size_t>(std::max(1, threads));
  auto work = [&](std::size_t part) {
    std::vector<float> scratch(storage == Format::kFP32 ? 0 : kGradientChunk);
    for (std::size_t c = part; c < chunks; c += parts) {
      const std::size_t begin = c * kGradientChunk;
      const std::size_t count = std::min(kGradientChunk, n - begin);
      char* dst = static_cast<char*>(out) + begin * elem;
      if (storage == Format::kFP32) {
        generate_chunk(c, count, spec, reinterpret_cast<float*>(dst));
      } else {
        generate_chunk(c, count, spec, scratch.data());
        convert_from_fp32(scratch.data(), dst, count, storage);
      }
    }
  };
  std::vector<std::thread> workers;
  for (std::size_t p = 1; p < parts; ++p) workers.emplace_back(work, p);
  work(0);
  for (auto& w : workers) w.join();
}

}  // namespace ampscope::bench
