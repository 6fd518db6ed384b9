// The ampscope command-line tool. Subcommands live in their own files and register themselves
// through one add_*_command() each; this file owns the process boundary: every failure becomes
// one line on stderr and an exit code (command.h), never an uncaught exception.
#include <grpc/support/log.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>

#include "command.h"
#include "cupti_check_command.h"
#include "runs_command.h"
#include "show_command.h"
#include "stats_command.h"
#include "tail_command.h"

namespace {

using ampscope::cli::kExitBadInput;
using ampscope::cli::kExitOk;
using ampscope::cli::kExitUsage;

// Messages from CLI11 and from the library are single lines by intent; this keeps them so if
// one ever is not, since scripts read the first line of stderr.
std::string one_line(std::string message) {
  for (char& c : message) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  while (!message.empty() && message.back() == ' ') message.pop_back();
  return message;
}

int fail(const std::string& message, int code) {
  std::cerr << "ampscope: " << one_line(message) << std::endl;
  return code;
}

void build_app(CLI::App& app) {
  app.name("ampscope");
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("ampscope ") + AMPSCOPE_VERSION);
  app.footer(std::string(ampscope::cli::kExitStatusHelp) +
             "\nRun 'ampscope SUBCOMMAND --help' for a subcommand's options.");
  ampscope::cli::add_stats_command(app);
  ampscope::cli::add_runs_command(app);
  ampscope::cli::add_show_command(app);
  ampscope::cli::add_tail_command(app);
  ampscope::cli::add_cupti_check_command(app);
}

// CLI11 reports "ampscope frobnicate" as a missing subcommand; name the word instead.
std::string unknown_subcommand(const CLI::App& app, int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return "";
  const std::string word = argv[1];
  std::string known;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    if (sub->check_name(word)) return "";
    known += (known.empty() ? "" : ", ") + sub->get_name();
  }
  return "unknown subcommand '" + word + "' (expected " + known + ")";
}

// Parses the command line and runs the chosen subcommand's callback.
int run(CLI::App& app, int argc, char** argv) {
  if (const std::string unknown = unknown_subcommand(app, argc, argv); !unknown.empty()) {
    return fail(unknown, kExitUsage);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);  // --help, --version
  } catch (const CLI::ParseError& e) {
    return fail(std::string(e.what()) + " (see --help)", kExitUsage);
  } catch (const ampscope::cli::UsageError& e) {
    return fail(e.what(), kExitUsage);
  } catch (const std::bad_alloc&) {
    return fail("out of memory", kExitBadInput);
  } catch (const std::exception& e) {
    return fail(e.what(), kExitBadInput);
  }
  // A full disk or a closed pipe shows up here, not as a wrong report.
  std::cout.flush();
  if (!std::cout) return fail("cannot write the output to stdout", kExitBadInput);
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  // gRPC's own log lines ("Handshake failed with fatal error ...") would come before the one
  // line this tool prints for the same failure, which names it better; GRPC_VERBOSITY, set to
  // debug a connection, keeps them.
  if (std::getenv("GRPC_VERBOSITY") == nullptr) gpr_set_log_function([](gpr_log_func_args*) {});
  try {
    CLI::App app{"ampscope: numerical-stability diagnostics for mixed-precision training"};
    build_app(app);
    return run(app, argc, argv);
  } catch (const std::exception& e) {
    // Only setting up the command line can get here, which is a bug in this tool.
    return fail(std::string("internal error: ") + e.what(), kExitBadInput);
  }
}
