// A thin RAII layer over SQLite's C API: a connection, prepared statements with typed binds and
// columns, and a transaction guard. Errors throw StoreError with SQLite's message and the SQL.
//
// Thread safety: a Connection and its statements belong to one thread at a time (the store
// opens one connection per thread that uses it).
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "ampscope/check.h"

namespace ampscope::server {

class StoreError : public Error {
 public:
  using Error::Error;
};

class Statement;

class Connection {
 public:
  // Opens (creating when `create`) the database file. `read_only` opens for queries only.
  Connection(const std::string& path, bool create, bool read_only);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  void exec(std::string_view sql);  // one or more statements, no results
  Statement prepare(std::string_view sql);
  std::int64_t last_insert_rowid() const { return sqlite3_last_insert_rowid(db_); }
  int changes() const { return sqlite3_changes(db_); }
  sqlite3* handle() const { return db_; }
  // A PRAGMA or query that yields one integer.
  std::int64_t query_int(std::string_view sql);

 private:
  sqlite3* db_ = nullptr;
};

class Statement {
 public:
  Statement(sqlite3* db, std::string_view sql);
  ~Statement();
  Statement(Statement&& other) noexcept;
  Statement& operator=(Statement&&) = delete;
  Statement(const Statement&) = delete;

  // Binds are 1-based, like SQLite's.
  Statement& bind(int index, std::int64_t value);
  Statement& bind(int index, double value);
  Statement& bind(int index, std::string_view text);
  Statement& bind_blob(int index, const void* data, std::size_t size);
  Statement& bind_null(int index);
  template <typename T>
  Statement& bind(int index, const std::optional<T>& value) {
    return value ? bind(index, *value) : bind_null(index);
  }

  // Steps once: true when a row is available, false when done.
  bool step();
  // Runs a statement that returns no rows, then resets it for reuse.
  void run();
  void reset();

  std::int64_t column_int(int col) const { return sqlite3_column_int64(stmt_, col); }
  double column_double(int col) const { return sqlite3_column_double(stmt_, col); }
  bool column_is_null(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }
  std::string column_text(int col) const;
  std::string_view column_blob(int col) const;

 private:
  void check(int rc, const char* what) const;
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
};

// BEGIN IMMEDIATE on construction; rolls back on destruction unless commit() succeeded.
class Transaction {
 public:
  explicit Transaction(Connection& c);
  ~Transaction();
  void commit();

 private:
  Connection& c_;
  bool done_ = false;
};

}  // namespace ampscope::server
