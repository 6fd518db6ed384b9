#include "hostile_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <stdexcept>

namespace ampscope::agent::testing {

void HostileServer::set(Behaviour behaviour) {
  std::lock_guard lock(mu_);
  behaviour_ = std::move(behaviour);
}

void HostileServer::release() {
  {
    std::lock_guard lock(mu_);
    released_ = true;
  }
  released_cv_.notify_all();
}

void HostileServer::cut_streams() {
  std::lock_guard lock(mu_);
  for (grpc::ServerContext* c : open_) c->TryCancel();
}

std::vector<v1::Hello> HostileServer::hellos() const {
  std::lock_guard lock(mu_);
  return hellos_;
}

std::vector<std::chrono::steady_clock::time_point> HostileServer::hello_times() const {
  std::lock_guard lock(mu_);
  return hello_times_;
}

std::vector<v1::StepReport> HostileServer::reports() const {
  std::lock_guard lock(mu_);
  return reports_;
}

HostileServer::Behaviour HostileServer::behaviour_copy() const {
  std::lock_guard lock(mu_);
  return behaviour_;
}

void HostileServer::stall(grpc::ServerContext* context) {
  std::unique_lock lock(mu_);
  while (!released_ && !context->IsCancelled()) {
    released_cv_.wait_for(lock, std::chrono::milliseconds(10));
  }
}

grpc::Status HostileServer::Attach(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::ServerMessage, v1::AgentMessage>* stream) {
  const Behaviour b = behaviour_copy();
  {
    std::lock_guard lock(mu_);
    open_.push_back(context);
  }
  struct Closed {
    HostileServer* self;
    grpc::ServerContext* context;
    ~Closed() {
      std::lock_guard lock(self->mu_);
      auto& v = self->open_;
      v.erase(std::find(v.begin(), v.end(), context));
    }
  } closed{this, context};
  v1::AgentMessage in;
  if (!stream->Read(&in) || !in.has_hello()) {
    return {grpc::StatusCode::INVALID_ARGUMENT, "hello: expected first"};
  }
  std::uint64_t first = 0;
  {
    std::lock_guard lock(mu_);
    hellos_.push_back(in.hello());
    hello_times_.push_back(std::chrono::steady_clock::now());
    first = b.first_ack.value_or(b.ack_reports ? received_ : acked_);
  }
  if (b.refuse) return *b.refuse;
  if (!b.ack_hello) {
    while (stream->Read(&in)) {
    }
    return grpc::Status::OK;
  }
  v1::ServerMessage ack;
  ack.mutable_ack()->set_persisted_seq(first);
  if (!stream->Write(ack)) return grpc::Status::OK;
  for (const v1::PolicyUpdate& u : b.updates) {
    v1::ServerMessage m;
    *m.mutable_policy() = u;
    if (!stream->Write(m)) return grpc::Status::OK;
  }
  if (b.end_after_hello) return grpc::Status::OK;
  int reports = 0;
  while (stream->Read(&in)) {
    if (!in.has_report()) continue;
    std::uint64_t seq = 0;
    {
      std::lock_guard lock(mu_);
      reports_.push_back(in.report());
      received_ = std::max(received_, in.report().seq());
      if (b.ack_reports) acked_ = std::max(acked_, in.report().seq());
      seq = acked_;
    }
    ++reports;
    if (b.absurd_ack && reports == 1) seq = *b.absurd_ack;
    if (b.ack_reports || (b.absurd_ack && reports == 1)) {
      v1::ServerMessage m;
      m.mutable_ack()->set_persisted_seq(seq);
      if (!stream->Write(m)) break;
    }
    if (b.stall_after && reports >= *b.stall_after) {
      stall(context);
      return {grpc::StatusCode::UNAVAILABLE, "stalled"};
    }
  }
  if (b.hold_after_half_close) stall(context);
  return grpc::Status::OK;
}

SilentListener::SilentListener() {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(fd_, 64) != 0 ||
      ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd_ >= 0) ::close(fd_);
    throw std::runtime_error("SilentListener: cannot listen on 127.0.0.1");
  }
  port_ = ntohs(addr.sin_port);
}

SilentListener::~SilentListener() { ::close(fd_); }

}  // namespace ampscope::agent::testing
