// The web UI's HTTP listener over real sockets on loopback, with libcurl as the browser: the
// embedded assets (types, bytes, ETag), page routes, 404 and 405, the security headers, the
// JSON API over a store written through StoreWriter, and with tokens the login form, sessions
// (their expiry on a clock the test moves), the Bearer header, logout and open redirects. Then
// the sessions on their own, HTTPS with a certificate made by openssl, and the ampscope-server
// binary with --http-listen.
#include "http_listener.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "ampscope/testing/child_process.h"
#include "ampscope/testing/files.h"
#include "ampscope/testing/net.h"
#include "ampscope/testing/server_process.h"
#include "metrics.h"
#include "metrics_endpoint.h"
#include "run_registry.h"
#include "server_harness.h"
#include "store.h"
#include "streams.h"
#include "web_routes.h"
#include "web_sessions.h"
#include "webui_api.h"
#include "webui_assets.h"

#ifndef AMPSCOPE_WEBUI_DIR
#error "AMPSCOPE_WEBUI_DIR must name server/webui of the source tree"
#endif
#ifndef AMPSCOPE_SERVER_BINARY
#error "AMPSCOPE_SERVER_BINARY must name the ampscope-server executable"
#endif

namespace ampscope::server {
namespace {

using namespace std::chrono_literals;
using testing::TempDir;

constexpr const char* kReader = "reader-token-5f1c0a7e";
constexpr const char* kAdmin = "admin-token-9a8b7c6d";
constexpr const char* kAgent = "agent-token-0b1c2d3e";

std::vector<TokenGrant> grants() {
  return {{AccessRole::kReader, kReader, ""},
          {AccessRole::kAdmin, kAdmin, ""},
          {AccessRole::kAgent, kAgent, ""}};
}

// --- A small HTTP client (libcurl) that shows everything: status, headers, body ------------------

struct Reply {
  long status = 0;  // 0: no answer
  std::string body;
  std::multimap<std::string, std::string> headers;  // names in lower case

  std::string header(const std::string& name) const {
    const auto it = headers.find(name);
    return it == headers.end() ? std::string() : it->second;
  }
};

size_t collect_body(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

size_t collect_header(char* data, size_t size, size_t n, void* out) {
  auto* headers = static_cast<std::multimap<std::string, std::string>*>(out);
  std::string line(data, size * n);
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
  if (line.starts_with("HTTP/")) {
    headers->clear();  // a new response (after a 100 Continue)
  } else if (const auto colon = line.find(':'); colon != std::string::npos) {
    std::string name = line.substr(0, colon);
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    std::string value = line.substr(colon + 1);
    value.erase(0, value.find_first_not_of(' '));
    headers->emplace(std::move(name), std::move(value));
  }
  return size * n;
}

// `headers`: "Name: value"; `body`: POST only, sent as a form; `ca_file`: HTTPS, the CA to
// trust; `client`: mutual TLS, the client certificate <client>.pem with its key <client>.key.
Reply send(const std::string& method, const std::string& url,
           const std::vector<std::string>& header_lines = {}, const std::string& body = "",
           const std::string& ca_file = "", const std::string& client = "") {
  Reply reply;
  CURL* curl = curl_easy_init();
  if (curl == nullptr) return reply;
  curl_slist* headers = nullptr;
  for (const std::string& h : header_lines) headers = curl_slist_append(headers, h.c_str());
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_PATH_AS_IS, 1L);  // send "/assets/../x" as it is
  curl_easy_setopt(curl, CURLOPT_NOPROXY, "*");
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, 10000L);
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, collect_body);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &reply.body);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, collect_header);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &reply.headers);
  if (method == "POST") {
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.c_str());
  } else if (method == "HEAD") {
    curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  } else if (method != "GET") {
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method.c_str());
  }
  if (!ca_file.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO, ca_file.c_str());
  const std::string client_cert = client + ".pem";
  const std::string client_key = client + ".key";
  if (!client.empty()) {
    curl_easy_setopt(curl, CURLOPT_SSLCERT, client_cert.c_str());
    curl_easy_setopt(curl, CURLOPT_SSLKEY, client_key.c_str());
  }
  if (curl_easy_perform(curl) == CURLE_OK) {
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &reply.status);
  }
  curl_slist_free_all(headers);
  curl_easy_cleanup(curl);
  return reply;
}

std::string form(const std::map<std::string, std::string>& fields) {
  std::string out;
  for (const auto& [name, value] : fields) {
    if (!out.empty()) out += '&';
    out += name + "=" + testing::url_encode(value);
  }
  return out;
}

// "ampscope_session=<id>" of a Set-Cookie header, for a Cookie header.
std::string cookie_of(const Reply& reply) {
  const std::string set = reply.header("set-cookie");
  return "Cookie: " + set.substr(0, set.find(';'));
}

std::string source_file(const std::string& relative) {
  return testing::read_text(std::filesystem::path(AMPSCOPE_WEBUI_DIR) / relative);
}

// --- The listener over a real store --------------------------------------------------------------

class HttpListenerTest : public ::testing::Test {
 protected:
  HttpListenerTest()
      : writer_(StoreOptions{(dir_ / "store.db").string(), false}),
        reader_((dir_ / "store.db").string()),
        runs_(10),
        api_(reader_, streams_, runs_) {}

  void start(std::vector<TokenGrant> tokens = {}, HttpOptions options = {}) {
    auth_ = std::make_unique<Authenticator>(std::move(tokens));
    routes_ = std::make_unique<WebRoutes>(
        *auth_, api_,
        [this] {
          return std::chrono::steady_clock::now() + std::chrono::seconds(clock_skew_s_.load());
        },
        [this] { ++refusals_; });
    options.listen = "127.0.0.1:0";
    options.default_headers = web_security_headers();
    options.on_tls_refusal = [this] { ++tls_refusals_; };
    const bool tls = !options.tls_cert_pem.empty();
    listener_ = std::make_unique<HttpListener>(std::move(options), handler());
    base_ = (tls ? "https://" : "http://") + listener_->address();
  }

  HttpListener::Handler handler() {
    return [r = routes_.get()](const HttpRequest& req) { return r->handle(req); };
  }

  Reply get(const std::string& path, const std::vector<std::string>& headers = {}) {
    return send("GET", base_ + path, headers);
  }
  Reply post(const std::string& path, const std::string& body,
             const std::vector<std::string>& headers = {}) {
    return send("POST", base_ + path, headers, body);
  }
  Reply login(const std::string& token, const std::string& next = "/") {
    return post("/login", form({{"token", token}, {"next", next}}));
  }

