// The web UI's HTTP listener (http_listener.h): routing, tokens and sessions on cpp-httplib.
#include "http_listener.h"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <string_view>
#include <vector>

#include "ampscope/check.h"
#include "log.h"
#include "webui_api.h"
#include "webui_assets.h"

namespace ampscope::server {
namespace {

// Workers: a browser opens up to six connections to one server and a worker serves one
// connection at a time (keep-alive included), so eight serve a page's parallel requests at once.
constexpr std::size_t kThreads = 8;
// Accepted connections waiting for a worker; beyond them the accept loop waits and new
// connections wait in the kernel's backlog, not in memory.
constexpr std::size_t kMaxQueuedConnections = 64;
// The largest request body (the login form is the only one read): a token and a path.
constexpr std::size_t kMaxRequestBody = 16 * 1024;
constexpr int kReadTimeoutS = 5;
constexpr int kWriteTimeoutS = 5;
// An idle keep-alive connection holds a worker this long; stop() waits for it as well.
constexpr int kKeepAliveS = 1;
constexpr std::size_t kKeepAliveMaxRequests = 100;

constexpr std::string_view kCookieName = "ampscope_session";
constexpr std::string_view kErrorMarker = "<!--ampscope:error-->";
constexpr std::string_view kNextMarker = "__NEXT__";
constexpr const char* kJson = "application/json";
constexpr const char* kHtml = "text/html; charset=utf-8";
constexpr const char* kText = "text/plain; charset=utf-8";
constexpr const char* kAgentRefused = "the web UI needs a reader or admin token";

// httplib's ThreadPool queues connections without limit; this pool makes the accept loop wait
// while `max_queued` connections wait for a worker. Thread safety: mu_ guards jobs_ and
// shutdown_; the workers are joined by shutdown(), which httplib calls once its accept loop
// ended.
class BoundedPool final : public httplib::TaskQueue {
 public:
  BoundedPool(std::size_t threads, std::size_t max_queued) : max_queued_(max_queued) {
    for (std::size_t i = 0; i < threads; ++i) workers_.emplace_back([this] { work(); });
  }

  void enqueue(std::function<void()> fn) override {
    {
      std::unique_lock lock(mu_);
      room_.wait(lock, [&] { return jobs_.size() < max_queued_ || shutdown_; });
      jobs_.push_back(std::move(fn));
    }
    ready_.notify_one();
  }

  void shutdown() override {
    {
      std::lock_guard lock(mu_);
      shutdown_ = true;
    }
    ready_.notify_all();
    room_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

 private:
  // Runs jobs until shutdown() and the queue is empty (a queued connection is still closed by
  // its job, which sees the listener stopped).
  void work() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock lock(mu_);
        ready_.wait(lock, [&] { return !jobs_.empty() || shutdown_; });
        if (jobs_.empty()) return;
        fn = std::move(jobs_.front());
        jobs_.pop_front();
      }
      room_.notify_one();
      fn();
    }
  }

  const std::size_t max_queued_;
  std::mutex mu_;
  std::condition_variable ready_;  // a job or shutdown
  std::condition_variable room_;   // the queue has room
  std::deque<std::function<void()>> jobs_;
  bool shutdown_ = false;
  std::vector<std::thread> workers_;
};

struct ListenAddress {
  std::string host;  // as httplib binds it: without IPv6 brackets
  std::string text;  // as given, without the port
  int port = 0;
};

