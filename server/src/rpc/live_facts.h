// What only the running server knows about a run, added to what the store says: the ranks
// whose agents hold a stream open now, and the duplicate reports received since the server
// started. The Query service and the web UI's API show the same facts through these.
//
// Thread safety: reads the stream table and the run registry, both safe from any thread.
#pragma once

#include <cstdint>
#include <set>
#include <string>

#include "ampscope/v1/query.pb.h"
#include "run_registry.h"
#include "streams.h"

namespace ampscope::server {

struct LiveFacts {
  std::set<std::uint32_t> connected;  // ranks with an open stream
  std::uint64_t duplicates = 0;
};

inline LiveFacts live_facts(const StreamTable& streams, const RunRegistry& runs,
                            const std::string& run_id) {
  return {streams.connected_ranks(run_id), runs.duplicates(run_id)};
}

inline void add_live_facts(const LiveFacts& facts, v1::RunSummary* summary) {
  summary->set_agents_connected(static_cast<std::uint32_t>(facts.connected.size()));
  summary->set_duplicate_reports(facts.duplicates);
}

// Sets AgentInfo.connected of each agent (a range of v1::AgentInfo).
template <typename Agents>
void mark_connected(const LiveFacts& facts, Agents& agents) {
  for (v1::AgentInfo& a : agents) a.set_connected(facts.connected.contains(a.rank()));
}

}  // namespace ampscope::server
