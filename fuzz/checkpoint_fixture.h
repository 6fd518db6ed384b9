// The trainer whose checkpoints the checkpoint target loads and the seed generator writes: the
// smallest GPT ampscope-train builds (a few KB of weights), in amp-fp16 so that the header
// carries a dynamic loss scaler.
#pragma once

#include <memory>

#include "ampscope/trainer/trainer.h"

namespace ampscope::fuzz {

inline std::unique_ptr<trainer::Trainer> make_checkpoint_trainer() {
  using namespace ampscope::trainer;
  static const Corpus corpus = Corpus::synthetic(20000);
  TrainerConfig c;
  c.model = {.vocab_size = 0, .context = 4, .n_embd = 4, .n_head = 1, .n_layer = 1};
  c.precision = PrecisionMode::kAmpFP16;
  c.batch = 2;
  c.steps = 4;
  c.warmup_steps = 1;
  return std::make_unique<Trainer>(c, corpus, make_cpu_backend({.blas_threads = 1}));
}

}  // namespace ampscope::fuzz