// "127.0.0.1:9465", "[::1]:0", "0.0.0.0:8080"
ListenAddress parse_listen(const std::string& listen) {
  const auto fail = [&]() -> ListenAddress {
    throw Error("--http-listen '" + listen + "': expected HOST:PORT (port 0: any free port)");
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
  const std::string port = listen.substr(colon + 1);
  if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos) return fail();
  a.port = std::stoi(port);
  if (a.port > 65535) return fail();
  return a;
}

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string replace_all(std::string text, std::string_view from, std::string_view to) {
  for (auto at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

// Where a sign-in may send the browser: a path of this server. "//host" and "/\host" are
// other hosts to a browser, and a scheme ("http://x") is another site: those go to "/".
std::string safe_next(std::string_view next) {
  const bool local = !next.empty() && next.front() == '/' &&
                     (next.size() < 2 || (next[1] != '/' && next[1] != '\\')) &&
                     std::none_of(next.begin(), next.end(), [](char c) {
                       return c == '\\' || static_cast<unsigned char>(c) < 0x20 || c == 0x7f;
                     });
  return local ? std::string(next) : "/";
}

// The value of the session cookie in the request's Cookie header ("a=1; ampscope_session=..").
std::optional<std::string> session_cookie(const httplib::Request& req) {
  const std::string header = req.get_header_value("Cookie");
  std::string_view rest = header;
  while (!rest.empty()) {
    const auto semi = rest.find(';');
    std::string_view pair = rest.substr(0, semi);
    rest = semi == std::string_view::npos ? std::string_view() : rest.substr(semi + 1);
    while (!pair.empty() && pair.front() == ' ') pair.remove_prefix(1);
    if (pair.starts_with(kCookieName) && pair.substr(kCookieName.size()).starts_with('=')) {
      return std::string(pair.substr(kCookieName.size() + 1));
    }
  }
  return std::nullopt;
}

std::string session_cookie_header(std::string_view id, long max_age_s, bool secure) {
  return std::string(kCookieName) + "=" + std::string(id) +
         "; Path=/; HttpOnly; SameSite=Strict; Max-Age=" + std::to_string(max_age_s) +
         (secure ? "; Secure" : "");
}

// If-None-Match: "*", or a list of entity tags, weak ones (W/"...") included.
bool etag_matches(std::string_view if_none_match, std::string_view etag) {
  while (!if_none_match.empty()) {
    const auto comma = if_none_match.find(',');
    std::string_view tag = if_none_match.substr(0, comma);
    if_none_match =
        comma == std::string_view::npos ? std::string_view() : if_none_match.substr(comma + 1);
    while (!tag.empty() && tag.front() == ' ') tag.remove_prefix(1);
    while (!tag.empty() && tag.back() == ' ') tag.remove_suffix(1);
    if (tag.starts_with("W/")) tag.remove_prefix(2);
    if (tag == "*" || tag == etag) return true;
  }
  return false;
}

// The paths the page itself routes (app.js): /, /runs, /runs/<id>, /runs/<id>/tensors (those
// two with or without a trailing slash), /compare.
bool is_page(std::string_view path) {
  if (path == "/" || path == "/runs" || path == "/compare") return true;
  if (!path.starts_with("/runs/")) return false;
  std::string_view run = path.substr(6);
  if (run.ends_with('/')) run.remove_suffix(1);
  if (run.ends_with("/tensors")) run.remove_suffix(8);
  return !run.empty() && run.find('/') == std::string_view::npos;
}

// The assets a page refers to ("/assets/app.css"): the login page's are served without a token.
std::set<std::string, std::less<>> assets_of(std::string_view html) {
  constexpr std::string_view kPrefix = "/assets/";
  std::set<std::string, std::less<>> names;
  for (auto at = html.find(kPrefix); at != std::string_view::npos; at = html.find(kPrefix, at)) {
    at += kPrefix.size();
    const auto end = html.find_first_of("\"' >", at);
    names.emplace(html.substr(at, end - at));
  }
  return names;
}

// A browser's form post carries Origin; one from another site is refused (login CSRF). A client
// without Origin (curl, scripts) is not a browser on another site.
bool same_origin(const httplib::Request& req, bool tls) {
  if (!req.has_header("Origin")) return true;
  return req.get_header_value("Origin") ==
         (tls ? "https://" : "http://") + req.get_header_value("Host");
}

void send_asset(const httplib::Request& req, httplib::Response& res, const WebAsset& asset) {
  res.set_header("ETag", std::string(asset.etag));
  res.set_header("Cache-Control", "no-cache");
  if (etag_matches(req.get_header_value("If-None-Match"), asset.etag)) {
    res.status = 304;
    return;
  }
  res.set_content(asset.bytes().data(), asset.size, std::string(asset.content_type).c_str());
}

// Debian's cpp-httplib compresses a response with brotli whenever the client accepts it
// (browsers always do), at brotli's default quality 11: about 1.2 s for a 600 KB API answer on
// a 2-core machine, while gzip at zlib's default level takes about 10 ms for a similar size.
// httplib offers no setting for it, so the request it reads the header from stops offering
// "br" before routing. The object is not const (httplib's connection loop owns it and hands it
// out as const), so the cast is defined.
void gzip_not_brotli(const httplib::Request& req) {
  auto it = req.headers.find("Accept-Encoding");
  if (it == req.headers.end() || it->second.find("br") == std::string::npos) return;
  std::string kept;
  std::string_view rest = it->second;
  while (!rest.empty()) {
    const std::size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    if (item.starts_with("br")) continue;
    if (!kept.empty()) kept += ", ";
    kept += item;
  }
  const_cast<std::string&>(it->second) = kept;
}

void method_not_allowed(const httplib::Request& req, httplib::Response& res) {
  res.status = 405;
  res.set_header("Allow", req.path == "/login"    ? "GET, HEAD, POST"
                          : req.path == "/logout" ? "POST"
                                                  : "GET, HEAD");
  res.set_content("method not allowed\n", kText);
}

void not_found(httplib::Response& res) {
  res.status = 404;
  res.set_content("not found\n", kText);
}

}  // namespace

HttpListener::HttpListener(HttpOptions options, const Authenticator& auth, const WebApi& api)
    : options_(std::move(options)),
      auth_(auth),
      api_(api),
      sessions_(options_.clock),
      tls_(!options_.tls_cert_file.empty()) {
  const WebAsset* login_page = find_web_asset("login.html");
  AMPSCOPE_CHECK(find_web_asset("index.html") != nullptr && login_page != nullptr,
                 "expected index.html and login.html among the web UI's assets");
  const ListenAddress where = parse_listen(options_.listen);
  if (tls_) {
    const std::string& ca = options_.tls_client_ca_file;
    auto ssl = std::make_unique<httplib::SSLServer>(options_.tls_cert_file.c_str(),
                                                    options_.tls_key_file.c_str(),
                                                    ca.empty() ? nullptr : ca.c_str());
    if (!ssl->is_valid()) {
      throw Error("--tls-cert '" + options_.tls_cert_file + "', --tls-key '" +
                  options_.tls_key_file + "'" +
                  (ca.empty() ? "" : ", --tls-client-ca '" + ca + "'") +
                  ": the web UI's HTTPS listener cannot load them");
    }
    server_ = std::move(ssl);
  } else {
    server_ = std::make_unique<httplib::Server>();
  }

  httplib::Server& s = *server_;
  s.new_task_queue = [] { return new BoundedPool(kThreads, kMaxQueuedConnections); };
  s.set_read_timeout(kReadTimeoutS, 0);
  s.set_write_timeout(kWriteTimeoutS, 0);
  s.set_keep_alive_timeout(kKeepAliveS);
  s.set_keep_alive_max_count(kKeepAliveMaxRequests);
  s.set_payload_max_length(kMaxRequestBody);
  s.set_tcp_nodelay(true);
  // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, with which a second server binds
  // the same port and the kernel splits the connections between them.
  s.set_socket_options([](int sock) {
    const int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  s.set_default_headers({{"Content-Security-Policy", "default-src 'self'"},
                         {"X-Content-Type-Options", "nosniff"},
                         {"X-Frame-Options", "DENY"}});
  const std::set<std::string, std::less<>> public_assets = assets_of(login_page->bytes());
  s.Get(".*", [this, public_assets](const httplib::Request& req, httplib::Response& res) {
    if (req.path.starts_with("/assets/")) {
      const WebAsset* asset = find_web_asset(std::string_view(req.path).substr(8));
      if (asset == nullptr) return not_found(res);
      if (!public_assets.contains(asset->name) && !authorize(req, res, false)) return;
      return send_asset(req, res, *asset);
    }
    route(req, res);
  });
  s.Post("/login",
         [this](const httplib::Request& req, httplib::Response& res) { login(req, res); });
  s.Post("/logout",
         [this](const httplib::Request& req, httplib::Response& res) { logout(req, res); });
  // After the routes above, which match first; httplib reads (and bounds) the body first.
  s.Post(".*", method_not_allowed);
  // Every other method before its body is read (httplib refuses a PUT without Content-Length
  // only after its read timeout): 405, and the connection closes rather than read on.
  s.set_pre_routing_handler([](const httplib::Request& req, httplib::Response& res) {
    if (req.method == "GET" || req.method == "HEAD" || req.method == "POST") {
      gzip_not_brotli(req);
      return httplib::Server::HandlerResponse::Unhandled;
    }
    method_not_allowed(req, res);
    res.set_header("Connection", "close");
    return httplib::Server::HandlerResponse::Handled;
  });
  s.set_exception_handler(
      [](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown exception";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        log_error("web UI: ", req.method, " ", req.path, ": ", what);
        res.status = 500;
        res.set_content("internal error\n", kText);
      });
  s.set_logger([](const httplib::Request& req, const httplib::Response& res) {
    log(LogLevel::kDebug, "web UI: ", req.method, " ", req.path, " ", res.status);
  });

  int port = where.port;
  if (port == 0) {
    port = s.bind_to_any_port(where.host);
  } else if (!s.bind_to_port(where.host, port)) {
    port = -1;
  }
  if (port <= 0) {
    throw Error("--http-listen '" + options_.listen + "': cannot bind (address in use or invalid)");
  }
  address_ = where.text + ":" + std::to_string(port);
  thread_ = std::thread([this] {
    server_->listen_after_bind();
    ended_ = true;
  });
  // httplib's stop() does nothing before the accept loop runs: wait for it.
  while (!server_->is_running() && !ended_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!server_->is_running()) {
    thread_.join();
    throw Error("--http-listen '" + options_.listen + "': cannot serve on it");
  }
}

HttpListener::~HttpListener() { stop(); }

void HttpListener::stop() {
  if (stopped_.exchange(true)) return;
  server_->stop();
  if (thread_.joinable()) thread_.join();
}

void HttpListener::route(const httplib::Request& req, httplib::Response& res) {
  const std::string& path = req.path;
  if (path == "/login") {
    if (!auth_.enabled()) return res.set_redirect("/", 303);
    return serve_login_form(res, 200, safe_next(req.get_param_value("next")), "");
  }
  if (path == "/logout") return method_not_allowed(req, res);
  if (path == "/api" || path.starts_with("/api/")) {
    if (!authorize(req, res, true)) return;
    const ApiResponse answer = api_.handle(path.substr(4), req.params);
    res.status = answer.status;
    res.set_header("Cache-Control", "no-store");
    res.set_content(answer.body, kJson);
    return;
  }
  if (is_page(path)) {
    if (!authorize(req, res, false)) return;
    return send_asset(req, res, *find_web_asset("index.html"));
  }
  not_found(res);
}

bool HttpListener::authorize(const httplib::Request& req, httplib::Response& res, bool api) {
  if (!auth_.enabled()) return true;
  std::optional<AccessRole> role;
  if (req.has_header("Authorization")) {
    role = auth_.role_of_authorization(req.get_header_value("Authorization"));
  } else if (const std::optional<std::string> id = session_cookie(req)) {
    role = sessions_.find(*id);
  }
  if (role == AccessRole::kReader || role == AccessRole::kAdmin) return true;
  if (role == AccessRole::kAgent) {
    res.status = 403;
    if (api) {
      res.set_content(std::string("{\"error\": \"") + kAgentRefused + "\"}", kJson);
    } else {
      res.set_content(std::string(kAgentRefused) + "\n", kText);
    }
    return false;
  }
  if (api) {
    res.status = 401;
    res.set_header("WWW-Authenticate", "Bearer realm=\"ampscope\"");
    res.set_header("Cache-Control", "no-store");
    res.set_content(
        "{\"error\": \"a reader or admin token is needed: 'Authorization: Bearer <token>' or a "
        "session from /login\"}",
        kJson);
  } else {
    res.set_redirect("/login?next=" + httplib::detail::encode_query_param(req.target), 303);
  }
  return false;
}

void HttpListener::login(const httplib::Request& req, httplib::Response& res) {
  // The form's fields from the body only: a token in the URL would end up in logs and history.
  httplib::Params form;
  if (req.get_header_value("Content-Type").starts_with("application/x-www-form-urlencoded")) {
    httplib::detail::parse_query_text(req.body, form);
  }
  const auto field = [&form](const std::string& name) {
    const auto it = form.find(name);
    return it == form.end() ? std::string() : it->second;
  };
  const std::string next = safe_next(field("next"));
  if (!same_origin(req, tls_)) {
    res.status = 403;
    res.set_content("a sign-in from another site is refused\n", kText);
    return;
  }
  if (!auth_.enabled()) return res.set_redirect(next, 303);
  const std::optional<AccessRole> role = auth_.role_of(field("token"));
  if (!role) {
    log_warning("web UI: refused a sign-in from ", req.remote_addr, ": not a known token");
    return serve_login_form(res, 401, next, "token refused");
  }
  if (*role == AccessRole::kAgent) {
    log_warning("web UI: refused a sign-in from ", req.remote_addr, ": an agent token");
    return serve_login_form(res, 403, next, kAgentRefused);
  }
  const std::string id = sessions_.create(*role);
  res.set_header("Set-Cookie", session_cookie_header(id, sessions_.lifetime().count(), tls_));
  res.set_redirect(next, 303);
}

void HttpListener::logout(const httplib::Request& req, httplib::Response& res) {
  if (!same_origin(req, tls_)) {
    res.status = 403;
    res.set_content("a sign-out from another site is refused\n", kText);
    return;
  }
  if (const std::optional<std::string> id = session_cookie(req)) sessions_.remove(*id);
  res.set_header("Set-Cookie", session_cookie_header("", 0, tls_));
  res.set_redirect(auth_.enabled() ? "/login" : "/", 303);
}

void HttpListener::serve_login_form(httplib::Response& res, int status, const std::string& next,
                                    const std::string& error) {
  // login.html holds <p class="error"><!--ampscope:error--></p> and value="__NEXT__".
  std::string page(find_web_asset("login.html")->bytes());
  page = replace_all(std::move(page), kErrorMarker, html_escape(error));
  page = replace_all(std::move(page), kNextMarker, html_escape(next));
  res.status = status;
  res.set_header("Cache-Control", "no-store");
  res.set_content(page, kHtml);
}

}  // namespace ampscope::server
