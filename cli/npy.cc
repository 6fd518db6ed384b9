// The .npy reader: header layout per NumPy's format spec (numpy/lib/format.py), the header dict
// parsed as the small Python literal subset np.save writes, and the file mapped read-only.
#include "npy.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <optional>
#include <string_view>
#include <utility>

namespace ampscope::npy {
namespace {

constexpr std::string_view kMagic = "\x93NUMPY";
// Bounds the recursion of the literal parser so that a hostile header like "((((..." is an
// error, not a stack overflow. np.save nests at most two levels.
constexpr int kMaxNesting = 32;

[[noreturn]] void fail(const std::string& message) { throw NpyError(message); }

// Header text quoted in an error: printable ASCII as is, every other byte as \xNN, at most 64
// bytes of it, so that a message stays one readable line whatever the file held.
std::string shown(std::string_view text) {
  constexpr std::size_t kMax = 64;
  std::string out;
  for (std::size_t i = 0; i < std::min(text.size(), kMax); ++i) {
    const auto b = static_cast<unsigned char>(text[i]);
    if (b >= 0x20 && b < 0x7f) {
      out += static_cast<char>(b);
    } else {
      constexpr char kHex[] = "0123456789abcdef";
      out += {'\\', 'x', kHex[b >> 4], kHex[b & 15]};
    }
  }
  if (text.size() > kMax) out += "...";
  return out;
}

// ---- Python literals: the subset ast.literal_eval accepts that np.save can produce ----------

struct PyEntry;

struct PyValue {
  enum class Kind { kString, kInt, kBool, kNone, kTuple, kList, kDict };
  Kind kind = Kind::kNone;
  std::string text;             // kString
  bool negative = false;        // kInt: sign and magnitude, so any 64-bit shape fits
  std::uint64_t magnitude = 0;  // kInt
  bool boolean = false;         // kBool
  std::vector<PyValue> items;   // kTuple, kList
  std::vector<PyEntry> entries;  // kDict
};

// A dict entry (npy keys are strings). A struct rather than std::pair, which may not hold the
// still incomplete PyValue (clang rejects it with libstdc++'s constexpr vector).
struct PyEntry {
  std::string key;
  PyValue value;
};

PyValue make_value(PyValue::Kind kind) {
  PyValue v;
  v.kind = kind;
  return v;
}

const char* kind_name(PyValue::Kind kind) {
  switch (kind) {
    case PyValue::Kind::kString:
      return "a string";
    case PyValue::Kind::kInt:
      return "an integer";
    case PyValue::Kind::kBool:
      return "a bool";
    case PyValue::Kind::kNone:
      return "None";
    case PyValue::Kind::kTuple:
      return "a tuple";
    case PyValue::Kind::kList:
      return "a list";
    case PyValue::Kind::kDict:
      return "a dict";
  }
  return "a value";
}

class LiteralParser {
 public:
  explicit LiteralParser(std::string_view text) : text_(text) {}

  // One value followed by nothing but whitespace (np.save pads with spaces and a newline).
  PyValue parse_document() {
    PyValue v = parse_value(0);
    skip_space();
    if (pos_ != text_.size()) syntax_error("unexpected text after the dict");
    return v;
  }

 private:
  PyValue parse_value(int depth) {
    if (depth > kMaxNesting) syntax_error("nested too deeply");
    skip_space();
    if (pos_ == text_.size()) syntax_error("unexpected end");
    const char c = text_[pos_];
    if (c == '\'' || c == '"') return parse_string();
    if (c == '-' || c == '+' || is_digit(c)) return parse_int();
    if (c == '(') return parse_tuple(depth);
    if (c == '[') return parse_list(depth);
    if (c == '{') return parse_dict(depth);
    if (is_word_char(c)) return parse_word();
    syntax_error("unexpected character '" + shown(std::string_view(&c, 1)) + "'");
  }

