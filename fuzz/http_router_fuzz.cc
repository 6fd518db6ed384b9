// Target: the HTTP listeners' routing without sockets: the web UI's routes (web_routes.h: the
// login form, sessions, assets, pages and WebApi's parameter parsing over a real store with one
// run) and GET /metrics (metrics_endpoint.h), with tokens configured.
// Input: a request as text: "METHOD TARGET" on the first line, then "Name: value" header lines up
// to an empty line, then the body (every part may be missing or malformed; the listener hands
// the routes whatever its HTTP parser accepted, and the routes must take any bytes).
// Properties:
//   - no answer is a 5xx (the store is healthy), none throws, and each takes under a second;
//   - the status is a real one (200..499), a header name or value holds no CR, LF or NUL, and a
//     redirect's Location is a path of this server;
//   - every answer under /api is JSON (its body parses) with Cache-Control: no-store, refusals
//     included;
//   - /metrics answers 200 only to the basic-auth password of a reader or admin token.
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "auth.h"
#include "http_message.h"
#include "metrics.h"
#include "metrics_endpoint.h"
#include "run_registry.h"
#include "store.h"
#include "streams.h"
#include "support.h"
#include "web_routes.h"
#include "webui_api.h"

namespace ampscope::fuzz {
namespace {

using server::HttpRequest;
using server::HttpResponse;

constexpr const char* kReader = "reader-token-0001";
constexpr const char* kAdmin = "admin-token-0002";
constexpr const char* kAgent = "agent-token-0003";

// The routes over a store holding run "demo" (three steps), built once per process.
struct World {
  World()
      : db((scratch_dir() / "router.db").string()),
        writer(server::StoreOptions{db, false}),
        reader(db),
        runs(10),
        api(reader, streams, runs),
        auth({{server::AccessRole::kReader, kReader, ""},
              {server::AccessRole::kAdmin, kAdmin, ""},
              {server::AccessRole::kAgent, kAgent, ""}}),
        routes(auth, api),
        metrics("fuzz"),
        endpoint(metrics.registry(), auth) {
    v1::Hello hello;
    hello.set_run_id("demo");
    hello.set_world_size(1);
    const std::int64_t now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                    std::chrono::system_clock::now().time_since_epoch())
                                    .count();
    writer.begin();
    writer.upsert_run(hello, now_ns);
    writer.upsert_agent(hello, now_ns);
    for (int seq = 1; seq <= 3; ++seq) {
      v1::StepReport r;
      r.set_run_id("demo");
      r.set_seq(static_cast<std::uint64_t>(seq));
      r.set_step(seq);
      r.set_loss(1.0 / seq);
      r.set_loss_scale(65536);
      r.set_scale_after(65536);
      writer.insert_report(r, r.SerializeAsString(), now_ns);
      writer.set_agent_progress("demo", 0, static_cast<std::uint64_t>(seq), now_ns, nullptr);
    }
    writer.commit();
    // The store answers: a property below that holds only because everything is 404 is no
    // property.
    HttpRequest probe;
    probe.method = "GET";
    probe.target = "/api/runs/demo";
    probe.headers = {{"Authorization", std::string("Bearer ") + kReader}};
    const HttpResponse demo = routes.handle(probe);
    FUZZ_CHECK(demo.status == 200, demo.body);
  }

  std::string db;
  server::StoreWriter writer;
  server::StoreReader reader;
  server::StreamTable streams;
  server::RunRegistry runs;
  server::WebApi api;
  server::Authenticator auth;
  server::WebRoutes routes;
  server::Metrics metrics;
  server::MetricsEndpoint endpoint;
};

HttpRequest parse_input(std::string_view text) {
  HttpRequest req;
  const auto next_line = [&text] {
    const auto end = text.find('\n');
    std::string_view line = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
    if (line.ends_with('\r')) line.remove_suffix(1);
    return line;
  };
  const std::string_view first = next_line();
  const auto space = first.find(' ');
  req.method = std::string(first.substr(0, space));
  if (space != std::string_view::npos) req.target = std::string(first.substr(space + 1));
  for (std::string_view line = next_line(); !line.empty(); line = next_line()) {
    const auto colon = line.find(':');
    std::string_view value = colon == std::string_view::npos ? "" : line.substr(colon + 1);
    while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    req.headers.emplace_back(std::string(line.substr(0, colon)), std::string(value));
  }
  req.body = std::string(text);
  req.remote_address = "127.0.0.1";
  return req;
}

bool clean_header_text(std::string_view text) {
  return text.find_first_of(std::string_view("\r\n\0", 3)) == std::string_view::npos;
}

void check_common(const HttpRequest& req, const HttpResponse& res) {
  const std::string what = req.method + " " + req.target + " -> " + std::to_string(res.status);
  FUZZ_CHECK(res.status >= 200 && res.status < 500, what + ": " + res.body.substr(0, 200));
  FUZZ_CHECK(clean_header_text(res.content_type), what);
  for (const auto& [name, value] : res.headers) {
    FUZZ_CHECK(clean_header_text(name) && clean_header_text(value), what + ": " + name);
  }
  const std::string_view location = res.header("Location");
  if (!location.empty()) {
    FUZZ_CHECK(location.front() == '/' && (location.size() < 2 || location[1] != '/'),
               what + ": Location " + std::string(location));
  }
}

}  // namespace
}  // namespace ampscope::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ampscope;
  using namespace ampscope::fuzz;
  static World* world = new World();  // lives for the process, as the server's routes do
  const HttpRequest req = parse_input(std::string_view(reinterpret_cast<const char*>(data), size));
  const auto t0 = std::chrono::steady_clock::now();
  const HttpResponse web = world->routes.handle(req);
  const HttpResponse metrics = world->endpoint.handle(req);
  const auto took = std::chrono::steady_clock::now() - t0;
  FUZZ_CHECK(took < std::chrono::seconds(1), req.method + " " + req.target + ": slow");
  check_common(req, web);
  check_common(req, metrics);

  const server::Target target = server::parse_target(req.target);
  if (target.path == "/api" || target.path.starts_with("/api/")) {
    if (req.method == "GET" || req.method == "HEAD") {
      FUZZ_CHECK(web.header("Cache-Control") == "no-store", req.target);
      FUZZ_CHECK(!nlohmann::json::parse(web.body, nullptr, false).is_discarded(),
                 req.target + ": " + web.body.substr(0, 200));
    }
  }
  if (metrics.status == 200) {
    const std::string_view authorization = req.header_or_empty("Authorization");
    FUZZ_CHECK(authorization.size() > 6, "/metrics served without credentials");
    std::string_view encoded = authorization.substr(6);
    while (!encoded.empty() && encoded.front() == ' ') encoded.remove_prefix(1);
    const auto decoded = server::base64_decode(encoded);
    FUZZ_CHECK(decoded.has_value(), std::string(authorization));
    const std::string password = decoded->substr(decoded->find(':') + 1);
    FUZZ_CHECK(password == kReader || password == kAdmin, "/metrics served to " + password);
  }
  return 0;
}
