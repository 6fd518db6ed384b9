// Wiring and lifecycle of ampscope-server (server.h).
#include "ampscope/server/server.h"

#include <grpcpp/ext/health_check_service_server_builder_option.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <condition_variable>
#include <thread>

#include "auth.h"
#include "http_listener.h"
#include "ingest.h"
#include "lease_ownership.h"
#include "log.h"
#include "metrics.h"
#include "metrics_endpoint.h"
#include "policy_host.h"
#include "query_service.h"
#include "run_ownership.h"
#include "run_registry.h"
#include "store.h"
#include "streams.h"
#include "telemetry_service.h"
#include "tls_files.h"
#include "web_routes.h"
#include "webui_api.h"

namespace ampscope::server {
namespace {

// "127.0.0.1:0" + 41234 -> "127.0.0.1:41234"
std::string with_port(const std::string& address, int port) {
  const auto colon = address.rfind(':');
  return (colon == std::string::npos ? address : address.substr(0, colon)) + ":" +
         std::to_string(port);
}

// The service names the health service answers for, besides "" (the whole server).
constexpr const char* kServiceNames[] = {"ampscope.v1.Telemetry", "ampscope.v1.Query"};

}  // namespace

struct Server::Impl {
  ServerOptions options;
  Authenticator auth;
  TlsFiles tls;  // read and checked once, at create()
  std::unique_ptr<Metrics> metrics;
  // After metrics: a run's series are removed from the families when the registry goes.
  std::unique_ptr<RunRegistry> runs;
  std::unique_ptr<StoreWriter> store;
  std::unique_ptr<StoreReader> reader;
  std::unique_ptr<Checkpointer> checkpointer;
  std::unique_ptr<PolicyHost> policy;
  std::shared_ptr<RunOwnership> ownership;
  StreamTable streams;
  std::unique_ptr<Ingest> ingest;
  std::unique_ptr<TelemetryService> telemetry;
  std::unique_ptr<QueryService> query;
  std::unique_ptr<grpc::Server> grpc_server;
  std::unique_ptr<MetricsEndpoint> metrics_endpoint;
  std::unique_ptr<HttpListener> metrics_http;  // after the endpoint it calls
  // Destroyed in reverse order: the listener before the WebApi it calls, both before the store,
  // the registry and the streams they read.
  std::unique_ptr<WebApi> web_api;
  std::unique_ptr<WebRoutes> web_routes;
  std::unique_ptr<HttpListener> http;

  std::mutex mu;
  std::condition_variable cv;
  bool started = false;
  bool stopping = false;
  bool stopped = false;

