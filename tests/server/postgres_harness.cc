#include "postgres_harness.h"

#include <gtest/gtest.h>

#include <memory>

namespace ampscope::testing {
namespace {

std::unique_ptr<PostgresInstance>& instance() {
  static std::unique_ptr<PostgresInstance> s;
  return s;
}

// Stops the server when the binary's tests end (before static destruction).
class StopPostgres : public ::testing::Environment {
 public:
  void TearDown() override { instance().reset(); }
};
const auto* const kStop = ::testing::AddGlobalTestEnvironment(new StopPostgres);

}  // namespace

PostgresServer& PostgresServer::get() {
  static PostgresServer server;
  return server;
}

std::string PostgresServer::conninfo(const std::string& dbname) const {
  return instance()->conninfo(dbname);
}

std::string PostgresServer::create_database() {
  std::unique_ptr<PostgresInstance>& s = instance();
  if (!s) s = std::make_unique<PostgresInstance>();
  return s->create_database();
}

}  // namespace ampscope::testing
