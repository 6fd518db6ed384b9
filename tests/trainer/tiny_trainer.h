// The small CPU training run the trainer tests share: a 2-layer, 32-wide GPT on the synthetic
// corpus, one BLAS thread, seed 1.
#pragma once

#include <cstdint>
#include <memory>

#include "ampscope/trainer/backend.h"
#include "ampscope/trainer/data.h"
#include "ampscope/trainer/trainer.h"

namespace ampscope::trainer::testing {

inline const Corpus& corpus() {
  static const Corpus c = Corpus::synthetic();
  return c;
}

inline TrainerConfig tiny(PrecisionMode mode, std::int64_t steps = 200) {
  TrainerConfig c;
  c.model = {.vocab_size = 0, .context = 32, .n_embd = 32, .n_head = 2, .n_layer = 2};
  c.precision = mode;
  c.batch = 8;
  c.steps = steps;
  c.seed = 1;
  c.lr = 5e-3f;
  c.min_lr = 5e-4f;
  c.warmup_steps = 10;
  return c;
}

inline std::unique_ptr<Trainer> make(const TrainerConfig& c) {
  return std::make_unique<Trainer>(c, corpus(), make_cpu_backend({.blas_threads = 1}));
}

}  // namespace ampscope::trainer::testing
