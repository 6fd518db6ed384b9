// Corpora and the batch sampler.
#include "ampscope/trainer/data.h"

#include <algorithm>
#include <array>
#include <fstream>
#include <iterator>
#include <sstream>

#include "require.h"

namespace ampscope::trainer {
namespace {

// The synthetic language: templated sentences with a little structure a small model can learn
// at several levels (spelling, word order, counting, copying a random word seen earlier).
constexpr std::array kSubjects = {"the cat",  "a dog",     "my friend", "the old man",
                                  "she",      "he",        "the bird",  "our teacher",
                                  "the girl", "a farmer"};
constexpr std::array kVerbs = {"sees", "likes", "finds", "wants", "eats", "takes", "paints",
                               "follows"};
constexpr std::array kObjects = {"the ball",  "a red apple",  "the big house", "some bread",
                                 "the river", "a small boat", "the garden",    "an old book"};
constexpr std::array kEndings = {"", " today", " in the morning", " at night", " again",
                                 " with care"};

void append_sentence(std::string& out, Rng& rng) {
  const auto pick = [&rng](const auto& list) {
    return std::string(list[rng.uniform_int(list.size())]);
  };
  const std::uint64_t kind = rng.uniform_int(10);
  std::string s;
  if (kind < 7) {
    s = pick(kSubjects) + " " + pick(kVerbs) + " " + pick(kObjects) + pick(kEndings);
    if (rng.uniform_int(3) == 0) s += ", and " + pick(kSubjects) + " " + pick(kVerbs) + " it";
  } else if (kind < 9) {
    const std::uint64_t start = rng.uniform_int(5);
    const std::uint64_t len = 3 + rng.uniform_int(4);
    s = "count";
    for (std::uint64_t i = 0; i < len; ++i) s += " " + std::to_string(start + i);
  } else {
    std::string word;
    for (int i = 0; i < 3; ++i) word += static_cast<char>('a' + rng.uniform_int(26));
    s = "say " + word + " " + word + " " + word;
  }
  s[0] = static_cast<char>(s[0] - 'a' + 'A');
  out += s;
  out += ".\n";
}

}  // namespace

Corpus Corpus::synthetic(std::size_t chars) {
  Rng rng(0x616d7073636f7065ull);  // fixed: every run sees the same text
  std::string text;
  text.reserve(chars + 128);
  while (text.size() < chars) append_sentence(text, rng);
  text.resize(chars);
  return from_text(text, "synthetic");
}

Corpus Corpus::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  AMPSCOPE_REQUIRE(in.good(), "cannot open data file '", path, "'");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  AMPSCOPE_REQUIRE(!in.bad(), "cannot read data file '", path, "'");
  AMPSCOPE_REQUIRE(!text.empty(), "data file '", path, "' is empty");
  return from_text(text, path);
}

Corpus Corpus::from_text(std::string_view text, std::string source) {
  Corpus c;
  c.source_ = std::move(source);
  std::array<bool, 256> seen{};
  for (unsigned char ch : text) seen[ch] = true;
  std::array<std::int32_t, 256> id{};
  for (int ch = 0; ch < 256; ++ch) {
    if (seen[static_cast<std::size_t>(ch)]) {
      id[static_cast<std::size_t>(ch)] = static_cast<std::int32_t>(c.alphabet_.size());
      c.alphabet_.push_back(static_cast<char>(ch));
    }
  }
  AMPSCOPE_REQUIRE(c.alphabet_.size() >= 2, "data '", c.source_,
                 "' has fewer than 2 distinct characters");
  c.tokens_.reserve(text.size());
  for (unsigned char ch : text) c.tokens_.push_back(id[ch]);
  return c;
}

std::string Corpus::decode(const std::int32_t* ids, std::size_t n) const {
  std::string s;
  for (std::size_t i = 0; i < n; ++i) s.push_back(alphabet_[static_cast<std::size_t>(ids[i])]);
  return s;
}

DataLoader::DataLoader(const Corpus& corpus, int batch, int context, double val_fraction,
                       std::uint64_t seed)
    : tokens_(corpus.tokens()), batch_(batch), context_(context), rng_(seed ^ 0xda7a) {
  AMPSCOPE_REQUIRE(val_fraction > 0.0 && val_fraction < 1.0, "val_fraction must be in (0, 1), got ",
                 val_fraction);
  train_end_ = static_cast<std::size_t>(static_cast<double>(tokens_.size()) * (1.0 - val_fraction));
  const auto need = static_cast<std::size_t>(context) + 1;
  AMPSCOPE_REQUIRE(train_end_ >= need && tokens_.size() - train_end_ >= need, "data '",
                 corpus.source(), "' has ", tokens_.size(),
                 " characters: too short for a context of ", context,
                 " in both the training and the validation part");
}

namespace {
void fill_window(const std::vector<std::int32_t>& tokens, std::size_t offset, int context,
                 std::int32_t* inputs, std::int32_t* targets) {
  std::copy_n(tokens.begin() + static_cast<std::ptrdiff_t>(offset), context, inputs);
  std::copy_n(tokens.begin() + static_cast<std::ptrdiff_t>(offset) + 1, context, targets);
}
}  // namespace

void DataLoader::next_train(Batch& out) {
  out.batch = batch_;
  out.context = context_;
  const auto n = static_cast<std::size_t>(batch_) * static_cast<std::size_t>(context_);
  out.inputs.resize(n);
  out.targets.resize(n);
  for (int b = 0; b < batch_; ++b) {
    fill_window(tokens_, draw_offset(), context_, out.inputs.data() + b * context_,
                out.targets.data() + b * context_);
  }
  ++drawn_;
}

void DataLoader::skip_train(std::int64_t batches) {
  for (std::int64_t i = 0; i < batches; ++i) {
    for (int b = 0; b < batch_; ++b) (void)draw_offset();
    ++drawn_;
  }
}

std::size_t DataLoader::draw_offset() {
  return rng_.uniform_int(train_end_ - static_cast<std::size_t>(context_));
}

void DataLoader::val_batch(int index, int count, Batch& out) const {
  out.batch = batch_;
  out.context = context_;
  const auto n = static_cast<std::size_t>(batch_) * static_cast<std::size_t>(context_);
  out.inputs.resize(n);
  out.targets.resize(n);
  const std::size_t span = tokens_.size() - train_end_ - static_cast<std::size_t>(context_) - 1;
  const std::size_t total = static_cast<std::size_t>(count) * static_cast<std::size_t>(batch_);
  for (int b = 0; b < batch_; ++b) {
    const std::size_t k = static_cast<std::size_t>(index) * static_cast<std::size_t>(batch_) +
                          static_cast<std::size_t>(b);
    const std::size_t off = train_end_ + (total > 1 ? (k * span) / (total - 1) : 0);
    fill_window(tokens_, off, context_, out.inputs.data() + b * context_,
                out.targets.data() + b * context_);
  }
}

}  // namespace ampscope::trainer
