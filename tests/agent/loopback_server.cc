#include "loopback_server.h"

namespace ampscope::agent::testing {

LoopbackServer::LoopbackServer(grpc::Service* service, std::chrono::milliseconds shutdown_grace)
    : shutdown_grace_(shutdown_grace) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
  builder.RegisterService(service);
  server_ = builder.BuildAndStart();
}

LoopbackServer::~LoopbackServer() {
  server_->Shutdown(std::chrono::system_clock::now() + shutdown_grace_);
}

}  // namespace ampscope::agent::testing
