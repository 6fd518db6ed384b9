#include "sqlite_connection.h"

#include <utility>

namespace ampscope::server {
namespace {

[[noreturn]] void fail(sqlite3* db, int rc, std::string_view what) {
  std::string msg = "sqlite: " + std::string(what) + ": ";
  msg += db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  throw StoreError(msg);
}

class SqliteStatement : public StatementImpl {
 public:
  SqliteStatement(sqlite3* db, std::string_view sql) : db_(db) {
    const int rc = sqlite3_prepare_v3(db, sql.data(), static_cast<int>(sql.size()),
                                      SQLITE_PREPARE_PERSISTENT, &stmt_, nullptr);
    if (rc != SQLITE_OK) fail(db, rc, "prepare " + std::string(sql.substr(0, 80)));
  }
  ~SqliteStatement() override { sqlite3_finalize(stmt_); }

  void bind_int(int index, std::int64_t value) override {
    check(sqlite3_bind_int64(stmt_, index, value));
  }
  void bind_double(int index, double value) override {
    check(sqlite3_bind_double(stmt_, index, value));
  }
  void bind_text(int index, std::string_view text) override {
    check(sqlite3_bind_text(stmt_, index, text.data(), static_cast<int>(text.size()),
                            SQLITE_TRANSIENT));
  }
  void bind_blob(int index, const void* data, std::size_t size) override {
    check(sqlite3_bind_blob64(stmt_, index, data, size, SQLITE_TRANSIENT));
  }
  void bind_null(int index) override { check(sqlite3_bind_null(stmt_, index)); }

  bool step() override {
    const int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    const std::string sql = sqlite3_sql(stmt_) != nullptr ? sqlite3_sql(stmt_) : "";
    sqlite3_reset(stmt_);
    fail(db_, rc, "step " + sql.substr(0, 80));
  }
  void reset() override {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }

  std::int64_t column_int(int col) const override { return sqlite3_column_int64(stmt_, col); }
  double column_double(int col) const override { return sqlite3_column_double(stmt_, col); }
  bool column_is_null(int col) const override {
    return sqlite3_column_type(stmt_, col) == SQLITE_NULL;
  }
  std::string column_text(int col) const override {
    const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, col));
    return p == nullptr ? std::string() : std::string(p, sqlite3_column_bytes(stmt_, col));
  }
  std::string_view column_blob(int col) const override {
    const auto* p = static_cast<const char*>(sqlite3_column_blob(stmt_, col));
    return p == nullptr ? std::string_view()
                        : std::string_view(p, sqlite3_column_bytes(stmt_, col));
  }

 private:
  void check(int rc) const {
    if (rc != SQLITE_OK) fail(db_, rc, "bind");
  }
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
};

}  // namespace

SqliteConnection::SqliteConnection(const std::string& path, bool create, bool read_only) {
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

SqliteConnection::~SqliteConnection() { sqlite3_close_v2(db_); }

void SqliteConnection::exec(std::string_view sql) {
  char* err = nullptr;
  const std::string text(sql);
  const int rc = sqlite3_exec(db_, text.c_str(), nullptr, nullptr, &err);
  if (rc != SQLITE_OK) {
    std::string msg = "sqlite: " + text.substr(0, 80) + ": " + (err ? err : sqlite3_errstr(rc));
    sqlite3_free(err);
    throw StoreError(msg);
  }
}

Statement SqliteConnection::prepare(std::string_view sql) {
  return Statement(std::make_unique<SqliteStatement>(db_, sql));
}

std::uint64_t SqliteConnection::live_bytes() {
  const std::int64_t pages = query_int("PRAGMA page_count");
  const std::int64_t free_pages = query_int("PRAGMA freelist_count");
  const std::int64_t page_size = query_int("PRAGMA page_size");
  return static_cast<std::uint64_t>((pages - free_pages) * page_size);
}

}  // namespace ampscope::server
