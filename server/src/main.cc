// ampscope-server: flags -> ServerOptions, then the lifecycle of server.h. SIGTERM and SIGINT
// are blocked in every thread and taken by one dedicated thread with sigwait(), which starts
// the graceful shutdown; nothing runs inside a signal handler.
//
// Exit status: 0 after a clean shutdown, 2 on a bad command line or when the server cannot
// start (store unusable, address in use). A store that fails while serving is waited for.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "ampscope/server/server.h"
#include "flags.h"
#include "log.h"

namespace {

using ampscope::server::ServerOptions;

struct Flags {
  ServerOptions options;
  std::string policy = "observe";
  std::string sync = "full";
  std::string retention_max_age;
  std::string retention_max_bytes;
  std::string retention_interval = "60s";
  std::string max_message_bytes = "16M";
  std::string ingest_queue_bytes = "64M";
  std::string lease_ttl = "10s";
  int test_ingest_item_delay_us = 0;
  std::string shutdown_timeout = "10s";
  std::string http_request_deadline = "10s";
  std::int64_t rank_merge_deadline_ms = 3000;
  std::string ready_file;
  std::string log_level = "info";
  // static-params
  std::optional<double> static_loss_scale;
  std::optional<std::int64_t> static_growth_interval;
  std::optional<double> static_growth_factor;
  std::optional<double> static_backoff_factor;
  std::optional<int> static_hysteresis;
  std::optional<double> static_min_scale;
  std::optional<double> static_max_scale;
};

void add_flags(CLI::App& app, Flags& f) {
  ServerOptions& o = f.options;
  ampscope::policy::EngineConfig& p = o.policy;
  app.add_option("--listen", o.listen, "gRPC address host:port (port 0: any free port)")
      ->capture_default_str();
  app.add_option("--advertise-address", o.advertise_address,
                 "gRPC address host:port that other servers sharing the store send this server's "
                 "agents to (default: --listen with its port, unless --listen is a wildcard)");
  app.add_option("--metrics-listen", o.metrics_listen,
                 "Prometheus /metrics address host:port; empty to turn off")
      ->capture_default_str();
  app.add_option("--http-listen", o.http_listen,
                 "Web UI address host:port (HTTPS with --tls-cert); empty to turn off")
      ->capture_default_str();
  app.add_option("--http-max-connections", o.http_limits.max_connections,
                 "Connections open at once on each HTTP listener (web UI, /metrics); more are "
                 "closed as they come")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--http-max-connections-per-address", o.http_limits.max_connections_per_address,
                 "Connections open at once from one client address on each HTTP listener")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--http-request-deadline", f.http_request_deadline,
                 "An HTTP request (header and body) must arrive whole within this from the "
                 "connection's start or its previous answer, or the connection is cut")
      ->capture_default_str();
  app.add_option("--db", o.db_path,
                 "The store: a SQLite file (created when missing), or PostgreSQL as a "
                 "postgresql:// URI or 'host=... dbname=...' (libpq's forms, sslmode included)")
      ->capture_default_str();
  app.add_option("--db-password-file", o.db_password_file,
                 "PostgreSQL's password, the file's first line (refused when group or others "
                 "may read it); default: libpq's PGPASSWORD, PGPASSFILE or ~/.pgpass");
  app.add_option("--auth-token-file", o.auth_token_file,
                 "Tokens with roles, one 'ROLE TOKEN [RUN_ID_PREFIX]' per line (roles agent, "
                 "reader, admin; a lone bare token is an admin token); calls present theirs as "
                 "'authorization: Bearer <token>', /metrics as the basic-auth password");
  app.add_option("--tls-cert", o.tls_cert_file, "PEM certificate chain; with --tls-key: TLS");
  app.add_option("--tls-key", o.tls_key_file, "PEM private key of --tls-cert");
  app.add_option("--tls-client-ca", o.tls_client_ca_file,
                 "PEM CA certificate(s): require client certificates signed by them (mutual "
                 "TLS; needs --tls-cert)");
  app.add_option("--sync", f.sync,
                 "full: each commit survives power loss; normal: survives a server crash")
      ->check(CLI::IsMember({"full", "normal"}))
      ->capture_default_str();
  app.add_option("--retention-max-age", f.retention_max_age,
                 "Delete reports older than this (30d, 12h, ...); default: keep");
  app.add_option("--retention-max-bytes", f.retention_max_bytes,
                 "Delete the oldest reports while the store holds more (512M, 2G, ...)");
  app.add_option("--retention-interval", f.retention_interval, "How often retention runs")
      ->capture_default_str();
  app.add_option("--max-message-bytes", f.max_message_bytes, "Largest accepted gRPC message")
      ->capture_default_str();
  app.add_option("--ingest-queue-bytes", f.ingest_queue_bytes,
                 "Received report bytes awaiting their commit, over all streams, beyond which the "
                 "server stops reading from agents (they spool)")
      ->capture_default_str();
  app.add_option("--ingest-shards", o.ingest_shards,
                 "Ingest threads, each settling its share of the runs; 0: one per hardware "
                 "thread, at most 8")
      ->capture_default_str();
  app.add_flag("--run-leases", o.run_leases,
               "Several servers share this store (PostgreSQL): each run is owned by one of them "
               "at a time through a lease; the others send its agents to the owner, and take it "
               "over when the owner stops renewing it");
  app.add_option("--lease-ttl", f.lease_ttl,
                 "With --run-leases: a run's lease lasts this long past its owner's last renewal "
                 "(renewed every quarter of it); a dead server's runs move after at most this")
      ->capture_default_str();
  // A test hook (tests/server/backpressure_test.cc), hidden from --help.
  app.add_option("--test-ingest-item-delay-us", f.test_ingest_item_delay_us)->group("");
  app.add_option("--max-in-flight", o.max_in_flight_per_stream,
                 "Reports per stream awaiting their commit before the server stops reading")
      ->capture_default_str();
  app.add_option("--top-k", o.top_k_tensors, "Per-tensor metric series per run")
      ->capture_default_str();
  app.add_option("--metrics-max-runs", o.metrics_max_runs,
                 "Runs exported on /metrics: the most recently active ones (a Hello or a report)")
      ->capture_default_str();
  app.add_option("--rank-merge-deadline-ms", f.rank_merge_deadline_ms,
                 "How long a step of a multi-rank run waits for its missing ranks before it is "
                 "merged without them (partial)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--rank-merge-max-steps", o.rank_merge.max_pending_steps,
                 "Steps per run waiting for their ranks at most; the oldest is merged partial. "
                 "0: as many as 16,384 reports of the run's ranks fill, at least 64")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--shutdown-timeout", f.shutdown_timeout,
                 "Deadline of the graceful shutdown on SIGTERM/SIGINT")
      ->capture_default_str();
  app.add_option("--ready-file", f.ready_file,
                 "Once serving, write {\"grpc\": ..., \"metrics\": ..., \"http\": ..., "
                 "\"pid\": ...} here");
  app.add_option("--log-level", f.log_level, "debug, info, warn or error")
      ->check(CLI::IsMember({"debug", "info", "warn", "error"}))
      ->capture_default_str();

  app.add_option("--policy", f.policy, "Loss-scaler policy: observe, static-params, headroom")
      ->check(CLI::IsMember({"observe", "static-params", "headroom"}))
      ->capture_default_str();
  app.add_option("--policy-lead-steps", p.lead_steps,
                 "Decisions take effect this many steps after the latest step seen")
      ->capture_default_str();
  app.add_option("--headroom-margin", p.headroom.margin_binades,
                 "Binades kept free below the format's overflow")
      ->capture_default_str();
  app.add_option("--headroom-window", p.headroom.window_steps, "Steps of evidence")
      ->capture_default_str();
  app.add_option("--headroom-every", p.headroom.update_every_steps, "Steps between evaluations")
      ->capture_default_str();
  app.add_option("--headroom-raise-after", p.headroom.raise_after_evaluations,
                 "Consecutive evaluations that must agree before raising the scale")
      ->capture_default_str();
  app.add_option("--headroom-min-scale", p.headroom.min_scale, "Lowest scale (power of two)")
      ->capture_default_str();
  app.add_option("--headroom-max-scale", p.headroom.max_scale, "Highest scale (power of two)")
      ->capture_default_str();
  app.add_option("--static-loss-scale", f.static_loss_scale, "static-params: loss scale");
  app.add_option("--static-growth-interval", f.static_growth_interval,
                 "static-params: growth interval (steps)");
  app.add_option("--static-growth-factor", f.static_growth_factor, "static-params: growth factor");
  app.add_option("--static-backoff-factor", f.static_backoff_factor,
                 "static-params: backoff factor");
  app.add_option("--static-hysteresis", f.static_hysteresis, "static-params: hysteresis");
  app.add_option("--static-min-scale", f.static_min_scale, "static-params: minimum scale");
  app.add_option("--static-max-scale", f.static_max_scale, "static-params: maximum scale");
  app.add_flag("--fp32-fallback", p.fp32_fallback.enabled,
               "Recommend FP32 for tensors that keep overflowing or do not fit their format");
  app.add_option("--fp32-window", p.fp32_fallback.window_reports,
                 "FP32 fallback: reports of a tensor considered")
      ->capture_default_str();
  app.add_option("--fp32-min-reports", p.fp32_fallback.min_reports,
                 "FP32 fallback: bad reports within the window that trigger it")
      ->capture_default_str();
  app.add_option("--fp32-max-tensors", p.fp32_fallback.max_tensors,
                 "FP32 fallback: most tensors ever recommended")
      ->capture_default_str();
  ampscope::policy::GemmPrecisionParams& g = p.gemm_precision;
  app.add_flag("--gemm-precision", g.enabled,
               "FP8/FP4 runs: move the GEMMs of layers whose quantisers keep losing values to "
               "BF16 and back, and shorten delayed scaling's amax history on spikes");
  app.add_option("--gemm-window", g.window_reports, "GEMM precision: reported steps of a layer")
      ->capture_default_str();
  app.add_option("--gemm-min-reports", g.min_reports,
                 "GEMM precision: harmful steps within the window that move a layer to BF16")
      ->capture_default_str();
  app.add_option("--gemm-max-underflow", g.max_underflow_share,
                 "GEMM precision: underflowing share of a quantiser's finite values")
      ->capture_default_str();
  app.add_option("--gemm-max-saturated", g.max_saturated_share,
                 "GEMM precision: saturated and overflowed share of its finite values")
      ->capture_default_str();
  app.add_option("--gemm-sqnr-margin", g.sqnr_margin_db,
                 "GEMM precision: dB below the element format's nominal SQNR")
      ->capture_default_str();
  app.add_option("--gemm-max-bf16-share", g.max_bf16_share,
                 "GEMM precision: most layers in BF16, as a share of the layers seen")
      ->capture_default_str();
  app.add_option("--gemm-promote-reports", g.promote_reports,
                 "GEMM precision: clean what-if steps before a layer returns to the recipe")
      ->capture_default_str();
  app.add_option("--gemm-promote-factor", g.promote_factor,
                 "GEMM precision: the limits' factor for the return (stricter, <= 1)")
      ->capture_default_str();
  app.add_option("--gemm-min-dwell", g.min_dwell_steps,
                 "GEMM precision: fewest steps a layer stays in BF16")
      ->capture_default_str();
  app.add_option("--gemm-spike-reports", g.spike_reports,
                 "GEMM precision: delayed-scaling spikes within the window that change it")
      ->capture_default_str();
  app.add_option("--gemm-max-amax-margin", g.max_amax_margin,
                 "GEMM precision: highest delayed-scaling margin it sets (binades)")
      ->capture_default_str();
  app.add_option("--gemm-min-loss-cost", g.min_loss_cost,
                 "GEMM precision: loss cost (nats per step, first order) that moves a layer "
                 "reporting one to BF16")
      ->capture_default_str();
  app.add_option("--gemm-loss-cost-reports", g.loss_cost_reports,
                 "GEMM precision: measured steps a layer's loss cost is averaged over")
      ->capture_default_str();
  app.add_option("--gemm-loss-cost-z", g.loss_cost_z,
                 "GEMM precision: standard errors the mean loss cost must clear the limit by")
      ->capture_default_str();
}

