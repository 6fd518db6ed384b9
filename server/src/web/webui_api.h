// The web UI's JSON API (GET /api/...): runs with their live status and alerts, one run's
// series downsampled to the width the page asks for, and one tensor's samples over steps. The
// HTTP listener owns the sockets, sessions and tokens; WebApi owns no data either: it reads the
// store (StoreReader) and the live facts only the running server knows (StreamTable,
// RunRegistry). docs/webui.md ("The JSON API") is the contract of every answer.
//
// Thread safety: handle() may be called from any number of threads at once (StoreReader
// serialises its queries; the stream table and run registry are thread safe to read).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "run_registry.h"
#include "store.h"
#include "streams.h"

namespace ampscope::server {

struct ApiResponse {
  int status = 200;
  std::string body;  // JSON text
};

// The conditions of dashboards/prometheus/alerts.yml that the store can evaluate over a run's
// recent reports, with the rules' thresholds (a test checks them against the file).
struct AlertThresholds {
  static constexpr double kUnderflowRatio = 0.05;     // AmpscopeUnderflowHigh: underflow/checked
  static constexpr double kSkippedRatio = 0.05;       // AmpscopeSkippedStepsHigh: skipped/steps
  static constexpr std::int64_t kSkippedMinimum = 2;  // ... and more than this many skipped
  static constexpr double kLossScaleFloor = 1.0;      // AmpscopeLossScaleCollapsed: scale below
  // The window of reports the alerts look at (server clock; the rules' longest range).
  static constexpr std::int64_t kWindowNs = 10LL * 60 * 1'000'000'000;
};

class WebApi {
 public:
  WebApi(StoreReader& store, const StreamTable& streams, const RunRegistry& runs);

  // path: everything after "/api" ("/runs", "/runs/demo", "/runs/demo/tensor"); params: the
  // decoded query parameters. Errors: 400 {"error": "<names the parameter>"}, 404 {"error":
  // "unknown run 'x'"} (or an unknown path), 500 {"error": ...} on a store failure. Never
  // throws.
  ApiResponse handle(const std::string& path,
                     const std::multimap<std::string, std::string>& params) const;

 private:
  ApiResponse run_answer(const std::string& run_id,
                         const std::multimap<std::string, std::string>& params,
                         std::int64_t now_ns) const;
  ApiResponse tensor_answer(const std::string& run_id,
                            const std::multimap<std::string, std::string>& params) const;

  StoreReader& store_;
  const StreamTable& streams_;
  const RunRegistry& runs_;
};

}  // namespace ampscope::server
