#include "web_sessions.h"

#include <sys/random.h>

#include <array>
#include <cerrno>
#include <cstdint>

#include "ampscope/check.h"

namespace ampscope::server {
namespace {

constexpr std::size_t kIdBytes = 16;  // 128 bits

std::string random_id() {
  std::array<std::uint8_t, kIdBytes> bytes{};
  std::size_t got = 0;
  while (got < bytes.size()) {
    // Blocks only until the kernel's pool was first seeded (early boot), then never.
    const ssize_t n = ::getrandom(bytes.data() + got, bytes.size() - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw Error("web UI sessions: getrandom failed");
    got += static_cast<std::size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id;
  id.reserve(2 * bytes.size());
  for (std::uint8_t b : bytes) {
    id.push_back(kHex[b >> 4]);
    id.push_back(kHex[b & 0xf]);
  }
  return id;
}

}  // namespace

WebSessions::WebSessions(Clock clock, std::chrono::seconds lifetime, std::size_t max_sessions)
    : clock_(clock ? std::move(clock) : Clock(std::chrono::steady_clock::now)),
      lifetime_(lifetime),
      max_sessions_(max_sessions) {
  AMPSCOPE_CHECK(max_sessions_ >= 1, "expected max_sessions >= 1, found ", max_sessions_);
}

std::string WebSessions::create(AccessRole role) {
  std::string id = random_id();
  const auto now = clock_();
  std::lock_guard lock(mu_);
  expire(now);
  while (sessions_.size() >= max_sessions_) {
    sessions_.erase(order_.front());
    order_.pop_front();
  }
  order_.push_back(id);
  sessions_.emplace(id, Entry{role, now + lifetime_, std::prev(order_.end())});
  return id;
}

std::optional<AccessRole> WebSessions::find(std::string_view id) {
  const auto now = clock_();
  std::lock_guard lock(mu_);
  expire(now);
  const auto it = sessions_.find(std::string(id));
  if (it == sessions_.end()) return std::nullopt;
  return it->second.role;
}

void WebSessions::remove(std::string_view id) {
  std::lock_guard lock(mu_);
  const auto it = sessions_.find(std::string(id));
  if (it == sessions_.end()) return;
  order_.erase(it->second.order);
  sessions_.erase(it);
}

std::size_t WebSessions::size() const {
  std::lock_guard lock(mu_);
  return sessions_.size();
}

void WebSessions::expire(std::chrono::steady_clock::time_point now) {
  while (!order_.empty()) {
    const auto it = sessions_.find(order_.front());
    if (it->second.expires > now) break;
    sessions_.erase(it);
    order_.pop_front();
  }
}

}  // namespace ampscope::server