// Turns the parsed strings into options; throws ampscope::Error naming the flag.
void finish_options(Flags& f) {
  using ampscope::server::parse_bytes;
  using ampscope::server::parse_duration;
  ServerOptions& o = f.options;
  o.policy.mode = *ampscope::policy::parse_mode(f.policy);
  ampscope::policy::ScalerSettings& st = o.policy.static_params;
  st.loss_scale = f.static_loss_scale;
  st.growth_interval = f.static_growth_interval;
  st.growth_factor = f.static_growth_factor;
  st.backoff_factor = f.static_backoff_factor;
  st.hysteresis = f.static_hysteresis;
  st.min_scale = f.static_min_scale;
  st.max_scale = f.static_max_scale;
  o.sync_full = f.sync == "full";
  if (!f.retention_max_age.empty()) {
    o.retention_max_age = std::chrono::duration_cast<std::chrono::seconds>(
        parse_duration(f.retention_max_age, "--retention-max-age"));
  }
  if (!f.retention_max_bytes.empty()) {
    o.retention_max_bytes = parse_bytes(f.retention_max_bytes, "--retention-max-bytes");
  }
  o.retention_interval = parse_duration(f.retention_interval, "--retention-interval");
  o.lease_ttl = parse_duration(f.lease_ttl, "--lease-ttl");
  o.http_limits.request_deadline =
      parse_duration(f.http_request_deadline, "--http-request-deadline");
  if (o.http_limits.request_deadline.count() < 100) {
    throw ampscope::Error("--http-request-deadline '" + f.http_request_deadline +
                          "': must be at least 100ms");
  }
  if (o.retention_interval.count() < 100) {
    throw ampscope::Error("--retention-interval: must be at least 100ms");
  }
  o.rank_merge.deadline = std::chrono::milliseconds(f.rank_merge_deadline_ms);
  o.max_message_bytes = parse_bytes(f.max_message_bytes, "--max-message-bytes");
  o.ingest_queue_bytes = parse_bytes(f.ingest_queue_bytes, "--ingest-queue-bytes");
  o.test_ingest_item_delay = std::chrono::microseconds(f.test_ingest_item_delay_us);
  if (o.max_message_bytes < 1024 || o.max_message_bytes > (1u << 30)) {
    throw ampscope::Error("--max-message-bytes: must be in [1K, 1G]");
  }
  ampscope::server::LogLevel level = ampscope::server::LogLevel::kInfo;
  if (f.log_level == "debug") level = ampscope::server::LogLevel::kDebug;
  if (f.log_level == "warn") level = ampscope::server::LogLevel::kWarning;
  if (f.log_level == "error") level = ampscope::server::LogLevel::kError;
  ampscope::server::set_log_level(level);
#ifdef AMPSCOPE_VERSION
  o.version = AMPSCOPE_VERSION;
#endif
}

