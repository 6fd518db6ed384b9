// The PostgreSQL back end of the store's database layer (db.h), over libpq. Statements are
// prepared on the server at their first run, once per combination of parameter types, and kept
// for the connection's life; results come whole (PQexecPrepared), so a statement may be stepped
// while others run on the same connection, as on SQLite. Inside a write transaction (a group
// commit) the statements whose rows nobody reads (Statement::run) are pipelined: sent without
// waiting for their answers, which are read, and their first error thrown, before the next
// statement that waits (a query, COMMIT), so that a batch costs few round trips. `?N` becomes `$N`;
// blobs travel as binary BYTEA, integers as BIGINT, doubles as DOUBLE PRECISION. Errors, a lost
// connection included, throw StoreError with PostgreSQL's message and the SQL; nothing reconnects.
//
// Thread safety: a connection and its statements belong to one thread at a time.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "db.h"

typedef struct pg_conn PGconn;

namespace ampscope::server {

class PgConnection : public Connection {
 public:
  // `conninfo`: a postgresql:// URI or "key=value ..." (libpq's own forms, sslmode and all);
  // `password`: given to libpq when not empty (else PGPASSWORD, PGPASSFILE, ~/.pgpass apply).
  PgConnection(const std::string& conninfo, const std::string& password);
  ~PgConnection() override;

  Backend backend() const override { return Backend::kPostgres; }
  bool broken() const override;
  void exec(std::string_view sql) override;
  Statement prepare(std::string_view sql) override;
  std::int64_t changes() override {
    flush();
    return changes_;
  }
  void begin_write() override {
    exec("BEGIN");
    writing_ = true;
  }
  void commit() override;
  void rollback() override;
  void begin_read() override { exec("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"); }
  // Summing the payloads reads every report row: measured at most once a minute, and again
  // after this connection deleted rows (retention re-measures after each batch it deletes).
  std::uint64_t live_bytes() override;
  void reclaim_space() override {}
  void checkpoint(bool) override {}

  // For PgStatement: the name of the server-side statement for `sql` with these parameter
  // types (prepared now when new), and the latest command's row count.
  const std::string& prepared(const std::string& sql, const std::string& types_key, int n_params,
                              const unsigned int* types);
  PGconn* handle() const { return conn_; }
  // Pipelining (above): whether run() may send without waiting; send one; read every answer.
  bool pipelining() const { return writing_; }
  void send(const std::string& name, int n_params, const char* const* values, const int* lengths,
            const int* formats, const std::string& sql);
  void flush();
  void set_changes(std::int64_t n, bool deleted) {
    changes_ = n;
    if (deleted) live_bytes_.reset();
  }

 private:
  PGconn* conn_ = nullptr;
  std::map<std::string, std::string> prepared_;  // sql + types -> statement name
  std::int64_t changes_ = 0;
  bool writing_ = false;           // inside begin_write() ... commit() or rollback()
  std::vector<std::string> sent_;  // the SQL of each statement sent and not yet answered
  std::optional<std::uint64_t> live_bytes_;
  std::chrono::steady_clock::time_point live_bytes_at_;
};

// `?N` -> `$N` outside string literals, quoted names and comments; `named` gets one entry per
// parameter up to the highest N, true for those the SQL names.
std::string postgres_placeholders(std::string_view sql, std::vector<bool>* named);

// libpq's connection string with its password masked, for logs.
std::string mask_conninfo_password(const std::string& conninfo);

}  // namespace ampscope::server