  PyValue parse_string() {
    const char quote = text_[pos_++];
    PyValue v = make_value(PyValue::Kind::kString);
    while (pos_ < text_.size() && text_[pos_] != quote) {
      char c = text_[pos_++];
      if (c == '\n') syntax_error("line break inside a string");
      if (c == '\\') {
        if (pos_ == text_.size()) break;
        c = unescape(text_[pos_++]);
      }
      v.text += c;
    }
    if (pos_ == text_.size()) syntax_error("unterminated string");
    ++pos_;  // closing quote
    return v;
  }

  PyValue parse_int() {
    PyValue v = make_value(PyValue::Kind::kInt);
    if (text_[pos_] == '-' || text_[pos_] == '+') v.negative = text_[pos_++] == '-';
    const char* first = text_.data() + pos_;
    const char* last = text_.data() + text_.size();
    const auto [ptr, ec] = std::from_chars(first, last, v.magnitude);
    if (ptr == first) syntax_error("expected digits");
    if (ec == std::errc::result_out_of_range) syntax_error("integer does not fit in 64 bits");
    pos_ += static_cast<std::size_t>(ptr - first);
    // Python 2 long literals ("3L") appear in files written by old NumPy versions.
    if (pos_ < text_.size() && (text_[pos_] == 'L' || text_[pos_] == 'l')) ++pos_;
    if (pos_ < text_.size() && (text_[pos_] == '.' || is_word_char(text_[pos_]))) {
      syntax_error("expected an integer");
    }
    return v;
  }

  PyValue parse_word() {
    const std::size_t start = pos_;
    while (pos_ < text_.size() && is_word_char(text_[pos_])) ++pos_;
    const std::string_view word = text_.substr(start, pos_ - start);
    if (word == "True" || word == "False") {
      PyValue v = make_value(PyValue::Kind::kBool);
      v.boolean = word == "True";
      return v;
    }
    if (word == "None") return make_value(PyValue::Kind::kNone);
    pos_ = start;
    syntax_error("unexpected name '" + shown(word) + "'");
  }

  // Python: "()" is an empty tuple, "(x)" is just x, "(x,)" and "(x, y)" are tuples.
  PyValue parse_tuple(int depth) {
    ++pos_;  // '('
    PyValue v = make_value(PyValue::Kind::kTuple);
    if (consume(')')) return v;
    PyValue first = parse_value(depth + 1);
    if (consume(')')) return first;
    expect(',');
    v.items.push_back(std::move(first));
    parse_items_until(')', depth, v.items);
    return v;
  }

  PyValue parse_list(int depth) {
    ++pos_;  // '['
    PyValue v = make_value(PyValue::Kind::kList);
    parse_items_until(']', depth, v.items);
    return v;
  }

  // Comma-separated values up to `close`, a trailing comma allowed (np.save writes "(3,)").
  void parse_items_until(char close, int depth, std::vector<PyValue>& items) {
    while (!consume(close)) {
      items.push_back(parse_value(depth + 1));
      if (consume(close)) return;
      expect(',');
    }
  }

  PyValue parse_dict(int depth) {
    ++pos_;  // '{'
    PyValue v = make_value(PyValue::Kind::kDict);
    while (!consume('}')) {
      PyValue key = parse_value(depth + 1);
      if (key.kind != PyValue::Kind::kString) syntax_error("dict key is not a string");
      expect(':');
      PyValue value = parse_value(depth + 1);
      for (const auto& [k, unused] : v.entries) {
        if (k == key.text) fail("header repeats the key '" + shown(k) + "'");
      }
      v.entries.push_back({std::move(key.text), std::move(value)});
      if (consume('}')) break;
      expect(',');
    }
    return v;
  }

