// Tokens with roles: the token file's format (its parser as a unit), and the real server with
// an admin, a reader, an agent and an agent limited to a run-id prefix: which calls each may
// make, what a refusal says (never a token), /metrics behind HTTP basic auth, and the CLI's
// one-line explanation of a refusal.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include "ampscope/check.h"
#include "ampscope/testing/net.h"
#include "auth.h"
#include "server_harness.h"

#ifndef AMPSCOPE_CLI_BINARY
#error "AMPSCOPE_CLI_BINARY must name the ampscope executable"
#endif
#ifndef AMPSCOPE_SERVER_BINARY
#error "AMPSCOPE_SERVER_BINARY must name the ampscope-server executable"
#endif

namespace ampscope::server {
namespace {

constexpr const char* kOrigin = "tokens";

// The message of the Error that parsing `text` throws; empty when it does not throw.
std::string parse_error(const std::string& text) {
  try {
    parse_token_file(text, kOrigin);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TokenFileTest, RolesPrefixesCommentsAndBlankLines) {
  const std::vector<TokenGrant> grants = parse_token_file(
      "# who may do what\n"
      "\n"
      "admin   adm-token-1\r\n"
      "  reader\tread-token-2  \n"
      "agent agent-any-3\n"
      "agent agent-team-4 team-a-\n",
      kOrigin);
  ASSERT_EQ(grants.size(), 4u);
  EXPECT_EQ(grants[0].role, AccessRole::kAdmin);
  EXPECT_EQ(grants[0].token, "adm-token-1");
  EXPECT_EQ(grants[1].role, AccessRole::kReader);
  EXPECT_EQ(grants[1].token, "read-token-2");
  EXPECT_EQ(grants[2].role, AccessRole::kAgent);
  EXPECT_EQ(grants[2].run_id_prefix, "");
  EXPECT_EQ(grants[3].role, AccessRole::kAgent);
  EXPECT_EQ(grants[3].token, "agent-team-4");
  EXPECT_EQ(grants[3].run_id_prefix, "team-a-");
}

TEST(TokenFileTest, ALoneBareTokenIsAnAdminToken) {
  const std::vector<TokenGrant> grants = parse_token_file("# old style\n  abc123 \n\n", kOrigin);
  ASSERT_EQ(grants.size(), 1u);
  EXPECT_EQ(grants[0].role, AccessRole::kAdmin);
  EXPECT_EQ(grants[0].token, "abc123");
  EXPECT_EQ(grants[0].run_id_prefix, "");
}

TEST(TokenFileTest, MistakesNameTheLineAndNeverTheToken) {
  const std::string secret = "Sup3r-s3cret";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "no token"},
      {"# only a comment\n\n", "no token"},
      {"admin x-1\n" + secret + "\n", "line 2: a bare token"},
      {secret + "\nreader y-2\n", "line 1: a bare token"},
      {"owner " + secret + "\n", "line 1: expected ROLE TOKEN"},
      {secret + " reader\n", "line 1: expected ROLE TOKEN"},
      {"reader\n", "line 1: role reader without a token"},
      {"reader " + secret + " team-\n", "line 1: a run-id prefix limits agent tokens only"},
      {"admin " + secret + " team-\n", "line 1: a run-id prefix limits agent tokens only"},
      {"agent " + secret + " team/a\n", "line 1: run-id prefix: may use only"},
      {"agent " + secret + " team a\n", "line 1: more than ROLE TOKEN"},
      {"admin " + secret + "\n\nreader " + secret + "\n", "line 3: the same token as line 1"},
      {"admin " + secret + "\xc3\xa9\n", "line 1: a token may use only printable ASCII"},
  };
  for (const auto& [text, expected] : cases) {
    const std::string message = parse_error(text);
    EXPECT_NE(message.find(expected), std::string::npos) << "'" << text << "': " << message;
    EXPECT_EQ(message.rfind(kOrigin, 0), 0u) << message;
    EXPECT_EQ(message.find(secret), std::string::npos) << message;
  }
}

TEST(TokenFileTest, WarnsWhenGroupOrOthersMayReadIt) {
  testing::TempDir dir;
  const std::string path = (dir / "tokens").string();
  testing::write_text(dir / "tokens", "admin warn-me-token\n");
  ::chmod(path.c_str(), 0644);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(read_token_file(path).size(), 1u);
  const std::string loose = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(loose.find("group or others may read it (mode 644)"), std::string::npos) << loose;
  EXPECT_EQ(loose.find("warn-me-token"), std::string::npos) << loose;

  ::chmod(path.c_str(), 0600);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(read_token_file(path).size(), 1u);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");

  EXPECT_THROW(read_token_file((dir / "missing").string()), Error);
}

TEST(TokenCompareTest, ConstantTimeEqualComparesWholeStrings) {
  EXPECT_TRUE(constant_time_equal("secret-token", "secret-token"));
  EXPECT_FALSE(constant_time_equal("secret-token", "secret-tokeN"));
  EXPECT_FALSE(constant_time_equal("Secret-token", "secret-token"));
  EXPECT_FALSE(constant_time_equal("secret", "secret-token"));
  EXPECT_FALSE(constant_time_equal("secret-token", "secret"));
  // A presented value that repeats a shorter secret is still a different length.
  EXPECT_FALSE(constant_time_equal("abcabc", "abc"));
  EXPECT_FALSE(constant_time_equal("", "abc"));
  EXPECT_TRUE(constant_time_equal("", ""));
}

TEST(AuthorizeRunTest, AgentTokensKeepToTheirPrefix) {
  EXPECT_TRUE(Authenticator::authorize_run({AccessRole::kAgent, ""}, "anything").ok());
  EXPECT_TRUE(Authenticator::authorize_run({AccessRole::kAgent, "team-a-"}, "team-a-7").ok());
  const grpc::Status denied =
      Authenticator::authorize_run({AccessRole::kAgent, "team-a-"}, "team-b-7");
  EXPECT_EQ(denied.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(denied.error_message().find("'team-a-'"), std::string::npos) << denied.error_message();
  EXPECT_TRUE(Authenticator::authorize_run({AccessRole::kAdmin, ""}, "team-b-7").ok());
}

TEST(AuthorizeMetricsTest, ReaderAndAdminTokensOnly) {
  const Authenticator off;
  EXPECT_TRUE(off.allows_metrics(""));
  const Authenticator on(
      parse_token_file("admin adm-1\nreader rd-2\nagent ag-3\nagent ag-4 team-\n", kOrigin));
  EXPECT_TRUE(on.allows_metrics("adm-1"));
  EXPECT_TRUE(on.allows_metrics("rd-2"));
  EXPECT_FALSE(on.allows_metrics("ag-3"));
  EXPECT_FALSE(on.allows_metrics("ag-4"));
  EXPECT_FALSE(on.allows_metrics(""));
  EXPECT_FALSE(on.allows_metrics("rd-2 "));
}

}  // namespace
}  // namespace ampscope::server

