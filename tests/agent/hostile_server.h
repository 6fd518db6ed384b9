// Stand-ins for a server that misbehaves, for the agent's fault tests: a Telemetry service
// whose answers the test chooses (absurd Acks, Acks withheld, streams ended at once, a stall,
// ALREADY_EXISTS, malformed PolicyUpdates), and a TCP listener that never speaks HTTP/2.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ampscope/v1/telemetry.grpc.pb.h"
#include "loopback_server.h"

namespace ampscope::agent::testing {

class HostileServer final : public v1::Telemetry::Service {
 public:
  struct Behaviour {
    // The first Ack of a stream; nullopt: what the server has (the highest seq it received,
    // or, while ack_reports is off, the highest it acknowledged).
    std::optional<std::uint64_t> first_ack;
    // After the first report of a stream: an Ack of this seq instead of the report's.
    std::optional<std::uint64_t> absurd_ack;
    bool ack_hello = true;     // false: the Hello is never answered
    bool ack_reports = true;   // false: reports are read, never acknowledged
    bool end_after_hello = false;  // end the call with OK right after the first Ack
    // Stop reading and writing after this many reports of a stream, until the call is
    // cancelled or release() is called.
    std::optional<int> stall_after;
    // After the agent half-closed, keep the call open until it is cancelled.
    bool hold_after_half_close = false;
    // End every stream at its Hello with this status.
    std::optional<grpc::Status> refuse;
    // Sent after the first Ack of every stream.
    std::vector<v1::PolicyUpdate> updates;
  };

  explicit HostileServer(Behaviour behaviour) : behaviour_(std::move(behaviour)) {}

  std::string address() const { return server_.address(); }
  void set(Behaviour behaviour);
  void release();  // ends a stall
  // Cancels the open calls (the agent sees its stream end and connects again).
  void cut_streams();

  std::vector<v1::Hello> hellos() const;
  std::vector<std::chrono::steady_clock::time_point> hello_times() const;
  std::vector<v1::StepReport> reports() const;

  grpc::Status Attach(grpc::ServerContext* context,
                      grpc::ServerReaderWriter<v1::ServerMessage, v1::AgentMessage>* stream)
      override;

 private:
  Behaviour behaviour_copy() const;
  // Waits until release() or the call's cancellation.
  void stall(grpc::ServerContext* context);

  mutable std::mutex mu_;
  std::condition_variable released_cv_;
  Behaviour behaviour_;
  bool released_ = false;
  std::uint64_t acked_ = 0;
  std::uint64_t received_ = 0;
  std::vector<grpc::ServerContext*> open_;  // calls in progress
  std::vector<v1::Hello> hellos_;
  std::vector<std::chrono::steady_clock::time_point> hello_times_;
  std::vector<v1::StepReport> reports_;
  LoopbackServer server_{this, std::chrono::milliseconds(200)};  // last: shuts down first
};

// A TCP listener on 127.0.0.1 that accepts connections (the kernel completes them) and never
// reads or writes: a peer that is not an HTTP/2 server.
class SilentListener {
 public:
  SilentListener();
  ~SilentListener();
  SilentListener(const SilentListener&) = delete;
  SilentListener& operator=(const SilentListener&) = delete;
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  int fd_ = -1;
  int port_ = 0;
};

}  // namespace ampscope::agent::testing
