// The sender: one background thread that keeps one Telemetry.Attach stream (docs/server.md,
// "The wire contract") open to ampscope-server and streams the spool over it.
//
//   connect (fresh channel, bounded by connect_timeout) -> Hello(resume_from_seq) -> first Ack
//   (what the server already has) -> reports from the spool in seq order, after that Ack,
//   written in batches of max_batch with gRPC's buffer hint and at most max_in_flight ahead of
//   the acknowledgements -> on any failure: cancel, wait backoff with jitter (doubling from
//   backoff_initial up to backoff_max, reset after a stream that was acknowledged), repeat.
// A reader thread per stream takes Acks (which trim the spool), PolicyUpdates (handed to the
// policy hook) and Rejects (counted; the report is settled and leaves the spool with the next
// Ack). Keepalive: pings every keepalive_time (>= 10 s, the server's minimum), also without
// calls. The reports are stored without their seq; the record's seq is set as it is sent.
//
// Thread safety: all public members are thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "ampscope/agent/config.h"
#include "ampscope/v1/telemetry.pb.h"
#include "notices.h"
#include "spool.h"

namespace grpc {
class ClientContext;
}

namespace ampscope::agent {

struct TransportHooks {
  // The Hello of a new stream; the argument is its resume_from_seq.
  std::function<v1::Hello(std::uint64_t)> hello;
  std::function<void(const v1::PolicyUpdate&)> on_policy;
  std::function<void(bool)> on_connected;
};

class Transport {
 public:
  Transport(const AgentConfig& config, Spool* spool, Notices* notices, TransportHooks hooks);
  ~Transport();  // stop(0) if needed

  void start();
  // Waits until the server acknowledged every seq <= `seq`, or the deadline. Returns whether it
  // did.
  bool wait_acked(std::uint64_t seq, std::chrono::steady_clock::time_point deadline);
  // Ends the stream (half-close when everything is acknowledged, else cancel) and joins the
  // threads. Call wait_acked first for a graceful end.
  void stop();

  bool connected() const { return connected_.load(); }
  // A stream had been acknowledged and none is now: the server went away (or is being
  // reconnected to). False before the first acknowledged stream.
  bool lost() const { return ever_connected_.load() && !connected_.load(); }
  std::uint64_t reconnects() const { return reconnects_.load(); }
  std::uint64_t rejected() const { return rejected_.load(); }

 private:
  class Session;
  void run();
  bool sleep_backoff(std::chrono::milliseconds d);  // false when stopping

  const AgentConfig& config_;
  Spool* spool_;
  Notices* notices_;
  TransportHooks hooks_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;  // stop requests, acks
  bool stopping_ = false;       // guarded by mu_
  grpc::ClientContext* context_ = nullptr;  // of the open stream, guarded by mu_
  std::atomic<bool> connected_{false};
  std::atomic<bool> ever_connected_{false};
  std::atomic<std::uint64_t> reconnects_{0};
  std::atomic<std::uint64_t> rejected_{0};
};

}  // namespace ampscope::agent
