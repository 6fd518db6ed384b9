// What every subcommand of the ampscope tool shares: how failures are reported and the exit
// codes they map to. Each subcommand lives in its own file and exposes one add_*_command()
// function that main.cc calls; the subcommand's callback does the work and throws on failure.
#pragma once

#include <stdexcept>

namespace ampscope::cli {

// Exit codes: 0 success, 1 an input the tool cannot use (a file, its data), 2 a bad command line.
inline constexpr int kExitOk = 0;
inline constexpr int kExitBadInput = 1;
inline constexpr int kExitUsage = 2;
inline constexpr const char* kExitStatusHelp =
    "Exit status: 0 on success, 1 when an input file or the server cannot be used, 2 on a bad "
    "command line.";

// A command-line value CLI11 cannot check by itself (for example a malformed --target). The
// message is one line that names the option and the value.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An input the tool cannot use. The message is one line that starts with the file name.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace ampscope::cli
