// The test binary's PostgreSQL (ampscope/testing/postgres.h: a real server from Debian's
// `postgresql` package in a temporary directory, on a Unix socket): started on first use, and
// stopped by a gtest Environment when the binary's tests end. Each test asks for a database of
// its own (CREATE DATABASE), so tests stay independent while sharing one server.
//
// When no PostgreSQL server binaries are installed, create_database() throws with a message
// that says so: the tests fail rather than skip (./run installs the package).
//
// Thread safety: used from the test's main thread only.
#pragma once

#include <string>

#include "ampscope/testing/postgres.h"

namespace ampscope::testing {

class PostgresServer {
 public:
  // The binary's server, started on first use.
  static PostgresServer& get();
  // A fresh, empty database; returns its libpq connection string ("host=... dbname=...").
  std::string create_database();
  // The connection string of `dbname` on this server.
  std::string conninfo(const std::string& dbname) const;

 private:
  PostgresServer() = default;
};

}  // namespace ampscope::testing
