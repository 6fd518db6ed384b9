// The open Attach streams, by run: the ingest thread pushes policy updates to the streams of a
// run, shutdown drains every stream, and queries report which agents are connected.
//
// Thread safety: StreamTable is internally synchronised. StreamSink methods are called from the
// ingest thread and from shutdown; implementations synchronise themselves.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
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
  // the agent with seq <= persisted_seq is stored, a duplicate or rejected.
  virtual void on_settled(std::uint64_t persisted_seq, int items) = 0;
  // A policy update for the stream's run (the current one right after the Hello, then each new
  // one as it is decided).
  virtual void on_policy(const v1::PolicyUpdate& update) = 0;
  // The store failed; nothing of the stream's unsettled items was stored.
  virtual void on_store_failure(const std::string& message) = 0;
  // The stream's run was deleted: end with ABORTED once what is queued is written; the items
  // still unsettled never will be (the ingest thread dropped them).
  virtual void on_run_deleted(const std::string& message) = 0;
  // Graceful shutdown: settle what was received, then end with UNAVAILABLE.
  virtual void drain() = 0;
};

class StreamTable {
 public:
  void add(const std::string& run_id, std::uint32_t rank, std::shared_ptr<StreamSink> sink);
  void remove(const std::string& run_id, const StreamSink* sink);
  std::vector<std::shared_ptr<StreamSink>> of_run(const std::string& run_id) const;
  std::vector<std::shared_ptr<StreamSink>> all() const;
  std::set<std::uint32_t> connected_ranks(const std::string& run_id) const;
  std::set<std::string> runs() const;  // runs with an open stream
  std::size_t size() const;

 private:
  struct Entry {
    std::uint32_t rank;
    std::shared_ptr<StreamSink> sink;
  };
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::vector<Entry>> by_run_;
};

}  // namespace ampscope::server
