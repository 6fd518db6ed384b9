#include "ampscope/agent/config.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <fstream>

#include "ampscope/proto/target.h"
#include "ampscope/testing/files.h"

namespace ampscope::agent {
namespace {

TEST(AgentConfigTest, SetsOptionsByKey) {
  AgentConfig c;
  EXPECT_EQ(set_option(c, "server", "127.0.0.1:7"), "");
  EXPECT_EQ(set_option(c, "run-id", "r1"), "");
  EXPECT_EQ(set_option(c, "spool_max_bytes", "2M"), "");
  EXPECT_EQ(set_option(c, "sample_full_every", "25"), "");
  EXPECT_EQ(set_option(c, "sample_counts", "off"), "");
  EXPECT_EQ(set_option(c, "sample_count_roles", "weight_grad, loss"), "");
  EXPECT_EQ(set_option(c, "stats_thread", "worker"), "");
  EXPECT_EQ(c.server, "127.0.0.1:7");
  EXPECT_EQ(c.run_id, "r1");
  EXPECT_EQ(c.spool_max_bytes, 2u << 20);
  EXPECT_EQ(c.sampling.full_every, 25);
  EXPECT_FALSE(c.sampling.counts);
  EXPECT_EQ(c.sampling.count_roles,
            (std::vector<TensorRole>{TensorRole::kWeightGrad, TensorRole::kLoss}));
  EXPECT_EQ(c.stats_thread, StatsThread::kWorker);
  EXPECT_EQ(validate(c), "");
}

TEST(AgentConfigTest, BadValuesNameTheKeyAndChangeNothing) {
  AgentConfig c;
  EXPECT_NE(set_option(c, "sample_full_every", "-1").find("sample_full_every"), std::string::npos);
  EXPECT_NE(set_option(c, "sample_count_roles", "weights").find("roles"), std::string::npos);
  EXPECT_NE(set_option(c, "keepalive_time_ms", "1000").find("10000"), std::string::npos);
  EXPECT_NE(set_option(c, "frobnicate", "1").find("unknown"), std::string::npos);
  EXPECT_EQ(c.sampling.full_every, AgentConfig{}.sampling.full_every);
}

TEST(AgentConfigTest, ASizeWhoseSuffixOverflowsIsRefused) {
  // -(2^63 - 1) * 1024 does not fit in 64 bits (it used to wrap to 1024, inside [0, 1T]).
  AgentConfig c;
  const std::uint64_t before = c.worker_max_bytes;
  EXPECT_NE(set_option(c, "worker_max_bytes", "-9223372036854775807K"), "");
  EXPECT_NE(set_option(c, "worker_max_bytes", "-9007199254740993K"), "");
  EXPECT_EQ(c.worker_max_bytes, before);
  EXPECT_EQ(set_option(c, "worker_max_bytes", "2K"), "");
  EXPECT_EQ(c.worker_max_bytes, 2048u);
}

TEST(AgentConfigTest, ReadsTheEnvironment) {
  ampscope::testing::TempDir dir;
  const auto token = dir / "token";
  std::ofstream(token) << "s3cret\n";
  setenv("AMPSCOPE_SERVER", "localhost:9", 1);
  setenv("AMPSCOPE_RUN_ID", "env-run", 1);
  setenv("AMPSCOPE_TOKEN_FILE", token.c_str(), 1);
  setenv("AMPSCOPE_SAMPLE_FULL_EVERY", "7", 1);
  AgentConfig c;
  const std::string err = apply_environment(c);
  unsetenv("AMPSCOPE_SERVER");
  unsetenv("AMPSCOPE_RUN_ID");
  unsetenv("AMPSCOPE_TOKEN_FILE");
  unsetenv("AMPSCOPE_SAMPLE_FULL_EVERY");
  EXPECT_EQ(err, "");
  EXPECT_EQ(c.server, "localhost:9");
  EXPECT_EQ(c.run_id, "env-run");
  EXPECT_EQ(c.token, "s3cret");
  EXPECT_EQ(c.sampling.full_every, 7);
}

TEST(AgentConfigTest, ABadVariableIsNamed) {
  setenv("AMPSCOPE_SAMPLE_COUNTS", "maybe", 1);
  AgentConfig c;
  const std::string err = apply_environment(c);
  unsetenv("AMPSCOPE_SAMPLE_COUNTS");
  EXPECT_NE(err.find("AMPSCOPE_SAMPLE_COUNTS"), std::string::npos) << err;
}

TEST(AgentConfigTest, LockstepIsOffByDefaultAndSetLikeEveryOption) {
  AgentConfig c;
  EXPECT_FALSE(c.policy_lockstep);
  EXPECT_EQ(c.policy_lockstep_timeout, std::chrono::milliseconds(10000));
  EXPECT_EQ(set_option(c, "policy_lockstep", "on"), "");
  EXPECT_EQ(set_option(c, "policy-lockstep-timeout-ms", "2500"), "");
  EXPECT_TRUE(c.policy_lockstep);
  EXPECT_EQ(c.policy_lockstep_timeout, std::chrono::milliseconds(2500));
  // Never unbounded, never zero.
  EXPECT_NE(set_option(c, "policy_lockstep_timeout_ms", "0").find("policy_lockstep_timeout_ms"),
            std::string::npos);
  EXPECT_NE(set_option(c, "policy_lockstep", "sometimes").find("policy_lockstep"),
            std::string::npos);
  EXPECT_EQ(c.policy_lockstep_timeout, std::chrono::milliseconds(2500));

  setenv("AMPSCOPE_POLICY_LOCKSTEP", "off", 1);
  setenv("AMPSCOPE_POLICY_LOCKSTEP_TIMEOUT_MS", "700", 1);
  const std::string err = apply_environment(c);
  unsetenv("AMPSCOPE_POLICY_LOCKSTEP");
  unsetenv("AMPSCOPE_POLICY_LOCKSTEP_TIMEOUT_MS");
  EXPECT_EQ(err, "");
  EXPECT_FALSE(c.policy_lockstep);
  EXPECT_EQ(c.policy_lockstep_timeout, std::chrono::milliseconds(700));
  const auto& keys = option_keys();
  EXPECT_NE(std::find(keys.begin(), keys.end(), "policy_lockstep"), keys.end());
}

TEST(AgentConfigTest, ValidateNamesTheField) {
  AgentConfig c;
  EXPECT_NE(validate(c).find("run_id"), std::string::npos);
  c.run_id = "bad id!";
  EXPECT_NE(validate(c).find("run_id"), std::string::npos);
  c.run_id = "ok";
  c.rank = 2;
  c.world_size = 2;
  EXPECT_NE(validate(c).find("rank"), std::string::npos);
  c.rank = 0;
  c.server = "nohostport";
  EXPECT_NE(validate(c).find("server"), std::string::npos);
  c.server.clear();
  c.flight_recorder_bytes = std::uint64_t{9} << 20;  // set in code, past what set_option takes
  EXPECT_NE(validate(c).find("flight_recorder_bytes"), std::string::npos);
}

// A port that is not a port would have the agent retry forever: every door refuses it here.
TEST(AgentConfigTest, ServerIsHostAndPortOrAGrpcUri) {
  AgentConfig c;
  c.run_id = "ok";
  for (const char* good :
       {"127.0.0.1:50051", "localhost:1", "[::1]:65535", "a.b:50051", "dns:///a.example:443",
        "ipv4:127.0.0.1:9", "unix:/tmp/sock", "unix-abstract:ampscope"}) {
    c.server = good;
    EXPECT_EQ(validate(c), "") << good;
  }
  for (const char* bad : {"localhost", "127.0.0.1:notaport", "127.0.0.1:0", "127.0.0.1:65536",
                          ":50051", "127.0.0.1:", "[::1]", "host:50051x", "dns:///a.example"}) {
    c.server = bad;
    const std::string why = validate(c);
    EXPECT_EQ(why.rfind("server: expected host:port", 0), 0u) << bad << ": " << why;
  }
}

// Several servers: each entry is checked as one address, and a bad one is named by its place.
TEST(AgentConfigTest, ServerListChecksEveryEntry) {
  AgentConfig c;
  c.run_id = "ok";
  for (const char* good : {"a:50051,b:50051", "127.0.0.1:1, [::1]:2 ,dns:///c.example:443",
                           "unix:/tmp/sock,localhost:9"}) {
    EXPECT_EQ(set_option(c, "server", good), "") << good;
    EXPECT_EQ(validate(c), "") << good;
  }
  EXPECT_EQ(proto::split_targets("a:1, b:2 ,dns:///c:3"),
            (std::vector<std::string>{"a:1", "b:2", "dns:///c:3"}));
  const std::pair<const char*, const char*> bad[] = {
      {"a:50051,b", "server: entry 2 of 2: expected host:port, got 'b'"},
      {"a:0,b:1", "server: entry 1 of 2: expected host:port with a port in 1..65535, got 'a:0'"},
      {"a:1,,b:2", "server: entry 2 of 3: empty (a list is host:port,host:port,...)"},
      {"a:1,", "server: entry 2 of 2: empty (a list is host:port,host:port,...)"},
      {" ", "server: empty (a list is host:port,host:port,...)"},
  };
  for (const auto& [list, why] : bad) {
    c.server = list;
    EXPECT_EQ(validate(c), why) << list;
  }
}

TEST(AgentConfigTest, FlightRecorderOptionsAndBounds) {
  AgentConfig c;
  EXPECT_EQ(c.flight_recorder_steps, 16u);
  EXPECT_EQ(c.flight_recorder_bytes, std::uint64_t{4} << 20);
  EXPECT_TRUE(c.flight_recorder_roles.empty());
  EXPECT_EQ(set_option(c, "flight_recorder_steps", "64"), "");
  EXPECT_EQ(set_option(c, "flight-recorder-bytes", "2M"), "");
  EXPECT_EQ(set_option(c, "flight_recorder_roles", "weight_grad,activation"), "");
  EXPECT_EQ(c.flight_recorder_steps, 64u);
  EXPECT_EQ(c.flight_recorder_bytes, std::uint64_t{2} << 20);
  EXPECT_EQ(c.flight_recorder_roles,
            (std::vector<TensorRole>{TensorRole::kWeightGrad, TensorRole::kActivation}));
  EXPECT_NE(set_option(c, "flight_recorder_steps", "1025"), "");
  EXPECT_NE(set_option(c, "flight_recorder_bytes", "9M"), "");
  EXPECT_EQ(c.flight_recorder_steps, 64u);  // unchanged on failure
}

// Token and certificate files: read whole (up to 1 MiB), PEM checked, TLS turned on; a path
// like /dev/zero or a file that is not PEM is refused and changes nothing.
TEST(AgentConfigTest, TokenAndTlsFiles) {
  testing::TempDir dir;
  testing::write_text(dir / "token", "  tok-123  \nsecond line\n");
  testing::write_text(dir / "ca.pem",
                      "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n");
  testing::write_text(dir / "plain.txt", "not a certificate\n");
  AgentConfig c;
  EXPECT_EQ(set_option(c, "token_file", (dir / "token").string()), "");
  EXPECT_EQ(c.token, "tok-123");
  EXPECT_FALSE(c.tls);
  EXPECT_EQ(set_option(c, "tls_ca_file", (dir / "ca.pem").string()), "");
  EXPECT_TRUE(c.tls);
  EXPECT_NE(c.tls_ca_pem.find("MIIB"), std::string::npos);

  AgentConfig d;
  EXPECT_NE(set_option(d, "tls_ca_file", (dir / "plain.txt").string()).find("tls_ca_file"),
            std::string::npos);
  EXPECT_NE(set_option(d, "tls_cert_file", "/dev/zero"), "");
  EXPECT_NE(set_option(d, "token_file", "/dev/zero"), "");
  EXPECT_NE(set_option(d, "tls_key_file", (dir / "missing.pem").string()), "");
  EXPECT_FALSE(d.tls);
  EXPECT_TRUE(d.token.empty());

  d.run_id = "ok";
  EXPECT_EQ(set_option(d, "tls_cert_file", (dir / "ca.pem").string()), "");
  EXPECT_NE(validate(d).find("tls_cert_file and tls_key_file go together"), std::string::npos);
  EXPECT_EQ(set_option(d, "tls_key_file", (dir / "ca.pem").string()), "");
  EXPECT_EQ(validate(d), "");
}

}  // namespace
}  // namespace ampscope::agent
