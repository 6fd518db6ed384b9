#include "transport.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <optional>
#include <random>
#include <vector>

#include "ampscope/proto/target.h"
#include "ampscope/proto/tls_failure.h"
#include "ampscope/v1/telemetry.grpc.pb.h"
#include "nvtx.h"

namespace ampscope::agent {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kBatchBytes = 4u << 20;
constexpr std::chrono::milliseconds kPoll{200};
// How late a stop is seen while connecting (a peer that accepts TCP and never speaks HTTP/2
// keeps the channel connecting until connect_timeout).
constexpr std::chrono::milliseconds kConnectSlice{50};
// A run whose owner cannot be reached (a server redirected this agent there) is changing hands:
// the owner's lease expires within the servers' --lease-ttl and the next Hello after that finds
// the new owner. Asked again at most this often meanwhile, however far the backoff has grown.
constexpr std::chrono::milliseconds kOwnerRetryMax{1000};
// A stream acknowledged and open this long resets the backoff (the lesser of backoff_max and
// this cap): a server that ends every stream at once, even cleanly, is not called in a loop.
constexpr std::chrono::milliseconds kHealthyStreamCap{10000};

// The longest owner address a Redirect may name (telemetry.proto).
constexpr std::size_t kMaxOwnerBytes = 256;

std::shared_ptr<grpc::Channel> make_channel(const AgentConfig& c, const std::string& target) {
  grpc::ChannelArguments args;
  // Keepalive that the server accepts (telemetry.proto): never more often than every 10 s.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, static_cast<int>(c.keepalive_time.count()));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, static_cast<int>(c.keepalive_timeout.count()));
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // Our own backoff decides when to try again; each try is a fresh channel that connects now
  // instead of sharing a subchannel (and its backoff state) with the previous one.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, static_cast<int>(c.backoff_initial.count()));
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, static_cast<int>(c.backoff_initial.count()));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, static_cast<int>(c.backoff_max.count()));
  args.SetInt(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, 16 << 20);
  if (!c.tls) return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = c.tls_ca_pem;
  ssl.pem_cert_chain = c.tls_cert_pem;
  ssl.pem_private_key = c.tls_key_pem;
  return grpc::CreateCustomChannel(target, grpc::SslCredentials(ssl), args);
}

// Why `channel` did not connect, as gRPC tells a call: one that does not wait for the channel
// ends at once with the last connection error. The health service's method: harmless should
// the channel connect meanwhile.
grpc::Status connect_error(const std::shared_ptr<grpc::Channel>& channel) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
  grpc::Slice empty;
  grpc::ByteBuffer request(&empty, 1);
  grpc::ByteBuffer response;
  grpc::Status status;
  // A completion queue this thread drains, not the callback API: the status is then written on
  // this thread, which ThreadSanitizer can follow (it cannot see how Debian's uninstrumented gRPC
  // hands a callback to its own threads).
  grpc::CompletionQueue cq;
  const std::unique_ptr<grpc::GenericClientAsyncResponseReader> call =
      stub.PrepareUnaryCall(&ctx, "/grpc.health.v1.Health/Check", request, &cq);
  call->StartCall();
  call->Finish(&response, &status, &status);
  void* tag = nullptr;
  bool ok = false;
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

std::string status_text(const grpc::Status& s) {
  static const char* kNames[] = {"OK",
                                 "CANCELLED",
                                 "UNKNOWN",
                                 "INVALID_ARGUMENT",
                                 "DEADLINE_EXCEEDED",
                                 "NOT_FOUND",
                                 "ALREADY_EXISTS",
                                 "PERMISSION_DENIED",
                                 "RESOURCE_EXHAUSTED",
                                 "FAILED_PRECONDITION",
                                 "ABORTED",
                                 "OUT_OF_RANGE",
                                 "UNIMPLEMENTED",
                                 "INTERNAL",
                                 "UNAVAILABLE",
                                 "DATA_LOSS",
                                 "UNAUTHENTICATED"};
  const int c = static_cast<int>(s.error_code());
  std::string name = c >= 0 && c <= 16 ? kNames[c] : std::to_string(c);
  return s.error_message().empty() ? name : name + ": " + s.error_message();
}

}  // namespace

