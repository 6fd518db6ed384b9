// One Attach stream (Telemetry.Attach): the callback-API reactor of one agent.
//
// Reads: Hello first, then StepReports; each is validated here (on the gRPC thread) and handed
// to the ingest thread. At most `max_in_flight` items wait for their commit; beyond that the
// reactor stops reading until acknowledgements come back, which pushes back on the agent
// through gRPC flow control.
// Writes: Acks, Rejects and PolicyUpdates go through a queue; the next write starts in
// OnWriteDone (back-pressure), and an Ack still queued is updated in place rather than queued
// again.
// End: OK once the agent half-closed and everything it sent is settled; UNAVAILABLE after a
// drain (shutdown); INVALID_ARGUMENT for a bad Hello; INTERNAL when the store fails; ABORTED
// when its run is deleted (after the Acks already queued); CANCELLED when a read or write
// fails.
//
// Lifetime: owned by itself (self_) until OnDone, and by whoever holds it as a StreamSink; late
// calls after OnDone are ignored. Thread safety: every member is guarded by mu_; gRPC
// operations are started outside the lock.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>

#include "ampscope/v1/telemetry.pb.h"
#include "ingest.h"
#include "metrics.h"
#include "streams.h"
#include "validation.h"

namespace ampscope::server {

class AttachReactor final : public grpc::ServerBidiReactor<v1::AgentMessage, v1::ServerMessage>,
                            public StreamSink {
 public:
  struct Deps {
    Ingest* ingest;
    StreamTable* streams;
    Metrics* metrics;
    std::size_t max_in_flight;
  };
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
  void on_settled(std::uint64_t persisted_seq, int items) override;
  void on_policy(const v1::PolicyUpdate& update) override;
  void on_store_failure(const std::string& message) override;
  void on_run_deleted(const std::string& message) override;
  void drain() override;

 private:
  enum class Phase { kAwaitHello, kStreaming };
  // gRPC operations decided under the lock and started after it is released.
  struct Actions {
    bool read = false;
    const v1::ServerMessage* write = nullptr;
    std::optional<grpc::Status> finish;
  };
  void handle_message(Actions& a);
  void handle_hello(const v1::Hello& hello);
  void handle_report(std::unique_ptr<v1::StepReport> report);
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
  v1::AgentMessage in_;
  Phase phase_ = Phase::kAwaitHello;
  StreamIdentity identity_;
  bool hello_settled_ = false;
  bool registered_ = false;
  std::size_t in_flight_ = 0;
  bool reading_ = false;
  bool reads_done_ = false;
  bool draining_ = false;
  std::deque<v1::ServerMessage> writes_;
  bool writing_ = false;
  std::optional<grpc::Status> end_status_;
  bool hard_end_ = false;
  bool finished_ = false;
  bool done_ = false;
};

}  // namespace ampscope::server
