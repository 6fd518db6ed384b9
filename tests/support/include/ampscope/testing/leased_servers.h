// ampscope-server processes sharing one PostgreSQL database with run leases (--run-leases), for
// the failover test (tests/agent/failover_test.cc) and benchmark (bench/server_failover.cc):
// each started on a port chosen beforehand, so that its lease names the address agents reach
// it at; the owner of a run read from its lease row; and a failover timed from the store: the
// owner killed with SIGKILL, then how long until another server holds the run's lease and has
// stored a report of it (a report is acknowledged once its commit returns, so that is when the
// agents hear from the new owner).
//
// Thread safety: used by one thread, the one that made it (ServerProcess's).
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ampscope/testing/postgres.h"
#include "ampscope/testing/server_process.h"

namespace ampscope::testing {

// What kill_owner() measured.
struct Takeover {
  std::size_t killed = 0;    // the server that owned the run
  std::size_t taken_by = 0;  // the server that holds its lease now
  std::int64_t epoch = 0;    // the lease's epoch after the move
  // From the kill to the lease row naming the new owner, and to its first stored report.
  std::chrono::duration<double> lease{0};
  std::chrono::duration<double> first_report{0};
};

class LeasedServers {
 public:
  // `count` servers on the database `conninfo`, each with --run-leases, --lease-ttl `ttl` and
  // `flags`, their logs in `dir`. Fails and throws as ServerProcess does.
  LeasedServers(const std::filesystem::path& dir, const std::string& conninfo, int count,
                const std::string& ttl, const std::vector<std::string>& flags = {});

  std::size_t size() const { return servers_.size(); }
  ServerProcess& at(std::size_t i) { return *servers_.at(i); }
  // Every server's address, comma separated: an agent's server list.
  std::string addresses() const;
  // The server the run's lease row names; nullopt without a row (or naming none of these).
  std::optional<std::size_t> owner(const std::string& run_id);
  std::int64_t epoch(const std::string& run_id);
  // The highest id among the run's stored reports (0: none).
  std::int64_t last_report_id(const std::string& run_id);
  // Kills the run's owner with SIGKILL (the run must have one) and polls the store every few
  // milliseconds until another server holds the lease and has stored a report of the run since
  // (what the dead server's last transaction commits after its death does not count); nullopt
  // when that did not happen within `timeout`.
  std::optional<Takeover> kill_owner(const std::string& run_id, std::chrono::milliseconds timeout);
  // The store, for the caller's own queries.
  PostgresConnection& db() { return db_; }

 private:
  std::vector<std::unique_ptr<ServerProcess>> servers_;
  PostgresConnection db_;
};

}  // namespace ampscope::testing