  // One run of `steps` reports, stored as the ingest thread stores them.
  void store_run(const std::string& run, int steps) {
    const std::int64_t now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                    std::chrono::system_clock::now().time_since_epoch())
                                    .count();
    writer_.begin();
    writer_.upsert_run(testing::make_hello(run), now_ns);
    writer_.upsert_agent(testing::make_hello(run), now_ns);
    for (int seq = 1; seq <= steps; ++seq) {
      const v1::StepReport r = testing::make_report(run, 0, seq, seq, 2);
      writer_.insert_report(r, r.SerializeAsString(), now_ns);
      writer_.set_agent_progress(run, 0, seq, now_ns, nullptr);
    }
    writer_.commit();
  }

  TempDir dir_;
  StoreWriter writer_;
  StoreReader reader_;
  StreamTable streams_;
  RunRegistry runs_;
  WebApi api_;
  std::atomic<std::int64_t> clock_skew_s_{0};
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<WebRoutes> routes_;
  std::atomic<int> refusals_{0};
  std::atomic<int> tls_refusals_{0};
  std::unique_ptr<HttpListener> listener_;  // last: stopped before what it reads goes
  std::string base_;
};

void expect_security_headers(const Reply& r, const std::string& what) {
  EXPECT_EQ(r.header("content-security-policy"), "default-src 'self'") << what;
  EXPECT_EQ(r.header("x-content-type-options"), "nosniff") << what;
  EXPECT_EQ(r.header("x-frame-options"), "DENY") << what;
}

TEST_F(HttpListenerTest, ServesEveryAssetWithItsTypeAndTheSourceFilesBytes) {
  start();
  ASSERT_GE(web_assets().size(), 6u);
  std::set<std::string> names;
  for (const WebAsset& asset : web_assets()) {
    const std::string name(asset.name);
    names.insert(name);
    const Reply r = get("/assets/" + name);
    EXPECT_EQ(r.status, 200) << name;
    EXPECT_EQ(r.header("content-type"), asset.content_type) << name;
    const bool from_npm = name.starts_with("uPlot.");
    const std::string source =
        source_file(from_npm ? "node_modules/uplot/dist/" + name : "assets/" + name);
    EXPECT_FALSE(source.empty()) << name;
    EXPECT_TRUE(r.body == source) << name << ": the served bytes differ from the source file";
    EXPECT_EQ(r.header("cache-control"), "no-cache") << name;
    EXPECT_EQ(r.header("etag"), asset.etag) << name;
  }
  for (const char* name :
       {"index.html", "login.html", "app.css", "app.js", "uPlot.iife.min.js", "uPlot.min.css"}) {
    EXPECT_TRUE(names.contains(name)) << name;
  }
  EXPECT_EQ(get("/assets/app.js").header("content-type"), "text/javascript; charset=utf-8");
  EXPECT_EQ(get("/assets/app.css").header("content-type"), "text/css; charset=utf-8");
  EXPECT_EQ(get("/assets/index.html").header("content-type"), "text/html; charset=utf-8");
}

// index.html names every module app.js imports (directly or not) as a modulepreload, so that
// the browser fetches them with app.js instead of one import level after another.
TEST(WebAssetsTest, IndexPreloadsEveryModule) {
  const WebAsset* index = find_web_asset("index.html");
  ASSERT_NE(index, nullptr);
  const std::string html(index->bytes());
  int modules = 0;
  for (const WebAsset& asset : web_assets()) {
    const std::string name(asset.name);
    if (!name.ends_with(".js") || name.starts_with("uPlot.") || name == "app.js") continue;
    ++modules;
    EXPECT_NE(html.find("<link rel=\"modulepreload\" href=\"/assets/" + name + "\">"),
              std::string::npos)
        << name << " is not preloaded by index.html";
  }
  EXPECT_GE(modules, 5);
}

TEST_F(HttpListenerTest, AnUnchangedAssetIs304OnItsETag) {
  start();
  const Reply first = get("/assets/app.js");
  const std::string etag = first.header("etag");
  ASSERT_EQ(etag.size(), 18u) << etag;  // 16 hex digits in quotes
  EXPECT_EQ(etag.front(), '"');
  const Reply again = get("/assets/app.js", {"If-None-Match: " + etag});
  EXPECT_EQ(again.status, 304);
  EXPECT_TRUE(again.body.empty());
  EXPECT_EQ(again.header("etag"), etag);
  EXPECT_EQ(get("/assets/app.js", {"If-None-Match: \"0\", W/" + etag}).status, 304);
  EXPECT_EQ(get("/assets/app.js", {"If-None-Match: \"0123456789abcdef\""}).status, 200);
  EXPECT_NE(get("/assets/app.css").header("etag"), etag);
}

// Brotli at its default quality 11 took 1.2 s for a 600 KB API answer: the listener never offers
// it, gzip (zlib's default level) or nothing instead.
TEST_F(HttpListenerTest, ResponsesAreGzipNeverBrotli) {
  start();
  const Reply plain = get("/assets/app.js");
  ASSERT_EQ(plain.status, 200);
  EXPECT_EQ(plain.header("content-encoding"), "");
  const Reply browser = get("/assets/app.js", {"Accept-Encoding: gzip, deflate, br"});
  EXPECT_EQ(browser.status, 200);
  EXPECT_EQ(browser.header("content-encoding"), "gzip");
  EXPECT_LT(browser.body.size(), plain.body.size());
  const Reply brotli_only = get("/assets/app.js", {"Accept-Encoding: br"});
  EXPECT_EQ(brotli_only.status, 200);
  EXPECT_EQ(brotli_only.header("content-encoding"), "");
  EXPECT_EQ(brotli_only.body, plain.body);
}

TEST_F(HttpListenerTest, PageRoutesServeIndexHtml) {
  start();
  const std::string index(find_web_asset("index.html")->bytes());
  for (const char* path : {"/", "/runs", "/runs/demo", "/runs/demo/",
                           "/runs/demo/tensors?name=h0.mlp.fc&role=weight_grad",
                           "/runs/demo/tensors/", "/compare?a=demo&b=other"}) {
    const Reply r = get(path);
    EXPECT_EQ(r.status, 200) << path;
    EXPECT_EQ(r.header("content-type"), "text/html; charset=utf-8") << path;
    EXPECT_TRUE(r.body == index) << path;
  }
}

TEST_F(HttpListenerTest, UnknownPathsAndAssetsAre404) {
  start();
  for (const char* path :
       {"/nope", "/assets/nope.js", "/assets/", "/assets/../CMakeLists.txt", "/runs/", "/runs/a/b",
        "/runs/a/tensors/x", "/index.html", "/compare/x", "/favicon.ico"}) {
    EXPECT_EQ(get(path).status, 404) << path;
  }
}

