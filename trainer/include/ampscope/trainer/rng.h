// A small deterministic random generator (xoshiro256**, seeded through splitmix64) whose whole
// state is four words, so checkpoints can store it and a resumed run draws the same numbers.
// Thread safety: a plain value.
#pragma once

#include <array>
#include <cstdint>

namespace ampscope::trainer {

class Rng {
 public:
  explicit Rng(std::uint64_t seed = 0);
  std::uint64_t next_u64();
  // Uniform in [0, n) (n > 0), unbiased.
  std::uint64_t uniform_int(std::uint64_t n);
  // Uniform in [0, 1) with 53 random bits.
  double uniform();
  // Standard normal (Box-Muller, no cached second value so the state stays four words).
  double normal();

  std::array<std::uint64_t, 4> state() const { return s_; }
  void set_state(const std::array<std::uint64_t, 4>& s) { s_ = s; }

 private:
  std::array<std::uint64_t, 4> s_{};
};

}  // namespace ampscope::trainer