namespace ampscope::testing {
namespace {

constexpr const char* kAdmin = "admin-token-0123456789";
constexpr const char* kReader = "reader-token-0123456789";
constexpr const char* kAgent = "agent-token-0123456789";
constexpr const char* kTeamAgent = "team-agent-token-0123456789";

// A server with one token of each role and an agent token for runs "team-a-*".
class RolesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    write_text(dir_ / "tokens", std::string("# roles\n") + "admin " + kAdmin + "\n" + "reader " +
                                    kReader + "\n" + "agent " + kAgent + "\n" + "agent " +
                                    kTeamAgent + " team-a-\n");
    ::chmod((dir_ / "tokens").c_str(), 0600);
    server_ = std::make_unique<ServerProcess>(
        dir_.path(), dir_ / "store.db",
        std::vector<std::string>{"--auth-token-file", (dir_ / "tokens").string()});
  }

  grpc::Status list_runs(const std::string& token) {
    grpc::ClientContext ctx;
    add_auth(&ctx, with_token(token));
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    v1::ListRunsResponse out;
    return v1::Query::NewStub(make_channel(server_->address()))
        ->ListRuns(&ctx, v1::ListRunsRequest(), &out);
  }
  grpc::Status get_reports(const std::string& token, const std::string& run) {
    grpc::ClientContext ctx;
    add_auth(&ctx, with_token(token));
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    v1::GetReportsRequest q;
    q.set_run_id(run);
    v1::GetReportsResponse out;
    return v1::Query::NewStub(make_channel(server_->address()))->GetReports(&ctx, q, &out);
  }
  // Streams one report of `run` with `token`; the stream's end status.
  grpc::Status stream_one(const std::string& token, const std::string& run) {
    AgentStream agent(make_channel(server_->address()), with_token(token));
    if (!agent.send_hello(make_hello(run))) return agent.wait_end();
    if (!agent.send(make_report(run, 0, 1, 0, 1))) return agent.wait_end();
    if (!agent.wait_ack(1).has_value()) return agent.wait_end();
    return agent.finish();
  }
  long scrape_as(const std::string& userinfo) {
    std::string body;
    return http_get("http://" + userinfo + server_->metrics_address() + "/metrics", &body);
  }

