// ampscope-train with the agent attached and the ampscope-server it reports to, as the
// end-to-end tests run them: a small model (a few milliseconds a step on a CPU), the agent's
// retries shortened so outages heal within a test.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ampscope/testing/server_process.h"

namespace ampscope::testing {

struct TrainerRun {
  std::filesystem::path dir;  // log.jsonl, spool/, checkpoints/ go here
  std::string run_id;
  std::string server;  // host:port
  int steps = 100;
  std::vector<std::string> extra;
  int batch = 4;  // sequences per step: more make a slower step

  std::vector<std::string> argv() const {
    std::vector<std::string> a = {AMPSCOPE_TRAIN_BINARY,
                                  "--steps", std::to_string(steps),
                                  "--width", "64", "--layers", "2", "--heads", "2",
                                  "--context", "32", "--batch", std::to_string(batch),
                                  "--eval-every", "0", "--eval-batches", "1", "--quiet",
                                  "--log-json", (dir / "log.jsonl").string(),
                                  "--run-id", run_id,
                                  "--spool-dir", (dir / "spool").string(),
                                  "--server", server,
                                  "--agent", "backoff_initial_ms=50",
                                  "--agent", "backoff_max_ms=300",
                                  "--agent", "connect_timeout_ms=1000",
                                  "--agent", "flush_timeout_ms=60000"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
};

// The server for a TrainerRun in `dir` (its store there, kept across restarts); `port` as in
// ServerOptions.
inline ServerOptions trainer_server(const std::filesystem::path& dir,
                                    std::vector<std::string> flags = {}, int port = 0) {
  flags.insert(flags.end(), {"--log-level", "warn"});
  return {.dir = dir, .db = {}, .flags = std::move(flags), .port = port};
}

// Lines of a JSON-lines file (the trainer's --log-json); 0 when it does not exist.
inline std::size_t count_lines(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::size_t n = 0;
  std::string line;
  while (std::getline(in, line)) n += line.empty() ? 0 : 1;
  return n;
}

}  // namespace ampscope::testing
