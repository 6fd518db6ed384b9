// What the fuzz targets share: the property check that fails a run, the input format of the
// targets that take an agent's stream, and a scratch directory for targets that need files.
//
// A target is one source defining LLVMFuzzerTestOneInput; the same source is linked with
// libFuzzer (./run fuzz) or with replay_main.cc (ctest replays the committed corpus).
// Thread safety: single-threaded, as libFuzzer runs a target.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "ampscope/v1/telemetry.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace ampscope::fuzz {

// A property the target checks. Failing prints the condition and `what` and aborts, which both
// libFuzzer and the replay count as a crash (with the input that caused it).
#define FUZZ_CHECK(cond, what)                                                  \
  do {                                                                          \
    if (!(cond)) ::ampscope::fuzz::check_failed(#cond, (what), __FILE__, __LINE__); \
  } while (0)
[[noreturn]] void check_failed(const char* cond, std::string_view what, const char* file,
                               int line);

// The input of the validation and ingest targets: what an agent sends on one stream, as
// protobuf's length-delimited messages (a varint length, then a serialised AgentMessage), in
// order. Parsing stops at the first frame that is not a whole AgentMessage.
std::vector<v1::AgentMessage> parse_stream(const std::uint8_t* data, std::size_t size);
std::string serialize_stream(const std::vector<v1::AgentMessage>& messages);
// The same framing around other messages (the policy-update target's PolicyUpdates).
template <typename Message>
std::vector<Message> parse_delimited(const std::uint8_t* data, std::size_t size);

// A directory of this process under the system's temporary directory, made on first use and
// removed with its contents when the process exits. (The tests' TempDir lives in the test
// support library, which needs GoogleTest and the server binary; the fuzz build has neither.)
const std::filesystem::path& scratch_dir();

// Writes `size` bytes to `path`, replacing it.
void write_file(const std::filesystem::path& path, const void* data, std::size_t size);
std::string read_file(const std::filesystem::path& path);

// True when the text is one line: no '\n' or '\r' (the contracts' "one line naming the field").
bool one_line(std::string_view text);

}  // namespace ampscope::fuzz
