// Target: the checkpoint loader (Trainer::load_checkpoint, trainer/src/checkpoint.cc), on the
// trainer of checkpoint_fixture.h. Each input is loaded as it is, and again with its CRC-32
// rewritten to match, so that mutations reach the header and size checks behind the CRC.
// Properties:
//   - a refused checkpoint throws ampscope::Error (nothing else) with one line, and leaves the
//     trainer as it was (its own checkpoint is byte for byte the same);
//   - an accepted checkpoint round-trips: the trainer's checkpoint after the load loads again
//     and is saved again unchanged.
#include <zlib.h>

#include <cstring>
#include <string>

#include "ampscope/check.h"
#include "checkpoint_fixture.h"
#include "support.h"

namespace ampscope::fuzz {
namespace {

trainer::Trainer& fixture() {
  static const std::unique_ptr<trainer::Trainer> t = make_checkpoint_trainer();
  return *t;
}

std::string saved(trainer::Trainer& t) {
  const auto path = scratch_dir() / "saved.ckpt";
  t.save_checkpoint(path.string());
  return read_file(path);
}

void load(const std::string& bytes) {
  trainer::Trainer& t = fixture();
  const std::string before = saved(t);
  const auto path = scratch_dir() / "input.ckpt";
  write_file(path, bytes.data(), bytes.size());
  try {
    t.load_checkpoint(path.string());
  } catch (const Error& e) {
    FUZZ_CHECK(one_line(e.what()), e.what());
    FUZZ_CHECK(saved(t) == before, std::string("a refused checkpoint changed the trainer: ") +
                                       e.what());
    return;
  }
  const std::string after = saved(t);
  t.load_checkpoint((scratch_dir() / "saved.ckpt").string());
  FUZZ_CHECK(saved(t) == after, "a checkpoint does not round-trip through load and save");
}

}  // namespace
}  // namespace ampscope::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  ampscope::fuzz::load(bytes);
  if (bytes.size() >= 4) {
    const auto crc = static_cast<std::uint32_t>(crc32(
        0L, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size() - 4)));
    std::uint32_t stored = 0;
    std::memcpy(&stored, bytes.data() + bytes.size() - 4, 4);
    if (stored != crc) {
      std::memcpy(bytes.data() + bytes.size() - 4, &crc, 4);
      ampscope::fuzz::load(bytes);
    }
  }
  return 0;
}