TEST_F(HttpListenerTest, OtherMethodsAre405) {
  start();
  struct Case {
    const char* method;
    const char* path;
    const char* allow;
  };
  for (const Case& c : {Case{"PUT", "/", "GET, HEAD"}, Case{"DELETE", "/api/runs", "GET, HEAD"},
                        Case{"POST", "/runs/demo", "GET, HEAD"}, Case{"PATCH", "/", "GET, HEAD"},
                        Case{"OPTIONS", "/api/runs", "GET, HEAD"}, Case{"TRACE", "/", "GET, HEAD"},
                        Case{"GET", "/logout", "POST"}, Case{"PUT", "/login", "GET, HEAD, POST"}}) {
    const Reply r = send(c.method, base_ + c.path, {}, "x=1");
    EXPECT_EQ(r.status, 405) << c.method << " " << c.path;
    EXPECT_EQ(r.header("allow"), c.allow) << c.method << " " << c.path;
  }
  // HEAD is a GET without the body.
  const Reply head = send("HEAD", base_ + "/assets/app.js");
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(head.header("content-length"), std::to_string(find_web_asset("app.js")->size));
}

TEST_F(HttpListenerTest, EveryResponseCarriesTheSecurityHeaders) {
  start(grants());
  expect_security_headers(get("/assets/app.css"), "asset");
  expect_security_headers(get("/login"), "login form");
  expect_security_headers(get("/runs/demo"), "redirect to the login form");
  expect_security_headers(get("/api/runs"), "401");
  expect_security_headers(get("/nope"), "404");
  expect_security_headers(send("PUT", base_ + "/"), "405");
  expect_security_headers(get("/api/runs", {std::string("Authorization: Bearer ") + kReader}),
                          "api");
  expect_security_headers(get("/", {std::string("Authorization: Bearer ") + kReader}), "page");
}

TEST_F(HttpListenerTest, ApiRequestsGoToWebApiWithTheirQueryParameters) {
  store_run("web-run", 5);
  start();
  const Reply runs = get("/api/runs");
  ASSERT_EQ(runs.status, 200) << runs.body;
  EXPECT_EQ(runs.header("content-type"), "application/json");
  EXPECT_EQ(runs.header("cache-control"), "no-store");
  const nlohmann::json listed = nlohmann::json::parse(runs.body);
  ASSERT_EQ(listed.at("runs").size(), 1u) << runs.body;
  EXPECT_EQ(listed["runs"][0].at("run_id"), "web-run");
  EXPECT_EQ(listed["runs"][0].at("last_step"), 5);

  // The listener hands WebApi the path after /api and the decoded query parameters: its
  // answers are those WebApi gives for them.
  struct Case {
    std::string url;
    std::string path;
    std::multimap<std::string, std::string> params;
  };
  for (const Case& c : {Case{"/api/runs/web-run", "/runs/web-run", {}},
                        Case{"/api/runs/web-run?from=2&to=4&width=10",
                             "/runs/web-run",
                             {{"from", "2"}, {"to", "4"}, {"width", "10"}}},
                        Case{"/api/runs/web-run?width=not%20a%20number",
                             "/runs/web-run",
                             {{"width", "not a number"}}},
                        Case{"/api/runs/no-such-run", "/runs/no-such-run", {}},
                        Case{"/api/nothing-here", "/nothing-here", {}}}) {
    const Reply r = get(c.url);
    const ApiResponse direct = api_.handle(c.path, c.params);
    EXPECT_EQ(r.status, direct.status) << c.url << ": " << r.body;
    EXPECT_EQ(r.header("content-type"), "application/json") << c.url;
    EXPECT_EQ(r.header("cache-control"), "no-store") << c.url;
    const nlohmann::json served = nlohmann::json::parse(r.body);
    const nlohmann::json handled = nlohmann::json::parse(direct.body);
    EXPECT_EQ(served.value("error", ""), handled.value("error", "")) << c.url;
  }
  EXPECT_EQ(get("/api/runs/web-run").status, 200);
  EXPECT_EQ(get("/api/runs/no-such-run").status, 404);
  const Reply bad = get("/api/runs/web-run?width=not%20a%20number");
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.body.find("width"), std::string::npos) << bad.body;
}

TEST_F(HttpListenerTest, WithoutTokensThereIsNoLogin) {
  start();
  const Reply form = get("/login");
  EXPECT_EQ(form.status, 303);
  EXPECT_EQ(form.header("location"), "/");
  EXPECT_EQ(get("/api/runs").status, 200);
  EXPECT_EQ(get("/runs/demo").status, 200);
}

TEST_F(HttpListenerTest, WithoutATokenPagesRedirectToTheLoginForm) {
  start(grants());
  const Reply r = get("/runs/demo/tensors?name=h0.mlp.fc&role=weight_grad");
  EXPECT_EQ(r.status, 303);
  EXPECT_EQ(r.header("location"),
            "/login?next=%2Fruns%2Fdemo%2Ftensors%3Fname%3Dh0.mlp.fc%26role%3Dweight_grad");
  EXPECT_EQ(get("/").status, 303);
  EXPECT_EQ(get("/assets/app.js").status, 303);
  EXPECT_EQ(get("/assets/uPlot.iife.min.js").status, 303);
  // The login form and what it links (its stylesheet and icon) are open.
  EXPECT_EQ(get("/assets/app.css").status, 200);
  const Reply icon = get("/assets/favicon.svg");
  EXPECT_EQ(icon.status, 200);
  EXPECT_EQ(icon.header("content-type"), "image/svg+xml");
  const Reply form = get("/login?next=%2Fruns%2Fdemo");
  EXPECT_EQ(form.status, 200);
  EXPECT_EQ(form.header("content-type"), "text/html; charset=utf-8");
  EXPECT_EQ(form.header("cache-control"), "no-store");
  EXPECT_NE(form.body.find("name=\"next\" value=\"/runs/demo\""), std::string::npos) << form.body;
  EXPECT_EQ(form.body.find("__NEXT__"), std::string::npos);
  EXPECT_EQ(form.body.find("token refused"), std::string::npos);
}

TEST_F(HttpListenerTest, WithoutATokenTheApiIs401Json) {
  start(grants());
  for (const char* path : {"/api/runs", "/api/runs/demo?width=10", "/api"}) {
    const Reply r = get(path);
    EXPECT_EQ(r.status, 401) << path;
    EXPECT_EQ(r.header("content-type"), "application/json") << path;
    EXPECT_EQ(r.header("www-authenticate"), "Bearer realm=\"ampscope\"") << path;
    const nlohmann::json body = nlohmann::json::parse(r.body);
    EXPECT_TRUE(body.at("error").is_string()) << r.body;
  }
  EXPECT_EQ(get("/api/runs", {"Authorization: Bearer wrong-token"}).status, 401);
  EXPECT_EQ(get("/api/runs", {std::string("Authorization: Basic ") + kReader}).status, 401);
  EXPECT_EQ(get("/api/runs", {"Cookie: ampscope_session=00112233445566778899aabbccddeeff"}).status,
            401);
}

