#include "attach_reactor.h"

#include <google/protobuf/arena.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpcpp/impl/codegen/proto_utils.h>

#include <algorithm>

#include "ampscope/proto/wire_time.h"
#include "log.h"

namespace ampscope::server {

std::optional<DecodedMessage> decode_agent_message(const grpc::ByteBuffer& buffer) {
  DecodedMessage d;
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return std::nullopt;
  d.wire.reserve(buffer.Length());
  for (const grpc::Slice& slice : slices) {
    d.wire.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  // One arena per message: a report's hundreds of tensors and histograms are allocated in a few
  // blocks and freed at once when it is settled, instead of one by one (docs/server.md).
  // Block sizes in whole 64-byte units: protobuf puts its cleanup records at a block's end, and
  // a size that is not a multiple of 8 leaves them misaligned (undefined behaviour that
  // UBSan stops at).
  google::protobuf::ArenaOptions options;
  options.start_block_size =
      (std::clamp<std::size_t>(2 * d.wire.size(), 4096, 1u << 20) + 63) & ~std::size_t{63};
  options.max_block_size = std::max<std::size_t>(options.start_block_size, 256u << 10);
  d.arena = std::make_unique<google::protobuf::Arena>(options);
  d.message = google::protobuf::Arena::CreateMessage<v1::AgentMessage>(d.arena.get());
  if (!d.message->ParseFromString(d.wire)) return std::nullopt;
  if (!d.message->has_report()) return d;
  // The report's own bytes, when the message holds them once (a field repeated on the wire is
  // merged by the parser, and then only re-serialising gives the report as parsed).
  google::protobuf::io::CodedInputStream input(reinterpret_cast<const std::uint8_t*>(d.wire.data()),
                                               static_cast<int>(d.wire.size()));
  int found = 0;
  std::pair<std::size_t, std::size_t> bytes;
  while (const std::uint32_t tag = input.ReadTag()) {
    using Wire = google::protobuf::internal::WireFormatLite;
    if (Wire::GetTagFieldNumber(tag) == v1::AgentMessage::kReportFieldNumber &&
        Wire::GetTagWireType(tag) == Wire::WIRETYPE_LENGTH_DELIMITED) {
      std::uint32_t length = 0;
      if (!input.ReadVarint32(&length)) return d;
      const int at = input.CurrentPosition();
      if (!input.Skip(static_cast<int>(length))) return d;
      bytes = {static_cast<std::size_t>(at), length};
      ++found;
    } else if (Wire::GetTagFieldNumber(tag) == v1::AgentMessage::kHelloFieldNumber ||
               !Wire::SkipField(&input, tag)) {
      return d;  // a Hello after the report wins the oneof; or not what the parser read
    }
  }
  if (found == 1) d.report_bytes = bytes;
  return d;
}

AttachReactor* AttachReactor::start(const Deps& deps, const grpc::Status& refusal,
                                    std::shared_ptr<AttachReactor>* handle) {
  auto reactor = std::make_shared<AttachReactor>(deps);
  reactor->self_ = reactor;
  *handle = reactor;
  deps.metrics->stream_opened();
  Actions a;
  {
    std::lock_guard lock(reactor->mu_);
    if (!refusal.ok()) reactor->end(refusal);
    reactor->plan(a);
  }
  reactor->act(a);
  return reactor.get();
}

AttachReactor::AttachReactor(const Deps& deps) : deps_(deps) {}

AttachReactor::~AttachReactor() = default;

void AttachReactor::OnReadDone(bool ok) {
  Actions a;
  {
    std::lock_guard lock(mu_);
    reading_ = false;
    if (!ok) {
      // Raw reads fail only when the agent half-closed or the call broke (OnCancel says which).
      reads_done_ = true;
    } else if (!end_status_) {
      message_bytes_ = in_.Length();
      handle_message();
    }
    plan(a);
  }
  act(a);
}

std::string AttachReactor::position() const {
  if (phase_ == Phase::kAwaitHello) return "before the Hello";
  if (identity_.previous_seq == 0) return "after the Hello";
  return "after seq " + std::to_string(identity_.previous_seq);
}

void AttachReactor::handle_message() {
  std::optional<DecodedMessage> decoded = decode_agent_message(in_);
  if (!decoded) {
    // A soft end: what came before is still committed and acknowledged, then the agent learns
    // that this message was not taken (a half-close would have read as "all settled").
    end(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                     "undecodable message " + position() +
                         " (not an ampscope.v1.AgentMessage, or a string that is not UTF-8)"));
    return;
  }
  v1::AgentMessage& in = *decoded->message;
  switch (in.kind_case()) {
    case v1::AgentMessage::kHello: {
      if (phase_ != Phase::kAwaitHello) {
        deps_.metrics->rejected("identity");
        end(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                         "hello: a stream carries one Hello, this is the second"));
        return;
      }
      if (std::optional<Violation> v = validate_hello(in.hello())) {
        deps_.metrics->rejected(v->reason);
        end(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, v->message));
        return;
      }
      if (grpc::Status denied = Authenticator::authorize_run(deps_.principal, in.hello().run_id());
          !denied.ok()) {
        end(std::move(denied));
        return;
      }
      handle_hello(in.hello());
      return;
    }
    case v1::AgentMessage::kReport: {
      if (phase_ == Phase::kAwaitHello) {
        deps_.metrics->rejected("missing_hello");
        end(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                         "hello: the first message of a stream must be a Hello"));
        return;
      }
      handle_report(std::move(*decoded));
      return;
    }
    case v1::AgentMessage::KIND_NOT_SET:
      // A message kind added after this server was built: ignored, as the compatibility rules
      // promise.
      return;
  }
}

