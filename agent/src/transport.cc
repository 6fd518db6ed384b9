#include "transport.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <random>
#include <vector>

#include "ampscope/v1/telemetry.grpc.pb.h"
#include "nvtx.h"

namespace ampscope::agent {
namespace {

constexpr std::size_t kBatchBytes = 4u << 20;
constexpr std::chrono::milliseconds kPoll{200};

std::shared_ptr<grpc::Channel> make_channel(const AgentConfig& c) {
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
  return grpc::CreateCustomChannel(c.server, grpc::InsecureChannelCredentials(), args);
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
  bool broken = false;                  // the reader saw the end of the stream
  bool acked_once = false;              // the first Ack arrived
  std::uint64_t first_ack = 0;
};

Transport::Transport(const AgentConfig& config, Spool* spool, Notices* notices,
                     TransportHooks hooks)
    : config_(config), spool_(spool), notices_(notices), hooks_(std::move(hooks)) {}

Transport::~Transport() { stop(); }

void Transport::start() {
  if (config_.server.empty()) {
    notices_->raise("transport: no server configured; reports stay in the spool at " +
                    spool_->dir());
    return;
  }
  thread_ = std::thread([this] { run(); });
}

bool Transport::wait_acked(std::uint64_t seq, std::chrono::steady_clock::time_point deadline) {
  std::unique_lock lock(mu_);
  while (spool_->acked() < seq) {
    if (stopping_ || config_.server.empty()) return spool_->acked() >= seq;
    if (cv_.wait_until(lock, std::min(deadline, std::chrono::steady_clock::now() + kPoll)) ==
            std::cv_status::timeout &&
        std::chrono::steady_clock::now() >= deadline) {
      return spool_->acked() >= seq;
    }
  }
  return true;
}

void Transport::stop() {
  {
    std::lock_guard lock(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
    // Everything acknowledged: the session half-closes by itself. Otherwise cut it short; what
    // is left stays in the spool.
    if (context_ != nullptr && spool_->acked() < spool_->last_seq()) context_->TryCancel();
  }
  cv_.notify_all();
  spool_->wake();
  if (thread_.joinable()) thread_.join();
}

bool Transport::sleep_backoff(std::chrono::milliseconds d) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, d, [&] { return stopping_; });
  return !stopping_;
}

void Transport::run() {
  std::mt19937_64 rng(std::random_device{}());
  auto backoff = config_.backoff_initial;
  bool ever_connected = false;
  std::string last_failure;
  for (;;) {
    {
      std::lock_guard lock(mu_);
      if (stopping_) return;
    }
    bool acknowledged = false;
    std::string failure;
    auto channel = make_channel(config_);
    if (!channel->WaitForConnected(std::chrono::system_clock::now() + config_.connect_timeout)) {
      failure = "cannot connect to " + config_.server;
    } else {
      auto client = v1::Telemetry::NewStub(channel);
      grpc::ClientContext ctx;
      if (!config_.token.empty()) ctx.AddMetadata("authorization", "Bearer " + config_.token);
      {
        std::lock_guard lock(mu_);
        if (stopping_) return;
        context_ = &ctx;
      }
      auto stream = client->Attach(&ctx);
      Session session;
      std::thread reader([&] {
        v1::ServerMessage msg;
        while (stream->Read(&msg)) {
          if (msg.has_ack()) {
            spool_->ack(msg.ack().persisted_seq());
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
            if (hooks_.on_policy) hooks_.on_policy(msg.policy());
          } else if (msg.has_reject()) {
            rejected_.fetch_add(1);
            const auto& r = msg.reject();
            notices_->raise("reject:" + r.reason() + ":" + r.field(),
                            "server rejected report seq " + std::to_string(r.seq()) + ": " +
                                r.field() + ": " + r.message());
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
      if (ok) {
        acknowledged = true;
        if (ever_connected) reconnects_.fetch_add(1);
        ever_connected = true;
        backoff = config_.backoff_initial;
        connected_ = true;
        ever_connected_ = true;
        if (hooks_.on_connected) hooks_.on_connected(true);
      }
      std::vector<SpoolRecord> batch;
      while (ok) {
        bool stopping;
        {
          std::lock_guard lock(mu_);
          stopping = stopping_;
        }
        {
          std::lock_guard lock(session.mu);
          if (session.broken) break;
        }
        if (stopping) break;
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
          grpc::WriteOptions options;
          if (i + 1 < batch.size()) options.set_buffer_hint();
          ok = stream->Write(m, options);
          if (ok) cursor = batch[i].seq + 1;
        }
      }
      // Half-close when everything is acknowledged (the server then ends the call with OK);
      // otherwise cancel: what is not acknowledged is replayed by the next stream.
      if (spool_->acked() >= spool_->last_seq() && acknowledged) {
        stream->WritesDone();
        std::unique_lock lock(session.mu);
        if (!session.cv.wait_for(lock, config_.connect_timeout, [&] { return session.broken; })) {
          ctx.TryCancel();
        }
      } else {
        ctx.TryCancel();
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
      if (!status.ok() && status.error_code() != grpc::StatusCode::CANCELLED) {
        failure = "stream to " + config_.server + " ended: " + status_text(status);
      } else if (!acknowledged) {
        failure = "no acknowledgement from " + config_.server + " after the Hello";
      }
    }
    if (!failure.empty() && failure != last_failure) {
      // One notice per distinct failure, so an outage does not flood the reports.
      notices_->raise("transport: " + failure);
    }
    last_failure = failure;
    std::uniform_real_distribution<double> jitter(0.5, 1.0);
    const auto wait = std::chrono::milliseconds(
        static_cast<std::int64_t>(static_cast<double>(backoff.count()) * jitter(rng)));
    if (!sleep_backoff(acknowledged ? std::chrono::milliseconds(0) : wait)) return;
    if (!acknowledged) backoff = std::min(config_.backoff_max, backoff * 2);
  }
}

}  // namespace ampscope::agent
