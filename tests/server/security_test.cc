// Authentication and transport security of the real server: with a token file every RPC needs
// "authorization: Bearer <token>" (UNAUTHENTICATED otherwise); with a certificate and key the
// server speaks TLS, here with certificates made by the openssl command at test time.
#include <gtest/gtest.h>

#include "server_harness.h"

namespace ampscope::testing {
namespace {

constexpr const char* kToken = "s3cret-token-for-tests";

grpc::Status list_runs(const std::shared_ptr<grpc::Channel>& channel,
                       const ClientOptions& options) {
  grpc::ClientContext ctx;
  add_auth(&ctx, options);
  ctx.set_deadline(std::chrono::system_clock::now() + 10s);
  v1::ListRunsResponse out;
  return v1::Query::NewStub(channel)->ListRuns(&ctx, v1::ListRunsRequest(), &out);
}

TEST(ServerSecurityTest, EveryRpcNeedsTheBearerToken) {
  TempDir dir;
  write_text(dir / "token", std::string(kToken) + "\n");
  ServerProcess server(dir.path(), dir / "store.db",
                       {"--auth-token-file", (dir / "token").string()});
  auto channel = make_channel(server.address());
  const ClientOptions none;
  const ClientOptions wrong{"s3cret-token-for-tesTs", "", ""};
  const ClientOptions right{kToken, "", ""};

  EXPECT_EQ(list_runs(channel, none).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(list_runs(channel, wrong).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(list_runs(channel, right).ok());

  for (const ClientOptions* bad : {&none, &wrong}) {
    AgentStream agent(channel, *bad);
    agent.send_hello(make_hello("run-auth"));
    const grpc::Status st = agent.wait_end();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
    EXPECT_EQ(st.error_message().find(kToken), std::string::npos);  // never echoes a token
  }
  AgentStream agent(channel, right);
  ASSERT_TRUE(agent.send_hello(make_hello("run-auth")));
  ASSERT_TRUE(agent.send(make_report("run-auth", 0, 1, 0, 1)));
  EXPECT_TRUE(agent.wait_ack(1).has_value());
  EXPECT_TRUE(agent.finish().ok());

  const std::vector<Sample> metrics = parse_samples(scrape(server.metrics_address()));
  // Two refused queries and two refused streams.
  EXPECT_EQ(sample_value(metrics, "ampscope_auth_failures_total"), 4.0);
}

TEST(ServerSecurityTest, DeleteRunNeedsTheBearerToken) {
  TempDir dir;
  write_text(dir / "token", std::string(kToken) + "\n");
  ServerProcess server(dir.path(), dir / "store.db",
                       {"--auth-token-file", (dir / "token").string()});
  const ClientOptions right{kToken, "", ""};
  {
    AgentStream agent(make_channel(server.address()), right);
    ASSERT_TRUE(agent.send_hello(make_hello("run-keep")));
    ASSERT_TRUE(agent.send(make_report("run-keep", 0, 1, 0, 1)));
    ASSERT_TRUE(agent.wait_ack(1).has_value());
    EXPECT_TRUE(agent.finish().ok());
  }
  for (const ClientOptions& bad : {ClientOptions{}, ClientOptions{"wrong", "", ""}}) {
    EXPECT_EQ(delete_run(server.address(), "run-keep", bad).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  v1::DeleteRunResponse deleted;
  const grpc::Status ok = delete_run(server.address(), "run-keep", right, &deleted);
  EXPECT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_EQ(deleted.deleted_reports(), 1u);
}

// Certificates for "localhost" and 127.0.0.1 signed by a throwaway CA.
bool make_certificates(const TempDir& dir, std::string* log) {
  const std::string d = dir.path().string();
  write_text(dir / "san.cnf", "subjectAltName=DNS:localhost,IP:127.0.0.1\n");
  const std::vector<std::vector<std::string>> steps = {
      {"openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
       "-nodes", "-keyout", d + "/ca.key", "-out", d + "/ca.pem", "-days", "1", "-subj",
       "/CN=ampscope test CA"},
      {"openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
       "-keyout", d + "/server.key", "-out", d + "/server.csr", "-subj", "/CN=localhost"},
      {"openssl", "x509", "-req", "-in", d + "/server.csr", "-CA", d + "/ca.pem", "-CAkey",
       d + "/ca.key", "-CAcreateserial", "-out", d + "/server.pem", "-days", "1", "-extfile",
       d + "/san.cnf"},
  };
  for (const auto& argv : steps) {
    std::vector<std::string> full = {"/usr/bin/env"};
    full.insert(full.end(), argv.begin(), argv.end());
    if (run_to_completion(full, log) != 0) return false;
  }
  return true;
}

TEST(ServerSecurityTest, TlsWithCertificatesMadeByOpenssl) {
  TempDir dir;
  std::string log;
  ASSERT_TRUE(make_certificates(dir, &log)) << "openssl failed:\n" << log;
  ServerProcess server(
      dir.path(), dir / "store.db",
      {"--tls-cert", (dir / "server.pem").string(), "--tls-key", (dir / "server.key").string()});
  const std::string port = server.address().substr(server.address().rfind(':') + 1);
  ClientOptions tls;
  tls.tls_ca = read_text(dir / "ca.pem");

  auto secure = make_channel("localhost:" + port, tls);
  EXPECT_TRUE(list_runs(secure, tls).ok());
  {
    AgentStream agent(secure, tls);
    ASSERT_TRUE(agent.send_hello(make_hello("run-tls")));
    ASSERT_TRUE(agent.send(make_report("run-tls", 0, 1, 0, 1)));
    EXPECT_TRUE(agent.wait_ack(1).has_value());
    EXPECT_TRUE(agent.finish().ok());
  }
  // A plaintext client cannot talk to it, and neither can one that trusts another CA.
  auto plain = make_channel("localhost:" + port);
  EXPECT_EQ(list_runs(plain, {}).error_code(), grpc::StatusCode::UNAVAILABLE);
  TempDir other;
  ASSERT_TRUE(make_certificates(other, &log)) << log;
  ClientOptions other_ca;
  other_ca.tls_ca = read_text(other / "ca.pem");
  EXPECT_EQ(list_runs(make_channel("localhost:" + port, other_ca), other_ca).error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

TEST(ServerSecurityTest, ListensOnLoopbackByDefault) {
  std::string help;
  ASSERT_EQ(run_to_completion({AMPSCOPE_SERVER_BINARY, "--help"}, &help), 0);
  EXPECT_NE(help.find("127.0.0.1:50051"), std::string::npos) << help;
  EXPECT_NE(help.find("127.0.0.1:9464"), std::string::npos) << help;
}

}  // namespace
}  // namespace ampscope::testing
