// cluster/: which ampscope-server owns which run. Several servers may share one store
// (docs/server.md, "Several servers"); each run is owned by exactly one of them at a time, and
// only the owner takes the run's reports, merges its ranks and runs its policy engine. This
// folder owns that decision: the RunOwnership interface the Hello path asks, the address a
// server advertises to agents, and the implementations: a server alone owns every run
// (SingleServerOwnership, the default), or a lease per run in the shared store decides
// (lease_ownership.h).
//
// The rest of the server asks only claim(): a Hello for a run this server does not own is
// answered with a Redirect to the owner (rpc/attach_reactor.cc) and nothing of it is stored.
#pragma once

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace ampscope::server {

class Connection;  // db.h

// The answer to "may this server take run R's streams?".
struct RunClaim {
  enum class Kind {
    kOwned,        // this server owns the run (it may just have taken it over)
    kElsewhere,    // another server owns it: `owner` is where agents should go
    kUnavailable,  // nobody can tell now (the shared store is unreachable): `reason` says why
  };
  Kind kind = Kind::kOwned;
  std::string owner;   // kElsewhere: the owner's advertised gRPC address ("host:port")
  std::string reason;  // kUnavailable: one line for the agent's status

  static RunClaim owned() { return {}; }
  static RunClaim elsewhere(std::string owner) { return {Kind::kElsewhere, std::move(owner), {}}; }
  static RunClaim unavailable(std::string reason) {
    return {Kind::kUnavailable, {}, std::move(reason)};
  }
};

// Thread safety: every member may be called from any thread at once (gRPC's callback threads
// ask claim() for each Hello; shutdown calls release_all()).
class RunOwnership {
 public:
  virtual ~RunOwnership() = default;

  // Asked for every Hello, on a gRPC callback thread, before the stream is registered or
  // anything of it reaches the ingest thread. kOwned means this server owns `run_id` now and
  // goes on owning it (renewing whatever keeps it its own) until release_all() or until it
  // loses it to another server; an implementation that must ask a shared store does so here,
  // bounded by its own short deadline, and answers kUnavailable past it.
  virtual RunClaim claim(const std::string& run_id) = 0;

  // Graceful shutdown, after the last commit: every run this server owns is free for another
  // server to take over at once (rather than when a lease expires).
  virtual void release_all() = 0;

  // True when runs move between servers: a server restores a run from the store when it takes
  // the run's first stream (it may have been another server's a moment ago), not at start-up.
  virtual bool runs_move() const { return false; }

  // The address agents reach this server at, once its port is bound (empty: unknown). Claims
  // before it are UNAVAILABLE where the owner's address matters.
  virtual void advertise(const std::string& address) { (void)address; }

  // Called (from any thread) with each run whose copy in this server's memory may be stale:
  // `taken`, another server owns it now (the heartbeat found its lease taken): the ingest ends
  // the run's streams and forgets it; not `taken`, this server has just claimed it afresh (it
  // was not its own a moment ago): the ingest forgets its copy, keeping the streams, and
  // restores the run from the store before it takes anything more of it. Set before the first
  // claim.
  virtual void on_lost(std::function<void(const std::string& run_id, bool taken)> callback) {
    (void)callback;
  }

  // Fencing, inside the ingest's transaction on `tx`, before it writes anything of `runs`: the
  // ones this server still owns. Another server's claim of those waits for the transaction to
  // end, so whatever it restores includes this commit; the rest must not be written. Asked
  // only where runs move; a server alone owns them all. Throws StoreError as the transaction's
  // statements do.
  virtual std::set<std::string> confirm(Connection& tx, const std::vector<std::string>& runs) {
    (void)tx;
    return {runs.begin(), runs.end()};
  }
};

// One server, or servers with stores of their own: this server owns every run (the default,
// and ampscope's behaviour before there were several servers).
class SingleServerOwnership final : public RunOwnership {
 public:
  RunClaim claim(const std::string&) override { return RunClaim::owned(); }
  void release_all() override {}
};

// Why `advertise` (--advertise-address) cannot be told to agents, one line; empty when it can
// (or when it is empty: not given).
std::string check_advertise_address(const std::string& advertise);

// The address this server tells agents and other servers to reach it at: `advertise` when
// given, else `bound` (the --listen address with the port actually bound) unless --listen is a
// wildcard (0.0.0.0, [::]) that no client can connect to; then empty: unknown.
std::string advertised_address(const std::string& advertise, const std::string& listen,
                               const std::string& bound);

}  // namespace ampscope::server
