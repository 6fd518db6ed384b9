#include "lease_ownership.h"

#include <cstdio>
#include <random>

#include "log.h"

namespace ampscope::server {
namespace {

// 128 random bits in hex: this server process among every server's, past and present.
std::string process_id() {
  std::random_device rd;
  std::string id;
  for (int i = 0; i < 4; ++i) {
    char word[9];
    std::snprintf(word, sizeof word, "%08x", static_cast<unsigned>(rd()));
    id += word;
  }
  return id;
}

// The store's clock in ms since the epoch: every server reads the same one.
std::string now_ms(const Connection& c) {
  return c.backend() == Backend::kPostgres
             ? "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)"
             : "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)";
}

}  // namespace

LeaseOwnership::LeaseOwnership(Connect connect, Options options)
    : connect_(std::move(connect)), options_(std::move(options)), id_(process_id()) {
  if (options_.renew_every.count() <= 0 || options_.renew_every * 2 >= options_.ttl) {
    throw Error("run leases: the renewal (" + std::to_string(options_.renew_every.count()) +
                " ms) must come within half the ttl (" + std::to_string(options_.ttl.count()) +
                " ms)");
  }
  {
    std::lock_guard lock(mu_);
    db_locked();  // a store that cannot be used fails the start, not the first claim
  }
  thread_ = std::thread([this] { heartbeat(); });
}

LeaseOwnership::~LeaseOwnership() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

Connection& LeaseOwnership::db_locked() {
  if (!db_) {
    db_ = connect_();
    // A claim runs on a gRPC thread: it waits for the store (a row another server's claim
    // holds, a store that hangs) for a bounded time, then answers UNAVAILABLE.
    if (db_->backend() == Backend::kPostgres) db_->exec("SET statement_timeout = 2000");
  }
  return *db_;
}

void LeaseOwnership::advertise(const std::string& address) {
  std::lock_guard lock(mu_);
  options_.advertised = address;
}

void LeaseOwnership::on_lost(std::function<void(const std::string&, bool)> callback) {
  std::lock_guard lock(mu_);
  on_lost_ = std::move(callback);
}

RunClaim LeaseOwnership::claim(const std::string& run_id) {
  std::lock_guard lock(mu_);
  bool afresh = false;
  RunClaim claim;
  try {
    claim = claim_locked(run_id, afresh);
  } catch (const StoreError& e) {
    db_.reset();  // the next call connects again
    return RunClaim::unavailable(std::string("the shared store: ") + e.what());
  }
  // Whatever this server still holds of a run it claims afresh may be older than what another
  // owner committed since: dropped before the Hello that follows is taken. Under mu_, so that
  // no other claim of the run answers "owned" (and its Hello is taken) before it.
  if (afresh && on_lost_) on_lost_(run_id, /*taken=*/false);
  return claim;
}

RunClaim LeaseOwnership::claim_locked(const std::string& run_id, bool& afresh) {
  const Clock::time_point start = Clock::now();
  {
    std::lock_guard held(held_mu_);
    if (auto it = held_.find(run_id); it != held_.end() && it->second > start) {
      return RunClaim::owned();
    }
    if (auto it = foreign_.find(run_id); it != foreign_.end()) {
      if (it->second.until > start) return RunClaim::elsewhere(it->second.owner);
      foreign_.erase(it);
    }
  }
  if (options_.advertised.empty()) {
    return RunClaim::unavailable("the server does not know its own address yet");
  }
  Connection& db = db_locked();
  const std::string now = now_ms(db);
  Statement take = db.prepare(
      "INSERT INTO run_leases (run_id, owner_id, owner_address, epoch, expires_ms) "
      "VALUES (?1, ?2, ?3, 1, " +
      now +
      " + ?4) "
      "ON CONFLICT (run_id) DO UPDATE SET owner_id = excluded.owner_id, "
      "owner_address = excluded.owner_address, expires_ms = excluded.expires_ms, "
      "epoch = run_leases.epoch + CASE WHEN run_leases.owner_id = excluded.owner_id THEN 0 "
      "ELSE 1 END "
      "WHERE run_leases.owner_id = excluded.owner_id OR run_leases.expires_ms < " +
      now + " RETURNING epoch");
  take.bind(1, run_id).bind(2, id_).bind(3, options_.advertised);
  take.bind(4, static_cast<std::int64_t>(options_.ttl.count()));
  const bool taken = take.step();
  take.reset();
  if (taken) {
    std::lock_guard held(held_mu_);
    foreign_.erase(run_id);
    held_[run_id] = start + options_.ttl - options_.renew_every;
    afresh = true;
    return RunClaim::owned();
  }
  Statement who = db.prepare("SELECT owner_address, expires_ms - " + now +
                             " FROM run_leases WHERE run_id = ?1");
  who.bind(1, run_id);
  std::string owner;
  std::int64_t left_ms = 0;
  if (who.step()) {
    owner = who.column_text(0);
    left_ms = who.column_int(1);
  }
  who.reset();
  if (owner.empty()) return RunClaim::unavailable("its lease changed hands while it was read");
  if (owner == options_.advertised) {
    return RunClaim::unavailable(
        "its lease is held by this server's previous process, until "
        "it expires within " +
        std::to_string(options_.ttl.count()) + " ms");
  }
  // Every rank of the run asks, and keeps asking while its owner is unreachable: the answer is
  // kept until the lease could expire, at most kForeignAnswerFor, so that a run changing hands
  // costs the store one question a second, not one per rank.
  const auto keep = std::min<std::chrono::milliseconds>(
      kForeignAnswerFor, std::chrono::milliseconds(std::max<std::int64_t>(left_ms, 0)));
  if (keep.count() > 0) {
    std::lock_guard held(held_mu_);
    foreign_[run_id] = Foreign{owner, start + keep};
  }
  return RunClaim::elsewhere(owner);
}

std::int64_t LeaseOwnership::epoch(const std::string& run_id) {
  std::lock_guard lock(mu_);
  Statement q = db_locked().prepare("SELECT epoch FROM run_leases WHERE run_id = ?1");
  q.bind(1, run_id);
  const std::int64_t e = q.step() ? q.column_int(0) : 0;
  q.reset();
  return e;
}

std::vector<std::string> LeaseOwnership::renew_locked() {
  const Clock::time_point start = Clock::now();
  Connection& db = db_locked();
  Statement renew = db.prepare("UPDATE run_leases SET expires_ms = " + now_ms(db) +
                               " + ?1 WHERE owner_id = ?2 RETURNING run_id");
  renew.bind(1, static_cast<std::int64_t>(options_.ttl.count())).bind(2, id_);
  std::map<std::string, Clock::time_point> renewed;
  while (renew.step()) renewed[renew.column_text(0)] = start + options_.ttl - options_.renew_every;
  renew.reset();
  std::vector<std::string> gone;
  {
    std::lock_guard held(held_mu_);
    for (const auto& [run, until] : held_) {
      if (!renewed.count(run)) gone.push_back(run);
    }
    held_ = std::move(renewed);
  }
  for (const std::string& run : gone) {
    log_warning("run '", run, "': its lease was taken by another server");
  }
  return gone;
}

std::set<std::string> LeaseOwnership::confirm(Connection& tx,
                                              const std::vector<std::string>& runs) {
  std::set<std::string> owned;
  if (runs.empty()) return owned;
  std::string sql = "SELECT run_id FROM run_leases WHERE owner_id = ?1 AND run_id IN (";
  for (std::size_t i = 0; i < runs.size(); ++i) {
    sql += (i == 0 ? "?" : ", ?") + std::to_string(i + 2);
  }
  sql += ")";
  // SQLite's write transaction already holds the whole database.
  if (tx.backend() == Backend::kPostgres) sql += " FOR SHARE";
  Statement q = tx.prepare(sql);
  q.bind(1, id_);
  for (std::size_t i = 0; i < runs.size(); ++i) q.bind(static_cast<int>(i + 2), runs[i]);
  while (q.step()) owned.insert(q.column_text(0));
  q.reset();
  std::lock_guard held(held_mu_);
  for (const std::string& run : runs) {
    if (!owned.contains(run)) held_.erase(run);
  }
  return owned;
}

void LeaseOwnership::heartbeat() {
  std::unique_lock lock(mu_);
  while (!cv_.wait_for(lock, options_.renew_every, [&] { return stopping_; })) {
    std::vector<std::string> gone;
    try {
      gone = renew_locked();
    } catch (const StoreError& e) {
      // What is held stays believed until its deadline; past it, claim() asks the store.
      db_.reset();
      log_warning("run leases: cannot renew: ", e.what());
    }
    if (on_lost_) {
      for (const std::string& run : gone) on_lost_(run, /*taken=*/true);
    }
  }
}

void LeaseOwnership::release_all() {
  std::lock_guard lock(mu_);
  {
    std::lock_guard held(held_mu_);
    held_.clear();
  }
  try {
    Statement drop = db_locked().prepare("DELETE FROM run_leases WHERE owner_id = ?1");
    drop.bind(1, id_).run();
  } catch (const StoreError& e) {
    db_.reset();
    log_warning("run leases: cannot release them (they expire within ", options_.ttl.count(),
                " ms): ", e.what());
  }
}

}  // namespace ampscope::server
