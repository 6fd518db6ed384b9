// Which back end a `--db` names, and opening it: the one place that knows both.
#include <fstream>
#include <regex>

#include "ampscope/secret_file.h"
#include "pg_connection.h"
#include "sqlite_connection.h"
#include "store.h"

namespace ampscope::server {

Backend backend_of(std::string_view location) {
  if (location.starts_with("postgresql://") || location.starts_with("postgres://")) {
    return Backend::kPostgres;
  }
  // libpq's "host=... dbname=...": a keyword and '=' first. (A file whose name starts so is
  // given as ./name.)
  static const std::regex key_value(R"(^\s*[A-Za-z_]+\s*=)");
  return std::regex_search(std::string(location), key_value) ? Backend::kPostgres
                                                             : Backend::kSqlite;
}

std::string printable_location(const std::string& location) {
  return backend_of(location) == Backend::kPostgres ? mask_conninfo_password(location) : location;
}

std::string read_password_file(const std::string& path) {
  const std::string origin = "--db-password-file '" + path + "'";
  std::ifstream in(path, std::ios::binary);
  if (!in) throw StoreError(origin + ": cannot read it");
  if (const std::string exposed = secret_file_exposure(path); !exposed.empty()) {
    throw StoreError(origin + ": refused: " + exposed);
  }
  std::string password;
  std::getline(in, password);
  if (!password.empty() && password.back() == '\r') password.pop_back();
  if (password.empty()) throw StoreError(origin + ": its first line is empty");
  return password;
}

int current_schema_version(Backend backend) {
  return backend == Backend::kSqlite ? kSchemaVersion : kPostgresSchemaVersion;
}

std::unique_ptr<Connection> open_store(const StoreOptions& o, StoreRole role) {
  if (backend_of(o.path) == Backend::kPostgres) {
    auto c = std::make_unique<PgConnection>(o.path, o.password);
    // A reader's mistakes cannot write.
    if (role == StoreRole::kReader) c->exec("SET default_transaction_read_only = on");
    return c;
  }
  switch (role) {
    case StoreRole::kWriter: {
      auto c = std::make_unique<SqliteConnection>(o.path, /*create=*/true, /*read_only=*/false);
      // Lets retention hand freed pages back to the file system; only settable before the
      // first table exists.
      if (sqlite_schema_version(*c) == 0) c->exec("PRAGMA auto_vacuum = INCREMENTAL");
      c->exec("PRAGMA journal_mode = WAL");
      c->exec(o.sync_full ? "PRAGMA synchronous = FULL" : "PRAGMA synchronous = NORMAL");
      // Checkpoints run on the Checkpointer's thread; the WAL file is truncated back to this
      // size after each reset, so that it does not stay at its high-water mark.
      c->exec("PRAGMA wal_autocheckpoint = 0");
      c->exec("PRAGMA journal_size_limit = 67108864");
      return c;
    }
    case StoreRole::kReader:
      return std::make_unique<SqliteConnection>(o.path, /*create=*/false, /*read_only=*/true);
    case StoreRole::kCheckpointer:
      break;
  }
  return std::make_unique<SqliteConnection>(o.path, /*create=*/false, /*read_only=*/false);
}

void migrate(Connection& c) {
  if (c.backend() == Backend::kSqlite) {
    migrate_sqlite(c);
  } else {
    migrate_postgres(c);
  }
}

int schema_version(Connection& c) {
  return c.backend() == Backend::kSqlite ? sqlite_schema_version(c) : postgres_schema_version(c);
}

}  // namespace ampscope::server