  static bool is_digit(char c) { return c >= '0' && c <= '9'; }
  static bool is_word_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || is_digit(c);
  }
  static char unescape(char c) {
    switch (c) {
      case 'n':
        return '\n';
      case 't':
        return '\t';
      case 'r':
        return '\r';
      case '0':
        return '\0';
      default:
        return c;  // \\, \', \" and anything np.save cannot produce anyway
    }
  }

  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  bool consume(char c) {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  void expect(char c) {
    if (!consume(c)) syntax_error(std::string("expected '") + c + "'");
  }

  [[noreturn]] void syntax_error(const std::string& what) const {
    fail("malformed header dict: " + what + " at offset " + std::to_string(pos_));
  }

  std::string_view text_;
  std::size_t pos_ = 0;
};

// ---- The header dict -------------------------------------------------------------------------

const PyValue& require_key(const PyValue& dict, std::string_view key) {
  for (const auto& [k, v] : dict.entries) {
    if (k == key) return v;
  }
  fail("header has no '" + std::string(key) + "'");
}

void reject_unknown_keys(const PyValue& dict) {
  // NumPy rejects other keys too: a file with them was not written by np.save.
  for (const auto& [k, unused] : dict.entries) {
    if (k != "descr" && k != "fortran_order" && k != "shape") {
      fail("header has an unexpected key '" + shown(k) +
           "' (expected descr, fortran_order, shape)");
    }
  }
}

std::vector<std::uint64_t> to_shape(const PyValue& v) {
  if (v.kind != PyValue::Kind::kTuple) {
    fail(std::string("'shape' is ") + kind_name(v.kind) + ", not a tuple");
  }
  std::vector<std::uint64_t> shape;
  for (const PyValue& dim : v.items) {
    if (dim.kind != PyValue::Kind::kInt) {
      fail(std::string("'shape' holds ") + kind_name(dim.kind) + ", not an integer");
    }
    if (dim.negative && dim.magnitude != 0) {
      fail("'shape' has a negative dimension -" + std::to_string(dim.magnitude));
    }
    shape.push_back(dim.magnitude);
  }
  return shape;
}

// Rejects shapes whose byte count does not fit in 64 bits, so numel() and data_bytes() are
// plain products afterwards. (Such a file cannot exist, but its header can.)
void check_shape_size(const std::vector<std::uint64_t>& shape, std::size_t itemsize) {
  std::uint64_t bytes = itemsize;
  for (std::uint64_t dim : shape) {
    if (__builtin_mul_overflow(bytes, dim, &bytes)) {
      fail("shape " + shape_to_string(shape) + " has more bytes than 2^64");
    }
  }
}

void fill_from_dict(const PyValue& dict, Header& h) {
  if (dict.kind != PyValue::Kind::kDict) {
    fail(std::string("header is ") + kind_name(dict.kind) + ", not a dict");
  }
  reject_unknown_keys(dict);
  const PyValue& descr = require_key(dict, "descr");
  const PyValue& fortran = require_key(dict, "fortran_order");
  const PyValue& shape = require_key(dict, "shape");
  if (descr.kind == PyValue::Kind::kList) {
    fail("structured dtypes (record arrays) are not supported");
  }
  if (descr.kind != PyValue::Kind::kString) {
    fail(std::string("'descr' is ") + kind_name(descr.kind) + ", not a string");
  }
  if (fortran.kind != PyValue::Kind::kBool) {
    fail(std::string("'fortran_order' is ") + kind_name(fortran.kind) + ", not True or False");
  }
  h.descr = descr.text;
  h.dtype = parse_descr(descr.text);
  h.fortran_order = fortran.boolean;
  h.shape = to_shape(shape);
  check_shape_size(h.shape, h.dtype.itemsize);
}

// ---- The fixed-size preamble -----------------------------------------------------------------

std::uint32_t read_le(std::span<const std::byte> bytes) {
  std::uint32_t v = 0;
  for (std::size_t i = bytes.size(); i-- > 0;) {
    v = (v << 8) | std::to_integer<std::uint32_t>(bytes[i]);
  }
  return v;
}

void check_magic(std::span<const std::byte> bytes) {
  const std::size_t n = std::min(bytes.size(), kMagic.size());
  if (n == 0) fail("empty file, not a .npy file");
  if (std::memcmp(bytes.data(), kMagic.data(), n) != 0) {
    fail("not a .npy file (bad magic: it does not start with \\x93NUMPY)");
  }
}

// Version 1.0 has a 2-byte header length; 2.0 (headers over 64 KiB) and 3.0 (UTF-8 header
// text) have 4 bytes. The header text itself is only ever ASCII where it matters.
std::size_t length_field_size(int major, int minor) {
  if (minor == 0 && major == 1) return 2;
  if (minor == 0 && (major == 2 || major == 3)) return 4;
  fail("unsupported .npy format version " + std::to_string(major) + "." + std::to_string(minor) +
       " (this reader knows 1.0, 2.0 and 3.0)");
}

// ---- Byte order ------------------------------------------------------------------------------

std::uint16_t bswap(std::uint16_t w) { return __builtin_bswap16(w); }
std::uint32_t bswap(std::uint32_t w) { return __builtin_bswap32(w); }
std::uint64_t bswap(std::uint64_t w) { return __builtin_bswap64(w); }

template <typename Word>
void swap_words(std::byte* p, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i, p += sizeof(Word)) {
    Word w;
    std::memcpy(&w, p, sizeof(Word));
    w = bswap(w);
    std::memcpy(p, &w, sizeof(Word));
  }
}

// Swaps `count` words of `width` bytes in place.
void swap_bytes(std::byte* p, std::size_t count, std::size_t width) {
  switch (width) {
    case 2:
      return swap_words<std::uint16_t>(p, count);
    case 4:
      return swap_words<std::uint32_t>(p, count);
    case 8:
      return swap_words<std::uint64_t>(p, count);
    default:
      for (std::size_t i = 0; i < count; ++i, p += width) std::reverse(p, p + width);
  }
}

// A complex number is two floats, each in the file's byte order.
std::size_t swap_width(const Dtype& d) { return d.kind == 'c' ? d.itemsize / 2 : d.itemsize; }

char native_order() { return std::endian::native == std::endian::little ? '<' : '>'; }

// ---- Files -----------------------------------------------------------------------------------

class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

[[noreturn]] void fail_errno(const std::string& what) { fail(what + ": " + std::strerror(errno)); }

std::size_t regular_file_size(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail_errno("cannot stat");
  if (S_ISDIR(st.st_mode)) fail("is a directory");
  // mmap needs a regular file; pipes and devices are not worth a second code path here.
  if (!S_ISREG(st.st_mode)) fail("not a regular file");
  if (st.st_size == 0) fail("empty file, not a .npy file");
  return static_cast<std::size_t>(st.st_size);
}

}  // namespace