TEST_F(HttpListenerTest, AWrongTokenAtLoginIs401WithTheFormSayingSo) {
  start(grants());
  const Reply r = login("not-a-token", "/runs/demo");
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(r.header("set-cookie"), "");
  EXPECT_NE(r.body.find("<p class=\"error\">token refused</p>"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("value=\"/runs/demo\""), std::string::npos) << r.body;
  EXPECT_EQ(r.body.find("not-a-token"), std::string::npos);
  EXPECT_EQ(login("", "/").status, 401);
  // The token is read from the form only, never from the URL.
  EXPECT_EQ(post(std::string("/login?token=") + kReader, "next=%2F").status, 401);
}

TEST_F(HttpListenerTest, AnAgentTokenIs403) {
  start(grants());
  const Reply r = login(kAgent);
  EXPECT_EQ(r.status, 403);
  EXPECT_EQ(r.header("set-cookie"), "");
  EXPECT_NE(r.body.find("the web UI needs a reader or admin token"), std::string::npos) << r.body;
  const std::string bearer = std::string("Authorization: Bearer ") + kAgent;
  const Reply api = get("/api/runs", {bearer});
  EXPECT_EQ(api.status, 403);
  EXPECT_EQ(nlohmann::json::parse(api.body).at("error"),
            "the web UI needs a reader or admin token");
  EXPECT_EQ(get("/", {bearer}).status, 403);
  EXPECT_EQ(get("/assets/app.js", {bearer}).status, 403);
}

TEST_F(HttpListenerTest, AReaderSignsInAndTheCookieWorks) {
  store_run("web-run", 3);
  start(grants());
  const Reply r = login(kReader, "/runs/web-run?x=1");
  ASSERT_EQ(r.status, 303) << r.body;
  EXPECT_EQ(r.header("location"), "/runs/web-run?x=1");
  const std::string set = r.header("set-cookie");
  EXPECT_TRUE(set.starts_with("ampscope_session=")) << set;
  const std::string id = set.substr(17, set.find(';') - 17);
  EXPECT_EQ(id.size(), 32u) << set;
  for (const char* attribute : {"; Path=/", "; HttpOnly", "; SameSite=Strict", "; Max-Age=43200"}) {
    EXPECT_NE(set.find(attribute), std::string::npos) << set;
  }
  EXPECT_EQ(set.find("Secure"), std::string::npos) << "plain HTTP: " << set;
  const std::string cookie = cookie_of(r);
  EXPECT_EQ(get("/api/runs", {cookie}).status, 200);
  EXPECT_EQ(get("/runs/web-run", {cookie}).status, 200);
  EXPECT_EQ(get("/assets/app.js", {cookie}).status, 200);
  EXPECT_EQ(get("/api/runs", {"Cookie: theme=dark; " + cookie.substr(8) + "; x=y"}).status, 200);
  // An admin signs in as well.
  EXPECT_EQ(login(kAdmin).status, 303);
  EXPECT_EQ(routes_->sessions().size(), 2u);
}

TEST_F(HttpListenerTest, TheBearerHeaderWorksWithoutASession) {
  start(grants());
  for (const char* token : {kReader, kAdmin}) {
    const std::string bearer = std::string("Authorization: Bearer ") + token;
    EXPECT_EQ(get("/api/runs", {bearer}).status, 200) << token;
    EXPECT_EQ(get("/", {bearer}).status, 200) << token;
  }
  EXPECT_EQ(routes_->sessions().size(), 0u);
}

TEST_F(HttpListenerTest, LogoutEndsTheSession) {
  start(grants());
  const std::string cookie = cookie_of(login(kReader));
  ASSERT_EQ(get("/api/runs", {cookie}).status, 200);
  const Reply out = post("/logout", "", {cookie});
  EXPECT_EQ(out.status, 303);
  EXPECT_EQ(out.header("location"), "/login");
  EXPECT_NE(out.header("set-cookie").find("Max-Age=0"), std::string::npos)
      << out.header("set-cookie");
  EXPECT_EQ(get("/api/runs", {cookie}).status, 401);
  EXPECT_EQ(get("/runs/demo", {cookie}).status, 303);
  EXPECT_EQ(routes_->sessions().size(), 0u);
}

TEST_F(HttpListenerTest, AnExpiredSessionIsRefused) {
  start(grants());
  const std::string cookie = cookie_of(login(kReader));
  clock_skew_s_ = 12 * 3600 - 60;
  EXPECT_EQ(get("/api/runs", {cookie}).status, 200) << "a minute before it expires";
  clock_skew_s_ = 12 * 3600;
  EXPECT_EQ(get("/api/runs", {cookie}).status, 401);
  EXPECT_EQ(get("/", {cookie}).status, 303);
  EXPECT_EQ(routes_->sessions().size(), 0u);
}

TEST_F(HttpListenerTest, NextNeverLeavesTheServer) {
  start(grants());
  for (const char* next :
       {"//evil.example/x", "http://x", "https://evil.example", "/\\evil.example",
        "javascript:alert(1)", "", "runs/demo", "/runs\r\nSet-Cookie: a=b"}) {
    const Reply r = login(kReader, next);
    EXPECT_EQ(r.status, 303) << next;
    EXPECT_EQ(r.header("location"), "/") << next;
  }
  EXPECT_EQ(login(kReader, "/compare?a=1&b=2").header("location"), "/compare?a=1&b=2");
  // The form shows a refused next as "/" and escapes an accepted one.
  EXPECT_NE(get("/login?next=%2F%2Fevil.example").body.find("value=\"/\""), std::string::npos);
  const Reply escaped = get("/login?next=%2F%22%3E%3Cscript%3Ealert(1)%3C%2Fscript%3E");
  EXPECT_EQ(escaped.body.find("<script>"), std::string::npos) << escaped.body;
  EXPECT_NE(escaped.body.find("value=\"/&quot;&gt;&lt;script&gt;alert(1)&lt;/script&gt;\""),
            std::string::npos)
      << escaped.body;
}

TEST_F(HttpListenerTest, ASignInFromAnotherSiteIsRefused) {
  start(grants());
  const std::string body = form({{"token", kReader}, {"next", "/"}});
  EXPECT_EQ(post("/login", body, {"Origin: http://evil.example"}).status, 403);
  EXPECT_EQ(routes_->sessions().size(), 0u);
  EXPECT_EQ(post("/login", body, {"Origin: http://" + listener_->address()}).status, 303);
  EXPECT_EQ(routes_->sessions().size(), 1u);
}

TEST_F(HttpListenerTest, ABodyAboveTheLimitIsRefused) {
  start(grants());
  const Reply r = post("/login", "token=" + std::string(64 * 1024, 'a'));
  EXPECT_EQ(r.status, 413);
  EXPECT_EQ(routes_->sessions().size(), 0u);
}

TEST_F(HttpListenerTest, ATakenPortIsAnErrorNamingTheFlag) {
  start();
  HttpOptions o;
  o.listen = listener_->address();
  try {
    HttpListener second(o, handler());
    FAIL() << "bound " << o.listen << " twice";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--http-listen '" + o.listen + "'"), std::string::npos)
        << e.what();
  }
  for (const char* bad : {"nonsense", "127.0.0.1:", ":80", "127.0.0.1:99999", "[::1:0"}) {
    o.listen = bad;
    EXPECT_THROW(HttpListener(o, handler()), Error) << bad;
  }
}

TEST_F(HttpListenerTest, StopIsPromptWithAnIdleKeepAliveConnection) {
  start();
  // A connection that stays open (curl keeps it for reuse) holds no worker: stop() closes it.
  CURL* curl = curl_easy_init();
  std::string body;
  curl_easy_setopt(curl, CURLOPT_URL, (base_ + "/assets/app.js").c_str());
  curl_easy_setopt(curl, CURLOPT_NOPROXY, "*");
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, collect_body);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &body);
  ASSERT_EQ(curl_easy_perform(curl), CURLE_OK);
  const auto t0 = std::chrono::steady_clock::now();
  listener_->stop();
  const auto took = std::chrono::steady_clock::now() - t0;
  curl_easy_cleanup(curl);
  EXPECT_LT(took, 2s);
  EXPECT_EQ(get("/").status, 0) << "still serving after stop()";
}