  TempDir dir_;
  std::unique_ptr<ServerProcess> server_;
};

void expect_denied(const grpc::Status& s, const std::string& says) {
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_NE(s.error_message().find(says), std::string::npos) << s.error_message();
  for (const char* token : {kAdmin, kReader, kAgent, kTeamAgent}) {
    EXPECT_EQ(s.error_message().find(token), std::string::npos) << s.error_message();
  }
}

TEST_F(RolesTest, EachRoleMakesItsOwnCalls) {
  // Agents stream; an agent token limited to "team-a-" streams only those runs.
  EXPECT_TRUE(stream_one(kAgent, "run-any").ok());
  EXPECT_TRUE(stream_one(kTeamAgent, "team-a-1").ok());
  expect_denied(stream_one(kTeamAgent, "team-b-1"),
                "may stream only runs whose id starts with 'team-a-'");
  expect_denied(stream_one(kReader, "run-reader"), "Attach needs an agent or admin token");
  EXPECT_TRUE(stream_one(kAdmin, "run-admin").ok());

  // Readers read; agents do not.
  EXPECT_TRUE(list_runs(kReader).ok());
  EXPECT_TRUE(get_reports(kReader, "run-any").ok());
  expect_denied(list_runs(kAgent), "ListRuns needs a reader or admin token; this is an agent");
  expect_denied(get_reports(kTeamAgent, "team-a-1"), "GetReports needs a reader or admin token");
  EXPECT_TRUE(list_runs(kAdmin).ok());
  // Nothing of the refused run was stored.
  EXPECT_EQ(get_reports(kAdmin, "team-b-1").error_code(), grpc::StatusCode::NOT_FOUND);

  // Only an admin deletes.
  expect_denied(delete_run(server_->address(), "run-any", with_token(kReader)),
                "DeleteRun needs an admin token; this is a reader token");
  expect_denied(delete_run(server_->address(), "run-any", with_token(kAgent)),
                "DeleteRun needs an admin token");
  v1::DeleteRunResponse deleted;
  const grpc::Status ok = delete_run(server_->address(), "run-any", with_token(kAdmin), &deleted);
  EXPECT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_EQ(deleted.deleted_reports(), 1u);

  // An unknown token is not a role: UNAUTHENTICATED, counted apart from refused roles.
  EXPECT_EQ(list_runs("nobody-knows-this").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(stream_one("", "run-none").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  std::string body;
  ASSERT_EQ(http_get("http://prometheus:" + url_encode(kReader) + "@" + server_->metrics_address() +
                         "/metrics",
                     &body),
            200);
  EXPECT_EQ(
      sample_value(parse_samples(body), "ampscope_auth_failures_total", {{"surface", "grpc"}}),
      2.0);
}

TEST_F(RolesTest, MetricsNeedAReaderOrAdminTokenAsBasicAuthPassword) {
  EXPECT_EQ(scrape_as(""), 401);
  EXPECT_EQ(scrape_as("prometheus:wrong@"), 401);
  EXPECT_EQ(scrape_as("prometheus:" + url_encode(kAgent) + "@"), 401);
  EXPECT_EQ(scrape_as(url_encode(kReader) + "@"), 401);  // the token as user name, no password
  EXPECT_EQ(scrape_as("prometheus:" + url_encode(kReader) + "@"), 200);
  EXPECT_EQ(scrape_as("anyone:" + url_encode(kAdmin) + "@"), 200);
  // Each 401 is counted, apart from gRPC's refusals.
  std::string body;
  ASSERT_EQ(http_get("http://p:" + url_encode(kReader) + "@" + server_->metrics_address() +
                         "/metrics",
                     &body),
            200);
  const std::vector<Sample> m = parse_samples(body);
  EXPECT_EQ(sample_value(m, "ampscope_auth_failures_total", {{"surface", "metrics"}}), 4.0);
  EXPECT_EQ(sample_value(m, "ampscope_auth_failures_total", {{"surface", "grpc"}}), 0.0);
}

TEST_F(RolesTest, CliExplainsARefusedRoleInOneLine) {
  write_text(dir_ / "reader", std::string(kReader) + "\n");
  write_text(dir_ / "admin", std::string(kAdmin) + "\n");
  // Private, as token files should be (the CLI warns about others' access on a line of its own).
  ::chmod((dir_ / "reader").c_str(), 0600);
  ::chmod((dir_ / "admin").c_str(), 0600);
  ASSERT_TRUE(stream_one(kAgent, "run-cli").ok());
  const CommandResult listed =
      run_process({AMPSCOPE_CLI_BINARY, "runs", "--json", "--server", server_->address(),
                   "--token-file", (dir_ / "reader").string()});
  EXPECT_EQ(listed.code, 0) << listed.err;
  EXPECT_NE(listed.out.find("run-cli"), std::string::npos) << listed.out;
  const CommandResult refused =
      run_process({AMPSCOPE_CLI_BINARY, "runs", "delete", "run-cli", "--server", server_->address(),
                   "--token-file", (dir_ / "reader").string()});
  EXPECT_EQ(refused.code, 1);
  EXPECT_EQ(refused.err.find('\n'), refused.err.size() - 1) << refused.err;
  EXPECT_NE(refused.err.find("DeleteRun needs an admin token"), std::string::npos) << refused.err;
  EXPECT_EQ(refused.err.find(kReader), std::string::npos) << refused.err;
  const CommandResult deleted =
      run_process({AMPSCOPE_CLI_BINARY, "runs", "delete", "run-cli", "--server", server_->address(),
                   "--token-file", (dir_ / "admin").string()});
  EXPECT_EQ(deleted.code, 0) << deleted.err;
}

TEST(RolesFileTest, ALoneBareTokenKeepsItsOldMeaning) {
  TempDir dir;
  write_text(dir / "token", "legacy-token-0123\n");
  ::chmod((dir / "token").c_str(), 0600);
  ServerProcess server(dir.path(), dir / "store.db",
                       {"--auth-token-file", (dir / "token").string()});
  const ClientOptions legacy = with_token("legacy-token-0123");
  EXPECT_EQ(AgentStream(make_channel(server.address())).wait_end().error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  {
    AgentStream agent(make_channel(server.address()), legacy);
    ASSERT_TRUE(agent.send_hello(make_hello("run-legacy")));
    ASSERT_TRUE(agent.send(make_report("run-legacy", 0, 1, 0, 1)));
    ASSERT_TRUE(agent.wait_ack(1).has_value());
    EXPECT_TRUE(agent.finish().ok());
  }
  std::string body;
  EXPECT_EQ(http_get("http://p:legacy-token-0123@" + server.metrics_address() + "/metrics", &body),
            200);
  EXPECT_TRUE(delete_run(server.address(), "run-legacy", legacy).ok());
}

TEST(RolesFileTest, ABadTokenFileStopsTheServerWithOneLine) {
  TempDir dir;
  write_text(dir / "tokens", "admin good-token-1\nowner secret-token-2\n");
  std::string out;
  const int code = run_to_completion(
      {AMPSCOPE_SERVER_BINARY, "--auth-token-file", (dir / "tokens").string(), "--listen",
       "127.0.0.1:0", "--metrics-listen", "", "--http-listen", "127.0.0.1:0", "--db",
       (dir / "store.db").string()},
      &out);
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("line 2: expected ROLE TOKEN"), std::string::npos) << out;
  EXPECT_EQ(out.find("secret-token-2"), std::string::npos) << out;
}

}  // namespace
}  // namespace ampscope::testing
