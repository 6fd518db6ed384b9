#include "support.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/stubs/logging.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/util/delimited_message_util.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <system_error>

#include "ampscope/v1/telemetry.pb.h"

namespace ampscope::fuzz {

void check_failed(const char* cond, std::string_view what, const char* file, int line) {
  std::fprintf(stderr, "%s:%d: property failed: %s: %.*s\n", file, line, cond,
               static_cast<int>(what.size()), what.data());
  std::abort();
}

template <typename Message>
std::vector<Message> parse_delimited(const std::uint8_t* data, std::size_t size) {
  // Fuzzed strings are rarely UTF-8, and protobuf logs each one it parses: silence it (a null
  // handler discards the messages), or the logging costs more than the target.
  static const bool silenced = [] {
    google::protobuf::SetLogHandler(nullptr);
    return true;
  }();
  (void)silenced;
  std::vector<Message> out;
  google::protobuf::io::ArrayInputStream input(data, static_cast<int>(size));
  google::protobuf::io::CodedInputStream coded(&input);
  while (static_cast<std::size_t>(coded.CurrentPosition()) < size) {
    Message m;
    bool clean_eof = false;
    if (!google::protobuf::util::ParseDelimitedFromCodedStream(&m, &coded, &clean_eof)) break;
    out.push_back(std::move(m));
  }
  return out;
}
template std::vector<v1::AgentMessage> parse_delimited(const std::uint8_t*, std::size_t);
template std::vector<v1::PolicyUpdate> parse_delimited(const std::uint8_t*, std::size_t);

std::vector<v1::AgentMessage> parse_stream(const std::uint8_t* data, std::size_t size) {
  return parse_delimited<v1::AgentMessage>(data, size);
}

std::string serialize_stream(const std::vector<v1::AgentMessage>& messages) {
  std::string out;
  google::protobuf::io::StringOutputStream output(&out);
  for (const v1::AgentMessage& m : messages) {
    if (!google::protobuf::util::SerializeDelimitedToZeroCopyStream(m, &output)) {
      throw std::runtime_error("cannot serialise an AgentMessage");
    }
  }
  return out;
}

namespace {

struct ScratchDir {
  std::filesystem::path path;
  ScratchDir() {
    std::string templ = (std::filesystem::temp_directory_path() / "ampscope-fuzz-XXXXXX").string();
    if (mkdtemp(templ.data()) == nullptr) {
      throw std::system_error(errno, std::generic_category(), "mkdtemp " + templ);
    }
    path = templ;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

}  // namespace

const std::filesystem::path& scratch_dir() {
  static const ScratchDir dir;
  return dir.path;
}

void write_file(const std::filesystem::path& path, const void* data, std::size_t size) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!f.flush()) throw std::runtime_error("cannot write " + path.string());
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

bool one_line(std::string_view text) { return text.find_first_of("\r\n") == std::string_view::npos; }

}  // namespace ampscope::fuzz
