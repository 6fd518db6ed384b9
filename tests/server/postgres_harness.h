// A real PostgreSQL for a test binary, from Debian's `postgresql` package and nothing else: on
// first use it makes a cluster in a temporary directory (initdb, or a copy of the cluster the
// build's first initdb made) and starts `postgres` on a Unix socket in that directory (no TCP
// port, no system service), and a gtest Environment stops it and removes the directory when
// the binary's tests end. Each test asks for a database of its own
// (CREATE DATABASE), so tests stay independent while sharing one server. As root (CI),
// initdb and postgres, which refuse to run as root, run as the `postgres` user.
//
// When no PostgreSQL server binaries are installed, database() throws with a message that says
// so: the tests fail rather than skip (./run installs the package).
//
// Thread safety: used from the test's main thread only.
#pragma once

#include <string>

namespace ampscope::testing {

class PostgresServer {
 public:
  // The binary's server, started on first use.
  static PostgresServer& get();
  // A fresh, empty database; returns its libpq connection string ("host=... dbname=...").
  std::string create_database();
  // The connection string of `dbname` on this server.
  std::string conninfo(const std::string& dbname) const;

  struct State;

 private:
  PostgresServer() = default;
};

// The directory holding PostgreSQL's server binaries (initdb, postgres): `pg_config --bindir`
// when it has them, else the newest /usr/lib/postgresql/<version>/bin; empty when none.
std::string postgres_bindir();

}  // namespace ampscope::testing