// ---- Public API ------------------------------------------------------------------------------

bool Dtype::needs_swap() const {
  return itemsize > 1 && kind != 'V' && byte_order != '|' && byte_order != native_order();
}

std::string Dtype::str() const {
  return byte_order + std::string(1, kind) + std::to_string(itemsize);
}

Dtype parse_descr(const std::string& descr) {
  const std::string plain =
      " (expected a plain bool, integer, float, complex or void type like '<f4')";
  auto unsupported = [&](const std::string& why) -> NpyError {
    return NpyError("unsupported dtype '" + shown(descr) + "'" + why);
  };
  std::string_view s = descr;
  Dtype d;
  d.byte_order = '|';
  if (!s.empty() && std::string_view("<>|=").find(s.front()) != std::string_view::npos) {
    d.byte_order = s.front() == '=' ? native_order() : s.front();
    s.remove_prefix(1);
  }
  if (s.empty()) throw unsupported(plain);
  d.kind = s.front();
  s.remove_prefix(1);
  if (d.kind == 'O') throw unsupported(" (object arrays hold pickled Python objects)");
  if (std::string_view("biufcV").find(d.kind) == std::string_view::npos) {
    throw unsupported(plain);
  }
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), d.itemsize);
  if (ec != std::errc() || ptr != s.data() + s.size() || d.itemsize == 0) {
    throw unsupported(plain);
  }
  // One-byte and raw types have no byte order; '|' on a wider number means native (NumPy).
  if (d.itemsize == 1 || d.kind == 'V') d.byte_order = '|';
  if (d.byte_order == '|' && d.itemsize > 1 && d.kind != 'V') d.byte_order = native_order();
  return d;
}

