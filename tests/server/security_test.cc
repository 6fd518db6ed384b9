// Authentication and transport security of the real server: with a token file every RPC needs
// "authorization: Bearer <token>" (UNAUTHENTICATED otherwise); with a certificate and key the
// server speaks TLS, and with --tls-client-ca it requires client certificates signed by that CA
// (mutual TLS), here with certificates made by the openssl command at test time.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "server_harness.h"

#ifndef AMPSCOPE_CLI_BINARY
#error "AMPSCOPE_CLI_BINARY must name the ampscope executable"
#endif
#ifndef AMPSCOPE_TRAIN_BINARY
#error "AMPSCOPE_TRAIN_BINARY must name the ampscope-train executable"
#endif

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
  const ClientOptions wrong = with_token("s3cret-token-for-tesTs");
  const ClientOptions right = with_token(kToken);

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

  // /metrics takes the token as the basic-auth password.
  const std::vector<Sample> metrics =
      parse_samples(scrape("prometheus:" + std::string(kToken) + "@" + server.metrics_address()));
  // Two refused queries and two refused streams.
  EXPECT_EQ(sample_value(metrics, "ampscope_auth_failures_total", {{"surface", "grpc"}}), 4.0);
}

TEST(ServerSecurityTest, DeleteRunNeedsTheBearerToken) {
  TempDir dir;
  write_text(dir / "token", std::string(kToken) + "\n");
  ServerProcess server(dir.path(), dir / "store.db",
                       {"--auth-token-file", (dir / "token").string()});
  const ClientOptions right = with_token(kToken);
  {
    AgentStream agent(make_channel(server.address()), right);
    ASSERT_TRUE(agent.send_hello(make_hello("run-keep")));
    ASSERT_TRUE(agent.send(make_report("run-keep", 0, 1, 0, 1)));
    ASSERT_TRUE(agent.wait_ack(1).has_value());
    EXPECT_TRUE(agent.finish().ok());
  }
  for (const ClientOptions& bad : {ClientOptions{}, with_token("wrong")}) {
    EXPECT_EQ(delete_run(server.address(), "run-keep", bad).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  v1::DeleteRunResponse deleted;
  const grpc::Status ok = delete_run(server.address(), "run-keep", right, &deleted);
  EXPECT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_EQ(deleted.deleted_reports(), 1u);
  // The log says who deleted it (never the token).
  const std::string log = server.log();
  EXPECT_NE(log.find("runs: run 'run-keep' deleted at the request of an admin token, from "
                     "ipv4:127.0.0.1:"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find(kToken), std::string::npos);
}

// A throwaway CA (ca.pem), a server certificate for "localhost" and 127.0.0.1 (server.pem,
// server.key) and a client certificate (client.pem, client.key), both signed by the CA, each
// with the one extended key usage of its side (serverAuth, clientAuth), as docs/security.md
// makes them.
bool make_certificates(const TempDir& dir, std::string* log) {
  const std::string d = dir.path().string();
  write_text(dir / "san.cnf",
             "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n");
  write_text(dir / "client.cnf", "extendedKeyUsage=clientAuth\n");
  const std::vector<std::vector<std::string>> steps = {
      {"openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
       "-nodes", "-keyout", d + "/ca.key", "-out", d + "/ca.pem", "-days", "1", "-subj",
       "/CN=ampscope test CA"},
      {"openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
       "-keyout", d + "/server.key", "-out", d + "/server.csr", "-subj", "/CN=localhost"},
      {"openssl", "x509", "-req", "-in", d + "/server.csr", "-CA", d + "/ca.pem", "-CAkey",
       d + "/ca.key", "-CAcreateserial", "-out", d + "/server.pem", "-days", "1", "-extfile",
       d + "/san.cnf"},
      {"openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
       "-keyout", d + "/client.key", "-out", d + "/client.csr", "-subj", "/CN=ampscope-cli"},
      {"openssl", "x509", "-req", "-in", d + "/client.csr", "-CA", d + "/ca.pem", "-CAkey",
       d + "/ca.key", "-CAcreateserial", "-out", d + "/client.pem", "-days", "1", "-extfile",
       d + "/client.cnf"},
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

// A client of the CA of `dir`, presenting the client certificate of `cert_dir` (none when empty).
ClientOptions tls_client(const TempDir& dir, const TempDir* cert_dir) {
  ClientOptions o;
  o.tls_ca = read_text(dir / "ca.pem");
  if (cert_dir != nullptr) {
    o.tls_cert = read_text(*cert_dir / "client.pem");
    o.tls_key = read_text(*cert_dir / "client.key");
  }
  return o;
}

// Certificates of two CAs (dir: the server's and its clients', other: a foreign one) and a
// server that requires client certificates of dir's CA, at the name its certificate carries.
struct MutualTls {
  TempDir dir;
  TempDir other;
  std::unique_ptr<ServerProcess> server;
  std::string address;
};

std::unique_ptr<MutualTls> start_mutual_tls() {
  auto m = std::make_unique<MutualTls>();
  std::string log;
  if (!make_certificates(m->dir, &log) || !make_certificates(m->other, &log)) {
    ADD_FAILURE() << "openssl failed:\n" << log;
    return nullptr;
  }
  const TempDir& d = m->dir;
  m->server = std::make_unique<ServerProcess>(
      d.path(), d / "store.db",
      std::vector<std::string>{"--tls-cert", (d / "server.pem").string(), "--tls-key",
                               (d / "server.key").string(), "--tls-client-ca",
                               (d / "ca.pem").string()});
  const std::string& bound = m->server->address();
  m->address = "localhost:" + bound.substr(bound.rfind(':') + 1);
  return m;
}

TEST(ServerSecurityTest, MutualTlsNeedsAClientCertificateOfItsCa) {
  const auto tls = start_mutual_tls();
  ASSERT_NE(tls, nullptr);
  const TempDir& dir = tls->dir;
  const TempDir& other = tls->other;
  const std::string& address = tls->address;

  const ClientOptions good = tls_client(dir, &dir);
  auto secure = make_channel(address, good);
  EXPECT_TRUE(list_runs(secure, good).ok());
  {
    AgentStream agent(secure, good);
    ASSERT_TRUE(agent.send_hello(make_hello("run-mtls")));
    ASSERT_TRUE(agent.send(make_report("run-mtls", 0, 1, 0, 1)));
    EXPECT_TRUE(agent.wait_ack(1).has_value());
    EXPECT_TRUE(agent.finish().ok());
  }
  // No client certificate, one from another CA, or no TLS at all: the handshake fails.
  const ClientOptions no_cert = tls_client(dir, nullptr);
  EXPECT_EQ(list_runs(make_channel(address, no_cert), no_cert).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  const ClientOptions foreign = tls_client(dir, &other);
  EXPECT_EQ(list_runs(make_channel(address, foreign), foreign).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  {
    AgentStream agent(make_channel(address, foreign), foreign);
    agent.send_hello(make_hello("run-foreign"));
    EXPECT_EQ(agent.wait_end().error_code(), grpc::StatusCode::UNAVAILABLE);
  }
  EXPECT_EQ(list_runs(make_channel(address), {}).error_code(), grpc::StatusCode::UNAVAILABLE);
  // Each refused handshake is counted as a refusal of the gRPC surface (the plaintext client
  // too); gRPC may retry a connection within one call, so at least four.
  const std::vector<Sample> metrics = parse_samples(scrape(tls->server->metrics_address()));
  EXPECT_GE(sample_value(metrics, "ampscope_auth_failures_total", {{"surface", "grpc"}}), 4.0);
  // Only the run of the client with a good certificate was stored.
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 10s);
  v1::ListRunsResponse listed;
  ASSERT_TRUE(v1::Query::NewStub(secure)->ListRuns(&ctx, v1::ListRunsRequest(), &listed).ok());
  ASSERT_EQ(listed.runs_size(), 1);
  EXPECT_EQ(listed.runs(0).run_id(), "run-mtls");
  // Whoever deletes it is named by the subject of their certificate too.
  ASSERT_TRUE(delete_run(address, "run-mtls", good).ok());
  const std::string log = tls->server->log();
  EXPECT_NE(log.find("runs: run 'run-mtls' deleted at the request of no token (tokens are off), "
                     "certificate subject 'CN=ampscope-cli', from ipv4:127.0.0.1:"),
            std::string::npos)
      << log;
}

TEST(ServerSecurityTest, CliPresentsItsClientCertificate) {
  const auto tls = start_mutual_tls();
  ASSERT_NE(tls, nullptr);
  const TempDir& dir = tls->dir;
  const TempDir& other = tls->other;
  const std::string& address = tls->address;
  auto runs = [&](std::vector<std::string> extra) {
    std::vector<std::string> argv = {
        AMPSCOPE_CLI_BINARY,      "runs", "--json", "--server", address, "--tls-ca",
        (dir / "ca.pem").string()};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return run_process(argv, 30s);
  };
  const CommandResult ok = runs(
      {"--tls-cert", (dir / "client.pem").string(), "--tls-key", (dir / "client.key").string()});
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_NE(ok.out.find("\"runs\""), std::string::npos) << ok.out;

  // Refused by mutual TLS: one line that names TLS (not "is it running?"), and none of gRPC's.
  const CommandResult without = runs({});
  EXPECT_EQ(without.code, 1);
  EXPECT_NE(without.err.find("cannot connect to ampscope-server at " + address + ": the server "
                             "closed the connection after the TLS handshake"),
            std::string::npos)
      << without.err;
  EXPECT_EQ(std::count(without.err.begin(), without.err.end(), '\n'), 1) << without.err;
  const CommandResult foreign = runs({"--tls-cert", (other / "client.pem").string(), "--tls-key",
                                      (other / "client.key").string()});
  EXPECT_EQ(foreign.code, 1) << foreign.err;
  EXPECT_NE(foreign.err.find("mutual TLS"), std::string::npos) << foreign.err;
  // A CLI that does not trust the server's CA says so.
  const CommandResult untrusted = run_process(
      {AMPSCOPE_CLI_BINARY, "runs", "--server", address, "--tls-ca", (other / "ca.pem").string()},
      30s);
  EXPECT_EQ(untrusted.code, 1);
  EXPECT_NE(untrusted.err.find("TLS handshake failed: certificate verify failed (the server's "
                               "certificate is not signed by the CA this client trusts"),
            std::string::npos)
      << untrusted.err;
  // The server logged each refusal as one line of its own log, with the reason.
  const std::string log = tls->server->log();
  EXPECT_NE(log.find("TLS handshake refused: the client sent no certificate"), std::string::npos)
      << log;
  EXPECT_NE(log.find("TLS handshake refused: certificate verify failed"), std::string::npos)
      << log;
  EXPECT_EQ(log.find("ssl_transport_security.cc"), std::string::npos) << log;
  const CommandResult half = runs({"--tls-cert", (dir / "client.pem").string()});
  EXPECT_EQ(half.code, 2);
  EXPECT_NE(half.err.find("--tls-cert and --tls-key go together"), std::string::npos) << half.err;
}

// The agent over mutual TLS (its tls_* options), in a real ampscope-train run: with its client
// certificate every step is stored; with the certificate of another CA the handshake fails,
// training still finishes, and nothing reaches the store.
TEST(ServerSecurityTest, AgentStreamsOverMutualTls) {
  const auto tls = start_mutual_tls();
  ASSERT_NE(tls, nullptr);
  const TempDir& dir = tls->dir;
  const TempDir& other = tls->other;
  const std::string& address = tls->address;
  constexpr int kSteps = 6;
  auto train = [&](const std::string& run_id, const TempDir& cert_dir) {
    return run_process(
        {AMPSCOPE_TRAIN_BINARY, "--steps", std::to_string(kSteps), "--context", "8", "--width",
         "8", "--heads", "1", "--layers", "1", "--batch", "2", "--threads", "1", "--eval-every",
         "0", "--quiet", "--server", address, "--run-id", run_id, "--spool-dir",
         (cert_dir / ("spool-" + run_id)).string(), "--agent",
         "tls_ca_file=" + (dir / "ca.pem").string(), "--agent",
         "tls_cert_file=" + (cert_dir / "client.pem").string(), "--agent",
         "tls_key_file=" + (cert_dir / "client.key").string(), "--agent", "flush_timeout_ms=1500",
         "--agent", "connect_timeout_ms=500"},
        60s);
  };
  const CommandResult good = train("agent-mtls", dir);
  ASSERT_EQ(good.code, 0) << good.err;
  const CommandResult foreign = train("agent-foreign", other);
  EXPECT_EQ(foreign.code, 0) << foreign.err;
  // The person training is told why nothing arrives, not only that reports were not acknowledged.
  EXPECT_NE(foreign.err.find("ampscope agent: cannot connect to " + address +
                             ": the server closed the connection after the TLS handshake"),
            std::string::npos)
      << foreign.err;

  const ClientOptions client = tls_client(dir, &dir);
  grpc::ClientContext ctx;
  add_auth(&ctx, client);
  ctx.set_deadline(std::chrono::system_clock::now() + 10s);
  v1::ListRunsResponse listed;
  ASSERT_TRUE(v1::Query::NewStub(make_channel(address, client))
                  ->ListRuns(&ctx, v1::ListRunsRequest(), &listed)
                  .ok());
  ASSERT_EQ(listed.runs_size(), 1);
  EXPECT_EQ(listed.runs(0).run_id(), "agent-mtls");
  EXPECT_EQ(listed.runs(0).last_step(), kSteps - 1);
}

// Half a client identity is a configuration error the agent names; the run refuses to start.
TEST(ServerSecurityTest, AgentCertificateWithoutKeyIsRefused) {
  TempDir dir;
  std::string log;
  ASSERT_TRUE(make_certificates(dir, &log)) << "openssl failed:\n" << log;
  const CommandResult half =
      run_process({AMPSCOPE_TRAIN_BINARY, "--steps", "1", "--quiet", "--server",
                   "localhost:1", "--run-id", "half", "--agent",
                   "tls_cert_file=" + (dir / "client.pem").string()},
                  30s);
  EXPECT_NE(half.code, 0);
  EXPECT_NE(half.err.find("tls_cert_file and tls_key_file go together"), std::string::npos)
      << half.err;
  const CommandResult not_pem = run_process(
      {AMPSCOPE_TRAIN_BINARY, "--steps", "1", "--quiet", "--server", "localhost:1", "--run-id",
       "notpem", "--agent", "tls_ca_file=" + (dir / "san.cnf").string()},
      30s);
  EXPECT_NE(not_pem.code, 0);
  EXPECT_NE(not_pem.err.find("tls_ca_file"), std::string::npos) << not_pem.err;
}

// The server's certificate carries only serverAuth: presented as a client certificate it is
// refused (without extended key usages, a certificate is good for either side).
TEST(ServerSecurityTest, TheServersCertificateIsNotAClientCertificate) {
  const auto tls = start_mutual_tls();
  ASSERT_NE(tls, nullptr);
  const TempDir& dir = tls->dir;
  ClientOptions as_server = tls_client(dir, nullptr);
  as_server.tls_cert = read_text(dir / "server.pem");
  as_server.tls_key = read_text(dir / "server.key");
  EXPECT_EQ(list_runs(make_channel(tls->address, as_server), as_server).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  const ClientOptions good = tls_client(dir, &dir);
  EXPECT_TRUE(list_runs(make_channel(tls->address, good), good).ok());
}

// Each TLS file is checked before the server binds anything: the flag, the file and what is
// wrong with it, in one line, exit status 2 (not "cannot bind" after gRPC's own log lines).
TEST(ServerSecurityTest, AWrongTlsFileIsNamedWithTheReason) {
  TempDir dir;
  std::string log;
  ASSERT_TRUE(make_certificates(dir, &log)) << "openssl failed:\n" << log;
  write_text(dir / "empty.pem", "");
  const auto f = [&](const char* name) { return (dir / name).string(); };
  struct Case {
    std::vector<std::string> flags;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--tls-cert", f("server.pem"), "--tls-key", f("client.key")},
       "--tls-key '" + f("client.key") + "': does not match the certificate of --tls-cert '" +
           f("server.pem") + "'"},
      {{"--tls-cert", f("server.pem"), "--tls-key", f("server.pem")},
       "--tls-key '" + f("server.pem") + "': no PEM private key in it (it holds a certificate"},
      {{"--tls-cert", f("server.key"), "--tls-key", f("server.key")},
       "--tls-cert '" + f("server.key") + "': no PEM certificate in it (it holds a private key"},
      {{"--tls-cert", f("server.pem"), "--tls-key", f("server.key"), "--tls-client-ca",
        f("empty.pem")},
       "--tls-client-ca '" + f("empty.pem") + "': no PEM certificate in it (the file is empty)"},
      {{"--tls-cert", f("server.pem"), "--tls-key", f("missing.key")},
       "--tls-key '" + f("missing.key") + "': cannot read it (No such file or directory)"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = {AMPSCOPE_SERVER_BINARY, "--listen",     "127.0.0.1:0",
                                     "--metrics-listen",     "",             "--http-listen",
                                     "",                     "--db",         f("store.db")};
    argv.insert(argv.end(), c.flags.begin(), c.flags.end());
    const CommandResult r = run_process(argv, 30s);
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("cannot bind"), std::string::npos) << r.err;
  }
}

// A private key that group or others may read is served, with a warning naming it.
TEST(ServerSecurityTest, AReadableTlsKeyIsWarnedAbout) {
  TempDir dir;
  std::string log;
  ASSERT_TRUE(make_certificates(dir, &log)) << "openssl failed:\n" << log;
  std::filesystem::permissions(dir / "server.key", std::filesystem::perms::others_read,
                               std::filesystem::perm_options::add);
  ServerProcess server(
      dir.path(), dir / "store.db",
      {"--tls-cert", (dir / "server.pem").string(), "--tls-key", (dir / "server.key").string()});
  EXPECT_NE(server.log().find("--tls-key '" + (dir / "server.key").string() +
                              "': group or others may read it"),
            std::string::npos)
      << server.log();
}

// The CLI warns, as the server does for its token file, when others may read its token.
TEST(ServerSecurityTest, CliWarnsAboutATokenFileOthersMayRead) {
  TempDir dir;
  write_text(dir / "token", std::string(kToken) + "\n");
  ServerProcess server(dir.path(), dir / "store.db",
                       {"--auth-token-file", (dir / "token").string()});
  const std::string token_file = (dir / "token").string();
  auto runs = [&] {
    return run_process({AMPSCOPE_CLI_BINARY, "runs", "--server", server.address(),
                        "--token-file", token_file},
                       30s);
  };
  std::filesystem::permissions(dir / "token", std::filesystem::perms::owner_read |
                                                  std::filesystem::perms::owner_write |
                                                  std::filesystem::perms::others_read);
  const CommandResult readable = runs();
  EXPECT_EQ(readable.code, 0) << readable.err;
  EXPECT_NE(readable.err.find("ampscope: warning: --token-file '" + token_file +
                              "': group or others may read it (mode 604); chmod 600 it"),
            std::string::npos)
      << readable.err;
  std::filesystem::permissions(dir / "token", std::filesystem::perms::owner_read |
                                                  std::filesystem::perms::owner_write);
  const CommandResult private_file = runs();
  EXPECT_EQ(private_file.code, 0) << private_file.err;
  EXPECT_EQ(private_file.err, "");
}

TEST(ServerSecurityTest, ClientCaWithoutTlsIsABadCommandLine) {
  TempDir dir;
  write_text(dir / "ca.pem", "not used\n");
  std::string out;
  const int code = run_to_completion(
      {AMPSCOPE_SERVER_BINARY, "--tls-client-ca", (dir / "ca.pem").string(), "--listen",
       "127.0.0.1:0", "--metrics-listen", "", "--http-listen", "127.0.0.1:0", "--db",
       (dir / "store.db").string()},
      &out);
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("--tls-client-ca needs --tls-cert and --tls-key"), std::string::npos) << out;
}

TEST(ServerSecurityTest, ListensOnLoopbackByDefault) {
  std::string help;
  ASSERT_EQ(run_to_completion({AMPSCOPE_SERVER_BINARY, "--help"}, &help), 0);
  EXPECT_NE(help.find("127.0.0.1:50051"), std::string::npos) << help;
  EXPECT_NE(help.find("127.0.0.1:9464"), std::string::npos) << help;
}

}  // namespace
}  // namespace ampscope::testing