// The state one stream shares between the sender and its reader thread.
class Transport::Session {
 public:
  std::mutex mu;
  std::condition_variable cv;
  bool broken = false;      // the reader saw the end of the stream
  bool acked_once = false;  // the first Ack arrived
  std::uint64_t first_ack = 0;
  std::string protocol_error;              // why the reader cut the stream
  std::optional<std::string> redirect;     // Redirect.owner, when the server sent one
  std::atomic<std::uint64_t> sent_max{0};  // the highest seq written (or being written)
};

Transport::Transport(const AgentConfig& config, Spool* spool, Notices* notices,
                     TransportHooks hooks)
    : config_(config),
      spool_(spool),
      notices_(notices),
      hooks_(std::move(hooks)),
      servers_(proto::split_targets(config.server)) {}

Transport::~Transport() { stop(Clock::now()); }

void Transport::start() {
  if (servers_.empty()) {
    notices_->raise("transport: no server configured; reports stay in the spool at " +
                    spool_->dir());
    return;
  }
  thread_ = std::thread([this] {
    run();
    {
      std::lock_guard lock(mu_);
      finished_ = true;
    }
    cv_.notify_all();
  });
}

bool Transport::wait_acked(std::uint64_t seq, Deadline deadline) {
  std::unique_lock lock(mu_);
  while (spool_->acked() < seq) {
    if (stopping_ || config_.server.empty()) return spool_->acked() >= seq;
    if (cv_.wait_until(lock, std::min(deadline, Clock::now() + kPoll)) == std::cv_status::timeout &&
        Clock::now() >= deadline) {
      return spool_->acked() >= seq;
    }
  }
  return true;
}

void Transport::stop(Deadline deadline) {
  std::lock_guard join(join_mu_);
  {
    std::unique_lock lock(mu_);
    if (!stopping_) {
      stopping_ = true;
      stop_deadline_ = deadline;
      // Everything acknowledged on an open stream: the session half-closes by itself (and
      // cancels at the deadline). Otherwise cut it short; what is left stays in the spool.
      if (context_ != nullptr && !(connected_.load() && spool_->acked() >= spool_->last_seq())) {
        context_->TryCancel();
      }
    }
    cv_.notify_all();
    spool_->wake();
    if (thread_.joinable() && !cv_.wait_until(lock, deadline, [&] { return finished_; })) {
      // The deadline passed with the stream still open (a server that does not end a
      // half-closed call): cut it; the sender sees the cancellation at once.
      if (context_ != nullptr) context_->TryCancel();
    }
  }
  if (thread_.joinable()) thread_.join();
}

bool Transport::stopping() const {
  std::lock_guard lock(mu_);
  return stopping_;
}

bool Transport::sleep_backoff(std::chrono::milliseconds d) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, d, [&] { return stopping_; });
  return !stopping_;
}

bool Transport::connect(grpc::Channel& channel) {
  const auto deadline = Clock::now() + config_.connect_timeout;
  for (;;) {
    if (stopping()) return false;
    const auto now = Clock::now();
    if (now >= deadline) return false;
    const auto slice = std::min<Clock::duration>(kConnectSlice, deadline - now);
    if (channel.WaitForConnected(std::chrono::system_clock::now() + slice)) return true;
    // Refused or failed (a dead server's port, a TLS handshake refused): gRPC would try again
    // until the deadline, but the next server of the list is the better try. A peer that does
    // not answer at all stays CONNECTING and is waited for.
    if (channel.GetState(false) == GRPC_CHANNEL_TRANSIENT_FAILURE) return false;
  }
}

