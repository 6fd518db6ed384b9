// Files for tests: a fresh temporary directory removed with everything in it, whole text files
// read and written, and text (a command's output) split into lines.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace ampscope::testing {

// A new directory of its own under the system's temporary directory; removed recursively when
// the TempDir goes away. Throws std::runtime_error when it cannot be made.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

// The whole file; empty when it cannot be read.
std::string read_text(const std::filesystem::path& path);
// Replaces the file's contents with `text`.
void write_text(const std::filesystem::path& path, const std::string& text);

// The lines of `text` without their '\n' (a last line without one counts too).
std::vector<std::string> lines_of(const std::string& text);

}  // namespace ampscope::testing
