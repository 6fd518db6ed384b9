// One Attach stream (Telemetry.Attach): the callback-API reactor of one agent.
//
// Reads: raw messages, parsed here, so that a message that does not decode (garbage, a string
// that is not UTF-8) is told apart from the agent's half-close: it ends the stream with
// INVALID_ARGUMENT once what came before it is settled and acknowledged. Hello first, then
// StepReports; each is validated here (on the gRPC thread) and handed to the ingest thread. The
// reactor stops reading while `max_in_flight` items wait for their commit, or while
// `max_pending_writes` messages wait to be written (an agent that does not read its Rejects),
// or while the server's queue of unsettled work is over its bound (Ingest::budget(), shared by
// every stream: resumed by on_capacity); gRPC flow control then pushes back on the agent.
// Writes: Acks, Rejects and PolicyUpdates go through a queue; the next write starts in
// OnWriteDone (back-pressure), and an Ack still queued is updated in place rather than queued
// again. The decisions a commit's reports caused are queued before that commit's Ack.
// End: OK once the agent half-closed and everything it sent is settled, acknowledged and every
// decision it caused written; UNAVAILABLE after a drain (shutdown); INVALID_ARGUMENT for a bad
// Hello or an undecodable message; ALREADY_EXISTS when another process streams for the same
// (run, rank); FAILED_PRECONDITION after a Redirect, when another server owns the Hello's run
// (RunOwnership; UNAVAILABLE when its owner cannot be settled now); INTERNAL when the store fails;
// ABORTED when its run is deleted (after the Acks already queued); CANCELLED when a read or write
// fails.
//
// Lifetime: owned by itself (self_) until OnDone, and by whoever holds it as a StreamSink; late
// calls after OnDone are ignored. Thread safety: every member is guarded by mu_; gRPC
// operations are started outside the lock.
#pragma once

#include <google/protobuf/arena.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ampscope/v1/telemetry.pb.h"
#include "auth.h"
#include "ingest.h"
#include "metrics.h"
#include "run_ownership.h"
#include "streams.h"
#include "validation.h"

namespace ampscope::server {

// A message read off the wire: decoded into an arena of its own, and, for a report, where the
// report's own encoding lies in the wire bytes (what the store keeps; no second serialisation).
struct DecodedMessage {
  std::string wire;
  std::unique_ptr<google::protobuf::Arena> arena;
  v1::AgentMessage* message = nullptr;  // in *arena
  // The report's bytes in `wire` (offset, size); unset: serialise the report.
  std::optional<std::pair<std::size_t, std::size_t>> report_bytes;
};
// Nullopt when the bytes are not an AgentMessage (or hold a string that is not UTF-8).
std::optional<DecodedMessage> decode_agent_message(const grpc::ByteBuffer& buffer);

class AttachReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
                            public StreamSink {
 public:
  struct Deps {
    Ingest* ingest;
    StreamTable* streams;
    Metrics* metrics;
    std::size_t max_in_flight;
    // Who opened the stream (TelemetryService); its run-id prefix is checked at the Hello.
    Principal principal{};
    // Messages waiting to be written beyond which the stream is not read (docs/server.md).
    std::size_t max_pending_writes = kMaxPendingWrites;
    // Whether this server owns a Hello's run (cluster/run_ownership.h); asked once per Hello.
    // Null: it owns every run, as a server alone does.
    RunOwnership* ownership = nullptr;
  };
  static constexpr std::size_t kMaxPendingWrites = 256;
  // Starts reading, or finishes at once with `refusal` when it is not OK (authentication,
  // shutdown).
  static AttachReactor* start(const Deps& deps, const grpc::Status& refusal,
                              std::shared_ptr<AttachReactor>* handle);

  explicit AttachReactor(const Deps& deps);
  ~AttachReactor() override;

  // grpc::ServerBidiReactor
  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

  // StreamSink
  void on_settled(std::uint64_t persisted_seq, int items,
                  const std::vector<v1::PolicyUpdate>& policies) override;
  void on_policy(const v1::PolicyUpdate& update) override;
  void on_store_failure(const std::string& message) override;
  void on_run_deleted(const std::string& message) override;
  void drain() override;
  void on_capacity() override;

 private:
  enum class Phase { kAwaitHello, kStreaming };
  // gRPC operations decided under the lock and started after it is released.
  struct Actions {
    bool read = false;
    bool write = false;  // out_
    std::optional<grpc::Status> finish;
  };
  void handle_message();
  std::string position() const;  // "after seq 12", for messages about the stream
  void handle_hello(const v1::Hello& hello);
  // False when another server owns the run, or nobody can tell now: the stream then ends (a
  // Redirect first, when the owner is known).
  bool owns_run(const std::string& run_id);
  void handle_report(DecodedMessage decoded);
  void submit(IngestItem item);
  void enqueue(v1::ServerMessage message);
  void enqueue_ack(std::uint64_t seq);
  // Finish as soon as the writes allow; `hard` drops what is queued (the call is broken).
  void end(grpc::Status status, bool hard = false);
  void plan(Actions& a);  // what to start next
  void act(const Actions& a);

  const Deps deps_;
  std::shared_ptr<AttachReactor> self_;

  std::mutex mu_;
  grpc::ByteBuffer in_;
  grpc::ByteBuffer out_;  // the message being written
  Phase phase_ = Phase::kAwaitHello;
  StreamIdentity identity_;
  bool hello_settled_ = false;
  bool registered_ = false;
  std::size_t in_flight_ = 0;
  bool reading_ = false;
  bool waiting_capacity_ = false;  // refused a read by the budget; on_capacity() resumes
  std::size_t message_bytes_ = 0;  // wire size of the message being handled
  bool reads_done_ = false;
  bool draining_ = false;
  std::deque<v1::ServerMessage> writes_;  // not started yet
  bool writing_ = false;
  std::optional<grpc::Status> end_status_;
  bool hard_end_ = false;
  bool finished_ = false;
  bool done_ = false;
};

}  // namespace ampscope::server
