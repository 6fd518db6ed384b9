// The agent's records in the wire contract (proto/ampscope/v1): StepRecord -> StepReport, the
// run -> Hello (the enums map through ampscope/proto/vocabulary_codec.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ampscope/agent/agent.h"
#include "ampscope/v1/telemetry.pb.h"
#include "flight_recorder.h"
#include "record.h"

namespace ampscope::agent {

struct ReportContext {
  const AgentConfig* config = nullptr;
  std::int64_t time_unix_ns = 0;
  v1::AgentCounters counters;
  std::vector<std::string> notices;
  const FlightHistory* history = nullptr;  // the flight recorder's, for an event step
};

// The policy outcomes the server accepts in one report (a report with more is rejected whole).
constexpr std::size_t kMaxOutcomesPerReport = 64;

// Fills `out` from a measured record. Samples at Level::kSkip (measured for the flight recorder
// only) are left out. The first offender is the measured sample with the lowest order that
// held a non-finite value. Of the outcomes, the first kMaxOutcomesPerReport go out (the caller
// notices the rest). A history with steps goes out as StepReport.history and flight_event.
void encode_report(const StepRecord& record, const ReportContext& context, v1::StepReport* out);

// When this process started, ns since the epoch: /proc/self/stat's start time (clock ticks
// after boot) plus /proc/stat's btime (whole seconds, so within a second of the truth, and the
// same for every call in the process). Where those cannot be read: the time of the first call
// (Agent::create makes it, so the creation of the process's first agent).
std::int64_t process_start_unix_ns();

// The layers the attached overrides can move: Hello.fp32_capable_layers, bf16_capable_gemms.
struct CapableLayers {
  std::vector<std::string> fp32;
  std::vector<std::string> bf16_gemms;
};

// With the identity of this process: Hello.pid (getpid()) and Hello.process_start_unix_ns.
void encode_hello(const AgentConfig& config, const RunInfo& run, const ScalerSettings& scaler,
                  const CapableLayers& capable, std::uint64_t resume_from,
                  std::uint64_t last_policy_seq, const std::string& agent_version, v1::Hello* out);

}  // namespace ampscope::agent
