// The open Attach streams, by run: the ingest thread pushes policy updates to the streams of a
// run, shutdown drains every stream, and queries report which agents are connected.
//
// Thread safety: StreamTable is internally synchronised. StreamSink methods are called from the
// ingest thread and from shutdown; implementations synchronise themselves.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "ampscope/v1/telemetry.pb.h"

namespace ampscope::server {

// What the ingest thread tells a stream. Held by shared_ptr so that a stream that ended while
// its items were queued is still a valid object (it ignores late calls).
class StreamSink {
 public:
  virtual ~StreamSink() = default;
  // After a commit: `items` of this stream's submitted items are settled, and every report of
  // the agent with seq <= persisted_seq is stored, a duplicate or rejected. `policies` (the
  // decisions those reports caused, or the policy in force after the stream's Hello) are
  // written before Ack(persisted_seq), and before the stream ends.
  virtual void on_settled(std::uint64_t persisted_seq, int items,
                          const std::vector<v1::PolicyUpdate>& policies) = 0;
  // A policy update for the stream's run that none of its own reports caused (another rank's
  // report, a step merged at its deadline). Ignored until the stream's Hello is settled: the
  // policy in force sent then includes it.
  virtual void on_policy(const v1::PolicyUpdate& update) = 0;
  // The store failed; nothing of the stream's unsettled items was stored.
  virtual void on_store_failure(const std::string& message) = 0;
  // The stream's run was deleted: end with ABORTED once what is queued is written; the items
  // still unsettled never will be (the ingest thread dropped them).
  virtual void on_run_deleted(const std::string& message) = 0;
  // Graceful shutdown: settle what was received, then end with UNAVAILABLE.
  virtual void drain() = 0;
  // The server's queue of unsettled work drained below its bound (ingest_budget.h): a stream
  // that was refused a read may read again. Called from any thread.
  virtual void on_capacity() {}
};

// The agent process behind a stream (Hello.host, pid, process_start_unix_ns). Two agents are
// the same process unless their hosts differ, or both name a pid (a start) and these differ;
// 0 is unknown and matches anything.
struct AgentProcess {
  std::string host;
  std::uint64_t pid = 0;
  std::int64_t start_unix_ns = 0;

  static AgentProcess of(const v1::Hello& hello);
  bool same_process(const AgentProcess& other) const;
  std::string describe() const;  // "host h1 pid 412"
};

class StreamTable {
 public:
  // Lists `sink` as a stream of (run_id, rank) from `process`, unless a stream of another
  // process holds that rank: then nothing is listed and that process is returned. The same
  // process reconnecting is listed next to its older stream, which goes when it ends.
  std::optional<AgentProcess> claim(const std::string& run_id, std::uint32_t rank,
                                    const AgentProcess& process, std::shared_ptr<StreamSink> sink);
  void remove(const std::string& run_id, const StreamSink* sink);
  std::vector<std::shared_ptr<StreamSink>> of_run(const std::string& run_id) const;
  std::vector<std::shared_ptr<StreamSink>> all() const;
  std::set<std::uint32_t> connected_ranks(const std::string& run_id) const;
  std::set<std::string> runs() const;  // runs with an open stream
  std::size_t size() const;

 private:
  struct Entry {
    std::uint32_t rank;
    AgentProcess process;
    std::shared_ptr<StreamSink> sink;
  };
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::vector<Entry>> by_run_;
};

}  // namespace ampscope::server
