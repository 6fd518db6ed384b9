// The web UI's HTTP listener (--http-listen): the pages and assets compiled into the server
// (webui_assets.h), the login form and its sessions (web_sessions.h), and GET /api/...
// answered by WebApi. cpp-httplib serves it on a bounded pool of worker threads; with
// --tls-cert/--tls-key it speaks HTTPS with the gRPC port's certificate (and asks for client
// certificates with --tls-client-ca, as the gRPC port does).
//
// Routes (docs/webui.md, "Serving and security"):
//   GET  /assets/<name>        an embedded file; ETag, 304 on If-None-Match
//   GET  /, /runs, /runs/<id>, /runs/<id>/tensors, /compare
//                              index.html (the page routes on location.pathname)
//   GET  /api/<path>           WebApi::handle("/<path>", query parameters), JSON
//   GET  /login, POST /login   the form; a reader or admin token starts a session
//   POST /logout               ends it
// Anything else is 404; another method 405. With tokens, everything but the login form and the
// stylesheet it uses needs a reader or admin token: "Authorization: Bearer <token>" or the
// session cookie. Every response carries Content-Security-Policy "default-src 'self'",
// X-Content-Type-Options nosniff and X-Frame-Options DENY.
//
// Lifecycle: the constructor binds and serves; stop() (or the destructor) refuses new
// connections and waits for the workers, each of which notices within the keep-alive timeout.
// Thread safety: stop() may be called from any thread; the listener reads `auth` and `api` from
// its worker threads, so both must outlive it.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <thread>

#include "auth.h"
#include "web_sessions.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace ampscope::server {

class WebApi;

struct HttpOptions {
  std::string listen;  // host:port; port 0: any free port
  // Both set: HTTPS with this certificate chain and key (PEM files).
  std::string tls_cert_file;
  std::string tls_key_file;
  // With TLS: client certificates signed by these CAs are required (mutual TLS).
  std::string tls_client_ca_file;
  // The sessions' clock (tests move it); empty: std::chrono::steady_clock::now.
  WebSessions::Clock clock;
};

class HttpListener {
 public:
  // Binds `options.listen` and serves. Throws ampscope::Error naming --http-listen when the
  // address is invalid or taken, naming --tls-cert when the certificate cannot be loaded.
  HttpListener(HttpOptions options, const Authenticator& auth, const WebApi& api);
  ~HttpListener();
  HttpListener(const HttpListener&) = delete;
  HttpListener& operator=(const HttpListener&) = delete;

  // host:port actually bound.
  const std::string& address() const { return address_; }
  bool tls() const { return tls_; }
  // Idempotent.
  void stop();

  WebSessions& sessions() { return sessions_; }

 private:
  void route(const httplib::Request& req, httplib::Response& res);
  void login(const httplib::Request& req, httplib::Response& res);
  void logout(const httplib::Request& req, httplib::Response& res);
  // Whether the request may read pages, assets or the API; when not, the refusal is in `res`.
  bool authorize(const httplib::Request& req, httplib::Response& res, bool api);
  void serve_login_form(httplib::Response& res, int status, const std::string& next,
                        const std::string& error);

  const HttpOptions options_;
  const Authenticator& auth_;
  const WebApi& api_;
  WebSessions sessions_;
  const bool tls_;
  std::unique_ptr<httplib::Server> server_;
  std::string address_;
  std::thread thread_;              // httplib's accept loop (listen_after_bind)
  std::atomic<bool> ended_{false};  // the accept loop returned
  std::atomic<bool> stopped_{false};
};

}  // namespace ampscope::server
