#include "db.h"

namespace ampscope::server {

std::int64_t Connection::query_int(std::string_view sql) {
  Statement s = prepare(sql);
  if (!s.step()) throw StoreError("store: no row from " + std::string(sql));
  return s.column_int(0);
}

std::string Dialect::index_hint(std::string_view index) const {
  return backend == Backend::kSqlite ? "INDEXED BY " + std::string(index) : std::string();
}

std::string sql_greatest(std::string_view a, std::string_view b) {
  // CASE reads the same in both dialects (SQLite has no GREATEST, PostgreSQL no scalar max).
  const std::string x(a), y(b);
  return "CASE WHEN " + x + " >= " + y + " THEN " + x + " ELSE " + y + " END";
}

Transaction::Transaction(Connection& c) : c_(c) { c_.begin_write(); }

Transaction::~Transaction() {
  if (!done_) {
    try {
      c_.rollback();
    } catch (const StoreError&) {
      // The transaction may already be gone (SQLite rolls back on some I/O errors itself; a
      // lost PostgreSQL connection took it with it).
    }
  }
}

void Transaction::commit() {
  c_.commit();
  done_ = true;
}

}  // namespace ampscope::server