// --- Slow, idle and hostile clients --------------------------------------------------------------

// A TCP connection to `address` ("127.0.0.1:port") from the loopback address `from` (Linux
// routes all of 127.0.0.0/8 to loopback, so each is a client address of its own); -1 on error.
int connect_from(const std::string& from, const std::string& address) {
  const auto colon = address.rfind(':');
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<std::uint16_t>(std::stoi(address.substr(colon + 1))));
  ::inet_pton(AF_INET, address.substr(0, colon).c_str(), &to.sin_addr);
  sockaddr_in source{};
  source.sin_family = AF_INET;
  ::inet_pton(AF_INET, from.c_str(), &source.sin_addr);
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&source), sizeof(source)) != 0 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool send_text(int fd, std::string_view text) {
  return ::send(fd, text.data(), text.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(text.size());
}

// Whether the server ends the connection within `wait` (what it sends first is dropped).
bool closed_within(int fd, std::chrono::milliseconds wait) {
  const auto end = std::chrono::steady_clock::now() + wait;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        end - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
    char buf[4096];
    if (::recv(fd, buf, sizeof(buf), 0) <= 0) return true;
  }
}

// One whole response to a request sent on `fd`: its status line, or empty when the connection
// ended first. Reads the header and Content-Length bytes of body, no more.
std::string read_response(int fd) {
  std::string data;
  char buf[8192];
  std::size_t need = std::string::npos;
  while (need == std::string::npos || data.size() < need) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 5000) <= 0) return "";
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return "";
    data.append(buf, static_cast<std::size_t>(n));
    const auto end = data.find("\r\n\r\n");
    if (need == std::string::npos && end != std::string::npos) {
      std::string head = data.substr(0, end);
      std::transform(head.begin(), head.end(), head.begin(),
                     [](unsigned char c) { return std::tolower(c); });
      const auto at = head.find("content-length:");
      need = end + 4 + (at == std::string::npos ? 0 : std::stoul(head.substr(at + 15)));
    }
  }
  return data.substr(0, data.find("\r\n"));
}

// Connections that sent half a request header and wait, `per_address` from each of
// 127.0.0.<first_address>, the next address, ... (under the per-address bound).
class HalfSentRequests {
 public:
  HalfSentRequests(const std::string& address, int count, int per_address = 50,
                   int first_address = 2) {
    for (int i = 0; i < count; ++i) {
      const int fd =
          connect_from("127.0.0." + std::to_string(first_address + i / per_address), address);
      if (fd < 0 || !send_text(fd, "GET /api/runs HTTP/1.1\r\nHost: x\r\nUser-Agent: sl")) {
        ADD_FAILURE() << "connection " << i << ": " << std::strerror(errno);
        if (fd >= 0) ::close(fd);
        return;
      }
      fds_.push_back(fd);
    }
  }
  ~HalfSentRequests() {
    for (int fd : fds_) ::close(fd);
  }
  // How many the server has not closed.
  int still_open() const {
    int open = 0;
    for (int fd : fds_) open += closed_within(fd, 0ms) ? 0 : 1;
    return open;
  }

 private:
  std::vector<int> fds_;
};

// Each connection is a file descriptor on both ends here: 1,000 need more than the usual soft
// limit of 1024.
void need_file_descriptors(std::uint64_t n) {
  const std::uint64_t limit = raise_open_file_limit();
  ASSERT_GE(limit, n) << "the hard limit on open files is too low for this test (ulimit -Hn)";
}

void wait_for_connections(const HttpListener& listener, std::size_t n) {
  const auto end = std::chrono::steady_clock::now() + 10s;
  while (listener.connections() < n && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_GE(listener.connections(), n);
}

// 79 half-sent requests held every worker of the listener this one replaced for its 5 s read
// timeout; 1,000 of them here cost memory only, and a real client is answered at once.
TEST_F(HttpListenerTest, AThousandHalfSentRequestsDoNotDelayARealClient) {
  need_file_descriptors(2200);
  store_run("web-run", 20);
  start();
  HalfSentRequests crowd(listener_->address(), 1000);
  wait_for_connections(*listener_, 1000);
  for (const char* path : {"/api/runs/web-run", "/", "/api/runs", "/assets/app.js"}) {
    const auto t0 = std::chrono::steady_clock::now();
    const Reply r = get(path);
    const auto took = std::chrono::steady_clock::now() - t0;
    EXPECT_EQ(r.status, 200) << path;
    EXPECT_LT(took, 1s) << path;
  }
  EXPECT_EQ(crowd.still_open(), 1000) << "the half-sent requests were not held open";
}

TEST_F(HttpListenerTest, AThousandHalfSentRequestsDoNotDelayAMetricsScrape) {
  need_file_descriptors(2200);
  Metrics metrics("test");
  Authenticator auth(grants());
  MetricsEndpoint endpoint(metrics.registry(), auth);
  HttpOptions o;
  o.listen = "127.0.0.1:0";
  o.flag = "--metrics-listen";
  o.workers = 2;
  HttpListener scraped(o, [&endpoint](const HttpRequest& req) { return endpoint.handle(req); });
  HalfSentRequests crowd(scraped.address(), 1000);
  wait_for_connections(scraped, 1000);
  const auto t0 = std::chrono::steady_clock::now();
  std::string body;
  const long status = testing::http_get(
      "http://prometheus:" + std::string(kReader) + "@" + scraped.address() + "/metrics", &body);
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(status, 200);
  EXPECT_LT(took, 1s);
  EXPECT_NE(body.find("ampscope_build_info"), std::string::npos) << body;
  EXPECT_EQ(crowd.still_open(), 1000);
}

// A byte every 100 ms never leaves a connection idle, yet the request must arrive whole within
// the deadline: the connection is cut then.
TEST_F(HttpListenerTest, ARequestTrickledInIsCutAtTheDeadline) {
  HttpOptions o;
  o.limits.request_deadline = 600ms;
  start({}, o);
  const int fd = connect_from("127.0.0.1", listener_->address());
  ASSERT_GE(fd, 0);
  const std::string request = "GET / HTTP/1.1\r\nHost: x\r\nUser-Agent: a slow client\r\n\r\n";
  const auto t0 = std::chrono::steady_clock::now();
  bool cut = false;
  for (char c : request) {
    if (!send_text(fd, std::string_view(&c, 1)) || closed_within(fd, 100ms)) {
      cut = true;
      break;
    }
  }
  const auto took = std::chrono::steady_clock::now() - t0;
  ::close(fd);
  EXPECT_TRUE(cut) << "the whole request was read at a byte per 100 ms";
  EXPECT_GE(took, 500ms);
  EXPECT_LT(took, 2s);
  // A connection that sends nothing goes the same way; a prompt client is served.
  const int idle = connect_from("127.0.0.1", listener_->address());
  EXPECT_TRUE(closed_within(idle, 2s));
  ::close(idle);
  EXPECT_EQ(get("/").status, 200);
}

TEST_F(HttpListenerTest, ConnectionsAreBoundedPerAddressAndInTotal) {
  HttpOptions o;
  o.limits.max_connections = 12;
  o.limits.max_connections_per_address = 5;
  start({}, o);
  HalfSentRequests five(listener_->address(), 5, 5);  // all from 127.0.0.2
  wait_for_connections(*listener_, 5);
  const int sixth = connect_from("127.0.0.2", listener_->address());
  EXPECT_TRUE(closed_within(sixth, 2s)) << "a sixth connection from one address was kept";
  ::close(sixth);
  EXPECT_EQ(five.still_open(), 5);
  EXPECT_EQ(get("/").status, 200) << "another address is served";
  // At the bound in total, a new connection waits in the kernel's backlog until one closes.
  auto more = std::make_unique<HalfSentRequests>(listener_->address(), 7, 1, 3);
  wait_for_connections(*listener_, 12);
  const int waiting = connect_from("127.0.0.20", listener_->address());
  ASSERT_TRUE(send_text(waiting, "GET /assets/app.css HTTP/1.1\r\nHost: x\r\n\r\n"));
  pollfd p{waiting, POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 500), 0) << "served beyond the bound in total";
  more.reset();
  EXPECT_EQ(read_response(waiting), "HTTP/1.1 200 OK");
  ::close(waiting);
}