void write_ready_file(const std::string& path, const ampscope::server::BoundAddresses& a) {
  // Written to a temporary name and renamed, so a reader never sees half a file.
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << "{\"grpc\": \"" << a.grpc << "\", \"metrics\": \"" << a.metrics << "\", \"http\": \""
        << a.http << "\", \"pid\": " << ::getpid() << "}\n";
    if (!out) throw ampscope::Error("--ready-file '" + path + "': cannot write it");
  }
  std::filesystem::rename(tmp, path);
}

int fail(const std::string& message, int code) {
  std::cerr << "ampscope-server: " << message << std::endl;
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  // Before any thread exists, so that every thread inherits the mask and only the signal
  // thread ever sees these signals.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  CLI::App app{
      "ampscope-server: receives agents' telemetry, stores it, exports Prometheus "
      "metrics and decides loss-scaler policy"};
  Flags flags;
  flags.options.http_listen = "127.0.0.1:9465";  // the library's default is off
  add_flags(app, flags);
  app.set_version_flag("--version", std::string("ampscope-server ") +
#ifdef AMPSCOPE_VERSION
                                        AMPSCOPE_VERSION
#else
                                        "dev"
#endif
  );
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  std::unique_ptr<ampscope::server::Server> server;
  std::chrono::milliseconds shutdown_timeout{};
  try {
    finish_options(flags);
    shutdown_timeout =
        ampscope::server::parse_duration(flags.shutdown_timeout, "--shutdown-timeout");
    server = ampscope::server::Server::create(flags.options);
    const ampscope::server::BoundAddresses bound = server->start();
    if (!flags.ready_file.empty()) write_ready_file(flags.ready_file, bound);
  } catch (const std::exception& e) {
    return fail(e.what(), 2);
  }

  // The server stops only here: wait() returns once the shutdown this thread started ends.
  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    ampscope::server::log_info("received ", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    server->shutdown(shutdown_timeout);
  });
  server->wait();
  signal_thread.join();
  server.reset();
  return 0;
}
