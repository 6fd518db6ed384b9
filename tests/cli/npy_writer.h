// Writes .npy files the way numpy.save does (magic, version, little-endian header length, the
// header dict padded with spaces and a newline to a multiple of 64 bytes, then the data), with
// knobs to break each part on purpose. Test-only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <gtest/gtest.h>
#include <string>
#include <vector>

#include "ampscope/testing/files.h"

namespace ampscope::testing {

using Bytes = std::vector<std::byte>;

// The dict np.save writes, e.g. {'descr': '<f4', 'fortran_order': False, 'shape': (3,), }.
inline std::string npy_dict(const std::string& descr, const std::string& shape,
                            bool fortran_order = false) {
  return "{'descr': '" + descr + "', 'fortran_order': " + (fortran_order ? "True" : "False") +
         ", 'shape': " + shape + ", }";
}

// Magic, version major.0, the header length (2 bytes for 1.0, 4 for 2.0 and 3.0) and `dict`
// padded so that the data starts at a multiple of 64.
inline Bytes npy_preamble_and_header(const std::string& dict, int major = 1) {
  const std::size_t field = major == 1 ? 2 : 4;
  const std::size_t prefix = 8 + field;
  std::string header = dict;
  const std::size_t unpadded = prefix + header.size() + 1;  // + the closing newline
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  Bytes out;
  for (char c : std::string("\x93NUMPY")) out.push_back(static_cast<std::byte>(c));
  out.push_back(static_cast<std::byte>(major));
  out.push_back(std::byte{0});
  for (std::size_t i = 0; i < field; ++i) {
    out.push_back(static_cast<std::byte>((header.size() >> (8 * i)) & 0xff));
  }
  for (char c : header) out.push_back(static_cast<std::byte>(c));
  return out;
}

template <typename T>
Bytes as_bytes(const std::vector<T>& values) {
  Bytes out(values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

inline Bytes concat(Bytes a, const Bytes& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A complete file: header for (descr, shape) followed by `values` as stored in memory.
template <typename T>
Bytes make_npy(const std::vector<T>& values, const std::string& descr, const std::string& shape,
               int major = 1, bool fortran_order = false) {
  return concat(npy_preamble_and_header(npy_dict(descr, shape, fortran_order), major),
                as_bytes(values));
}

inline void write_file(const std::filesystem::path& path, const Bytes& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// A fixture with a fresh temporary directory (removed afterwards) and a helper that writes a
// file into it.
class TempDirTest : public ::testing::Test {
 protected:
  std::string write(const std::string& name, const Bytes& bytes) {
    const std::string path = (dir_ / name).string();
    write_file(path, bytes);
    return path;
  }

  const TempDir temp_dir_;
  const std::filesystem::path dir_ = temp_dir_.path();
};

}  // namespace ampscope::testing
