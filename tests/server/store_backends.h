// The store's tests run on each back end: a test's store is a SQLite file in a temporary
// directory or a fresh database on the binary's PostgreSQL (postgres_harness.h). Suites of
// StoreBackendTest are instantiated for both with INSTANTIATE_STORE_BACKENDS; tests of what
// only one back end has (SQLite's WAL and migrations, PostgreSQL's migration lock) use a
// StoreLocation of that back end.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "ampscope/testing/files.h"
#include "postgres_harness.h"
#include "store.h"

namespace ampscope::server {

class StoreLocation {
 public:
  explicit StoreLocation(Backend backend)
      : backend_(backend),
        path_(backend == Backend::kSqlite ? (dir_ / "store.db").string()
                                          : testing::PostgresServer::get().create_database()) {}
  Backend backend() const { return backend_; }
  // The store's --db.
  const std::string& path() const { return path_; }
  // A connection of its own that may write (the database must exist: a StoreWriter made it).
  std::unique_ptr<Connection> connect() const {
    return open_store(StoreOptions{path_}, StoreRole::kCheckpointer);
  }

 private:
  testing::TempDir dir_;
  Backend backend_;
  std::string path_;
};

class StoreBackendTest : public ::testing::TestWithParam<Backend> {
 protected:
  StoreBackendTest() : store_(GetParam()) {}
  Backend backend() const { return store_.backend(); }
  const std::string& path() const { return store_.path(); }
  std::unique_ptr<Connection> connect() const { return store_.connect(); }
  StoreLocation store_;
};

inline std::string backend_name(const ::testing::TestParamInfo<Backend>& info) {
  return info.param == Backend::kSqlite ? "sqlite" : "postgres";
}

}  // namespace ampscope::server

#define INSTANTIATE_STORE_BACKENDS(suite)                                             \
  INSTANTIATE_TEST_SUITE_P(Backends, suite,                                           \
                           ::testing::Values(::ampscope::server::Backend::kSqlite,    \
                                             ::ampscope::server::Backend::kPostgres), \
                           ::ampscope::server::backend_name)
