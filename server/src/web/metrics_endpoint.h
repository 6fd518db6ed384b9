// GET /metrics (--metrics-listen): the registry's metrics in Prometheus' text format
// (prometheus::TextSerializer), served by an HttpListener of its own. A plain function from
// request to response (http_message.h), like the web UI's routes.
//
// With tokens, a reader or admin token is needed as the password of HTTP basic auth (the user
// name is not checked; Prometheus' basic_auth needs one). No other scheme: a Bearer header is
// 401 like a wrong password, with WWW-Authenticate: Basic realm="ampscope". Any other path is
// 404, another method 405.
//
// Thread safety: handle() may be called from any number of threads (prometheus-cpp's Collect
// locks the registry). `auth` must outlive the endpoint.
#pragma once

#include <prometheus/registry.h>

#include <functional>
#include <memory>

#include "auth.h"
#include "http_message.h"

namespace ampscope::server {

class MetricsEndpoint {
 public:
  // `on_refusal`: called once for each 401.
  MetricsEndpoint(std::shared_ptr<prometheus::Registry> registry, const Authenticator& auth,
                  std::function<void()> on_refusal = {});

  HttpResponse handle(const HttpRequest& request) const;

 private:
  bool authorized(const HttpRequest& request) const;

  const std::shared_ptr<prometheus::Registry> registry_;
  const Authenticator& auth_;
  const std::function<void()> on_refusal_;
};

}  // namespace ampscope::server
