// The sender: one background thread that keeps one Telemetry.Attach stream (docs/server.md,
// "The wire contract") open to ampscope-server and streams the spool over it.
//
//   connect (fresh channel, bounded by connect_timeout) -> Hello(resume_from_seq) -> first Ack
//   (what the server already has) -> reports from the spool in seq order, after that Ack,
//   written in batches of max_batch with gRPC's buffer hint and at most max_in_flight ahead of
//   the acknowledgements -> on any end of the stream, clean or not: cancel, wait the backoff
//   with jitter, repeat. The backoff doubles from backoff_initial up to backoff_max after every
//   stream that ended early, and goes back to backoff_initial only after a stream that was
//   acknowledged and stayed open for backoff_max (at most 10 s); a server that refuses this
//   agent (ALREADY_EXISTS: another process streams as this run and rank; UNAUTHENTICATED or
//   PERMISSION_DENIED: its token) is asked again every backoff_max.
// Several servers (config.server "a:50051,b:50051"): each stream goes to one entry of the list,
// the first one first; a stream that ends before it was healthy (not connected, refused, ended
// early) moves on to the next entry, round the list, with the backoff as above; a healthy one
// keeps its entry. A server that does not own the run answers the Hello with a Redirect to the
// owner: the next stream goes there at once, without a backoff, and the one after it starts
// from the list again (whoever owns the run then says where it is). At most kMaxRedirects are
// followed in a row; one more, or an owner that cannot be reached, is a notice and a backoff.
// A reader thread per stream takes Acks (which trim the spool), PolicyUpdates (handed to the
// policy hook) and Rejects (counted; the report is settled and leaves the spool with the next
// Ack). An Ack is believed only for what it can cover: the first one of a stream for what this
// agent ever numbered (or, with nothing unacknowledged, any seq below Spool::kMaxSeq: the
// server kept more than the spool did), the later ones for what this stream carried. Anything
// else is a protocol error: the spool stays as it is, the stream is cut, counted
// (protocol_errors()) and noticed once, and the next one waits its backoff. Keepalive: pings
// every keepalive_time (>= 10 s, the server's minimum), also without calls. The reports are
// stored without their seq; the record's seq is set as it is sent.
//
// Stopping is bounded by the deadline given to stop(): connecting is waited for in slices that
// see the stop, a stream with reports still unacknowledged is cancelled at once, and a
// half-closed one the server does not end is cancelled at the deadline.
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
#include <vector>

#include "ampscope/agent/config.h"
#include "ampscope/v1/telemetry.pb.h"
#include "notices.h"
#include "spool.h"

namespace grpc {
class Channel;
class ClientContext;
}  // namespace grpc

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
  ~Transport();  // stop(now) if needed

  using Deadline = std::chrono::steady_clock::time_point;

  void start();
  // Waits until the server acknowledged every seq <= `seq`, or the deadline. Returns whether it
  // did.
  bool wait_acked(std::uint64_t seq, std::chrono::steady_clock::time_point deadline);
  // Ends the stream (half-close when everything is acknowledged, else cancel) and joins the
  // threads, cancelling whatever is still open at `deadline`. Call wait_acked first for a
  // graceful end. Later calls return at once.
  void stop(Deadline deadline);

  // Redirects followed in a row before the agent backs off: a loop between servers that
  // disagree about the owner costs a few Hellos per backoff, never a busy loop.
  static constexpr int kMaxRedirects = 3;

  bool connected() const { return connected_.load(); }
  // A stream had been acknowledged and none is now: the server went away (or is being
  // reconnected to). False before the first acknowledged stream.
  bool lost() const { return ever_connected_.load() && !connected_.load(); }
  std::uint64_t reconnects() const { return reconnects_.load(); }
  std::uint64_t rejected() const { return rejected_.load(); }
  // Streams cut because the server broke the protocol (an Ack of a report never sent).
  std::uint64_t protocol_errors() const { return protocol_errors_.load(); }

 private:
  class Session;
  void run();
  // One stream, from connecting to its end; returns why it ended ("" when it ended because of
  // stop()).
  struct StreamEnd {
    // One line for a notice per distinct failure; empty when stopping, cancelled by the agent,
    // or noticed already (a protocol error, a refusal: once, whatever the details).
    std::string failure;
    bool healthy = false;  // acknowledged and open for backoff_max (at most 10 s)
    // The server refused this agent (ALREADY_EXISTS: another process streams this run and
    // rank; UNAUTHENTICATED, PERMISSION_DENIED: its token): asking again soon cannot help.
    bool refused = false;
    // The server named the run's owner (Redirect.owner, checked): stream there next.
    std::string redirect;
  };
  StreamEnd stream_once(const std::string& target);
  bool connect(grpc::Channel& channel);  // false on timeout or stop
  bool stopping() const;
  // Empty when the Ack may be believed (and was applied to the spool), else why not.
  std::string take_ack(Session& session, std::uint64_t seq);
  bool sleep_backoff(std::chrono::milliseconds d);  // false when stopping

  const AgentConfig& config_;
  Spool* spool_;
  Notices* notices_;
  TransportHooks hooks_;
  const std::vector<std::string> servers_;  // config.server's entries, in order
  std::thread thread_;
  std::mutex join_mu_;  // one stop() joins
  mutable std::mutex mu_;
  std::condition_variable cv_;              // stop requests, acks, the sender's end
  bool stopping_ = false;                   // guarded by mu_
  Deadline stop_deadline_{};                // guarded by mu_; set with stopping_
  bool finished_ = false;                   // guarded by mu_: run() returned
  grpc::ClientContext* context_ = nullptr;  // of the open stream, guarded by mu_
  std::atomic<bool> connected_{false};
  std::atomic<bool> ever_connected_{false};
  std::atomic<std::uint64_t> reconnects_{0};
  std::atomic<std::uint64_t> rejected_{0};
  std::atomic<std::uint64_t> protocol_errors_{0};
};

}  // namespace ampscope::agent
