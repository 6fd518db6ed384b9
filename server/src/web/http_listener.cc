// The HTTP listener on libmicrohttpd (http_listener.h): the event thread, the worker pool, the
// request deadline and mutual TLS.
#include "http_listener.h"

#include <arpa/inet.h>
#include <gnutls/gnutls.h>
#include <gnutls/x509.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "ampscope/check.h"
#include "log.h"

namespace ampscope::server {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kText = "text/plain; charset=utf-8";
constexpr int kListenBacklog = 1024;
// The deadline is checked this often (and at least 8 times per deadline).
constexpr std::chrono::milliseconds kSweepInterval{250};
// The library's own messages (a connection limit reached, a TLS handshake failed) come in
// bursts under load: at most one line per this interval, with the count of those left out.
constexpr std::chrono::seconds kLibraryLogInterval{10};

struct ListenAddress {
  std::string host;  // as getaddrinfo takes it: without IPv6 brackets
  std::string text;  // as given, without the port
  std::string port;
};

// "127.0.0.1:9465", "[::1]:0", "0.0.0.0:8080"
ListenAddress parse_listen(const std::string& listen, const std::string& flag) {
  const auto fail = [&]() -> ListenAddress {
    throw Error(flag + " '" + listen + "': expected HOST:PORT (port 0: any free port)");
  };
  const auto colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == listen.size()) return fail();
  ListenAddress a;
  a.text = listen.substr(0, colon);
  a.host = a.text;
  if (a.host.front() == '[') {
    if (a.host.size() < 3 || a.host.back() != ']') return fail();
    a.host = a.host.substr(1, a.host.size() - 2);
  }
  a.port = listen.substr(colon + 1);
  if (a.port.size() > 5 || a.port.find_first_not_of("0123456789") != std::string::npos) {
    return fail();
  }
  if (std::stoi(a.port) > 65535) return fail();
  return a;
}

// A listening socket (non-blocking: the event thread accepts until EAGAIN) and its port, or -1.
int bind_listen_socket(const ListenAddress& where, int* port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (::getaddrinfo(where.host.empty() ? nullptr : where.host.c_str(), where.port.c_str(), &hints,
                    &found) != 0) {
    return -1;
  }
  int fd = -1;
  for (addrinfo* ai = found; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) continue;
    // SO_REUSEADDR only: with SO_REUSEPORT a second server would bind the same port and the
    // kernel would split the connections between them.
    const int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd, kListenBacklog) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(found);
  if (fd < 0) return -1;
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  *port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return fd;
}

std::string address_text(const sockaddr* addr) {
  char text[INET6_ADDRSTRLEN] = "?";
  if (addr == nullptr) return text;
  if (addr->sa_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(addr)->sin_addr, text, sizeof(text));
  } else if (addr->sa_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr, text,
                sizeof(text));
  }
  return text;
}

bool compressible(std::string_view type) {
  return (type.starts_with("text/") && !type.starts_with("text/event-stream")) ||
         type.starts_with("application/json") || type.starts_with("application/javascript") ||
         type.starts_with("application/xml") || type.starts_with("image/svg+xml");
}

