// Training data: a character-level corpus (the built-in synthetic one, or any text file) split
// into train and validation parts, and a deterministic batch sampler whose position is part of
// a checkpoint.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ampscope/trainer/rng.h"

namespace ampscope::trainer {

class Corpus {
 public:
  // The built-in synthetic corpus: `chars` characters of templated English-like sentences drawn
  // from a fixed generator (independent of the training seed), so every run sees the same text.
  static Corpus synthetic(std::size_t chars = 200000);
  // Any text file; the vocabulary is the set of bytes in it. Throws ampscope::Error with a
  // one-line message (missing, unreadable, empty, fewer than 2 distinct characters).
  static Corpus from_file(const std::string& path);
  static Corpus from_text(std::string_view text, std::string source = "text");

  int vocab_size() const { return static_cast<int>(alphabet_.size()); }
  const std::string& alphabet() const { return alphabet_; }  // token id -> byte
  const std::vector<std::int32_t>& tokens() const { return tokens_; }
  const std::string& source() const { return source_; }
  std::string decode(const std::int32_t* ids, std::size_t n) const;

 private:
  std::string source_;
  std::string alphabet_;
  std::vector<std::int32_t> tokens_;
};

// A (B, T) batch of inputs and next-token targets.
struct Batch {
  int batch = 0;
  int context = 0;
  std::vector<std::int32_t> inputs;
  std::vector<std::int32_t> targets;
};

// Train/validation split of a corpus: the last `val_fraction` of the tokens are validation.
// Training batches start at uniformly random offsets of the train part drawn from the sampler's
// own generator; validation batches are fixed, evenly spaced windows.
class DataLoader {
 public:
  // Throws ampscope::Error when either part is shorter than context + 1 tokens.
  DataLoader(const Corpus& corpus, int batch, int context, double val_fraction,
             std::uint64_t seed);

  void next_train(Batch& out);
  // Draws `batches` training batches without filling one: the position of a rank that takes
  // every N-th batch of the one stream all ranks share.
  void skip_train(std::int64_t batches);
  // Validation batch `index` of `count`; the windows of all `count` batches do not repeat
  // unless the validation part is too short.
  void val_batch(int index, int count, Batch& out) const;

  std::size_t train_tokens() const { return train_end_; }
  std::size_t val_tokens() const { return tokens_.size() - train_end_; }
  Rng& rng() { return rng_; }
  const Rng& rng() const { return rng_; }
  std::int64_t batches_drawn() const { return drawn_; }
  void set_batches_drawn(std::int64_t n) { drawn_ = n; }

 private:
  std::size_t draw_offset();  // a training window's first token

  std::vector<std::int32_t> tokens_;
  int batch_;
  int context_;
  std::size_t train_end_;
  Rng rng_;
  std::int64_t drawn_ = 0;
};

}  // namespace ampscope::trainer
