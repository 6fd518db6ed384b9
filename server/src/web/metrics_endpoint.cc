// GET /metrics (metrics_endpoint.h).
#include "metrics_endpoint.h"

#include <prometheus/text_serializer.h>

#include <optional>
#include <string_view>

namespace ampscope::server {
namespace {

constexpr const char* kText = "text/plain; charset=utf-8";
// The exposition format's version, as prometheus-cpp's exposer announced it.
constexpr const char* kExposition = "text/plain; version=0.0.4; charset=utf-8";

// The password of "Basic base64(user:password)"; nullopt for another scheme or bad base64.
std::optional<std::string> basic_password(std::string_view authorization) {
  constexpr std::string_view kBasic = "basic ";
  if (authorization.size() < kBasic.size()) return std::nullopt;
  for (std::size_t i = 0; i < kBasic.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(authorization[i])) != kBasic[i]) {
      return std::nullopt;
    }
  }
  authorization.remove_prefix(kBasic.size());
  while (!authorization.empty() && authorization.front() == ' ') authorization.remove_prefix(1);
  const std::optional<std::string> decoded = base64_decode(authorization);
  if (!decoded) return std::nullopt;
  const auto colon = decoded->find(':');
  if (colon == std::string::npos) return std::nullopt;
  return decoded->substr(colon + 1);
}

}  // namespace

MetricsEndpoint::MetricsEndpoint(std::shared_ptr<prometheus::Registry> registry,
                                 const Authenticator& auth, std::function<void()> on_refusal)
    : registry_(std::move(registry)), auth_(auth), on_refusal_(std::move(on_refusal)) {}

bool MetricsEndpoint::authorized(const HttpRequest& request) const {
  if (!auth_.enabled()) return true;
  const std::optional<std::string_view> header = request.header("Authorization");
  if (!header) return false;
  const std::optional<std::string> password = basic_password(*header);
  return password && auth_.allows_metrics(*password);
}

HttpResponse MetricsEndpoint::handle(const HttpRequest& request) const {
  HttpResponse res;
  const Target target = parse_target(request.target);
  if (target.path != "/metrics") {
    res.status = 404;
    res.set_content("not found: metrics are at /metrics\n", kText);
    return res;
  }
  if (request.method != "GET" && request.method != "HEAD") {
    res.status = 405;
    res.set_header("Allow", "GET, HEAD");
    res.set_content("method not allowed\n", kText);
    res.close = request.method != "POST";  // its body is not read
    return res;
  }
  if (!authorized(request)) {
    if (on_refusal_) on_refusal_();
    res.status = 401;
    res.set_header("WWW-Authenticate", "Basic realm=\"ampscope\"");
    res.set_content("a reader or admin token is needed as the password of HTTP basic auth\n",
                    kText);
    return res;
  }
  res.set_content(prometheus::TextSerializer().Serialize(registry_->Collect()), kExposition);
  return res;
}

}  // namespace ampscope::server
