// Linear warmup then cosine decay, indexed by the number of applied optimizer updates, so a
// skipped step (found_inf) does not advance it (unlike PyTorch's LR schedulers, which step
// regardless: pytorch#67590).
// Thread safety: a plain value.
#pragma once

#include <cstdint>

namespace ampscope::trainer {

struct LrSchedule {
  float max_lr = 1e-3f;
  float min_lr = 1e-4f;
  std::int64_t warmup_steps = 0;
  std::int64_t total_steps = 1;  // updates over which the cosine decays to min_lr

  // The rate of update number `update` (0-based): (update + 1) / warmup * max_lr during warmup,
  // then cosine from max_lr to min_lr, min_lr after total_steps.
  float at(std::int64_t update) const;
};

}  // namespace ampscope::trainer
