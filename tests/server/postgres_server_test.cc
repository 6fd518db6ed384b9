// The real ampscope-server on PostgreSQL (a database of the binary's own server,
// postgres_harness.h): reports streamed, queried, kept across a restart and deleted; the
// start-up line shows the connection string without its password; a password file others may
// read is refused at start.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include "ampscope/testing/child_process.h"
#include "ampscope/testing/files.h"
#include "postgres_harness.h"
#include "server_harness.h"

namespace ampscope::testing {
namespace {

TEST(PostgresServerTest, StoresQueriesRestartsAndDeletesARun) {
  TempDir dir;
  // Trust authentication ignores the password; it is here to be masked in the log.
  const std::string db = PostgresServer::get().create_database() + " password=s3cret";
  ServerProcess server(dir.path(), db);
  send_reports(make_channel(server.address()), "run-pg", 1, 20, 2);
  EXPECT_EQ(stored_reports(server.address(), "run-pg").size(), 20u);

  // The store restores the agent's last seq: a replay of 1..20 is duplicates, 21..25 new.
  server.restart();
  send_reports(make_channel(server.address()), "run-pg", 1, 25, 2);
  const std::vector<v1::StepReport> stored = stored_reports(server.address(), "run-pg");
  ASSERT_EQ(stored.size(), 25u);
  EXPECT_EQ(stored.back().seq(), 25u);
  const std::optional<v1::GetRunResponse> run = get_run(server.address(), "run-pg");
  ASSERT_TRUE(run.has_value());
  EXPECT_EQ(run->summary().reports(), 25u);

  v1::DeleteRunResponse deleted;
  ASSERT_TRUE(delete_run(server.address(), "run-pg", {}, &deleted).ok());
  EXPECT_EQ(deleted.deleted_reports(), 25u);
  EXPECT_FALSE(get_run(server.address(), "run-pg").has_value());

  const std::string log = server.log();
  EXPECT_NE(log.find("password=***"), std::string::npos) << log;
  EXPECT_EQ(log.find("s3cret"), std::string::npos) << log;
}

TEST(PostgresServerTest, APasswordFileOthersMayReadIsRefusedAtStart) {
  TempDir dir;
  const std::string file = (dir / "db-password").string();
  write_text(file, "s3cret\n");
  ASSERT_EQ(::chmod(file.c_str(), 0644), 0);
  const CommandResult r =
      run_process({AMPSCOPE_SERVER_BINARY, "--db", PostgresServer::get().create_database(),
                   "--db-password-file", file, "--listen", "127.0.0.1:0", "--metrics-listen", "",
                   "--http-listen", ""});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--db-password-file"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("chmod 600"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("s3cret"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace ampscope::testing
