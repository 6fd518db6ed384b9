// The embedded back end of the store's database layer (db.h): a thin RAII layer over SQLite's C
// API. Errors throw StoreError with SQLite's message and the SQL.
//
// Thread safety: a connection and its statements belong to one thread at a time.
#pragma once

#include <sqlite3.h>

#include <string>

#include "db.h"

namespace ampscope::server {

class SqliteConnection : public Connection {
 public:
  // Opens (creating when `create`) the database file. `read_only` opens for queries only.
  SqliteConnection(const std::string& path, bool create, bool read_only);
  ~SqliteConnection() override;

  Backend backend() const override { return Backend::kSqlite; }
  void exec(std::string_view sql) override;
  Statement prepare(std::string_view sql) override;
  std::int64_t changes() override { return sqlite3_changes(db_); }
  void begin_write() override { exec("BEGIN IMMEDIATE"); }
  void begin_read() override { exec("BEGIN"); }
  std::uint64_t live_bytes() override;
  void reclaim_space() override { exec("PRAGMA incremental_vacuum"); }
  void checkpoint(bool truncate) override {
    exec(truncate ? "PRAGMA wal_checkpoint(TRUNCATE)" : "PRAGMA wal_checkpoint(PASSIVE)");
  }

 private:
  sqlite3* db_ = nullptr;
};

}  // namespace ampscope::server
