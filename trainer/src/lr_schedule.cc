#include "ampscope/trainer/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace ampscope::trainer {

float LrSchedule::at(std::int64_t update) const {
  if (update < warmup_steps) {
    return max_lr * static_cast<float>(update + 1) / static_cast<float>(warmup_steps);
  }
  const std::int64_t decay_steps = std::max<std::int64_t>(1, total_steps - warmup_steps);
  const double progress =
      std::min(1.0, static_cast<double>(update - warmup_steps) / static_cast<double>(decay_steps));
  const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  return static_cast<float>(min_lr + (max_lr - min_lr) * cosine);
}

}  // namespace ampscope::trainer