std::uint64_t Header::numel() const {
  std::uint64_t n = 1;
  for (std::uint64_t dim : shape) n *= dim;
  return n;
}

std::string shape_to_string(const std::vector<std::uint64_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

Header parse_header(std::span<const std::byte> bytes) {
  check_magic(bytes);
  if (bytes.size() < kMagic.size() + 2) fail("truncated header: file ends inside the preamble");
  Header h;
  h.major_version = std::to_integer<int>(bytes[6]);
  h.minor_version = std::to_integer<int>(bytes[7]);
  const std::size_t field = length_field_size(h.major_version, h.minor_version);
  const std::size_t prefix = kMagic.size() + 2 + field;
  if (bytes.size() < prefix) fail("truncated header: file ends inside the preamble");
  const std::size_t header_len = read_le(bytes.subspan(prefix - field, field));
  if (bytes.size() - prefix < header_len) {
    fail("truncated header: preamble says " + std::to_string(header_len) +
         " header bytes, file has " + std::to_string(bytes.size() - prefix));
  }
  h.data_offset = prefix + header_len;
  const std::string_view text(reinterpret_cast<const char*>(bytes.data() + prefix), header_len);
  fill_from_dict(LiteralParser(text).parse_document(), h);
  return h;
}

ParsedNpy parse_npy(std::span<const std::byte> bytes) {
  Header h = parse_header(bytes);
  const std::span<const std::byte> data = bytes.subspan(h.data_offset);
  const std::uint64_t expected = h.data_bytes();
  if (data.size() != expected) {
    fail(std::string(data.size() < expected ? "truncated data" : "trailing data") +
         ": header says " + std::to_string(h.numel()) + " elements (" + std::to_string(expected) +
         " bytes), file has " + std::to_string(data.size()));
  }
  return ParsedNpy{std::move(h), data};
}

NpyFile::NpyFile(NpyFile&& other) noexcept
    : header_(std::move(other.header_)),
      data_(std::exchange(other.data_, nullptr)),
      mapping_(std::exchange(other.mapping_, nullptr)),
      mapping_size_(std::exchange(other.mapping_size_, 0)) {}

NpyFile& NpyFile::operator=(NpyFile&& other) noexcept {
  if (this != &other) {
    unmap();
    header_ = std::move(other.header_);
    data_ = std::exchange(other.data_, nullptr);
    mapping_ = std::exchange(other.mapping_, nullptr);
    mapping_size_ = std::exchange(other.mapping_size_, 0);
  }
  return *this;
}

NpyFile::~NpyFile() { unmap(); }

void NpyFile::unmap() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_size_);
  mapping_ = nullptr;
  data_ = nullptr;
}

NpyFile load_npy(const std::string& path) {
  try {
    FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) fail_errno("cannot open");
    NpyFile file;
    file.mapping_size_ = regular_file_size(fd.get());
    // MAP_PRIVATE so that a byte swap below stays in a copy-on-write copy, never in the file.
    void* m = ::mmap(nullptr, file.mapping_size_, PROT_READ, MAP_PRIVATE, fd.get(), 0);
    if (m == MAP_FAILED) fail_errno("cannot map");
    file.mapping_ = m;
    const auto* bytes = static_cast<std::byte*>(m);
    ParsedNpy parsed = parse_npy({bytes, file.mapping_size_});
    file.header_ = std::move(parsed.header);
    file.data_ = parsed.data.data();
    if (file.header_.dtype.needs_swap() && !parsed.data.empty()) {
      if (::mprotect(m, file.mapping_size_, PROT_READ | PROT_WRITE) != 0) {
        fail_errno("cannot swap the byte order");
      }
      const std::size_t width = swap_width(file.header_.dtype);
      swap_bytes(const_cast<std::byte*>(parsed.data.data()), parsed.data.size() / width, width);
      ::mprotect(m, file.mapping_size_, PROT_READ);
    }
    return file;
  } catch (const NpyError& e) {
    throw NpyError(path + ": " + e.what());
  }
}

}  // namespace ampscope::npy
