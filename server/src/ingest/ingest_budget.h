// The server's bound on received work not settled yet, over every stream and ingest shard: the
// wire bytes of the items submitted to ingest and not yet committed and acknowledged (or
// dropped). While they exceed the bound the streams stop reading (the reactor issues no next
// read), gRPC flow control pushes back on the agents, and they spool as they do when the server
// is down; a stream that was refused a read is told (StreamSink::on_capacity) once the queued
// bytes have drained to three quarters of the bound.
//
// The bound is checked before a read, so it is crossed by at most the messages already being
// read: one per stream (each at most --max-message-bytes). It counts wire bytes; the decoded
// reports they stand for take a few times that in memory.
//
// Thread safety: every method from any thread; sinks are told outside the lock.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "streams.h"

namespace ampscope::server {

class IngestBudget {
 public:
  // `changed` (optional; the metrics) is called after every change with the queued bytes, the
  // streams waiting and the pauses so far, under the budget's lock: it must be quick and must
  // not call back. A `max_bytes` of 0 is taken as 1.
  using Changed =
      std::function<void(std::uint64_t queued, std::size_t waiting, std::uint64_t pauses)>;
  explicit IngestBudget(std::uint64_t max_bytes, Changed changed = {});

  // True when the stream may read its next message; false while the queued bytes are over the
  // bound, and then `sink` is told on_capacity() once, when they drained.
  bool admit(const std::shared_ptr<StreamSink>& sink);
  void charge(std::uint64_t bytes);
  void release(std::uint64_t bytes);

  std::uint64_t queued_bytes() const;
  std::uint64_t max_bytes() const { return max_bytes_; }
  // How often a stream was refused a read (ampscope_ingest_read_pauses_total).
  std::uint64_t pauses() const;

 private:
  void report() const;  // under mu_

  const std::uint64_t max_bytes_;
  const std::uint64_t resume_bytes_;  // 3/4 of the bound
  const Changed changed_;
  mutable std::mutex mu_;
  std::uint64_t queued_ = 0;
  std::uint64_t pauses_ = 0;
  std::vector<std::weak_ptr<StreamSink>> waiting_;
};

}  // namespace ampscope::server