bool AttachReactor::owns_run(const std::string& run_id) {
  if (deps_.ownership == nullptr) return true;
  // Asked under the lock: nothing else waits on a stream before its Hello (but its own cancel).
  const RunClaim claim = deps_.ownership->claim(run_id);
  switch (claim.kind) {
    case RunClaim::Kind::kOwned:
      return true;
    case RunClaim::Kind::kElsewhere: {
      log(LogLevel::kDebug, "run '", run_id, "': redirected an agent to its owner at ",
          claim.owner);
      v1::ServerMessage m;
      m.mutable_redirect()->set_run_id(run_id);
      m.mutable_redirect()->set_owner(claim.owner);
      enqueue(std::move(m));
      // The status names the owner too, for an agent that does not know Redirect.
      end(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                       "run '" + run_id + "' is owned by the ampscope-server at " + claim.owner +
                           ": stream there (server=" + claim.owner +
                           "), or use an agent that follows redirects"));
      return false;
    }
    case RunClaim::Kind::kUnavailable:
      end(grpc::Status(grpc::StatusCode::UNAVAILABLE, "run '" + run_id +
                                                          "': its owner cannot be settled now (" +
                                                          claim.reason + "); try again later"));
      return false;
  }
  return false;
}

void AttachReactor::handle_hello(const v1::Hello& hello) {
  // Only the run's owner serves it: asked before the stream is listed or anything of it
  // reaches the ingest thread, so that a redirected Hello leaves no trace here.
  if (!owns_run(hello.run_id())) return;
  identity_ = stream_identity(hello);
  phase_ = Phase::kStreaming;
  // Listed before the Hello reaches the ingest thread, so that deleting the run after that
  // Hello always finds (and ends) this stream.
  const AgentProcess process = AgentProcess::of(hello);
  if (std::optional<AgentProcess> holder =
          deps_.streams->claim(identity_.run_id, identity_.rank, process, self_)) {
    // Two processes numbering their reports alike would be merged by seq, half of them
    // dropped as duplicates: the second one is refused, and the run keeps a note of it.
    deps_.metrics->rejected("identity");
    end(grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                     "rank " + std::to_string(identity_.rank) + " of run '" + identity_.run_id +
                         "' is streaming from " + holder->describe() + "; this agent (" +
                         process.describe() + ") is another process"));
    IngestItem note;
    note.kind = IngestItem::Kind::kRefusal;
    note.run_id = identity_.run_id;
    note.rank = identity_.rank;
    note.notice = "refused a second agent (" + process.describe() + ") while " +
                  holder->describe() + " was streaming";
    deps_.ingest->submit(std::move(note));
    return;
  }
  registered_ = true;
  IngestItem item;
  item.kind = IngestItem::Kind::kHello;
  item.hello = std::make_unique<v1::Hello>(hello);
  submit(std::move(item));
}

