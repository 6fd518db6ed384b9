// The web UI's routes (web_routes.h): tokens, sessions, assets, pages and the JSON API.
#include "web_routes.h"

#include <algorithm>
#include <optional>
#include <set>

#include "ampscope/check.h"
#include "log.h"
#include "webui_api.h"
#include "webui_assets.h"

namespace ampscope::server {
namespace {

constexpr std::string_view kCookieName = "ampscope_session";
constexpr std::string_view kErrorMarker = "<!--ampscope:error-->";
constexpr std::string_view kNextMarker = "__NEXT__";
constexpr const char* kJson = "application/json";
constexpr const char* kHtml = "text/html; charset=utf-8";
constexpr const char* kText = "text/plain; charset=utf-8";
constexpr const char* kAgentRefused = "the web UI needs a reader or admin token";

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

std::string first_param(const QueryParams& params, const std::string& name) {
  const auto it = params.find(name);
  return it == params.end() ? std::string() : it->second;
}

// The value of the session cookie in the request's Cookie header ("a=1; ampscope_session=..").
std::optional<std::string> session_cookie(const HttpRequest& req) {
  std::string_view rest = req.header_or_empty("Cookie");
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

const std::set<std::string, std::less<>>& public_assets() {
  static const std::set<std::string, std::less<>> names = [] {
    const WebAsset* login_page = find_web_asset("login.html");
    AMPSCOPE_CHECK(find_web_asset("index.html") != nullptr && login_page != nullptr,
                   "expected index.html and login.html among the web UI's assets");
    return assets_of(login_page->bytes());
  }();
  return names;
}

// A browser's form post carries Origin; one from another site is refused (login CSRF). A client
// without Origin (curl, scripts) is not a browser on another site.
bool same_origin(const HttpRequest& req) {
  const std::optional<std::string_view> origin = req.header("Origin");
  if (!origin) return true;
  return *origin == (req.tls ? "https://" : "http://") + std::string(req.header_or_empty("Host"));
}

HttpResponse send_asset(const HttpRequest& req, const WebAsset& asset) {
  HttpResponse res;
  res.set_header("ETag", std::string(asset.etag));
  res.set_header("Cache-Control", "no-cache");
  if (etag_matches(req.header_or_empty("If-None-Match"), asset.etag)) {
    res.status = 304;
    return res;
  }
  res.set_content(std::string(asset.bytes()), std::string(asset.content_type));
  return res;
}

HttpResponse method_not_allowed(std::string_view path) {
  HttpResponse res;
  res.status = 405;
  res.set_header("Allow", path == "/login"    ? "GET, HEAD, POST"
                          : path == "/logout" ? "POST"
                                              : "GET, HEAD");
  res.set_content("method not allowed\n", kText);
  return res;
}

HttpResponse not_found() {
  HttpResponse res;
  res.status = 404;
  res.set_content("not found\n", kText);
  return res;
}

}  // namespace

const std::vector<std::pair<std::string, std::string>>& web_security_headers() {
  static const std::vector<std::pair<std::string, std::string>> headers = {
      {"Content-Security-Policy", "default-src 'self'"},
      {"X-Content-Type-Options", "nosniff"},
      {"X-Frame-Options", "DENY"}};
  return headers;
}

WebRoutes::WebRoutes(const Authenticator& auth, const WebApi& api, WebSessions::Clock clock,
                     std::function<void()> on_refusal)
    : auth_(auth), api_(api), sessions_(std::move(clock)), on_refusal_(std::move(on_refusal)) {
  public_assets();  // checks the table once, at start-up
}

HttpResponse WebRoutes::handle(const HttpRequest& req) {
  const Target target = parse_target(req.target);
  const bool get = req.method == "GET" || req.method == "HEAD";
  if (!get && req.method != "POST") {
    // Its body is not read: the connection closes after the answer.
    HttpResponse res = method_not_allowed(target.path);
    res.close = true;
    return res;
  }
  if (req.method == "POST") {
    if (target.path == "/login") return login(req);
    if (target.path == "/logout") return logout(req);
    return method_not_allowed(target.path);
  }
  return route(req, target);
}

HttpResponse WebRoutes::route(const HttpRequest& req, const Target& target) {
  const std::string& path = target.path;
  HttpResponse res;
  if (path.starts_with("/assets/")) {
    const WebAsset* asset = find_web_asset(std::string_view(path).substr(8));
    if (asset == nullptr) return not_found();
    if (!public_assets().contains(asset->name) && !authorize(req, res, false)) return res;
    return send_asset(req, *asset);
  }
  if (path == "/login") {
    if (!auth_.enabled()) {
      res.redirect("/");
      return res;
    }
    return login_form(200, safe_next(first_param(target.params, "next")), "");
  }
  if (path == "/logout") return method_not_allowed(path);
  if (path == "/api" || path.starts_with("/api/")) {
    if (!authorize(req, res, true)) return res;
    const ApiResponse answer = api_.handle(path.substr(4), target.params);
    res.status = answer.status;
    res.set_header("Cache-Control", "no-store");
    res.set_content(answer.body, kJson);
    return res;
  }
  if (is_page(path)) {
    if (!authorize(req, res, false)) return res;
    return send_asset(req, *find_web_asset("index.html"));
  }
  return not_found();
}

void WebRoutes::refused() const {
  if (on_refusal_) on_refusal_();
}

bool WebRoutes::authorize(const HttpRequest& req, HttpResponse& res, bool api) {
  if (!auth_.enabled()) return true;
  std::optional<AccessRole> role;
  const std::optional<std::string_view> authorization = req.header("Authorization");
  if (authorization) {
    role = auth_.role_of_authorization(*authorization);
  } else if (const std::optional<std::string> id = session_cookie(req)) {
    role = sessions_.find(*id);
  }
  if (role == AccessRole::kReader || role == AccessRole::kAdmin) return true;
  if (role == AccessRole::kAgent) {
    refused();
    res.status = 403;
    if (api) {
      res.set_header("Cache-Control", "no-store");
      res.set_content(std::string("{\"error\": \"") + kAgentRefused + "\"}", kJson);
    } else {
      res.set_content(std::string(kAgentRefused) + "\n", kText);
    }
    return false;
  }
  if (api) {
    refused();
    res.status = 401;
    res.set_header("WWW-Authenticate", "Bearer realm=\"ampscope\"");
    res.set_header("Cache-Control", "no-store");
    res.set_content(
        "{\"error\": \"a reader or admin token is needed: 'Authorization: Bearer <token>' or a "
        "session from /login\"}",
        kJson);
  } else {
    // A browser that has not signed in yet: the form, not a refusal.
    res.redirect("/login?next=" + percent_encode(req.target));
  }
  return false;
}

HttpResponse WebRoutes::login(const HttpRequest& req) {
  // The form's fields from the body only: a token in the URL would end up in logs and history.
  QueryParams form;
  if (req.header_or_empty("Content-Type").starts_with("application/x-www-form-urlencoded")) {
    form = parse_query(req.body);
  }
  const std::string next = safe_next(first_param(form, "next"));
  HttpResponse res;
  if (!same_origin(req)) {
    res.status = 403;
    res.set_content("a sign-in from another site is refused\n", kText);
    return res;
  }
  if (!auth_.enabled()) {
    res.redirect(next);
    return res;
  }
  const std::optional<AccessRole> role = auth_.role_of(first_param(form, "token"));
  if (!role) {
    refused();
    log_warning("web UI: refused a sign-in from ", req.remote_address, ": not a known token");
    return login_form(401, next, "token refused");
  }
  if (*role == AccessRole::kAgent) {
    refused();
    log_warning("web UI: refused a sign-in from ", req.remote_address, ": an agent token");
    return login_form(403, next, kAgentRefused);
  }
  const std::string id = sessions_.create(*role);
  res.set_header("Set-Cookie", session_cookie_header(id, sessions_.lifetime().count(), req.tls));
  res.redirect(next);
  return res;
}

HttpResponse WebRoutes::logout(const HttpRequest& req) {
  HttpResponse res;
  if (!same_origin(req)) {
    res.status = 403;
    res.set_content("a sign-out from another site is refused\n", kText);
    return res;
  }
  if (const std::optional<std::string> id = session_cookie(req)) sessions_.remove(*id);
  res.set_header("Set-Cookie", session_cookie_header("", 0, req.tls));
  res.redirect(auth_.enabled() ? "/login" : "/");
  return res;
}

HttpResponse WebRoutes::login_form(int status, const std::string& next, const std::string& error) {
  // login.html holds <p class="error"><!--ampscope:error--></p> and value="__NEXT__".
  std::string page(find_web_asset("login.html")->bytes());
  page = replace_all(std::move(page), kErrorMarker, html_escape(error));
  page = replace_all(std::move(page), kNextMarker, html_escape(next));
  HttpResponse res;
  res.status = status;
  res.set_header("Cache-Control", "no-store");
  res.set_content(std::move(page), kHtml);
  return res;
}

}  // namespace ampscope::server