TEST_F(HttpListenerTest, IdleKeptAliveConnectionsHoldNoWorker) {
  HttpOptions o;
  o.workers = 2;
  start({}, o);
  std::vector<int> idle;
  for (int i = 0; i < 40; ++i) {
    const int fd = connect_from("127.0.0." + std::to_string(2 + i / 20), listener_->address());
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(send_text(fd, "GET /assets/app.css HTTP/1.1\r\nHost: x\r\n\r\n"));
    EXPECT_EQ(read_response(fd), "HTTP/1.1 200 OK") << i;
    idle.push_back(fd);
  }
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(get("/").status, 200);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
  // They were kept alive: each answers a second request.
  for (int fd : idle) {
    ASSERT_TRUE(send_text(fd, "GET /assets/favicon.svg HTTP/1.1\r\nHost: x\r\n\r\n"));
    EXPECT_EQ(read_response(fd), "HTTP/1.1 200 OK");
    ::close(fd);
  }
}

TEST_F(HttpListenerTest, APostWithoutABodyLogsOut) {
  start(grants());
  const std::string cookie = cookie_of(login(kReader));
  ASSERT_EQ(routes_->sessions().size(), 1u);
  const int fd = connect_from("127.0.0.1", listener_->address());
  ASSERT_GE(fd, 0);
  // No Content-Length, no body: what a form without fields or `fetch(.., {method: "POST"})` sends.
  ASSERT_TRUE(send_text(fd, "POST /logout HTTP/1.1\r\nHost: x\r\n" + cookie + "\r\n\r\n"));
  EXPECT_EQ(read_response(fd), "HTTP/1.1 303 See Other");
  ::close(fd);
  EXPECT_EQ(routes_->sessions().size(), 0u);
}

TEST_F(HttpListenerTest, RefusalsAreCountedAndApiRefusalsAreNotStored) {
  start(grants());
  const Reply agent = get("/api/runs", {std::string("Authorization: Bearer ") + kAgent});
  EXPECT_EQ(agent.status, 403);
  EXPECT_EQ(agent.header("cache-control"), "no-store");
  EXPECT_EQ(get("/api/runs").status, 401);
  EXPECT_EQ(login("not-a-token").status, 401);
  EXPECT_EQ(get("/runs/demo").status, 303) << "a browser sent to the login form";
  EXPECT_EQ(refusals_.load(), 3);
}

TEST_F(HttpListenerTest, ABadRunIdIs400NamingIt) {
  start();
  for (const char* path : {"/api/runs/%ff%fe", "/api/runs/%ff%fe/tensor?name=x&role=weight",
                           "/api/runs/a%20b", "/api/runs/%C3%A9t%C3%A9"}) {
    const Reply r = get(path);
    EXPECT_EQ(r.status, 400) << path;
    const nlohmann::json body = nlohmann::json::parse(r.body, nullptr, false);
    ASSERT_FALSE(body.is_discarded()) << path << ": " << r.body;
    EXPECT_NE(body.value("error", "").find("run id"), std::string::npos) << r.body;
  }
  // Text that is not UTF-8 is quoted with U+FFFD, never a 500.
  const Reply unknown = get("/api/%ff%fe");
  EXPECT_EQ(unknown.status, 404);
  EXPECT_FALSE(nlohmann::json::parse(unknown.body, nullptr, false).is_discarded()) << unknown.body;
}

// --- The routes without sockets ------------------------------------------------------------------

HttpRequest request(std::string method, std::string target,
                    std::vector<std::pair<std::string, std::string>> headers = {}) {
  HttpRequest r;
  r.method = std::move(method);
  r.target = std::move(target);
  r.headers = std::move(headers);
  return r;
}

TEST(HttpMessageTest, TargetsAreSplitAndDecoded) {
  const Target t = parse_target("/api/runs/a%2Fb+c?x=1+2&y=%41%zz&flag&=v&z=%");
  EXPECT_EQ(t.path, "/api/runs/a/b+c");
  const QueryParams want = {{"x", "1 2"}, {"y", "A%zz"}, {"flag", ""}, {"", "v"}, {"z", "%"}};
  EXPECT_EQ(t.params, want);
  EXPECT_EQ(percent_encode("/runs/a b?x=é"), "%2Fruns%2Fa%20b%3Fx%3D%C3%A9");
  EXPECT_EQ(base64_decode("cHJvbWV0aGV1czpzZWNyZXQ="), "prometheus:secret");
  EXPECT_EQ(base64_decode("cHJvbWV0aGV1czpzZWNyZXQ"), "prometheus:secret");
  EXPECT_EQ(base64_decode("not base64!"), std::nullopt);
  EXPECT_TRUE(accepts_gzip("gzip, deflate, br"));
  EXPECT_TRUE(accepts_gzip("br;q=1.0, gzip;q=0.8"));
  EXPECT_TRUE(accepts_gzip("*"));
  EXPECT_FALSE(accepts_gzip("br"));
  EXPECT_FALSE(accepts_gzip("gzip;q=0, br"));
  EXPECT_FALSE(accepts_gzip(""));
}