  Impl(ServerOptions o, Authenticator a) : options(std::move(o)), auth(std::move(a)) {}
};

std::unique_ptr<Server> Server::create(ServerOptions options) {
  if (std::string why = policy::validate(options.policy); !why.empty()) {
    throw Error("--policy: " + why);
  }
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    throw Error("--tls-cert and --tls-key go together: give both or neither");
  }
  if (!options.tls_client_ca_file.empty() && options.tls_cert_file.empty()) {
    throw Error("--tls-client-ca needs --tls-cert and --tls-key: mutual TLS is TLS first");
  }
  if (options.max_in_flight_per_stream == 0) throw Error("--max-in-flight: must be >= 1");
  if (options.ingest_queue_bytes < (1u << 20)) throw Error("--ingest-queue-bytes: must be >= 1M");
  if (options.ingest_shards > kMaxIngestShards) {
    throw Error("--ingest-shards: must be at most " + std::to_string(kMaxIngestShards));
  }
  if (options.metrics_max_runs == 0) throw Error("--metrics-max-runs: must be >= 1");
  if (std::string why = check_advertise_address(options.advertise_address); !why.empty()) {
    throw Error("--advertise-address: " + why);
  }
  Authenticator auth(options.auth_token_file.empty() ? std::vector<TokenGrant>()
                                                     : read_token_file(options.auth_token_file));
  TlsFiles tls;
  if (!options.tls_cert_file.empty()) {
    tls = load_tls_files(options.tls_cert_file, options.tls_key_file, options.tls_client_ca_file);
  }
  auto impl = std::make_unique<Impl>(std::move(options), std::move(auth));
  impl->tls = std::move(tls);
  const ServerOptions& o = impl->options;
  const StoreOptions store{
      o.db_path, o.sync_full,
      o.db_password_file.empty() ? std::string() : read_password_file(o.db_password_file)};
  impl->store = std::make_unique<StoreWriter>(store);  // first: it migrates the schema
  if (o.ownership) {
    impl->ownership = o.ownership;
  } else if (o.run_leases) {
    if (o.advertise_address.empty() && advertised_address("", o.listen, o.listen).empty()) {
      throw Error(
          "--run-leases: other servers must be able to send agents here: give "
          "--advertise-address (--listen is a wildcard)");
    }
    const auto ttl = o.lease_ttl;
    if (ttl < std::chrono::milliseconds(300)) throw Error("--lease-ttl: must be at least 300ms");
    impl->ownership = std::make_shared<LeaseOwnership>(
        [store] { return open_store(store, StoreRole::kWriter); },
        LeaseOwnership::Options{o.advertise_address, ttl, ttl / 4});
  } else {
    impl->ownership = std::make_shared<SingleServerOwnership>();
  }
  impl->metrics = std::make_unique<Metrics>(o.version);
  impl->runs = std::make_unique<RunRegistry>(
      o.metrics_max_runs, MergeOptions{o.rank_merge.deadline, o.rank_merge.max_pending_steps},
      resolve_ingest_shards(o.ingest_shards));
  impl->reader = std::make_unique<StoreReader>(store);
  impl->policy = std::make_unique<PolicyHost>(o.policy, o.policy_snapshot_interval, *impl->runs);
  IngestOptions io;
  io.retention_interval = o.retention_interval;
  io.retention_max_age_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(o.retention_max_age).count();
  io.retention_max_bytes = o.retention_max_bytes;
  io.top_k = o.top_k_tensors;
  io.max_queued_bytes = o.ingest_queue_bytes;
  io.test_item_delay = o.test_ingest_item_delay;
  io.ownership = impl->ownership.get();
  impl->ingest = std::make_unique<Ingest>(*impl->store, *impl->runs, *impl->metrics, *impl->policy,
                                          impl->streams, io);
  impl->ingest->restore();
  impl->ownership->on_lost([ingest = impl->ingest.get()](const std::string& run_id, bool taken) {
    ingest->drop_run(run_id, taken);
  });
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() {
  bool need_shutdown = false;
  {
    std::lock_guard lock(impl_->mu);
    need_shutdown = impl_->started && !impl_->stopping;
  }
  if (need_shutdown) shutdown(std::chrono::milliseconds(0));
  route_grpc_log({});  // its refusal counter is ours
  if (impl_->ingest) impl_->ingest->stop();
}

BoundAddresses Server::start() {
  Impl& s = *impl_;
  const ServerOptions& o = s.options;
  s.checkpointer = std::make_unique<Checkpointer>(o.db_path, std::chrono::milliseconds(500));
  s.ingest->start();

  AttachReactor::Deps attach{s.ingest.get(), &s.streams, s.metrics.get(),
                             o.max_in_flight_per_stream};
  attach.ownership = s.ownership.get();
  s.telemetry = std::make_unique<TelemetryService>(attach, s.auth);
  s.query =
      std::make_unique<QueryService>(*s.reader, s.streams, *s.runs, *s.ingest, s.auth, *s.metrics);

  std::shared_ptr<grpc::ServerCredentials> creds;
  if (!o.tls_cert_file.empty()) {
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({s.tls.key_pem, s.tls.cert_pem});
    if (!o.tls_client_ca_file.empty()) {
      ssl.pem_root_certs = s.tls.client_ca_pem;
      ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
    }
    creds = grpc::SslServerCredentials(ssl);
  } else {
    creds = grpc::InsecureServerCredentials();
  }

  // gRPC's log lines into ours; a refused TLS handshake counts as a refused caller.
  route_grpc_log([metrics = s.metrics.get()] { metrics->auth_failure(AuthSurface::grpc); });
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(o.listen, creds, &port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(o.max_message_bytes));
  // Keepalive (gRPC's doc/keepalive.md): the server pings idle connections every
  // 60 s and accepts client pings down to every 10 s, also without calls, so agents that ping
  // at 10 s or slower never get GOAWAY "too_many_pings".
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 60000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 2);
  builder.RegisterService(s.telemetry.get());
  builder.RegisterService(s.query.get());
  s.grpc_server = builder.BuildAndStart();
  if (!s.grpc_server || port == 0) {
    s.ingest->stop();
    throw Error("--listen '" + o.listen + "': cannot bind (address in use or invalid)");
  }
  if (grpc::HealthCheckServiceInterface* health = s.grpc_server->GetHealthCheckService()) {
    health->SetServingStatus(true);
    for (const char* name : kServiceNames) health->SetServingStatus(name, true);
  }

