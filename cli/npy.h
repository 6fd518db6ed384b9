// A reader for NumPy's .npy files (format versions 1.0, 2.0 and 3.0), internal to the ampscope
// tool.
//
// The reader checks everything the file promises before anyone reads a value: the magic and
// version, the header dict (exactly the keys 'descr', 'fortran_order' and 'shape', parsed as the
// Python literals NumPy writes), a plain dtype, and that the data is exactly as long as the
// shape says — a truncated file and trailing bytes are both errors. It knows nothing about
// ampscope's formats: it hands out the raw elements with their dtype and the caller decides what
// it can use.
//
// Files are memory-mapped, so a tensor of hundreds of MB costs no copy; a file in the other
// byte order is swapped in a private copy-on-write mapping. As with any mapped file, the file
// must not be truncated while it is loaded (reading a page past the new end raises SIGBUS).
// Errors are reported by throwing NpyError with one line that names the problem (and, from
// load_npy, the file).
// Thread safety: the functions are re-entrant; an NpyFile is an immutable value once loaded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace ampscope::npy {

class NpyError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A plain (non-structured, non-object) NumPy dtype, as in the descr string "<f4".
struct Dtype {
  char byte_order = '|';  // '<' little, '>' big, '|' not applicable (bytes, bools, voids)
  char kind = 'f';        // 'b' bool, 'i' signed, 'u' unsigned, 'f' float, 'c' complex, 'V' raw
  std::size_t itemsize = 4;

  // True when the elements have to be byte-swapped to be read on this machine.
  bool needs_swap() const;
  // "<f4": the canonical descr of this dtype.
  std::string str() const;
  friend bool operator==(const Dtype&, const Dtype&) = default;
};

// Parses a descr string such as "<f4", "|u1" or "|V2". '=' (native order) is resolved to this
// machine's order. Throws NpyError for anything else (object arrays, strings, datetimes, ...).
Dtype parse_descr(const std::string& descr);

struct Header {
  int major_version = 1;
  int minor_version = 0;
  std::string descr;  // as written in the file, e.g. "<f4"
  Dtype dtype;
  bool fortran_order = false;
  std::vector<std::uint64_t> shape;  // () for a scalar
  std::size_t data_offset = 0;       // bytes from the start of the file to the first element

  // Product of the shape (1 for a scalar). The parser guarantees numel() * itemsize fits in
  // 64 bits.
  std::uint64_t numel() const;
  std::uint64_t data_bytes() const { return numel() * dtype.itemsize; }
};

// "(1024, 4096)", "(3,)", "()": the shape as Python prints it.
std::string shape_to_string(const std::vector<std::uint64_t>& shape);

// Parses the magic, version and header dict at the start of `bytes` (the whole file or at least
// its header). Does not look at the data.
Header parse_header(std::span<const std::byte> bytes);

// Parses a whole file held in memory and checks the data length against the header exactly.
// The returned span points into `bytes` and is in the file's byte order.
struct ParsedNpy {
  Header header;
  std::span<const std::byte> data;
};
ParsedNpy parse_npy(std::span<const std::byte> bytes);

// A loaded .npy file: its header and its elements in this machine's byte order. Move-only; owns
// the mapping of the file.
class NpyFile {
 public:
  NpyFile(NpyFile&& other) noexcept;
  NpyFile& operator=(NpyFile&& other) noexcept;
  NpyFile(const NpyFile&) = delete;
  NpyFile& operator=(const NpyFile&) = delete;
  ~NpyFile();

  const Header& header() const { return header_; }
  // header().numel() elements of header().dtype, native byte order, C or Fortran order as the
  // header says. Aligned as the file aligns it (NumPy pads the header to 64 bytes).
  const void* data() const { return data_; }

 private:
  friend NpyFile load_npy(const std::string& path);
  NpyFile() = default;
  void unmap();

  Header header_;
  const void* data_ = nullptr;
  void* mapping_ = nullptr;
  std::size_t mapping_size_ = 0;
};

// Maps and validates `path`. Throws NpyError with "<path>: <problem>".
NpyFile load_npy(const std::string& path);

}  // namespace ampscope::npy