// gzip at zlib's default level (about 10 ms for a 600 KB API answer on a slow core).
std::optional<std::string> gzip(std::string_view data) {
  z_stream z{};
  if (deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
    return std::nullopt;
  }
  std::string out(deflateBound(&z, data.size()), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z.avail_in = static_cast<uInt>(data.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  const int rc = deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  if (rc != Z_STREAM_END) return std::nullopt;
  return out;
}

// One connection, from the library's "started" to its "closed" notification.
struct Connection {
  MHD_Connection* mhd = nullptr;
  int fd = -1;
  std::string remote;  // the client's address
  // Guarded by Impl::conn_mu: whether a request is awaited, since when, and whether the sweep
  // cut the connection already.
  bool awaiting = true;
  Clock::time_point since;
  bool cut = false;
  // Event thread only.
  std::string uri;      // the raw request target, from the URI log callback
  int tls_verdict = 0;  // mutual TLS: 0 not checked yet, 1 allowed, -1 refused
};

// One request, from the first call of the access handler to the "completed" notification.
struct Request {
  HttpRequest req;
  Connection* conn = nullptr;
  MHD_Connection* mhd = nullptr;
  bool dispatched = false;
  bool too_large = false;
  // Written by a worker before it resumes the connection, read by the event thread after.
  std::optional<HttpResponse> response;
};

Connection* connection_of(MHD_Connection* c) {
  const MHD_ConnectionInfo* info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return info == nullptr ? nullptr : static_cast<Connection*>(info->socket_context);
}

MHD_Result collect_header(void* cls, MHD_ValueKind, const char* key, const char* value) {
  static_cast<std::vector<std::pair<std::string, std::string>>*>(cls)->emplace_back(
      key, value == nullptr ? "" : value);
  return MHD_YES;
}

}  // namespace

struct HttpListener::Impl {
  HttpOptions options;
  Handler handler;
  bool tls = false;
  std::string address;
  int listen_fd = -1;
  MHD_Daemon* daemon = nullptr;
  std::atomic<bool> serving{false};  // the library started (its messages before: errors)
  std::atomic<bool> stopped{false};

  // The worker pool: jobs are suspended connections' requests. The queue is bounded by the
  // connection limit (one request per connection at a time).
  std::mutex pool_mu;
  std::condition_variable pool_cv;
  std::deque<Request*> jobs;
  bool accepting = true;
  std::vector<std::thread> workers;

  // Open connections, for the request deadline.
  std::mutex conn_mu;
  std::condition_variable sweep_cv;
  std::set<Connection*> conns;
  bool sweeping = true;
  std::thread sweeper;

  std::mutex log_mu;
  Clock::time_point last_library_log{};
  std::size_t library_logs_left_out = 0;
  std::string last_library_message;  // for the error when the library cannot start

  // --- The library's callbacks (event thread) ---

  static void on_connection(void* cls, MHD_Connection* c, void** socket_context,
                            MHD_ConnectionNotificationCode code) {
    auto* self = static_cast<Impl*>(cls);
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
      auto* conn = new Connection;
      conn->mhd = c;
      if (const MHD_ConnectionInfo* fd =
              MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD)) {
        conn->fd = fd->connect_fd;
      }
      if (const MHD_ConnectionInfo* a =
              MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS)) {
        conn->remote = address_text(a->client_addr);
      }
      conn->since = Clock::now();
      *socket_context = conn;
      std::lock_guard lock(self->conn_mu);
      self->conns.insert(conn);
      return;
    }
    auto* conn = static_cast<Connection*>(*socket_context);
    if (conn == nullptr) return;
    {
      // The library closes the descriptor after this returns: the sweep, which shuts
      // descriptors down under this lock, never touches one that is closed or reused.
      std::lock_guard lock(self->conn_mu);
      self->conns.erase(conn);
    }
    delete conn;
    *socket_context = nullptr;
  }

  static void* on_uri(void* cls, const char* uri, MHD_Connection* c) {
    (void)cls;
    if (Connection* conn = connection_of(c)) conn->uri = uri == nullptr ? "" : uri;
    return nullptr;
  }

  static void on_completed(void* cls, MHD_Connection* c, void** req_cls,
                           MHD_RequestTerminationCode) {
    auto* self = static_cast<Impl*>(cls);
    delete static_cast<Request*>(*req_cls);
    *req_cls = nullptr;
    if (Connection* conn = connection_of(c)) {
      std::lock_guard lock(self->conn_mu);
      conn->awaiting = true;
      conn->since = Clock::now();
    }
  }

  static void on_log(void* cls, const char* format, va_list ap) {
    char line[512];
    std::vsnprintf(line, sizeof(line), format, ap);
    std::string_view text(line);
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
    static_cast<Impl*>(cls)->library_log(text);
  }

  static MHD_Result on_request(void* cls, MHD_Connection* c, const char* url, const char* method,
                               const char*, const char* upload, std::size_t* upload_size,
                               void** req_cls) {
    auto* self = static_cast<Impl*>(cls);
    auto* r = static_cast<Request*>(*req_cls);
    if (r == nullptr) {
      Connection* conn = connection_of(c);
      if (conn == nullptr || !self->client_allowed(c, conn)) return MHD_NO;
      r = new Request;
      *req_cls = r;
      r->conn = conn;
      r->mhd = c;
      r->req.method = method;
      r->req.target = conn->uri.empty() ? std::string(url) : std::move(conn->uri);
      conn->uri.clear();
      MHD_get_connection_values(c, MHD_HEADER_KIND, collect_header, &r->req.headers);
      r->req.remote_address = conn->remote;
      r->req.tls = self->tls;
      // The library keeps a connection alive only for an answer queued after the whole
      // request was read (a later call). Other methods are answered before their body, and
      // their connection closes.
      if (r->req.method == "GET" || r->req.method == "HEAD") return MHD_YES;
      if (r->req.method != "POST") return self->dispatch(r);
      // A body announced above the limit is refused before it is read.
      if (const std::optional<std::string_view> length = r->req.header("Content-Length")) {
        const std::string digits(*length);
        if (digits.size() > 18 ||
            std::strtoull(digits.c_str(), nullptr, 10) > self->options.max_body_bytes) {
          r->too_large = true;
          return self->queue(c, self->too_large());
        }
      }
      return MHD_YES;  // the body follows
    }
    if (*upload_size != 0) {
      if (r->req.method == "POST" && !r->too_large) {
        if (r->req.body.size() + *upload_size > self->options.max_body_bytes) {
          r->too_large = true;
          r->req.body.clear();
        } else {
          r->req.body.append(upload, *upload_size);
        }
      }
      *upload_size = 0;
      return MHD_YES;
    }
    if (r->response) return self->queue(c, *r->response);
    if (r->too_large) return self->queue(c, self->too_large());
    if (!r->dispatched) return self->dispatch(r);
    return MHD_YES;
  }

  // --- Event thread ---

  // Mutual TLS: whether the connection's client certificate was signed by the client CA and
  // may authenticate a client; decided once per connection.
  bool client_allowed(MHD_Connection* c, Connection* conn) {
    if (!tls || options.tls_client_ca_pem.empty()) return true;
    if (conn->tls_verdict != 0) return conn->tls_verdict > 0;
    std::string why;
    const MHD_ConnectionInfo* info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_GNUTLS_SESSION);
    auto session = info == nullptr ? nullptr : static_cast<gnutls_session_t>(info->tls_session);
    if (session == nullptr) {
      why = "no TLS session";
    } else {
      gnutls_typed_vdata_st purpose{};
      purpose.type = GNUTLS_DT_KEY_PURPOSE_OID;
      purpose.data = reinterpret_cast<unsigned char*>(const_cast<char*>(GNUTLS_KP_TLS_WWW_CLIENT));
      unsigned status = 0;
      const int rc = gnutls_certificate_verify_peers(session, &purpose, 1, &status);
      if (rc == GNUTLS_E_NO_CERTIFICATE_FOUND) {
        why = "it sent no client certificate";
      } else if (rc < 0) {
        why = gnutls_strerror(rc);
      } else if (status != 0) {
        gnutls_datum_t text{};
        if (gnutls_certificate_verification_status_print(status, GNUTLS_CRT_X509, &text, 0) == 0) {
          why.assign(reinterpret_cast<const char*>(text.data), text.size);
          gnutls_free(text.data);
          while (!why.empty() && why.back() == ' ') why.pop_back();
        } else {
          why = "its certificate is not valid";
        }
      }
    }
    conn->tls_verdict = why.empty() ? 1 : -1;
    if (!why.empty()) {
      log_warning(options.name, ": refused a TLS client at ", conn->remote,
                  " (--tls-client-ca): ", why);
      if (options.on_tls_refusal) options.on_tls_refusal();
    }
    return why.empty();
  }

  // Hands the request to a worker; the connection sleeps until the worker resumes it.
  MHD_Result dispatch(Request* r) {
    r->dispatched = true;
    {
      std::lock_guard lock(conn_mu);
      r->conn->awaiting = false;
    }
    std::lock_guard lock(pool_mu);
    if (!accepting) return MHD_NO;  // stopping: close the connection
    MHD_suspend_connection(r->mhd);
    jobs.push_back(r);
    pool_cv.notify_one();
    return MHD_YES;
  }

  MHD_Result queue(MHD_Connection* c, const HttpResponse& res) {
    MHD_Response* m = MHD_create_response_from_buffer(
        res.body.size(), const_cast<char*>(res.body.data()), MHD_RESPMEM_MUST_COPY);
    if (m == nullptr) return MHD_NO;
    if (!res.content_type.empty()) {
      MHD_add_response_header(m, "Content-Type", res.content_type.c_str());
    }
    for (const auto& [name, value] : options.default_headers) {
      if (res.header(name).empty()) MHD_add_response_header(m, name.c_str(), value.c_str());
    }
    for (const auto& [name, value] : res.headers) {
      MHD_add_response_header(m, name.c_str(), value.c_str());
    }
    if (res.close) MHD_add_response_header(m, "Connection", "close");
    const MHD_Result rc = MHD_queue_response(c, static_cast<unsigned>(res.status), m);
    MHD_destroy_response(m);
    return rc;
  }

  static HttpResponse internal_error() {
    HttpResponse res;
    res.status = 500;
    res.set_content("internal error\n", kText);
    return res;
  }

  HttpResponse too_large() const {
    HttpResponse res;
    res.status = 413;
    res.set_content(
        "request body too large: at most " + std::to_string(options.max_body_bytes) + " bytes\n",
        kText);
    res.close = true;
    return res;
  }

  void library_log(std::string_view text) {
    std::lock_guard lock(log_mu);
    last_library_message = text;
    // A client that hangs up mid-request or speaks plain HTTP to the HTTPS port is routine:
    // debug. A bound reached, or the library failing at start, is for the operator.
    const bool for_operator = !serving || text.find("limit") != std::string_view::npos;
    if (!for_operator) {
      log(LogLevel::kDebug, options.name, " listener: ", text);
      return;
    }
    const Clock::time_point now = Clock::now();
    if (now - last_library_log < kLibraryLogInterval) {
      ++library_logs_left_out;
      return;
    }
    if (library_logs_left_out > 0) {
      log_warning(options.name, " listener: ", text, " (and ", library_logs_left_out,
                  " more messages in the last ", kLibraryLogInterval.count(), " s)");
    } else {
      log_warning(options.name, " listener: ", text);
    }
    last_library_log = now;
    library_logs_left_out = 0;
  }

  // --- Workers ---

  void work() {
    for (;;) {
      Request* r = nullptr;
      {
        std::unique_lock lock(pool_mu);
        pool_cv.wait(lock, [&] { return !jobs.empty() || !accepting; });
        if (jobs.empty()) return;
        r = jobs.front();
        jobs.pop_front();
      }
      r->response = answer(r->req);
      // The event thread owns the request again from here (and may free it at once).
      MHD_resume_connection(r->mhd);
    }
  }

  HttpResponse answer(const HttpRequest& req) const {
    HttpResponse res;
    try {
      res = handler(req);
    } catch (const std::exception& e) {
      log_error(options.name, ": ", req.method, " ", req.target, ": ", e.what());
      res = internal_error();
    } catch (...) {
      log_error(options.name, ": ", req.method, " ", req.target, ": an unknown exception");
      res = internal_error();
    }
    if (!res.body.empty() && compressible(res.content_type) &&
        accepts_gzip(req.header_or_empty("Accept-Encoding"))) {
      if (std::optional<std::string> packed = gzip(res.body)) {
        res.body = std::move(*packed);
        res.set_header("Content-Encoding", "gzip");
        res.set_header("Vary", "Accept-Encoding");
      }
    }
    log(LogLevel::kDebug, options.name, ": ", req.method, " ", req.target, " ", res.status);
    return res;
  }

  // --- The request deadline ---

  void sweep() {
    const auto deadline = options.limits.request_deadline;
    const auto interval = std::min<std::chrono::milliseconds>(
        kSweepInterval,
        std::max<std::chrono::milliseconds>(deadline / 8, std::chrono::milliseconds(10)));
    std::unique_lock lock(conn_mu);
    while (sweeping) {
      sweep_cv.wait_for(lock, interval);
      const Clock::time_point now = Clock::now();
      for (Connection* conn : conns) {
        if (conn->awaiting && !conn->cut && now - conn->since > deadline && conn->fd >= 0) {
          // The event thread sees the end of the stream and closes the connection.
          ::shutdown(conn->fd, SHUT_RDWR);
          conn->cut = true;
          log(LogLevel::kDebug, options.name, ": cut a connection from ", conn->remote,
              ": no whole request within ", deadline.count(), " ms");
        }
      }
    }
  }

  void start(Handler h) {
    handler = std::move(h);
    tls = !options.tls_cert_pem.empty();
    const ListenAddress where = parse_listen(options.listen, options.flag);
    int port = 0;
    listen_fd = bind_listen_socket(where, &port);
    if (listen_fd < 0) {
      throw Error(options.flag + " '" + options.listen +
                  "': cannot bind (address in use or invalid)");
    }
    address = where.text + ":" + std::to_string(port);

    const auto timeout_s = static_cast<unsigned>(
        std::max<long long>(1, (options.limits.request_deadline.count() + 999) / 1000));
    std::vector<MHD_OptionItem> items = {
        // First, so that the library's messages about the other options come here too.
        {MHD_OPTION_EXTERNAL_LOGGER, reinterpret_cast<intptr_t>(&Impl::on_log), this},
        {MHD_OPTION_LISTEN_SOCKET, listen_fd, nullptr},
        {MHD_OPTION_CONNECTION_LIMIT, static_cast<intptr_t>(options.limits.max_connections),
         nullptr},
        {MHD_OPTION_PER_IP_CONNECTION_LIMIT,
         static_cast<intptr_t>(options.limits.max_connections_per_address), nullptr},
        // Inactivity: a client that stops reading its answer.
        {MHD_OPTION_CONNECTION_TIMEOUT, static_cast<intptr_t>(timeout_s), nullptr},
        {MHD_OPTION_NOTIFY_CONNECTION, reinterpret_cast<intptr_t>(&Impl::on_connection), this},
        {MHD_OPTION_NOTIFY_COMPLETED, reinterpret_cast<intptr_t>(&Impl::on_completed), this},
        {MHD_OPTION_URI_LOG_CALLBACK, reinterpret_cast<intptr_t>(&Impl::on_uri), this},
    };
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
                     MHD_USE_ERROR_LOG;
    if (tls) {
      flags |= MHD_USE_TLS;
      items.push_back(
          {MHD_OPTION_HTTPS_MEM_CERT, 0, const_cast<char*>(options.tls_cert_pem.c_str())});
      items.push_back(
          {MHD_OPTION_HTTPS_MEM_KEY, 0, const_cast<char*>(options.tls_key_pem.c_str())});
      if (!options.tls_client_ca_pem.empty()) {
        items.push_back(
            {MHD_OPTION_HTTPS_MEM_TRUST, 0, const_cast<char*>(options.tls_client_ca_pem.c_str())});
      }
    }
    items.push_back({MHD_OPTION_END, 0, nullptr});

    for (std::size_t i = 0; i < std::max<std::size_t>(1, options.workers); ++i) {
      workers.emplace_back([this] { work(); });
    }
    sweeper = std::thread([this] { sweep(); });
    daemon = MHD_start_daemon(flags, 0, nullptr, nullptr, &Impl::on_request, this, MHD_OPTION_ARRAY,
                              items.data(), MHD_OPTION_END);
    if (daemon == nullptr) {
      stop_threads();
      ::close(listen_fd);
      listen_fd = -1;
      if (tls) {
        throw Error("--tls-cert, --tls-key" +
                    std::string(options.tls_client_ca_pem.empty() ? "" : ", --tls-client-ca") +
                    ": the " + options.name + "'s HTTPS listener (" + options.flag +
                    ") cannot start with them: " + last_library_message);
      }
      throw Error(options.flag + " '" + options.listen + "': cannot serve on it");
    }
    serving = true;
  }

  void stop_threads() {
    {
      std::lock_guard lock(pool_mu);
      accepting = false;
    }
    pool_cv.notify_all();
    for (std::thread& t : workers) t.join();
    workers.clear();
    {
      std::lock_guard lock(conn_mu);
      sweeping = false;
    }
    sweep_cv.notify_all();
    if (sweeper.joinable()) sweeper.join();
  }

  void stop() {
    if (stopped.exchange(true) || daemon == nullptr) return;
    // No new connections; the requests on the workers finish and resume their connections
    // (the library refuses to stop while one is suspended); then every connection closes.
    MHD_quiesce_daemon(daemon);
    stop_threads();
    MHD_stop_daemon(daemon);
    daemon = nullptr;
    if (listen_fd >= 0) ::close(listen_fd);
    listen_fd = -1;
  }
};

HttpListener::HttpListener(HttpOptions options, Handler handler) : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  impl_->start(std::move(handler));
}

HttpListener::~HttpListener() { stop(); }

const std::string& HttpListener::address() const { return impl_->address; }
bool HttpListener::tls() const { return impl_->tls; }

std::size_t HttpListener::connections() const {
  if (impl_->daemon == nullptr) return 0;
  const MHD_DaemonInfo* info =
      MHD_get_daemon_info(impl_->daemon, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
  return info == nullptr ? 0 : info->num_connections;
}

void HttpListener::stop() { impl_->stop(); }

std::uint64_t raise_open_file_limit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
  if (rl.rlim_cur < rl.rlim_max) {
    rlimit raised = rl;
    raised.rlim_cur = rl.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) rl = raised;
  }
  return rl.rlim_cur;
}

}  // namespace ampscope::server
