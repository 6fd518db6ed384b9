// Target: the .npy reader (cli/npy.h): parse_npy on the bytes in memory, and load_npy on the same
// bytes as a file (mapped, byte-swapped when the file's order is not this machine's).
// Properties:
//   - anything the reader refuses is an NpyError with one line;
//   - an accepted file's data is exactly numel() * itemsize bytes and ends the file, and its
//     shape prints as Python would ("(3,)", "()");
//   - load_npy accepts exactly what parse_npy accepts, with the same header, and its elements
//     are the file's, swapped to this machine's order when the dtype says so.
#include <algorithm>
#include <cstring>
#include <optional>
#include <span>
#include <string>

#include "npy.h"
#include "support.h"

namespace ampscope::fuzz {
namespace {

void check_shape_text(const npy::Header& h) {
  const std::string text = npy::shape_to_string(h.shape);
  FUZZ_CHECK(text.starts_with("(") && text.ends_with(")"), text);
  if (h.shape.size() == 1) FUZZ_CHECK(text.ends_with(",)"), text);
}

// The element at `i` of the file's data, swapped when the dtype is in the other byte order.
bool same_element(const std::byte* file, const std::byte* loaded, const npy::Dtype& dtype) {
  if (!dtype.needs_swap()) return std::memcmp(file, loaded, dtype.itemsize) == 0;
  // Complex numbers swap each of their two halves.
  const std::size_t part = dtype.kind == 'c' ? dtype.itemsize / 2 : dtype.itemsize;
  for (std::size_t at = 0; at < dtype.itemsize; at += part) {
    for (std::size_t b = 0; b < part; ++b) {
      if (file[at + b] != loaded[at + part - 1 - b]) return false;
    }
  }
  return true;
}

}  // namespace
}  // namespace ampscope::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ampscope;
  using namespace ampscope::fuzz;
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  std::optional<npy::ParsedNpy> parsed;
  try {
    parsed = npy::parse_npy(bytes);
  } catch (const npy::NpyError& e) {
    FUZZ_CHECK(one_line(e.what()), e.what());
  }
  if (parsed) {
    const npy::Header& h = parsed->header;
    FUZZ_CHECK(parsed->data.size() == h.numel() * h.dtype.itemsize, "data size is not the shape's");
    FUZZ_CHECK(h.data_offset + parsed->data.size() == size, "data does not end the file");
    FUZZ_CHECK(parsed->data.data() == bytes.data() + h.data_offset, "data is not at data_offset");
    FUZZ_CHECK(npy::parse_descr(h.dtype.str()) == h.dtype, h.dtype.str());
    check_shape_text(h);
  }

  const std::string path = (scratch_dir() / "input.npy").string();
  write_file(path, data, size);
  try {
    const npy::NpyFile file = npy::load_npy(path);
    FUZZ_CHECK(parsed.has_value(), "load_npy accepted what parse_npy refused");
    const npy::Header& h = file.header();
    FUZZ_CHECK(h.shape == parsed->header.shape && h.dtype == parsed->header.dtype &&
                   h.fortran_order == parsed->header.fortran_order &&
                   h.data_offset == parsed->header.data_offset,
               "load_npy's header differs from parse_npy's");
    const auto* loaded = static_cast<const std::byte*>(file.data());
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(h.numel(), 4096));
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t at = i * h.dtype.itemsize;
      FUZZ_CHECK(same_element(parsed->data.data() + at, loaded + at, h.dtype),
                 "element " + std::to_string(i) + " differs from the file's");
    }
  } catch (const npy::NpyError& e) {
    FUZZ_CHECK(!parsed.has_value(), std::string("load_npy refused what parse_npy accepted: ") +
                                        e.what());
    FUZZ_CHECK(one_line(e.what()), e.what());
  }
  return 0;
}
