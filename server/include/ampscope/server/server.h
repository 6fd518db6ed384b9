// ampscope-server as a library: the gRPC services (Telemetry.Attach, Query, health), the store,
// the ingest thread, the policy engines, the Prometheus exporter and the web UI, with an explicit
// lifecycle:
//
//   auto server = Server::create(options);   // opens and migrates the store, restores state
//   BoundAddresses a = server->start();      // binds (port 0 picks a free port), serves
//   server->shutdown(deadline);              // graceful: refuse new streams, drain the open
//                                            // ones, commit, stop; cancels what is left at
//                                            // the deadline
//   server->wait();                          // until shutdown has completed
//
// Thread safety: shutdown() may be called from any thread (the signal thread), once or more;
// the other members from the owning thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "ampscope/policy/policy_engine.h"

namespace ampscope::server {

class RunOwnership;

// Bounds of each HTTP listener (the web UI's, /metrics'): a connection costs memory, never a
// thread, so these bound the memory and the file descriptors that clients can hold.
struct HttpLimits {
  std::size_t max_connections = 1024;            // open at once; more are closed at accept
  std::size_t max_connections_per_address = 64;  // from one client address
  // A request's header and body must arrive within this from the connection's start (or the
  // previous answer on a kept-alive one), however slowly they trickle in: a slow client is cut.
  std::chrono::milliseconds request_deadline{10000};
};

struct ServerOptions {
  std::string listen = "127.0.0.1:50051";  // gRPC; port 0: any free port
  // The gRPC address agents are told to reach this server at (host:port), when another server
  // redirects them here; empty: `listen` with its bound port, unless `listen` is a wildcard
  // (0.0.0.0, [::]), then unknown.
  std::string advertise_address;
  std::string metrics_listen = "127.0.0.1:9464";  // Prometheus /metrics; empty: off
  // The store: a SQLite file (created when missing), or a PostgreSQL connection string (a
  // postgresql:// URI or "host=... dbname=..."; docs/server.md).
  std::string db_path = "ampscope.db";
  // PostgreSQL's password, first line of this file (refused when group or others may read it);
  // empty: libpq's PGPASSWORD, PGPASSFILE or ~/.pgpass.
  std::string db_password_file;
  // The web UI (HTTP, HTTPS with the TLS options below); empty: off. The binary's flag
  // defaults to 127.0.0.1:9465; off here, so that servers made in a test open no extra port.
  std::string http_listen;
  // Tokens with roles (agent, reader, admin), one "ROLE TOKEN [RUN_ID_PREFIX]" per line; a
  // file holding only a bare token holds one admin token. Empty: no authentication.
  std::string auth_token_file;
  std::string tls_cert_file;  // both set: TLS; both empty: plaintext
  std::string tls_key_file;
  // With TLS: the PEM CA certificates that client certificates must be signed by (mutual TLS);
  // a client without one is refused at the handshake. Empty: no client certificate asked for.
  std::string tls_client_ca_file;
  HttpLimits http_limits;                      // each of the web UI's and /metrics' listeners
  bool sync_full = true;                       // fsync every group commit
  std::size_t max_message_bytes = 16u << 20;   // per gRPC message
  std::size_t max_in_flight_per_stream = 256;  // reports awaiting commit per stream
  // Wire bytes of received reports not yet committed, over all streams, beyond which the
  // server stops reading from agents (docs/server.md, "Back-pressure").
  std::uint64_t ingest_queue_bytes = 64u << 20;
  // Ingest threads; each run is settled by one of them (docs/server.md, "Ingest shards").
  // 0: one per hardware thread, at most 8.
  std::size_t ingest_shards = 0;
  // A test hook: an ingest transaction waits this long per item before its commit.
  std::chrono::microseconds test_ingest_item_delay{0};
  std::size_t top_k_tensors = 20;             // per-tensor metric series per run
  std::size_t metrics_max_runs = 100;         // runs with series: the most recently active
  std::chrono::seconds retention_max_age{0};  // 0: keep forever
  std::uint64_t retention_max_bytes = 0;      // 0: no size limit
  std::chrono::milliseconds retention_interval{60000};
  std::chrono::milliseconds policy_snapshot_interval{5000};
  // Multi-rank runs: how long a step waits for its missing ranks, and how many steps per run
  // may wait, before they are merged without them.
  struct RankMerge {
    std::chrono::milliseconds deadline{3000};
    std::size_t max_pending_steps = 0;  // 0: 16,384 reports' worth, at least 64 steps
  } rank_merge;
  policy::EngineConfig policy;  // validated by create()
  // Servers sharing one store (PostgreSQL): each run is owned by one server at a time through
  // a lease row that expires `lease_ttl` after its owner's last renewal (every quarter of it);
  // a server that dies leaves its runs to another after at most that (docs/deploy.md).
  bool run_leases = false;
  std::chrono::milliseconds lease_ttl{10000};
  // Which runs this server owns, among servers that share a store (an internal interface,
  // the server's cluster/run_ownership.h); null: every run, as a server alone does. Tests set
  // a stand-in that sends some runs elsewhere. Set, it takes the place of run_leases.
  std::shared_ptr<RunOwnership> ownership;
  std::string version = "0.0.0";
};

struct BoundAddresses {
  std::string grpc;        // host:port actually bound
  std::string metrics;     // host:port, empty when off
  std::string http;        // the web UI's host:port, empty when off
  std::string advertised;  // what agents are told (ServerOptions::advertise_address); may be empty
};

class Server {
 public:
  // Throws ampscope::Error with a one-line reason (bad option, store unusable).
  static std::unique_ptr<Server> create(ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Throws ampscope::Error when an address cannot be bound.
  BoundAddresses start();
  void shutdown(std::chrono::milliseconds deadline);
  // Blocks until shutdown() finished.
  void wait();

 private:
  struct Impl;
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ampscope::server
