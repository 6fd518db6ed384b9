// A gRPC server on a free loopback port, for tests whose own Telemetry service stands in for
// ampscope-server. Declare it as the service's last member, so that it shuts down before the
// state its handlers use is destroyed.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

namespace ampscope::agent::testing {

class LoopbackServer {
 public:
  // Serves `service` (which must outlive this object) on 127.0.0.1 at a port of the system's
  // choosing. The destructor gives open calls `shutdown_grace` to end.
  explicit LoopbackServer(grpc::Service* service,
                          std::chrono::milliseconds shutdown_grace = std::chrono::seconds(5));
  ~LoopbackServer();
  LoopbackServer(const LoopbackServer&) = delete;
  LoopbackServer& operator=(const LoopbackServer&) = delete;

  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  int port_ = 0;
  std::chrono::milliseconds shutdown_grace_;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace ampscope::agent::testing