std::string Transport::take_ack(Session& session, std::uint64_t seq) {
  bool first = false;
  {
    std::lock_guard lock(session.mu);
    first = !session.acked_once;
  }
  if (first) {
    // What the server already has: at most what this agent ever numbered, or, with nothing
    // unacknowledged, more (the spool was lost); the numbering continues after it.
    const std::uint64_t last = spool_->last_seq();
    if (seq <= last ? spool_->ack(seq) : spool_->adopt(seq)) {
      session.sent_max.store(std::max(session.sent_max.load(), seq));
      return {};
    }
    if (seq >= Spool::kMaxSeq) {
      return "the first Ack claims seq " + std::to_string(seq) + ", beyond the seq space (2^63)";
    }
    return "the first Ack claims seq " + std::to_string(seq) + ", beyond the " +
           std::to_string(last) + " this agent numbered, with " +
           std::to_string(spool_->pending()) + " reports still unacknowledged";
  }
  const std::uint64_t sent = session.sent_max.load();
  if (seq > sent) {
    return "an Ack of seq " + std::to_string(seq) +
           ", beyond the last report sent on this stream (" + std::to_string(sent) + ")";
  }
  spool_->ack(seq);
  return {};
}

void Transport::run() {
  std::mt19937_64 rng(std::random_device{}());
  auto backoff = config_.backoff_initial;
  std::string last_failure;
  std::size_t entry = 0;      // servers_[entry] takes the next stream, unless redirected
  std::string owner;          // the redirect to follow with the next stream
  std::string redirected_by;  // the server that named `owner`
  int redirects = 0;          // followed in a row
  while (!stopping()) {
    const bool to_owner = !owner.empty();
    const std::string target = to_owner ? owner : servers_[entry];
    StreamEnd end = stream_once(target);
    if (stopping()) return;
    // One stream to the owner; after it, whoever owns the run then says where it is.
    owner.clear();
    if (!end.redirect.empty()) {
      if (redirects < kMaxRedirects) {
        ++redirects;
        owner = end.redirect;
        redirected_by = target;
        continue;
      }
      end.failure = "redirected " + std::to_string(redirects + 1) + " times in a row for run '" +
                    config_.run_id + "', last by " + target + " to " + end.redirect +
                    " (do the servers agree on the run's owner?); backing off";
    } else if (to_owner && !end.failure.empty()) {
      end.failure = "cannot reach the owner of run '" + config_.run_id + "' at " + target +
                    " (redirected by " + redirected_by + "): " + end.failure;
      backoff = std::min<std::chrono::milliseconds>(backoff, kOwnerRetryMax);
    }
    redirects = 0;
    // A server that did not serve this agent well: the next one of the list gets the next try.
    if (!end.healthy) entry = (entry + 1) % servers_.size();
    if (!end.failure.empty() && end.failure != last_failure) {
      // One notice per distinct failure, so an outage does not flood the reports.
      notices_->raise("transport: " + end.failure);
    }
    last_failure = end.failure;
    if (end.healthy) backoff = config_.backoff_initial;
    std::chrono::milliseconds wait = config_.backoff_max;
    if (!end.refused) {
      std::uniform_real_distribution<double> jitter(0.5, 1.0);
      wait = std::chrono::milliseconds(
          static_cast<std::int64_t>(static_cast<double>(backoff.count()) * jitter(rng)));
    }
    if (!sleep_backoff(wait)) return;
    if (!end.healthy) backoff = std::min(config_.backoff_max, backoff * 2);
  }
}

