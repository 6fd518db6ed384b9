// Telemetry.Attach: authenticates the call and hands it to a new AttachReactor. Keeps the live
// reactors so that a graceful shutdown can drain every one of them. The method is registered
// raw (ByteBuffer): the reactor parses each message itself, so that one that does not decode is
// not mistaken for the agent's half-close.
//
// Thread safety: internally synchronised.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "ampscope/v1/telemetry.grpc.pb.h"
#include "attach_reactor.h"
#include "auth.h"

namespace ampscope::server {

class TelemetryService final
    : public v1::Telemetry::WithRawCallbackMethod_Attach<v1::Telemetry::Service> {
 public:
  TelemetryService(AttachReactor::Deps deps, const Authenticator& auth);

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Attach(
      grpc::CallbackServerContext* context) override;

  // Refuses new streams and drains the open ones (each ends once what it sent is settled).
  void drain_all();

 private:
  AttachReactor::Deps deps_;
  const Authenticator& auth_;
  std::mutex mu_;
  bool draining_ = false;
  std::vector<std::weak_ptr<AttachReactor>> live_;
};

}  // namespace ampscope::server
