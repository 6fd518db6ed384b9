#include "webhook_receiver.h"

#include <civetweb.h>

#include <cstring>
#include <stdexcept>
#include <thread>

namespace ampscope::testing {

using nlohmann::json;

WebhookReceiver::WebhookReceiver() {
  // Port 0: the kernel picks a free one, read back below, so no other process can take it
  // between choosing and binding.
  const char* options[] = {"listening_ports", "127.0.0.1:0", "num_threads", "2", nullptr};
  mg_callbacks callbacks;
  std::memset(&callbacks, 0, sizeof callbacks);
  context_ = mg_start(&callbacks, nullptr, options);
  if (context_ == nullptr) throw std::runtime_error("webhook receiver: civetweb did not start");
  mg_set_request_handler(context_, "/", &WebhookReceiver::handle, this);
  mg_server_port port{};
  if (mg_get_server_ports(context_, 1, &port) != 1 || port.port <= 0) {
    mg_stop(context_);
    throw std::runtime_error("webhook receiver: no listening port");
  }
  base_url_ = "http://127.0.0.1:" + std::to_string(port.port);
}

WebhookReceiver::~WebhookReceiver() { mg_stop(context_); }

int WebhookReceiver::handle(mg_connection* connection, void* self) {
  const mg_request_info* request = mg_get_request_info(connection);
  if (std::strcmp(request->request_method, "POST") != 0) {
    mg_send_http_error(connection, 405, "POST only");
    return 405;
  }
  std::string body;
  char buffer[4096];
  for (int n; (n = mg_read(connection, buffer, sizeof buffer)) > 0;) body.append(buffer, n);
  static_cast<WebhookReceiver*>(self)->record(
      {request->local_uri, json::parse(body, nullptr, /*allow_exceptions=*/false)});
  mg_send_http_ok(connection, "text/plain", 0);
  return 200;
}

void WebhookReceiver::record(Post post) {
  if (post.body.is_discarded()) post.body = nullptr;
  std::lock_guard lock(mutex_);
  posts_.push_back(std::move(post));
}

std::vector<WebhookReceiver::Post> WebhookReceiver::posts() const {
  std::lock_guard lock(mutex_);
  return posts_;
}

std::optional<WebhookReceiver::Post> WebhookReceiver::wait_for(
    const std::function<bool(const Post&)>& matches, std::chrono::milliseconds timeout) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (std::size_t seen = 0;;) {
    const std::vector<Post> all = posts();
    for (; seen < all.size(); ++seen) {
      if (matches(all[seen])) return all[seen];
    }
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace ampscope::testing
