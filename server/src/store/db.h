// The store's database layer, neutral to the back end: a connection, prepared statements with
// typed binds and columns, and a transaction guard. The store's SQL is written once against it,
// in the subset SQLite and PostgreSQL share (parameters `?1`, `?2`, ...; COALESCE, CASE,
// ON CONFLICT, RETURNING); what the two spell differently is in Dialect below, one function
// per difference. The back ends: store/sqlite (the embedded default) and store/postgres (libpq).
// Errors throw StoreError with the engine's message and the SQL.
//
// Thread safety: a Connection and its statements belong to one thread at a time (the store
// opens one connection per thread that uses it).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "ampscope/check.h"

namespace ampscope::server {

class StoreError : public Error {
 public:
  using Error::Error;
};

enum class Backend { kSqlite, kPostgres };

// What a back end's statement does; Statement below is the handle the store holds.
class StatementImpl {
 public:
  virtual ~StatementImpl() = default;
  virtual void bind_int(int index, std::int64_t value) = 0;
  virtual void bind_double(int index, double value) = 0;
  virtual void bind_text(int index, std::string_view text) = 0;
  virtual void bind_blob(int index, const void* data, std::size_t size) = 0;
  virtual void bind_null(int index) = 0;
  virtual bool step() = 0;
  virtual void reset() = 0;  // also clears the binds
  // Runs a statement whose rows nobody reads, then resets it. A back end may send it without
  // waiting for its answer (PostgreSQL pipelines a write transaction's statements); its error
  // then surfaces at the next statement that waits, at the latest at COMMIT.
  virtual void run() {
    while (step()) {
    }
    reset();
  }
  virtual std::int64_t column_int(int col) const = 0;
  virtual double column_double(int col) const = 0;
  virtual bool column_is_null(int col) const = 0;
  virtual std::string column_text(int col) const = 0;
  // Valid until the next step() or reset().
  virtual std::string_view column_blob(int col) const = 0;
};

class Statement {
 public:
  explicit Statement(std::unique_ptr<StatementImpl> impl) : impl_(std::move(impl)) {}
  Statement(Statement&&) noexcept = default;
  Statement& operator=(Statement&&) = delete;
  Statement(const Statement&) = delete;

  // Binds are 1-based, to `?N`. A parameter left unbound is NULL.
  Statement& bind(int index, std::int64_t value) {
    impl_->bind_int(index, value);
    return *this;
  }
  Statement& bind(int index, double value) {
    impl_->bind_double(index, value);
    return *this;
  }
  Statement& bind(int index, std::string_view text) {
    impl_->bind_text(index, text);
    return *this;
  }
  Statement& bind_blob(int index, const void* data, std::size_t size) {
    impl_->bind_blob(index, data, size);
    return *this;
  }
  Statement& bind_null(int index) {
    impl_->bind_null(index);
    return *this;
  }
  template <typename T>
  Statement& bind(int index, const std::optional<T>& value) {
    return value ? bind(index, *value) : bind_null(index);
  }

  // Steps once: true when a row is available, false when done.
  bool step() { return impl_->step(); }
  // Runs a statement whose rows nobody reads, then resets it for reuse (StatementImpl::run).
  void run() { impl_->run(); }
  void reset() { impl_->reset(); }

  // A NULL reads as 0, 0.0, "".
  std::int64_t column_int(int col) const { return impl_->column_int(col); }
  double column_double(int col) const { return impl_->column_double(col); }
  bool column_is_null(int col) const { return impl_->column_is_null(col); }
  std::string column_text(int col) const { return impl_->column_text(col); }
  std::string_view column_blob(int col) const { return impl_->column_blob(col); }

 private:
  std::unique_ptr<StatementImpl> impl_;
};

class Connection {
 public:
  virtual ~Connection() = default;
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  virtual Backend backend() const = 0;
  // The link to the database is gone (PostgreSQL's server went away): a new connection is
  // needed. A SQLite file never breaks that way.
  virtual bool broken() const { return false; }
  virtual void exec(std::string_view sql) = 0;  // one or more statements, no parameters
  virtual Statement prepare(std::string_view sql) = 0;
  // Rows changed by the latest INSERT, UPDATE or DELETE (not counting what triggers did).
  virtual std::int64_t changes() = 0;
  // A transaction that will write (SQLite takes its write lock at once), and one that only
  // reads and sees one committed state throughout.
  virtual void begin_write() = 0;
  virtual void begin_read() = 0;
  virtual void commit() { exec("COMMIT"); }
  virtual void rollback() { exec("ROLLBACK"); }

  // The bytes of data retention can delete: SQLite's used pages; on PostgreSQL the stored
  // payloads (its files do not shrink after a DELETE, so they cannot say when to stop).
  virtual std::uint64_t live_bytes() = 0;
  // After retention deleted rows: SQLite hands free pages back to the file system; PostgreSQL
  // leaves it to autovacuum.
  virtual void reclaim_space() = 0;
  // SQLite moves its WAL into the database file; nothing on PostgreSQL.
  virtual void checkpoint(bool truncate) = 0;

  // A query that yields one integer.
  std::int64_t query_int(std::string_view sql);

 protected:
  Connection() = default;
};

// The spellings the two back ends do not share, one function each.
struct Dialect {
  Backend backend;
  // SQLite's planner hint "INDEXED BY <index>" (it would otherwise prefer the covering index
  // and filter the whole range); PostgreSQL takes no hints.
  std::string index_hint(std::string_view index) const;
};
inline Dialect dialect_of(const Connection& c) { return Dialect{c.backend()}; }

// The larger of two SQL expressions (SQLite's scalar max(a, b) is PostgreSQL's GREATEST).
std::string sql_greatest(std::string_view a, std::string_view b);

// BEGIN (for writing) on construction; rolls back on destruction unless commit() succeeded.
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
