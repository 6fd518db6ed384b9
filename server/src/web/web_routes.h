// The web UI's routes (--http-listen): the pages and assets compiled into the server
// (webui_assets.h), the login form and its sessions (web_sessions.h), and GET /api/...
// answered by WebApi. A plain function from request to response (http_message.h): the
// listener (http_listener.h) calls it on its worker threads, tests and the fuzz target call it
// without sockets.
//
// Routes (docs/webui.md, "Serving and security"):
//   GET  /assets/<name>        an embedded file; ETag, 304 on If-None-Match
//   GET  /, /runs, /runs/<id>, /runs/<id>/tensors, /compare
//                              index.html (the page routes on location.pathname)
//   GET  /api/<path>           WebApi::handle("/<path>", query parameters), JSON
//   GET  /login, POST /login   the form; a reader or admin token starts a session
//   POST /logout               ends it (a body is not needed)
// HEAD is GET without the body. Anything else is 404; another method 405, and the connection
// closes rather than read its body. With tokens, everything but the login form and the assets
// it uses needs a reader or admin token: "Authorization: Bearer <token>" or the session
// cookie. Every answer under /api carries Cache-Control: no-store, refusals included.
//
// No request makes a 5xx: bad paths, parameters and headers are 4xx naming what is wrong; only
// a failing store is (WebApi's 500).
//
// Thread safety: handle() may be called from any number of threads at once (WebSessions locks,
// WebApi and Authenticator are safe to share). `auth` and `api` must outlive the routes.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "auth.h"
#include "http_message.h"
#include "web_sessions.h"

namespace ampscope::server {

class WebApi;

// Content-Security-Policy "default-src 'self'", X-Content-Type-Options nosniff, X-Frame-Options
// DENY: on every answer of the web UI's listener (HttpOptions::default_headers).
const std::vector<std::pair<std::string, std::string>>& web_security_headers();

class WebRoutes {
 public:
  // `clock`: the sessions' clock (tests move it); empty: steady_clock. `on_refusal`: called
  // once for each refused credential (a wrong or missing token on /api, a wrong token at the
  // login form, an agent token); a page that sends a browser to the login form is not one.
  WebRoutes(const Authenticator& auth, const WebApi& api, WebSessions::Clock clock = {},
            std::function<void()> on_refusal = {});

  HttpResponse handle(const HttpRequest& request);

  WebSessions& sessions() { return sessions_; }

 private:
  HttpResponse route(const HttpRequest& req, const Target& target);
  HttpResponse login(const HttpRequest& req);
  HttpResponse logout(const HttpRequest& req);
  // Whether the request may read pages, assets or the API; when not, the refusal is in `res`.
  bool authorize(const HttpRequest& req, HttpResponse& res, bool api);
  HttpResponse login_form(int status, const std::string& next, const std::string& error);
  void refused() const;

  const Authenticator& auth_;
  const WebApi& api_;
  WebSessions sessions_;
  const std::function<void()> on_refusal_;
};

}  // namespace ampscope::server
