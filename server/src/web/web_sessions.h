// Login sessions of the web UI: a browser that signed in with a reader or admin token holds a
// session id in a cookie instead of the token. The id is 128 bits from the kernel's CSPRNG
// (getrandom(2), the source of /dev/urandom), written as 32 hex digits; it maps to the role of
// the token that signed in, never to the token itself. Sessions live in memory only (a restart
// signs everyone out), expire `lifetime` after they were made, and at most `max_sessions` exist:
// a new one pushes out the oldest.
//
// Thread safety: every member may be called from any thread (the HTTP listener's workers);
// mu_ guards the table and the order list.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "auth.h"

namespace ampscope::server {

class WebSessions {
 public:
  using Clock = std::function<std::chrono::steady_clock::time_point()>;
  static constexpr std::chrono::hours kLifetime{12};
  static constexpr std::size_t kMaxSessions = 4096;

  // `clock`: std::chrono::steady_clock::now when empty (tests pass their own).
  explicit WebSessions(Clock clock = {}, std::chrono::seconds lifetime = kLifetime,
                       std::size_t max_sessions = kMaxSessions);

  // A new session for `role`; returns its id. Throws ampscope::Error when the kernel gives no
  // random bytes.
  std::string create(AccessRole role);
  // The role of the live session `id`; nullopt for an unknown or expired one.
  std::optional<AccessRole> find(std::string_view id);
  // Ends the session `id` (nothing when there is none).
  void remove(std::string_view id);
  std::size_t size() const;

  std::chrono::seconds lifetime() const { return lifetime_; }

 private:
  struct Entry {
    AccessRole role;
    std::chrono::steady_clock::time_point expires;
    std::list<std::string>::iterator order;
  };
  // Drops the expired sessions, oldest first; called with mu_ held.
  void expire(std::chrono::steady_clock::time_point now);

  const Clock clock_;
  const std::chrono::seconds lifetime_;
  const std::size_t max_sessions_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> sessions_;
  std::list<std::string> order_;  // ids, oldest first (all live equally long: also by expiry)
};

}  // namespace ampscope::server