void AttachReactor::handle_report(DecodedMessage decoded) {
  v1::StepReport* report = decoded.message->mutable_report();
  ReportVerdict verdict = validate_report(*report, identity_);
  if (std::optional<Violation>& v = verdict.rejected) {
    deps_.metrics->rejected(v->reason);
    v1::ServerMessage m;
    v1::Reject* reject = m.mutable_reject();
    reject->set_seq(report->seq());
    reject->set_code(static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
    reject->set_field(v->field);
    reject->set_reason(v->reason);
    reject->set_message(v->message);
    enqueue(std::move(m));
    IngestItem item;
    item.kind = IngestItem::Kind::kReject;
    // A seq the store cannot keep settles nothing (seq 0): no Ack may ever name it.
    const bool settles = report->seq() <= limits::kMaxSeq;
    item.seq = settles ? report->seq() : 0;
    item.violation = std::move(*v);
    if (settles && report->seq() > identity_.previous_seq) identity_.previous_seq = report->seq();
    submit(std::move(item));
    return;
  }
  identity_.previous_seq = report->seq();
  IngestItem item;
  item.kind = IngestItem::Kind::kReport;
  item.seq = report->seq();
  for (Refusal& r : verdict.refused) {
    deps_.metrics->refused_part(r.violation.reason);
    item.notices.push_back(std::move(r.notice));
  }
  // The report as received is what the store keeps, unless validation took parts out of it.
  if (verdict.refused.empty() && decoded.report_bytes) {
    item.payload.assign(decoded.wire, decoded.report_bytes->first, decoded.report_bytes->second);
  } else {
    item.payload = report->SerializeAsString();
  }
  item.report = report;
  item.arena = std::move(decoded.arena);
  submit(std::move(item));
}

void AttachReactor::submit(IngestItem item) {
  item.sink = self_;
  item.run_id = identity_.run_id;
  item.rank = identity_.rank;
  item.received_ns = proto::unix_now_ns();
  item.received = std::chrono::steady_clock::now();
  item.bytes = message_bytes_;
  if (!deps_.ingest->submit(std::move(item))) {
    end(grpc::Status(grpc::StatusCode::UNAVAILABLE, "server is shutting down"));
    return;
  }
  ++in_flight_;
}

void AttachReactor::enqueue(v1::ServerMessage message) {
  if (end_status_ && hard_end_) return;
  writes_.push_back(std::move(message));
}

void AttachReactor::enqueue_ack(std::uint64_t seq) {
  // An Ack queued last (behind every message that must precede it) is simply advanced.
  if (!writes_.empty() && writes_.back().has_ack()) {
    v1::Ack* ack = writes_.back().mutable_ack();
    if (seq > ack->persisted_seq()) ack->set_persisted_seq(seq);
    return;
  }
  v1::ServerMessage m;
  m.mutable_ack()->set_persisted_seq(seq);
  enqueue(std::move(m));
}

void AttachReactor::end(grpc::Status status, bool hard) {
  if (!end_status_) end_status_ = std::move(status);
  if (hard) {
    hard_end_ = true;
    // Whatever is not on the wire yet is dropped; the agent replays from its spool.
    writes_.clear();
  }
}

void AttachReactor::plan(Actions& a) {
  if (finished_) return;
  if (!writing_ && !writes_.empty() && !hard_end_) {
    bool own_buffer = false;
    out_.Clear();  // the serializer writes only into an empty buffer
    grpc::SerializationTraits<v1::ServerMessage>::Serialize(writes_.front(), &out_, &own_buffer);
    writes_.pop_front();
    writing_ = true;
    a.write = true;
  }
  if (!end_status_) {
    if (in_flight_ == 0 && reads_done_) end_status_ = grpc::Status::OK;
    if (in_flight_ == 0 && draining_) {
      end_status_ = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                 "server shutting down; everything received is acknowledged");
    }
  }
  if (!end_status_ && !reading_ && !reads_done_ && !draining_ && !waiting_capacity_ &&
      in_flight_ < deps_.max_in_flight && writes_.size() < deps_.max_pending_writes) {
    if (deps_.ingest->budget().admit(self_)) {
      reading_ = true;
      a.read = true;
    } else {
      waiting_capacity_ = true;
    }
  }
  // A soft end (the server draining, a refused submit, a protocol error) waits for the items
  // already handed to the ingest thread: they may still be committed, and their Ack must reach
  // the agent before the stream ends. A hard end (cancelled, store failure) does not wait.
  if (end_status_ && !writing_ && (hard_end_ || (writes_.empty() && in_flight_ == 0))) {
    finished_ = true;
    // Off the table as soon as its end is decided: the same rank may claim a new stream once the
    // agent has this status.
    if (registered_) deps_.streams->remove(identity_.run_id, this);
    registered_ = false;
    a.finish = *end_status_;
  }
}