TEST(MetricsEndpointTest, BasicAuthWithAReaderOrAdminTokenOnly) {
  Metrics metrics("test");
  Authenticator auth(grants());
  int refused = 0;
  MetricsEndpoint endpoint(metrics.registry(), auth, [&refused] { ++refused; });
  const auto basic = [](const std::string& userinfo) {
    static constexpr char kAlphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    std::uint32_t bits = 0;
    int n = 0;
    for (unsigned char c : userinfo) {
      bits = (bits << 8) | c;
      n += 8;
      while (n >= 6) out += kAlphabet[(bits >> (n -= 6)) & 63];
    }
    if (n > 0) out += kAlphabet[(bits << (6 - n)) & 63];
    while (out.size() % 4 != 0) out += '=';
    return std::pair<std::string, std::string>{"Authorization", "Basic " + out};
  };
  const HttpResponse ok =
      endpoint.handle(request("GET", "/metrics", {basic(std::string("p:") + kReader)}));
  EXPECT_EQ(ok.status, 200);
  EXPECT_EQ(ok.content_type, "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_NE(ok.body.find("# TYPE ampscope_build_info gauge"), std::string::npos) << ok.body;
  EXPECT_EQ(endpoint.handle(request("GET", "/metrics", {basic(std::string("x:") + kAdmin)})).status,
            200);
  for (const auto& header :
       {basic(std::string("p:") + kAgent), basic("p:wrong"), basic(kReader),
        std::pair<std::string, std::string>{"Authorization", std::string("Bearer ") + kReader}}) {
    const HttpResponse r = endpoint.handle(request("GET", "/metrics", {header}));
    EXPECT_EQ(r.status, 401) << header.second;
    EXPECT_EQ(r.header("WWW-Authenticate"), "Basic realm=\"ampscope\"");
  }
  EXPECT_EQ(endpoint.handle(request("GET", "/metrics")).status, 401);
  EXPECT_EQ(refused, 5);
  EXPECT_EQ(endpoint.handle(request("GET", "/other")).status, 404);
  EXPECT_EQ(endpoint.handle(request("PUT", "/metrics")).status, 405);
}

// --- HTTPS ---------------------------------------------------------------------------------------

// A self-signed certificate for localhost and 127.0.0.1, made by openssl: <dir>/<name>.pem and
// <name>.key; returns <dir>/<name>, empty when openssl failed (the test fails then).
std::string self_signed(const TempDir& dir, const std::string& name) {
  const std::string base = (dir / name).string();
  std::string log;
  const int code = testing::run_to_completion(
      {"/usr/bin/env", "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
       "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", base + ".key", "-out", base + ".pem",
       "-days", "1", "-subj", "/CN=localhost", "-addext",
       "subjectAltName=DNS:localhost,IP:127.0.0.1"},
      &log);
  EXPECT_EQ(code, 0) << log;
  return code == 0 ? base : "";
}

TEST_F(HttpListenerTest, HttpsWithTheServersCertificate) {
  const std::string d = dir_.path().string();
  ASSERT_FALSE(self_signed(dir_, "server").empty());
  HttpOptions o;
  o.tls_cert_pem = testing::read_text(d + "/server.pem");
  o.tls_key_pem = testing::read_text(d + "/server.key");
  start(grants(), o);
  EXPECT_TRUE(listener_->tls());
  const Reply r = send("POST", base_ + "/login", {}, form({{"token", kReader}, {"next", "/"}}),
                       d + "/server.pem");
  ASSERT_EQ(r.status, 303) << r.body;
  EXPECT_NE(r.header("set-cookie").find("; Secure"), std::string::npos) << r.header("set-cookie");
  const Reply page = send("GET", base_ + "/", {cookie_of(r)}, "", d + "/server.pem");
  EXPECT_EQ(page.status, 200);
  // Plain HTTP to the HTTPS port gets no page.
  EXPECT_NE(send("GET", "http://" + listener_->address() + "/assets/app.css").status, 200);

  HttpOptions bad;
  bad.tls_cert_pem = "-----BEGIN CERTIFICATE-----\nnot one\n-----END CERTIFICATE-----\n";
  bad.tls_key_pem = testing::read_text(d + "/server.key");
  bad.listen = "127.0.0.1:0";
  try {
    HttpListener listener(bad, handler());
    FAIL() << "served HTTPS without a certificate";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--tls-cert"), std::string::npos) << e.what();
  }
}

TEST_F(HttpListenerTest, MutualTlsNeedsAClientCertificateOfTheCa) {
  const std::string server = self_signed(dir_, "server");
  // A self-signed client certificate is its own CA: --tls-client-ca names it.
  const std::string client = self_signed(dir_, "client");
  const std::string stranger = self_signed(dir_, "stranger");
  ASSERT_FALSE(server.empty() || client.empty() || stranger.empty());
  HttpOptions o;
  o.tls_cert_pem = testing::read_text(server + ".pem");
  o.tls_key_pem = testing::read_text(server + ".key");
  o.tls_client_ca_pem = testing::read_text(client + ".pem");
  start(grants(), o);
  const std::string bearer = std::string("Authorization: Bearer ") + kReader;
  EXPECT_EQ(send("GET", base_ + "/api/runs", {bearer}, "", server + ".pem", client).status, 200);
  EXPECT_EQ(send("GET", base_ + "/api/runs", {bearer}, "", server + ".pem").status, 0)
      << "served a client without a certificate";
  EXPECT_EQ(send("GET", base_ + "/api/runs", {bearer}, "", server + ".pem", stranger).status, 0)
      << "served a client whose certificate the CA did not sign";
  EXPECT_EQ(tls_refusals_.load(), 2) << "each refused client certificate is counted";
}

// A certificate made for servers only (extendedKeyUsage serverAuth) is not a client's, even
// signed by the client CA.
TEST_F(HttpListenerTest, MutualTlsRefusesACertificateForServersOnly) {
  const std::string server = self_signed(dir_, "server");
  const std::string base = (dir_ / "servers-only").string();
  std::string log;
  ASSERT_EQ(
      testing::run_to_completion({"/usr/bin/env", "openssl", "req", "-x509", "-newkey", "ec",
                                  "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
                                  base + ".key", "-out", base + ".pem", "-days", "1", "-subj",
                                  "/CN=servers-only", "-addext", "extendedKeyUsage=serverAuth"},
                                 &log),
      0)
      << log;
  HttpOptions o;
  o.tls_cert_pem = testing::read_text(server + ".pem");
  o.tls_key_pem = testing::read_text(server + ".key");
  o.tls_client_ca_pem = testing::read_text(base + ".pem");
  start({}, o);
  EXPECT_EQ(send("GET", base_ + "/api/runs", {}, "", server + ".pem", base).status, 0)
      << "served a client certificate made for servers only";
  EXPECT_EQ(tls_refusals_.load(), 1);
}

// --- Sessions on their own -----------------------------------------------------------------------

TEST(WebSessionsTest, IdsAre128RandomBitsInHex) {
  WebSessions sessions;
  std::set<std::string> ids;
  for (int i = 0; i < 1000; ++i) {
    const std::string id = sessions.create(AccessRole::kReader);
    EXPECT_EQ(id.size(), 32u);
    EXPECT_EQ(id.find_first_not_of("0123456789abcdef"), std::string::npos) << id;
    ids.insert(id);
  }
  EXPECT_EQ(ids.size(), 1000u);
  // Every hex digit shows up in every position over 1000 ids: the bits are not a counter.
  for (std::size_t pos = 0; pos < 32; ++pos) {
    std::set<char> digits;
    for (const std::string& id : ids) digits.insert(id[pos]);
    EXPECT_EQ(digits.size(), 16u) << "position " << pos;
  }
}

TEST(WebSessionsTest, ASessionKeepsItsRoleUntilItExpires) {
  auto now = std::chrono::steady_clock::now();
  WebSessions sessions([&now] { return now; }, std::chrono::hours(12));
  const std::string reader = sessions.create(AccessRole::kReader);
  now += std::chrono::hours(1);
  const std::string admin = sessions.create(AccessRole::kAdmin);
  EXPECT_EQ(sessions.find(reader), AccessRole::kReader);
  EXPECT_EQ(sessions.find(admin), AccessRole::kAdmin);
  EXPECT_EQ(sessions.find("00000000000000000000000000000000"), std::nullopt);
  now += std::chrono::hours(11) - std::chrono::seconds(1);
  EXPECT_EQ(sessions.find(reader), AccessRole::kReader);
  now += std::chrono::seconds(1);
  EXPECT_EQ(sessions.find(reader), std::nullopt);
  EXPECT_EQ(sessions.find(admin), AccessRole::kAdmin);
  EXPECT_EQ(sessions.size(), 1u);
  now += std::chrono::hours(1);
  EXPECT_EQ(sessions.find(admin), std::nullopt);
  EXPECT_EQ(sessions.size(), 0u);
}

TEST(WebSessionsTest, TheOldestGoBeyondTheBound) {
  WebSessions sessions({}, std::chrono::hours(12), 3);
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(sessions.create(AccessRole::kReader));
  EXPECT_EQ(sessions.size(), 3u);
  EXPECT_EQ(sessions.find(ids[0]), std::nullopt);
  EXPECT_EQ(sessions.find(ids[1]), std::nullopt);
  for (int i = 2; i < 5; ++i) EXPECT_EQ(sessions.find(ids[i]), AccessRole::kReader) << i;
  EXPECT_EQ(WebSessions::kMaxSessions, 4096u);
  EXPECT_EQ(WebSessions::kLifetime, std::chrono::hours(12));
}

TEST(WebSessionsTest, RemoveEndsOneSession) {
  WebSessions sessions;
  const std::string a = sessions.create(AccessRole::kReader);
  const std::string b = sessions.create(AccessRole::kReader);
  sessions.remove(a);
  sessions.remove("not-a-session");
  EXPECT_EQ(sessions.find(a), std::nullopt);
  EXPECT_EQ(sessions.find(b), AccessRole::kReader);
  // A later session still pushes out the right one after a removal in the middle.
  WebSessions two({}, std::chrono::hours(12), 2);
  const std::string x = two.create(AccessRole::kReader);
  const std::string y = two.create(AccessRole::kReader);
  two.remove(x);
  const std::string z = two.create(AccessRole::kReader);
  EXPECT_EQ(two.find(y), AccessRole::kReader);
  EXPECT_EQ(two.find(z), AccessRole::kReader);
}

// --- The ampscope-server binary ------------------------------------------------------------------

TEST(HttpListenerServerTest, TheBinaryServesTheWebUiAndStopsCleanly) {
  TempDir dir;
  testing::write_text(dir / "tokens", std::string("reader ") + kReader + "\n");
  std::filesystem::permissions(
      dir / "tokens", std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  testing::ServerProcess server(dir.path(), dir / "store.db",
                                {"--auth-token-file", (dir / "tokens").string()});
  ASSERT_FALSE(server.http_address().empty());
  const std::string base = "http://" + server.http_address();
  EXPECT_EQ(send("GET", base + "/runs/demo").status, 303);
  const Reply page = send("GET", base + "/", {std::string("Authorization: Bearer ") + kReader});
  EXPECT_EQ(page.status, 200);
  EXPECT_TRUE(page.body == find_web_asset("index.html")->bytes());
  const Reply runs =
      send("GET", base + "/api/runs", {std::string("Authorization: Bearer ") + kReader});
  EXPECT_EQ(runs.status, 200) << runs.body;
  EXPECT_NE(server.log().find("web UI http://" + server.http_address() + "/"), std::string::npos)
      << server.log();
  // A refusal counts for the web UI; the redirect to the sign-in form above does not.
  EXPECT_EQ(send("GET", base + "/api/runs").status, 401);
  std::string metrics;
  ASSERT_EQ(testing::http_get(
                "http://p:" + std::string(kReader) + "@" + server.metrics_address() + "/metrics",
                &metrics),
            200);
  EXPECT_EQ(testing::sample_value(testing::parse_samples(metrics), "ampscope_auth_failures_total",
                                  {{"surface", "webui"}}),
            1.0);
  EXPECT_EQ(server.terminate(), 0) << server.log();
  EXPECT_EQ(send("GET", base + "/").status, 0);
}

TEST(HttpListenerServerTest, ATakenWebUiPortStopsTheServerWithOneLine) {
  // A socket of this process holds the port, so no other test can take it meanwhile.
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string taken = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  TempDir dir;
  std::string out;
  const int code = testing::run_to_completion(
      {AMPSCOPE_SERVER_BINARY, "--listen", "127.0.0.1:0", "--metrics-listen", "", "--http-listen",
       taken, "--db", (dir / "store.db").string()},
      &out, 60s);
  ::close(fd);
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("--http-listen '" + taken + "': cannot bind"), std::string::npos) << out;
}

TEST(HttpListenerServerTest, TheFlagDefaultsToLoopback) {
  std::string help;
  ASSERT_EQ(testing::run_to_completion({AMPSCOPE_SERVER_BINARY, "--help"}, &help), 0);
  EXPECT_NE(help.find("--http-listen"), std::string::npos) << help;
  EXPECT_NE(help.find("127.0.0.1:9465"), std::string::npos) << help;
}

}  // namespace
}  // namespace ampscope::server
