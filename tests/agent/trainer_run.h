// ampscope-train with the agent attached, as the end-to-end tests run it: a small model (a few
// milliseconds a step on a CPU), the agent's retries shortened so outages heal within a test.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace ampscope::agent::testing {

struct TrainerRun {
  std::filesystem::path dir;  // log.jsonl, spool/, checkpoints/ go here
  std::string run_id;
  std::string server;  // host:port
  int steps = 100;
  std::vector<std::string> extra;

  std::vector<std::string> argv() const {
    std::vector<std::string> a = {AMPSCOPE_TRAIN_BINARY,
                                  "--steps", std::to_string(steps),
                                  "--width", "64", "--layers", "2", "--heads", "2",
                                  "--context", "32", "--batch", "4",
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

}  // namespace ampscope::agent::testing
