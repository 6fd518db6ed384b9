// The receiving end of Alertmanager's webhook notifications, for tests: an HTTP server on a
// free loopback port (civetweb, the HTTP server prometheus-cpp already brings) that answers
// every POST with 200 and records its path and JSON body.
//
// Thread safety: civetweb calls the handler on its own threads; posts() and wait_for() may be
// called from any thread (the records are behind a mutex).
#pragma once

#include <chrono>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

struct mg_context;
struct mg_connection;

namespace ampscope::testing {

class WebhookReceiver {
 public:
  struct Post {
    std::string path;     // e.g. "/ampscope/critical"
    nlohmann::json body;  // null when the body was not JSON
  };

  // Listens on 127.0.0.1 on a port of its choosing. Throws std::runtime_error when it cannot.
  WebhookReceiver();
  ~WebhookReceiver();  // stops serving; handlers in flight finish first
  WebhookReceiver(const WebhookReceiver&) = delete;
  WebhookReceiver& operator=(const WebhookReceiver&) = delete;

  // "http://127.0.0.1:PORT"
  const std::string& base_url() const { return base_url_; }
  // Every POST so far, in the order they arrived.
  std::vector<Post> posts() const;
  // Polls until a POST satisfies `matches`; the first that does, or nullopt at the timeout.
  std::optional<Post> wait_for(const std::function<bool(const Post&)>& matches,
                               std::chrono::milliseconds timeout) const;

 private:
  static int handle(mg_connection* connection, void* self);
  void record(Post post);

  mutable std::mutex mutex_;
  std::vector<Post> posts_;  // guarded by mutex_
  mg_context* context_ = nullptr;
  std::string base_url_;
};

}  // namespace ampscope::testing
