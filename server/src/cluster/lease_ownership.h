// Run ownership through a lease per run in the shared store, for servers that share one
// PostgreSQL (docs/server.md, "Several servers"). A row of run_leases names the server that
// owns a run (its advertised address, and an id of this server process) and holds until
// expires_ms on the store's clock. A claim takes a row that is missing, expired or already this
// process's (one INSERT ... ON CONFLICT DO UPDATE ... WHERE, atomic in PostgreSQL: two servers
// claiming at once cannot both win); a heartbeat renews every row this process holds in one
// UPDATE every renew_every; release_all() deletes them, so that a graceful shutdown hands its
// runs over at once and a crash after at most ttl.
//
// Why a lease row rather than an advisory lock: the row carries the owner's address, which a
// Redirect needs (a lock names only a backend pid); it runs on the store's clock and survives a
// reconnect shorter than the ttl, where a session's locks go with the session, every run at
// once, and outlive a dead host until PostgreSQL's TCP keepalive notices it (minutes to hours,
// not ampscope's to choose); and a commit can check the row in its own transaction (the
// fence: confirm()). The epoch, raised at every change of owner, counts the moves.
//
// This process believes it owns a run until the start of the last claim or renewal that found
// it, plus ttl - renew_every: a server cut off from the store stops claiming the run before
// another server can take the lease over. A lease whose row names this server's advertised
// address under another process id is this server's previous process (killed before it could
// release): the claim is UNAVAILABLE until that lease expires, rather than a redirect to itself.
//
// A run this process claims afresh (first claim, or after its belief lapsed) and a run the
// heartbeat or a commit's fence finds owned by another process are handed to on_lost(): the
// ingest forgets what it held of the run and restores it from the store at its next Hello, so
// that a server taking a run over starts from what the previous owner committed, and a server
// getting a run back never trusts a stale copy. Each commit checks its runs' rows in its own
// transaction (confirm(), the fence): owner_id is this process's id, new for every process, so
// a row still naming it was not taken, and FOR SHARE makes another server's claim wait for the
// commit.
//
// Thread safety: every member may be called from any thread; the connection is used under mu_.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "db.h"
#include "run_ownership.h"

namespace ampscope::server {

class LeaseOwnership final : public RunOwnership {
 public:
  struct Options {
    // This server's address for agents (--advertise-address); may come later, by advertise().
    std::string advertised;
    std::chrono::milliseconds ttl{10000};
    std::chrono::milliseconds renew_every{3000};  // less than half the ttl
  };
  // A new connection to the shared store, for this object alone (again after a failure).
  using Connect = std::function<std::unique_ptr<Connection>()>;

  // Connects, creates run_leases when missing and starts the heartbeat. Throws ampscope::Error
  // on a bad option, StoreError when the store cannot be used.
  LeaseOwnership(Connect connect, Options options);
  ~LeaseOwnership() override;  // stops the heartbeat; what is still held expires after the ttl

  RunClaim claim(const std::string& run_id) override;
  void release_all() override;
  bool runs_move() const override { return true; }
  void advertise(const std::string& address) override;
  void on_lost(std::function<void(const std::string&, bool)> callback) override;
  std::set<std::string> confirm(Connection& tx, const std::vector<std::string>& runs) override;

  // The lease's epoch for `run_id` as the store has it (0: no lease): how often it moved.
  std::int64_t epoch(const std::string& run_id);

 private:
  using Clock = std::chrono::steady_clock;
  Connection& db_locked();  // connects when needed
  // `afresh`: the run was not this process's a moment ago (its state must come from the store).
  RunClaim claim_locked(const std::string& run_id, bool& afresh);
  std::vector<std::string> renew_locked();  // the runs whose lease another process took
  void heartbeat();

  const Connect connect_;
  Options options_;       // `advertised` under mu_
  const std::string id_;  // this process, among every server's
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;           // guarded by mu_
  std::unique_ptr<Connection> db_;  // guarded by mu_; null after a failure
  // Called under mu_: it must only hand the run to another thread, never call back here.
  std::function<void(const std::string&, bool)> on_lost_;  // guarded by mu_
  // run -> believed owned until. Its own lock, never held across a statement: the ingest's fence
  // updates it inside its transaction while a claim may wait on that transaction's row lock.
  std::mutex held_mu_;
  std::map<std::string, Clock::time_point> held_;
  // Runs another server owns, as last read: the owner's address, trusted until `until`
  // (claim_locked). Under held_mu_.
  struct Foreign {
    std::string owner;
    Clock::time_point until;
  };
  static constexpr std::chrono::milliseconds kForeignAnswerFor{1000};
  std::map<std::string, Foreign> foreign_;
  std::thread thread_;
};

}  // namespace ampscope::server
