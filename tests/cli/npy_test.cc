// The .npy reader: every header version, the shapes NumPy writes, and every way a file can be
// broken, each with the message a user would see.
#include "npy.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cstdlib>
#include <filesystem>
#include <functional>

#include "npy_writer.h"

namespace ampscope::npy {
namespace {

using testing::Bytes;
using testing::make_npy;
using testing::npy_dict;
using testing::npy_preamble_and_header;

// The message parse_npy throws for `bytes`, or "" when it parses.
std::string parse_error(const Bytes& bytes) {
  try {
    parse_npy(bytes);
  } catch (const NpyError& e) {
    return e.what();
  }
  return "";
}

Bytes with_dict(const std::string& dict, const Bytes& data = {}) {
  return testing::concat(npy_preamble_and_header(dict), data);
}

class NpyVersionTest : public ::testing::TestWithParam<int> {};

TEST_P(NpyVersionTest, ParsesHeaderAndData) {
  const std::vector<float> values = {1.5f, -2.0f, 0.0f, 3.25f, 7.0f, -0.5f};
  const Bytes file = make_npy(values, "<f4", "(2, 3)", GetParam());
  const ParsedNpy parsed = parse_npy(file);
  EXPECT_EQ(parsed.header.major_version, GetParam());
  EXPECT_EQ(parsed.header.minor_version, 0);
  EXPECT_EQ(parsed.header.descr, "<f4");
  EXPECT_EQ(parsed.header.dtype, (Dtype{'<', 'f', 4}));
  EXPECT_FALSE(parsed.header.fortran_order);
  EXPECT_EQ(parsed.header.shape, (std::vector<std::uint64_t>{2, 3}));
  EXPECT_EQ(parsed.header.numel(), 6u);
  EXPECT_EQ(parsed.header.data_offset % 64, 0u);
  ASSERT_EQ(parsed.data.size(), values.size() * 4);
  EXPECT_EQ(std::memcmp(parsed.data.data(), values.data(), parsed.data.size()), 0);
}

INSTANTIATE_TEST_SUITE_P(Versions, NpyVersionTest, ::testing::Values(1, 2, 3));

TEST(NpyHeaderTest, ScalarShapeHasOneElement) {
  const ParsedNpy parsed = parse_npy(make_npy(std::vector<float>{4.0f}, "<f4", "()"));
  EXPECT_TRUE(parsed.header.shape.empty());
  EXPECT_EQ(parsed.header.numel(), 1u);
  EXPECT_EQ(parsed.data.size(), 4u);
}

TEST(NpyHeaderTest, EmptyShapeHasNoElements) {
  const ParsedNpy parsed = parse_npy(make_npy(std::vector<float>{}, "<f4", "(0,)"));
  EXPECT_EQ(parsed.header.shape, (std::vector<std::uint64_t>{0}));
  EXPECT_EQ(parsed.header.numel(), 0u);
  EXPECT_TRUE(parsed.data.empty());
}

TEST(NpyHeaderTest, ZeroDimensionAmongOthersHasNoElements) {
  const ParsedNpy parsed = parse_npy(make_npy(std::vector<float>{}, "<f4", "(5, 0, 7)"));
  EXPECT_EQ(parsed.header.numel(), 0u);
}

TEST(NpyHeaderTest, FortranOrderIsReported) {
  const std::vector<std::uint16_t> values(12, 0x3c00);
  const ParsedNpy parsed = parse_npy(make_npy(values, "<f2", "(3, 4)", 1, true));
  EXPECT_TRUE(parsed.header.fortran_order);
  EXPECT_EQ(parsed.header.numel(), 12u);
}

TEST(NpyHeaderTest, AcceptsKeysInAnyOrderAndDoubleQuotes) {
  const Bytes file =
      with_dict(R"({"shape": (2,), "fortran_order": False, "descr": "<f2"})", Bytes(4));
  EXPECT_EQ(parse_npy(file).header.shape, (std::vector<std::uint64_t>{2}));
}

TEST(NpyHeaderTest, AcceptsPython2LongDimensions) {
  const Bytes file = with_dict(npy_dict("<f4", "(2L, 1L)"), Bytes(8));
  EXPECT_EQ(parse_npy(file).header.shape, (std::vector<std::uint64_t>{2, 1}));
}

TEST(NpyHeaderTest, ParsesLargeShapeWithoutReadingData) {
  const Header h = parse_header(npy_preamble_and_header(npy_dict("<u2", "(65536, 65536)")));
  EXPECT_EQ(h.numel(), std::uint64_t{1} << 32);
  EXPECT_EQ(h.data_bytes(), std::uint64_t{1} << 33);
}

TEST(NpyHeaderTest, ShapeToStringMatchesPython) {
  EXPECT_EQ(shape_to_string({}), "()");
  EXPECT_EQ(shape_to_string({0}), "(0,)");
  EXPECT_EQ(shape_to_string({2, 3}), "(2, 3)");
}

TEST(NpyErrorTest, BadMagic) {
  Bytes file = make_npy(std::vector<float>{1.0f}, "<f4", "(1,)");
  file[1] = std::byte{'X'};
  EXPECT_EQ(parse_error(file), "not a .npy file (bad magic: it does not start with \\x93NUMPY)");
}

TEST(NpyErrorTest, EmptyInput) { EXPECT_EQ(parse_error({}), "empty file, not a .npy file"); }

TEST(NpyErrorTest, TruncatedPreamble) {
  Bytes file = make_npy(std::vector<float>{1.0f}, "<f4", "(1,)");
  file.resize(9);
  EXPECT_EQ(parse_error(file), "truncated header: file ends inside the preamble");
}

TEST(NpyErrorTest, TruncatedHeader) {
  Bytes file = npy_preamble_and_header(npy_dict("<f4", "(1,)"));  // 128 bytes, 118 of header
  ASSERT_EQ(file.size(), 128u);
  file.resize(40);
  EXPECT_EQ(parse_error(file), "truncated header: preamble says 118 header bytes, file has 30");
}

TEST(NpyErrorTest, TruncatedData) {
  Bytes file = make_npy(std::vector<float>(1000, 1.0f), "<f4", "(1000,)");
  file.resize(file.size() - 4);
  EXPECT_EQ(parse_error(file),
            "truncated data: header says 1000 elements (4000 bytes), file has 3996");
}

TEST(NpyErrorTest, TrailingBytes) {
  Bytes file = make_npy(std::vector<float>(10, 1.0f), "<f4", "(2, 5)");
  file.push_back(std::byte{0});
  EXPECT_EQ(parse_error(file), "trailing data: header says 10 elements (40 bytes), file has 41");
}

TEST(NpyErrorTest, UnsupportedVersion) {
  Bytes file = make_npy(std::vector<float>{1.0f}, "<f4", "(1,)");
  file[6] = std::byte{4};
  EXPECT_EQ(parse_error(file),
            "unsupported .npy format version 4.0 (this reader knows 1.0, 2.0 and 3.0)");
  file[6] = std::byte{1};
  file[7] = std::byte{1};
  EXPECT_NE(parse_error(file).find("version 1.1"), std::string::npos);
}

TEST(NpyErrorTest, HeaderWithoutShape) {
  EXPECT_EQ(parse_error(with_dict("{'descr': '<f4', 'fortran_order': False}")),
            "header has no 'shape'");
}

TEST(NpyErrorTest, HeaderWithoutDescr) {
  EXPECT_EQ(parse_error(with_dict("{'fortran_order': False, 'shape': (1,)}")),
            "header has no 'descr'");
}

TEST(NpyErrorTest, HeaderWithUnexpectedKey) {
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (), 'x': 1}";
  EXPECT_EQ(parse_error(with_dict(dict, Bytes(4))),
            "header has an unexpected key 'x' (expected descr, fortran_order, shape)");
}

TEST(NpyErrorTest, HeaderRepeatsKey) {
  const std::string dict = "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': ()}";
  EXPECT_EQ(parse_error(with_dict(dict, Bytes(4))), "header repeats the key 'descr'");
}

TEST(NpyErrorTest, ParenthesisedIntegerIsNotAShape) {
  // Python reads "(3)" as the integer 3; NumPy rejects it, so does this reader.
  EXPECT_EQ(parse_error(with_dict(npy_dict("<f4", "(3)"), Bytes(12))),
            "'shape' is an integer, not a tuple");
}

TEST(NpyErrorTest, NegativeDimension) {
  EXPECT_EQ(parse_error(with_dict(npy_dict("<f4", "(2, -1)"))),
            "'shape' has a negative dimension -1");
}

TEST(NpyErrorTest, NonIntegerDimension) {
  EXPECT_EQ(parse_error(with_dict(npy_dict("<f4", "(2.5,)"))),
            "malformed header dict: expected an integer at offset 52");
}

TEST(NpyErrorTest, ShapeTooLargeForAnyFile) {
  EXPECT_EQ(parse_error(with_dict(npy_dict("<f4", "(4294967296, 4294967296)"))),
            "shape (4294967296, 4294967296) has more bytes than 2^64");
}

TEST(NpyErrorTest, FortranOrderNotABool) {
  const std::string dict = "{'descr': '<f4', 'fortran_order': 0, 'shape': ()}";
  EXPECT_EQ(parse_error(with_dict(dict, Bytes(4))),
            "'fortran_order' is an integer, not True or False");
}

TEST(NpyErrorTest, HeaderNotADict) {
  EXPECT_EQ(parse_error(with_dict("['descr', '<f4']")), "header is a list, not a dict");
}

TEST(NpyErrorTest, MalformedDict) {
  EXPECT_NE(parse_error(with_dict("{'descr': '<f4' 'shape': ()}")).find("malformed header dict"),
            std::string::npos);
  EXPECT_NE(parse_error(with_dict("{'descr: '<f4'}")).find("malformed header dict"),
            std::string::npos);
  EXPECT_NE(parse_error(with_dict("{'descr': '<f4', ")).find("malformed header dict"),
            std::string::npos);
  EXPECT_NE(parse_error(with_dict("{'descr': numpy.float32}")).find("unexpected name"),
            std::string::npos);
}

TEST(NpyErrorTest, DeepNestingIsAnErrorNotACrash) {
  const std::string deep = std::string(100000, '(') + std::string(100000, ')');
  EXPECT_EQ(parse_error(with_dict(npy_dict("<f4", deep))),
            "malformed header dict: nested too deeply at offset 82");
}

TEST(NpyErrorTest, StructuredDtype) {
  const std::string dict =
      "{'descr': [('a', '<f4'), ('b', '<i4')], 'fortran_order': False, "
      "'shape': (2,)}";
  EXPECT_EQ(parse_error(with_dict(dict, Bytes(16))),
            "structured dtypes (record arrays) are not supported");
}

TEST(NpyErrorTest, ObjectArray) {
  EXPECT_EQ(parse_error(with_dict(npy_dict("|O", "(2,)"), Bytes(16))),
            "unsupported dtype '|O' (object arrays hold pickled Python objects)");
}

TEST(NpyErrorTest, UnsupportedDescr) {
  for (const char* descr : {"<U10", "<M8[ns]", "|S4", "<f", "", "<q8", "<f0"}) {
    SCOPED_TRACE(descr);
    EXPECT_EQ(parse_error(with_dict(npy_dict(descr, "(1,)"))),
              "unsupported dtype '" + std::string(descr) +
                  "' (expected a plain bool, integer, float, complex or void type like '<f4')");
  }
}

TEST(DtypeTest, ParsesPlainDescrs) {
  const char native = std::endian::native == std::endian::little ? '<' : '>';
  const char foreign = native == '<' ? '>' : '<';
  EXPECT_EQ(parse_descr("<f4"), (Dtype{'<', 'f', 4}));
  EXPECT_EQ(parse_descr(">f8"), (Dtype{'>', 'f', 8}));
  EXPECT_EQ(parse_descr("|u1"), (Dtype{'|', 'u', 1}));
  EXPECT_EQ(parse_descr("<u1"), (Dtype{'|', 'u', 1}));  // one byte has no order
  EXPECT_EQ(parse_descr("=f2"), (Dtype{native, 'f', 2}));
  EXPECT_EQ(parse_descr("|V2"), (Dtype{'|', 'V', 2}));
  EXPECT_EQ(parse_descr("<c8"), (Dtype{'<', 'c', 8}));
  EXPECT_FALSE(parse_descr(std::string(1, native) + "f4").needs_swap());
  EXPECT_TRUE(parse_descr(std::string(1, foreign) + "f4").needs_swap());
  EXPECT_FALSE(parse_descr(std::string(1, foreign) + "u1").needs_swap());
  EXPECT_FALSE(parse_descr("<V2").needs_swap());  // raw bytes are never swapped
  EXPECT_EQ(parse_descr("=f4").str(), std::string(1, native) + "f4");
}

// ---- load_npy: files on disk ---------------------------------------------------------------

class NpyFileTest : public testing::TempDirTest {
 protected:
  static std::string load_error(const std::string& path) {
    try {
      load_npy(path);
    } catch (const NpyError& e) {
      return e.what();
    }
    return "";
  }

};

TEST_F(NpyFileTest, LoadsMappedData) {
  const std::vector<float> values = {1.0f, 2.0f, 3.0f};
  const std::string path = write("a.npy", make_npy(values, "<f4", "(3,)"));
  const NpyFile file = load_npy(path);
  EXPECT_EQ(file.header().numel(), 3u);
  EXPECT_EQ(std::memcmp(file.data(), values.data(), 12), 0);
}

TEST_F(NpyFileTest, SwapsForeignByteOrder) {
  const std::vector<std::uint32_t> native = {0x3f800000u, 0xc0490fdbu, 0x00000001u};
  std::vector<std::uint32_t> swapped;
  for (std::uint32_t w : native) swapped.push_back(__builtin_bswap32(w));
  const char foreign = std::endian::native == std::endian::little ? '>' : '<';
  const std::string path =
      write("be.npy", make_npy(swapped, std::string(1, foreign) + "f4", "(3,)"));
  const NpyFile file = load_npy(path);
  EXPECT_EQ(std::memcmp(file.data(), native.data(), 12), 0);
  // The swap happened in a private copy, not in the file.
  const NpyFile again = load_npy(path);
  EXPECT_EQ(std::memcmp(again.data(), native.data(), 12), 0);
}

TEST_F(NpyFileTest, SwapsComplexPartsSeparately) {
  const std::vector<std::uint32_t> native = {0x3f800000u, 0x40000000u};  // 1 + 2i
  std::vector<std::uint32_t> swapped;
  for (std::uint32_t w : native) swapped.push_back(__builtin_bswap32(w));
  const char foreign = std::endian::native == std::endian::little ? '>' : '<';
  const NpyFile file =
      load_npy(write("c.npy", make_npy(swapped, std::string(1, foreign) + "c8", "()")));
  EXPECT_EQ(std::memcmp(file.data(), native.data(), 8), 0);
}

TEST_F(NpyFileTest, ErrorsNameTheFile) {
  Bytes file = make_npy(std::vector<float>(1000, 1.0f), "<f4", "(1000,)");
  file.resize(file.size() - 4);
  const std::string path = write("x.npy", file);
  EXPECT_EQ(load_error(path),
            path + ": truncated data: header says 1000 elements (4000 bytes), file has 3996");
}

TEST_F(NpyFileTest, MissingFile) {
  const std::string path = (dir_ / "missing.npy").string();
  EXPECT_EQ(load_error(path), path + ": cannot open: No such file or directory");
}

TEST_F(NpyFileTest, Directory) {
  EXPECT_EQ(load_error(dir_.string()), dir_.string() + ": is a directory");
}

TEST_F(NpyFileTest, EmptyFile) {
  const std::string path = write("empty.npy", {});
  EXPECT_EQ(load_error(path), path + ": empty file, not a .npy file");
}

TEST_F(NpyFileTest, MoveKeepsTheMapping) {
  const std::vector<float> values = {5.0f};
  NpyFile a = load_npy(write("m.npy", make_npy(values, "<f4", "()")));
  NpyFile b = std::move(a);
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(*static_cast<const float*>(b.data()), 5.0f);
}

// Header text quoted in an error is shown printable and cut, so the message stays one line: a
// key holding a carriage return (the escape \r in the header's Python literal) once split it.
TEST(NpyHeaderTest, QuotedHeaderTextKeepsTheMessageOnOneLine) {
  const std::string repeated = parse_error(with_dict(
      "{'descr': '<f4', 'a\\r': 1, 'a\\r': 2, 'fortran_order': False, 'shape': (1,)}",
      Bytes(4)));
  EXPECT_EQ(repeated, "header repeats the key 'a\\x0d'");
  const std::string unexpected = parse_error(with_dict(
      "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x\\n" + std::string(100, 'y') +
          "': 0}",
      Bytes(4)));
  EXPECT_EQ(unexpected.find('\n'), std::string::npos) << unexpected;
  EXPECT_NE(unexpected.find("x\\x0a" + std::string(62, 'y') + "..."), std::string::npos)
      << unexpected;
  const std::string dtype = parse_error(
      with_dict("{'descr': '<\x01" "f4', 'fortran_order': False, 'shape': (1,)}", Bytes(4)));
  EXPECT_EQ(dtype.find('\x01'), std::string::npos) << dtype;
  EXPECT_NE(dtype.find("unsupported dtype '<\\x01f4'"), std::string::npos) << dtype;
}

}  // namespace
}  // namespace ampscope::npy
