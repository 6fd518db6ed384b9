#include "sqlite_util.h"

#include <utility>

namespace ampscope::server {
namespace {

[[noreturn]] void fail(sqlite3* db, int rc, std::string_view what) {
  std::string msg = "sqlite: " + std::string(what) + ": ";
  msg += db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  throw StoreError(msg);
}

}  // namespace

Connection::Connection(const std::string& path, bool create, bool read_only) {
  int flags = SQLITE_OPEN_NOMUTEX;
  flags |= read_only ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE;
  if (create && !read_only) flags |= SQLITE_OPEN_CREATE;
  const int rc = sqlite3_open_v2(path.c_str(), &db_, flags, nullptr);
  if (rc != SQLITE_OK) {
    std::string msg =
        "cannot open " + path + ": " + (db_ != nullptr ? sqlite3_errmsg(db_) : sqlite3_errstr(rc));
    sqlite3_close_v2(db_);
    db_ = nullptr;
    throw StoreError(msg);
  }
  sqlite3_extended_result_codes(db_, 1);
  // Readers wait for a checkpoint or the writer's commit instead of failing with SQLITE_BUSY.
  sqlite3_busy_timeout(db_, 5000);
}

Connection::~Connection() { sqlite3_close_v2(db_); }

void Connection::exec(std::string_view sql) {
  char* err = nullptr;
  const std::string text(sql);
  const int rc = sqlite3_exec(db_, text.c_str(), nullptr, nullptr, &err);
  if (rc != SQLITE_OK) {
    std::string msg = "sqlite: " + text.substr(0, 80) + ": " + (err ? err : sqlite3_errstr(rc));
    sqlite3_free(err);
    throw StoreError(msg);
  }
}

Statement Connection::prepare(std::string_view sql) { return Statement(db_, sql); }

std::int64_t Connection::query_int(std::string_view sql) {
  Statement s(db_, sql);
  if (!s.step()) throw StoreError("sqlite: no row from " + std::string(sql));
  return s.column_int(0);
}

Statement::Statement(sqlite3* db, std::string_view sql) : db_(db) {
  const int rc = sqlite3_prepare_v3(db, sql.data(), static_cast<int>(sql.size()),
                                    SQLITE_PREPARE_PERSISTENT, &stmt_, nullptr);
  if (rc != SQLITE_OK) fail(db, rc, "prepare " + std::string(sql.substr(0, 80)));
}

Statement::~Statement() { sqlite3_finalize(stmt_); }

Statement::Statement(Statement&& other) noexcept
    : db_(other.db_), stmt_(std::exchange(other.stmt_, nullptr)) {}

void Statement::check(int rc, const char* what) const {
  if (rc != SQLITE_OK) fail(db_, rc, what);
}

Statement& Statement::bind(int index, std::int64_t value) {
  check(sqlite3_bind_int64(stmt_, index, value), "bind");
  return *this;
}

Statement& Statement::bind(int index, double value) {
  check(sqlite3_bind_double(stmt_, index, value), "bind");
  return *this;
}

Statement& Statement::bind(int index, std::string_view text) {
  check(
      sqlite3_bind_text(stmt_, index, text.data(), static_cast<int>(text.size()), SQLITE_TRANSIENT),
      "bind");
  return *this;
}

Statement& Statement::bind_blob(int index, const void* data, std::size_t size) {
  check(sqlite3_bind_blob64(stmt_, index, data, size, SQLITE_TRANSIENT), "bind");
  return *this;
}

Statement& Statement::bind_null(int index) {
  check(sqlite3_bind_null(stmt_, index), "bind");
  return *this;
}

bool Statement::step() {
  const int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  const std::string sql = sqlite3_sql(stmt_) != nullptr ? sqlite3_sql(stmt_) : "";
  sqlite3_reset(stmt_);
  fail(db_, rc, "step " + sql.substr(0, 80));
}

void Statement::run() {
  while (step()) {
  }
  reset();
}

void Statement::reset() {
  sqlite3_reset(stmt_);
  sqlite3_clear_bindings(stmt_);
}

std::string Statement::column_text(int col) const {
  const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, col));
  return p == nullptr ? std::string() : std::string(p, sqlite3_column_bytes(stmt_, col));
}

std::string_view Statement::column_blob(int col) const {
  const auto* p = static_cast<const char*>(sqlite3_column_blob(stmt_, col));
  return p == nullptr ? std::string_view() : std::string_view(p, sqlite3_column_bytes(stmt_, col));
}

Transaction::Transaction(Connection& c) : c_(c) { c_.exec("BEGIN IMMEDIATE"); }

Transaction::~Transaction() {
  if (!done_) {
    try {
      c_.exec("ROLLBACK");
    } catch (const StoreError&) {
      // The transaction may already be gone (SQLite rolls back on some I/O errors itself).
    }
  }
}

void Transaction::commit() {
  c_.exec("COMMIT");
  done_ = true;
}

}  // namespace ampscope::server
