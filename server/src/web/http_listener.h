// The server's HTTP listeners: the web UI (--http-listen, web_routes.h) and /metrics
// (--metrics-listen, metrics_endpoint.h) are two instances of this class, each with its own
// routing function (request in, response out: http_message.h).
//
// Why libmicrohttpd (Debian's libmicrohttpd-dev) in its epoll mode: one event thread reads every
// connection, so a connection that is idle, kept alive or sends its request one byte at a time
// costs memory (a small buffer) and a file descriptor, never a thread; the library itself
// bounds connections in total and per client address, parses HTTP and speaks TLS (GnuTLS,
// client certificates included). A thread per connection (the listener this one replaced, and
// prometheus-cpp's exposer) let 79 half-sent requests lock every user out. Boost.Beast would
// do the same on Asio with more of the HTTP handling written here.
//
// A request runs on a small pool of worker threads: the event thread suspends the connection
// (MHD_suspend_connection), a worker calls the routing function, gzips the answer when the
// client accepts gzip (never brotli: at its default quality it took 1.2 s for a 600 KB API
// answer) and resumes it. A slow query therefore never holds up another connection's reads.
//
// Bounds (HttpLimits, flags --http-max-connections, --http-max-connections-per-address,
// --http-request-deadline): connections beyond them are closed as they are accepted; a request
// (header and body) must arrive whole within the deadline, counted from the connection's start
// or the previous answer on a kept-alive connection, else the connection is cut, so a client
// that trickles a byte every few seconds does not keep it; a POST body is at most 16 KiB (413).
//
// With TLS (cert and key as PEM text): HTTPS; with a client CA: a request is served only over
// a connection whose client certificate that CA signed (and usable for client authentication);
// any other connection is closed without an answer, logged with the client's address and
// counted (on_tls_refusal).
//
// Lifecycle: the constructor binds and serves; stop() (or the destructor) stops accepting, lets
// the requests on the workers finish, then closes every connection. Thread safety: stop() may
// be called from any thread; the handler is called from the worker threads, concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ampscope/server/server.h"
#include "http_message.h"

namespace ampscope::server {

struct HttpOptions {
  std::string listen;                  // host:port; port 0: any free port
  std::string flag = "--http-listen";  // names the address in errors
  std::string name = "web UI";         // in log lines
  // Both set: HTTPS with this certificate chain (leaf first) and key, PEM text.
  std::string tls_cert_pem;
  std::string tls_key_pem;
  // With TLS: client certificates signed by these CAs (PEM) are required (mutual TLS).
  std::string tls_client_ca_pem;
  HttpLimits limits;
  std::size_t workers = 8;                 // a browser opens up to six connections to one server
  std::size_t max_body_bytes = 16 * 1024;  // POST bodies: the login form (a token and a path)
  // Set on every answer, the listener's own (413, 500) included.
  std::vector<std::pair<std::string, std::string>> default_headers;
  std::function<void()> on_tls_refusal;  // a client certificate refused
};

class HttpListener {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;

  // Binds `options.listen` and serves. Throws ampscope::Error naming options.flag when the
  // address is invalid or taken, naming --tls-cert/--tls-key when TLS cannot start with them.
  HttpListener(HttpOptions options, Handler handler);
  ~HttpListener();
  HttpListener(const HttpListener&) = delete;
  HttpListener& operator=(const HttpListener&) = delete;

  // host:port actually bound.
  const std::string& address() const;
  bool tls() const;
  // Connections open now.
  std::size_t connections() const;
  // Idempotent.
  void stop();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Raises this process's soft limit on open files to its hard limit (each connection is a file
// descriptor; the soft limit is often 1024); returns the soft limit now.
std::uint64_t raise_open_file_limit();

}  // namespace ampscope::server