  BoundAddresses bound;
  bound.grpc = with_port(o.listen, port);
  bound.advertised = advertised_address(o.advertise_address, o.listen, bound.grpc);
  s.ownership->advertise(bound.advertised);
  // Each connection is a file descriptor: the listeners' bounds need more than the usual
  // soft limit of 1024.
  const std::uint64_t files = raise_open_file_limit();
  const std::size_t listeners =
      (o.metrics_listen.empty() ? 0 : 1) + (o.http_listen.empty() ? 0 : 1);
  if (files < listeners * o.http_limits.max_connections + 256) {
    log_warning("the open-file limit (", files, ") is below what ", listeners,
                " HTTP listener(s) of --http-max-connections ", o.http_limits.max_connections,
                " need: raise it (ulimit -n) or lower the flag");
  }
  const auto fail = [&s] {
    s.http.reset();
    s.metrics_http.reset();
    s.grpc_server->Shutdown();
    s.ingest->stop();
  };
  // A listener that cannot start stops what already started before the error goes up.
  const auto start_listener = [&fail](HttpOptions http, HttpListener::Handler handler) {
    try {
      return std::make_unique<HttpListener>(std::move(http), std::move(handler));
    } catch (const std::exception&) {
      fail();
      throw;
    }
  };
  if (!o.metrics_listen.empty()) {
    s.metrics_endpoint = std::make_unique<MetricsEndpoint>(
        s.metrics->registry(), s.auth,
        [m = s.metrics.get()] { m->auth_failure(AuthSurface::metrics); });
    HttpOptions http;
    http.listen = o.metrics_listen;
    http.flag = "--metrics-listen";
    http.name = "/metrics";
    http.limits = o.http_limits;
    http.workers = 2;
    s.metrics_http = start_listener(
        std::move(http),
        [e = s.metrics_endpoint.get()](const HttpRequest& req) { return e->handle(req); });
    bound.metrics = s.metrics_http->address();
  }
  if (!o.http_listen.empty()) {
    s.web_api = std::make_unique<WebApi>(*s.reader, s.streams, *s.runs);
    Metrics* metrics = s.metrics.get();
    s.web_routes = std::make_unique<WebRoutes>(s.auth, *s.web_api, WebSessions::Clock(), [metrics] {
      metrics->auth_failure(AuthSurface::webui);
    });
    HttpOptions http;
    http.listen = o.http_listen;
    http.tls_cert_pem = s.tls.cert_pem;
    http.tls_key_pem = s.tls.key_pem;
    http.tls_client_ca_pem = s.tls.client_ca_pem;
    http.limits = o.http_limits;
    http.default_headers = web_security_headers();
    http.on_tls_refusal = [metrics] { metrics->auth_failure(AuthSurface::webui); };
    s.http = start_listener(std::move(http), [r = s.web_routes.get()](const HttpRequest& req) {
      return r->handle(req);
    });
    bound.http = s.http->address();
  }
  {
    std::lock_guard lock(s.mu);
    s.started = true;
  }
  const char* transport = o.tls_cert_file.empty()        ? " (plaintext)"
                          : o.tls_client_ca_file.empty() ? " (TLS)"
                                                         : " (mutual TLS)";
  log_info("serving: grpc ", bound.grpc, transport,
           s.auth.enabled() ? ", tokens required" : ", no tokens: every call allowed",
           bound.metrics.empty() ? "" : ", metrics http://" + bound.metrics + "/metrics",
           bound.http.empty() ? ""
           : s.http->tls()    ? ", web UI https://" + bound.http + "/"
                              : ", web UI http://" + bound.http + "/",
           ", store ", printable_location(o.db_path), ", policy ", s.policy->mode_name(),
           bound.advertised.empty() ? ", no address advertised (--listen is a wildcard)"
                                    : ", advertised to agents as " + bound.advertised);
  return bound;
}

void Server::shutdown(std::chrono::milliseconds deadline) {
  Impl& s = *impl_;
  {
    std::lock_guard lock(s.mu);
    if (!s.started || s.stopping) return;
    s.stopping = true;
  }
  const auto t0 = std::chrono::steady_clock::now();
  log_info("shutting down: draining streams (deadline ", deadline.count(), " ms)");
  if (grpc::HealthCheckServiceInterface* health = s.grpc_server->GetHealthCheckService()) {
    health->SetServingStatus(false);
    for (const char* name : kServiceNames) health->SetServingStatus(name, false);
  }
  // Streams settle what they received, send their last Ack and end with UNAVAILABLE; gRPC's
  // Shutdown refuses new calls, waits for them up to the deadline, then cancels the rest.
  // The HTTP listeners wait for the requests their workers run: stop both while the streams
  // drain.
  std::thread exposer_stop([&s] {
    if (s.metrics_http) s.metrics_http->stop();
  });
  std::thread http_stop([&s] {
    if (s.http) s.http->stop();
  });
  s.telemetry->drain_all();
  s.grpc_server->Shutdown(std::chrono::system_clock::now() + deadline);
  log(LogLevel::kDebug, "shutdown: gRPC stopped");
  // Whatever the cancelled streams had submitted is still committed; the ingest thread's last
  // act is a full checkpoint, so the background one goes first.
  s.checkpointer.reset();
  s.ingest->stop();
  log(LogLevel::kDebug, "shutdown: store committed and checkpointed");
  // Everything of its runs is committed: another server may take them over at once.
  s.ownership->release_all();
  exposer_stop.join();
  log(LogLevel::kDebug, "shutdown: metrics endpoint closed");
  http_stop.join();
  log(LogLevel::kDebug, "shutdown: web UI closed");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  log_info("stopped after ", seconds, " s");
  {
    std::lock_guard lock(s.mu);
    s.stopped = true;
  }
  s.cv.notify_all();
}

void Server::wait() {
  std::unique_lock lock(impl_->mu);
  impl_->cv.wait(lock, [&] { return impl_->stopped; });
}

}  // namespace ampscope::server
