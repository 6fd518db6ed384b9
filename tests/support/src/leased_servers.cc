#include "ampscope/testing/leased_servers.h"

#include <stdexcept>
#include <thread>

#include "ampscope/testing/net.h"

namespace ampscope::testing {

using Clock = std::chrono::steady_clock;

LeasedServers::LeasedServers(const std::filesystem::path& dir, const std::string& conninfo,
                             int count, const std::string& ttl,
                             const std::vector<std::string>& flags)
    : db_(conninfo) {
  for (int i = 0; i < count; ++i) {
    std::vector<std::string> f = {"--run-leases", "--lease-ttl", ttl};
    f.insert(f.end(), flags.begin(), flags.end());
    // The port is known before the server binds it: the address its leases name is the one
    // the agents are given.
    servers_.push_back(std::make_unique<ServerProcess>(ServerOptions{
        .dir = dir, .db = conninfo, .flags = std::move(f), .port = free_loopback_port()}));
  }
}

std::string LeasedServers::addresses() const {
  std::string out;
  for (const auto& s : servers_) out += (out.empty() ? "" : ",") + s->address();
  return out;
}

std::optional<std::size_t> LeasedServers::owner(const std::string& run_id) {
  const std::string address =
      db_.value("SELECT owner_address FROM run_leases WHERE run_id = $1", {run_id});
  for (std::size_t i = 0; i < servers_.size(); ++i) {
    if (!address.empty() && servers_[i]->address() == address) return i;
  }
  return std::nullopt;
}

std::int64_t LeasedServers::epoch(const std::string& run_id) {
  const std::string e = db_.value("SELECT epoch FROM run_leases WHERE run_id = $1", {run_id});
  return e.empty() ? 0 : std::stoll(e);
}

std::int64_t LeasedServers::last_report_id(const std::string& run_id) {
  return std::stoll(
      db_.value("SELECT coalesce(max(r.id), 0) FROM reports r JOIN runs u ON r.run = u.id "
                "WHERE u.run_id = $1",
                {run_id}));
}

std::optional<Takeover> LeasedServers::kill_owner(const std::string& run_id,
                                                  std::chrono::milliseconds timeout) {
  const std::optional<std::size_t> killed = owner(run_id);
  if (!killed) throw std::runtime_error("run '" + run_id + "' has no owner to kill");
  const Clock::time_point start = Clock::now();
  servers_[*killed]->kill9();
  // The dead server's last transaction may still commit: PostgreSQL finishes what it received.
  // Reports stored before the lease moved are the old owner's, however late.
  std::int64_t before = last_report_id(run_id);
  Takeover t;
  t.killed = *killed;
  bool leased = false;
  bool reported = false;
  while (!(leased && reported)) {
    const Clock::time_point now = Clock::now();
    if (now - start > timeout) return std::nullopt;
    if (!leased) {
      const std::optional<std::size_t> o = owner(run_id);
      if (o && *o != *killed) {
        leased = true;
        t.taken_by = *o;
        t.epoch = epoch(run_id);
        t.lease = now - start;
      }
    }
    const std::int64_t last = last_report_id(run_id);
    if (!leased) {
      before = last;
    } else if (!reported && last > before) {
      reported = true;
      t.first_report = now - start;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return t;
}

}  // namespace ampscope::testing
