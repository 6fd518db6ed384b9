#include "telemetry_service.h"

namespace ampscope::server {

TelemetryService::TelemetryService(AttachReactor::Deps deps, const Authenticator& auth)
    : deps_(deps), auth_(auth) {}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* TelemetryService::Attach(
    grpc::CallbackServerContext* context) {
  // The run is named by the stream's Hello: the reactor checks an agent token's run-id prefix
  // there (Authenticator::authorize_run).
  AttachReactor::Deps deps = deps_;
  grpc::Status refusal = auth_.authorize(*context, "Attach", AccessRole::kAgent, &deps.principal);
  if (refusal.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
    deps_.metrics->auth_failure(AuthSurface::grpc);
  }
  std::lock_guard lock(mu_);
  if (refusal.ok() && draining_) {
    refusal = grpc::Status(grpc::StatusCode::UNAVAILABLE, "server is shutting down");
  }
  std::shared_ptr<AttachReactor> handle;
  AttachReactor* reactor = AttachReactor::start(deps, refusal, &handle);
  std::erase_if(live_, [](const std::weak_ptr<AttachReactor>& w) { return w.expired(); });
  live_.push_back(handle);
  return reactor;
}

void TelemetryService::drain_all() {
  std::vector<std::weak_ptr<AttachReactor>> live;
  {
    std::lock_guard lock(mu_);
    draining_ = true;
    live = live_;
  }
  for (const std::weak_ptr<AttachReactor>& w : live) {
    if (std::shared_ptr<AttachReactor> r = w.lock()) r->drain();
  }
}

}  // namespace ampscope::server