Transport::StreamEnd Transport::stream_once(const std::string& target) {
  StreamEnd end;
  auto channel = make_channel(config_, target);
  if (!connect(*channel)) {
    if (stopping()) return end;
    end.failure = "cannot connect to " + target;
    if (const std::string tls = proto::tls_failure(connect_error(channel), config_.tls);
        !tls.empty()) {
      // Not a passing outage: nothing arrives until the certificates change, and the person
      // training would otherwise see only "reports not acknowledged" at the end.
      end.failure += ": " + tls +
                     "; training goes on, reports stay in the spool (tls_ca_file, tls_cert_file, "
                     "tls_key_file)";
      // Under the key run() raises it with next: one notice, and one line on stderr.
      notices_->raise_loud("transport: " + end.failure, end.failure);
    }
    return end;
  }
  auto client = v1::Telemetry::NewStub(channel);
  grpc::ClientContext ctx;
  if (!config_.token.empty()) ctx.AddMetadata("authorization", "Bearer " + config_.token);
  {
    std::lock_guard lock(mu_);
    if (stopping_) return end;
    context_ = &ctx;
  }
  auto stream = client->Attach(&ctx);
  Session session;
  std::thread reader([&] {
    v1::ServerMessage msg;
    while (stream->Read(&msg)) {
      if (msg.has_ack()) {
        const std::string error = take_ack(session, msg.ack().persisted_seq());
        if (!error.empty()) {
          {
            std::lock_guard lock(session.mu);
            session.protocol_error = error;
          }
          ctx.TryCancel();
          break;
        }
        {
          std::lock_guard lock(session.mu);
          if (!session.acked_once) {
            session.acked_once = true;
            session.first_ack = msg.ack().persisted_seq();
          }
        }
        session.cv.notify_all();
        cv_.notify_all();
      } else if (msg.has_policy()) {
        // The trainer's code runs in there (its scaler's settings); nothing escapes a thread.
        try {
          if (hooks_.on_policy) hooks_.on_policy(msg.policy());
        } catch (const std::exception& e) {
          notices_->raise("transport:policy",
                          std::string("policy: an update was lost: ") + e.what());
        } catch (...) {
          notices_->raise("transport:policy", "policy: an update was lost");
        }
      } else if (msg.has_redirect()) {
        // Another server owns the run: this stream is over (the server ends it too), and what
        // it did not acknowledge goes to the owner.
        {
          std::lock_guard lock(session.mu);
          session.redirect = msg.redirect().owner();
        }
        ctx.TryCancel();
        break;
      } else if (msg.has_reject()) {
        rejected_.fetch_add(1);
        const auto& r = msg.reject();
        notices_->raise("reject:" + r.reason() + ":" + r.field(),
                        "server rejected report seq " + std::to_string(r.seq()) + ": " + r.field() +
                            ": " + r.message());
      }
    }
    {
      std::lock_guard lock(session.mu);
      session.broken = true;
    }
    session.cv.notify_all();
    spool_->wake();
  });

  v1::AgentMessage hello;
  *hello.mutable_hello() = hooks_.hello(spool_->acked() + 1);
  bool ok = stream->Write(hello);
  // The first Ack says what the server already has for this (run, rank).
  std::uint64_t cursor = 0;
  if (ok) {
    std::unique_lock lock(session.mu);
    session.cv.wait_for(lock, config_.connect_timeout,
                        [&] { return session.acked_once || session.broken; });
    ok = session.acked_once && !session.broken;
    if (ok) cursor = session.first_ack + 1;
  }
  const bool acknowledged = ok;
  const auto opened = Clock::now();
  if (acknowledged) {
    if (ever_connected_.load()) reconnects_.fetch_add(1);
    connected_ = true;
    ever_connected_ = true;
    if (hooks_.on_connected) hooks_.on_connected(true);
  }
  std::vector<SpoolRecord> batch;
  while (ok && !stopping()) {
    {
      std::lock_guard lock(session.mu);
      if (session.broken) break;
    }
    // Stay within max_in_flight of the acknowledgements.
    const std::uint64_t acked = spool_->acked();
    cursor = std::max(cursor, acked + 1);
    const std::uint64_t in_flight = cursor - 1 - std::min(cursor - 1, acked);
    if (in_flight >= config_.max_in_flight || !spool_->wait_for(cursor, kPoll)) {
      if (in_flight >= config_.max_in_flight) {
        std::unique_lock lock(session.mu);
        session.cv.wait_for(lock, kPoll);
      }
      continue;
    }
    batch.clear();
    std::string error;
    const std::size_t room = static_cast<std::size_t>(config_.max_in_flight - in_flight);
    spool_->read(cursor, std::min(config_.max_batch, room), kBatchBytes, &batch, &error);
    if (!error.empty()) notices_->raise(error);
    if (batch.empty()) continue;
    nvtx::Scoped range(nvtx::Range::kAgentSend, config_.nvtx);
    for (std::size_t i = 0; i < batch.size() && ok; ++i) {
      v1::AgentMessage m;
      v1::StepReport* r = m.mutable_report();
      if (!r->ParseFromString(batch[i].payload)) {
        // Cannot happen for what the agent wrote (the CRC matched); sent as it is, the
        // server would reject it, so it is skipped and the gap is counted there.
        notices_->raise("spool: report seq " + std::to_string(batch[i].seq) +
                        " does not parse; skipped");
        continue;
      }
      r->set_seq(batch[i].seq);
      // Before the write: the server may acknowledge it before Write returns.
      session.sent_max.store(std::max(session.sent_max.load(), batch[i].seq));
      grpc::WriteOptions options;
      if (i + 1 < batch.size()) options.set_buffer_hint();
      ok = stream->Write(m, options);
      if (ok) cursor = batch[i].seq + 1;
    }
  }
  // Half-close when everything is acknowledged (the server then ends the call with OK), and
  // wait for that until the stop's deadline; otherwise cancel: what is not acknowledged is
  // replayed by the next stream.
  if (spool_->acked() >= spool_->last_seq() && acknowledged) {
    stream->WritesDone();
    Deadline until = Clock::now() + config_.connect_timeout;
    {
      std::lock_guard lock(mu_);
      if (stopping_) until = std::min(until, stop_deadline_);
    }
    std::unique_lock lock(session.mu);
    if (!session.cv.wait_until(lock, until, [&] { return session.broken; })) ctx.TryCancel();
  } else {
    // A stream the server ended keeps its status (ALREADY_EXISTS must not read as CANCELLED).
    std::lock_guard lock(session.mu);
    if (!session.broken) ctx.TryCancel();
  }
  reader.join();
  const grpc::Status status = stream->Finish();
  {
    std::lock_guard lock(mu_);
    context_ = nullptr;
  }
  if (acknowledged) {
    connected_ = false;
    if (hooks_.on_connected) hooks_.on_connected(false);
  }
  const auto lived = Clock::now() - opened;
  const std::string protocol_error = [&] {
    std::lock_guard lock(session.mu);
    return session.protocol_error;
  }();
  if (!protocol_error.empty()) {
    protocol_errors_.fetch_add(1);
    notices_->raise("transport:protocol",
                    "transport: protocol error from " + target + ": " + protocol_error +
                        "; the spool is kept, the stream is cut and retried with backoff "
                        "(counted in protocol_errors)");
    return end;  // noticed once above, whatever the next one says
  }
  if (const std::optional<std::string> owner = [&] {
        std::lock_guard lock(session.mu);
        return session.redirect;
      }()) {
    const std::string why = owner->size() > kMaxOwnerBytes
                                ? "longer than " + std::to_string(kMaxOwnerBytes) + " bytes"
                                : proto::check_target(*owner);
    if (why.empty()) {
      end.redirect = *owner;
    } else {
      end.failure = "the server at " + target + " redirected run '" + config_.run_id +
                    "' to an owner address that is not one: " + why;
    }
    return end;
  }
  end.healthy =
      acknowledged && lived >= std::min<Clock::duration>(config_.backoff_max, kHealthyStreamCap);
  if (const auto code = status.error_code(); code == grpc::StatusCode::ALREADY_EXISTS ||
                                             code == grpc::StatusCode::UNAUTHENTICATED ||
                                             code == grpc::StatusCode::PERMISSION_DENIED) {
    end.refused = true;
    notices_->raise_loud("transport:refused:" + std::to_string(static_cast<int>(code)),
                         "the server refuses this agent: " + status_text(status) +
                             "; training goes on, reports stay in the spool (up to "
                             "spool_max_bytes, then dropped and counted), asking again every "
                             "backoff_max_ms");
  } else if (!status.ok() && status.error_code() != grpc::StatusCode::CANCELLED) {
    end.failure = "stream to " + target + " ended: " + status_text(status);
  } else if (!acknowledged && !stopping()) {
    end.failure = "no acknowledgement from " + target + " after the Hello";
  }
  return end;
}

}  // namespace ampscope::agent