void AttachReactor::act(const Actions& a) {
  if (a.write) StartWrite(&out_);
  if (a.read) StartRead(&in_);
  if (a.finish) Finish(*a.finish);
}

void AttachReactor::OnWriteDone(bool ok) {
  Actions a;
  {
    std::lock_guard lock(mu_);
    writing_ = false;
    if (!ok) end(grpc::Status(grpc::StatusCode::CANCELLED, "write to the agent failed"), true);
    plan(a);
  }
  act(a);
}

void AttachReactor::OnCancel() {
  Actions a;
  {
    std::lock_guard lock(mu_);
    end(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"), true);
    plan(a);
  }
  act(a);
}

void AttachReactor::OnDone() {
  std::shared_ptr<AttachReactor> keep;
  {
    std::lock_guard lock(mu_);
    done_ = true;
    if (registered_) deps_.streams->remove(identity_.run_id, this);
    keep = std::move(self_);
  }
  deps_.metrics->stream_closed();
  // `keep` releases the reactor's own reference here; the ingest thread may still hold one
  // until its queued items are settled.
}

void AttachReactor::on_settled(std::uint64_t persisted_seq, int items,
                               const std::vector<v1::PolicyUpdate>& policies) {
  Actions a;
  {
    std::lock_guard lock(mu_);
    if (done_) return;
    in_flight_ -= std::min<std::size_t>(in_flight_, static_cast<std::size_t>(items));
    hello_settled_ = true;
    // Queued before the Ack, and before plan() can decide that the stream is over.
    for (const v1::PolicyUpdate& p : policies) {
      v1::ServerMessage m;
      *m.mutable_policy() = p;
      enqueue(std::move(m));
    }
    enqueue_ack(persisted_seq);
    plan(a);
  }
  act(a);
}

void AttachReactor::on_policy(const v1::PolicyUpdate& update) {
  Actions a;
  {
    std::lock_guard lock(mu_);
    // Before its Hello is settled the stream gets the policy in force with that Hello's Ack,
    // this decision included. A stream ending softly still writes what is decided until it
    // finishes; a hard end drops it (enqueue).
    if (done_ || finished_ || !hello_settled_) return;
    v1::ServerMessage m;
    *m.mutable_policy() = update;
    enqueue(std::move(m));
    plan(a);
  }
  act(a);
}

void AttachReactor::on_store_failure(const std::string& message) {
  Actions a;
  {
    std::lock_guard lock(mu_);
    if (done_) return;
    // A passing outage: the agent keeps what was not acknowledged and comes back.
    end(grpc::Status(grpc::StatusCode::UNAVAILABLE, message), true);
    plan(a);
  }
  act(a);
}

void AttachReactor::on_run_deleted(const std::string& message) {
  Actions a;
  {
    std::lock_guard lock(mu_);
    if (done_) return;
    end(grpc::Status(grpc::StatusCode::ABORTED, message));
    in_flight_ = 0;  // dropped by the ingest thread: nothing more will settle
    plan(a);
  }
  act(a);
}

void AttachReactor::on_capacity() {
  Actions a;
  {
    std::lock_guard lock(mu_);
    if (done_) return;
    waiting_capacity_ = false;
    plan(a);
  }
  act(a);
}

void AttachReactor::drain() {
  Actions a;
  {
    std::lock_guard lock(mu_);
    if (done_) return;
    draining_ = true;
    plan(a);
  }
  act(a);
}

}  // namespace ampscope::server
