// A real PostgreSQL from Debian's `postgresql` package and nothing else, for tests and
// benchmarks: a cluster in a temporary directory of its own (initdb, or a copy of the cluster
// the build's first initdb made) and `postgres` on a Unix socket in that directory (no TCP
// port, no system service), stopped and removed when the PostgresInstance goes away. As root
// (CI), initdb and postgres, which refuse to run as root, run as the `postgres` user.
//
// The tests' per-binary server (tests/server/postgres_harness.h) and ampscope_server_load
// --db-backend postgres (bench/server_load.cc) are both one of these.
//
// Thread safety: used by one thread, the one that made it (the server's death signal follows
// that thread: a process killed mid-run leaves no postgres behind).
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

struct pg_conn;  // libpq's PGconn

namespace ampscope::testing {

struct PostgresOptions {
  // Off (tests): fsync, synchronous_commit and full_page_writes off, the data dies with the
  // test anyway. On (benchmarks): PostgreSQL's durable defaults, each commit flushed to disk as
  // SQLite's --sync full does.
  bool durable = false;
  int max_connections = 200;
};

class PostgresInstance {
 public:
  // Makes the cluster and starts postgres; throws std::runtime_error with what failed (no
  // server binaries installed: says to install the postgresql package; postgres's log when it
  // did not start).
  explicit PostgresInstance(PostgresOptions options = {});
  // Fast shutdown (SIGINT), SIGKILL after 10 s; removes the directory.
  ~PostgresInstance();
  PostgresInstance(const PostgresInstance&) = delete;
  PostgresInstance& operator=(const PostgresInstance&) = delete;

  // Stops the server (fast shutdown: its clients' connections are cut) and starts it again on
  // the same data, socket and port: a database that goes away and comes back. Each does
  // nothing when the server is already so; start() throws as the constructor does.
  void stop();
  void start();

  // A fresh, empty database (test_1, test_2, ...); returns its libpq connection string
  // ("host=<socket dir> port=5432 user=ampscope dbname=test_N").
  std::string create_database();
  // The connection string of `dbname` on this server.
  std::string conninfo(const std::string& dbname) const;
  // The postmaster's process id (its backends are its children); -1 while stopped.
  pid_t pid() const;
  // "PostgreSQL 15.x ..." as the server reports it.
  std::string version() const;
  std::string log_tail() const;

  struct State;

 private:
  std::unique_ptr<State> s_;
};

// One libpq connection to a database, for tests that read what servers stored (and poll it:
// the connection stays open between queries).
class PostgresConnection {
 public:
  // Throws std::runtime_error with libpq's message when it cannot connect.
  explicit PostgresConnection(const std::string& conninfo);
  ~PostgresConnection();
  PostgresConnection(const PostgresConnection&) = delete;
  PostgresConnection& operator=(const PostgresConnection&) = delete;

  // The rows `sql` returns, each column as text (NULL as ""), with `params` for $1, $2, ...;
  // throws std::runtime_error naming the statement and PostgreSQL's message.
  std::vector<std::vector<std::string>> query(const std::string& sql,
                                              const std::vector<std::string>& params = {});
  // The first column of the first row; "" when there is none.
  std::string value(const std::string& sql, const std::vector<std::string>& params = {});

 private:
  ::pg_conn* conn_;
};

// The directory holding PostgreSQL's server binaries (initdb, postgres): `pg_config --bindir`
// when it has them, else the newest /usr/lib/postgresql/<version>/bin; empty when none.
std::string postgres_bindir();

}  // namespace ampscope::testing
