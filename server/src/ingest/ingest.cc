#include "ingest.h"

#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>

#include "ampscope/proto/wire_time.h"
#include "log.h"
#include "report_digest.h"

namespace ampscope::server {
namespace {

// Ranking of the per-tensor series: tensors with non-finite values first, then by the larger of
// their overflow and underflow shares.
double tensor_score(const TensorTotals& t) {
  const double values = static_cast<double>(std::max<std::uint64_t>(t.values, 1));
  const double ratio =
      std::max(static_cast<double>(t.overflow), static_cast<double>(t.underflow)) / values;
  return (t.nonfinite > 0 ? 2.0 : 0.0) + std::min(ratio, 1.0);
}

// Totals over more samples: a sample into its batch's, a batch's into the run's.
void add_totals(TensorTotals& into, const TensorTotals& more) {
  into.samples += more.samples;
  if (more.format != 0) into.format = more.format;  // the latest sample's format
  into.values += more.values;
  into.overflow += more.overflow;
  into.underflow += more.underflow;
  into.nonfinite += more.nonfinite;
  into.max_abs = std::max(into.max_abs, more.max_abs);
  into.last_step = std::max(into.last_step, more.last_step);
}

// One stored sample of a tensor, as totals.
TensorTotals sample_totals(const TensorDigest& t, std::int64_t step) {
  TensorTotals s;
  s.format = t.format;
  s.samples = 1;
  s.values = t.values;
  s.overflow = t.overflow;
  s.underflow = t.underflow;
  s.nonfinite = t.nonfinite;
  s.max_abs = t.max_abs;
  s.last_step = step;
  return s;
}

// What a run's streams are told when another server took the run.
std::string moved_away(const std::string& run_id) {
  return "run '" + run_id + "' is owned by another server now; reconnecting finds its owner";
}

}  // namespace

// Everything one transaction produced, for after the commit.
struct Ingest::Batch {
  struct SinkResult {
    std::shared_ptr<StreamSink> sink;
    RunState* run = nullptr;
    std::uint32_t rank = 0;
    int items = 0;
    bool hello = false;
    std::uint64_t last_policy_seq = 0;  // the Hello's: the agent holds the policy up to it
  };
  struct Undo {  // an agent's seq before the batch, restored when the commit fails
    RunState* run;
    std::uint32_t rank;
    std::uint64_t seq;
  };
  struct Stored {
    RunState* run;
    const v1::StepReport* report;
    std::int64_t id;
    ReportDigest digest;  // the one digest of the report: totals, metrics and policy
  };
  struct Merged {
    RunState* run;
    bool partial;
    std::vector<v1::RankDivergence> divergences;
    std::uint32_t offender_rank = 0;
    int offender_role = 0;  // v1::TensorRole of the step's first offender; 0: none
  };
  struct Gap {
    RunState* run;
    std::uint32_t rank;
    std::uint64_t missing;
  };
  std::map<const StreamSink*, SinkResult> sinks;
  std::vector<Undo> previous_seq;
  std::vector<Stored> stored;
  std::map<RunState*, std::uint64_t> duplicates;
  std::vector<Gap> gaps;
  std::vector<Merged> merged;  // multi-rank runs' merged steps, for the metrics
  std::vector<std::pair<RunState*, v1::PolicyUpdate>> decisions;
  std::vector<std::chrono::steady_clock::time_point> received;
  int policy_errors = 0;
  // The items' digests, by index (process() makes them before the transaction).
  std::vector<ReportDigest>* digests = nullptr;
  // Streams whose run is not known (any more): ended after the batch, their items skipped.
  std::map<const StreamSink*, std::shared_ptr<StreamSink>> orphans;
  // Runs another server owns now (Ingest::fence): forgotten, their items skipped.
  std::set<std::string> lost;

  SinkResult& settle(const IngestItem& item, RunState& run) {
    SinkResult& r = sinks[item.sink.get()];
    if (!r.sink) {
      r.sink = item.sink;
      r.run = &run;
      r.rank = item.rank;
    }
    ++r.items;
    return r;
  }
};

std::size_t resolve_ingest_shards(std::size_t requested) {
  if (requested > 0) return std::min(requested, kMaxIngestShards);
  const std::size_t cores = std::thread::hardware_concurrency();
  return std::clamp<std::size_t>(cores, 1, kDefaultIngestShards);
}

Ingest::Ingest(StoreWriter& store, RunRegistry& runs, Metrics& metrics, PolicyHost& policy,
               StreamTable& streams, IngestOptions options)
    : store_(store),
      runs_(runs),
      metrics_(metrics),
      policy_(policy),
      streams_(streams),
      options_(std::move(options)),
      budget_(options_.max_queued_bytes,
              [&metrics](std::uint64_t queued, std::size_t waiting, std::uint64_t pauses) {
                metrics.ingest_backlog(queued, waiting, pauses);
              }) {
  for (std::size_t i = 0; i < runs_.shards(); ++i) {
    shards_.push_back(std::make_unique<Shard>());
    shards_.back()->index = i;
  }
}

Ingest::~Ingest() { stop(); }

void Ingest::restore() {
  if (runs_move()) return;
  RestoredState state = store_.load_state();
  restore_runs(state);
  log_info("store: restored ", state.runs.size(), " runs, ", state.agents.size(), " agents");
}

void Ingest::restore_runs(RestoredState& state) {
  for (const RestoredAgent& a : state.agents) {
    runs_.get(a.run_id).last_seq[a.rank] = a.last_seq;
  }
  for (TensorTotals& t : state.tensors) {
    RunState& run = runs_.get(t.run_id);
    run.totals[{t.name, t.role}] = std::move(t);
    run.top_stale = true;
  }
  std::map<std::string, const RestoredPolicy*> saved;
  for (const RestoredPolicy& p : state.policies) saved[p.run_id] = &p;
  // Least recently seen first: the most recently seen runs end up exported.
  for (const RestoredRun& run : state.runs) {
    const auto s = saved.find(run.run_id);
    const auto c = state.current_updates.find(run.run_id);
    RunState& restored = runs_.get(run.run_id);
    runs_.mark_active(restored);
    restored.merge.set_layout(run.hello.world_size(), run.hello.gradients_sharded());
    policy_.restore_run(
        restored, run, s == saved.end() ? nullptr : s->second,
        c == state.current_updates.end() ? std::nullopt
                                         : std::optional<v1::PolicyUpdate>(c->second),
        [&](std::int64_t after_merged, std::int64_t after_report) {
          return PolicyHost::Replay{store_.merges_since(run.run_id, after_merged, after_report),
                                    store_.reports_after(run.run_id, after_report)};
        });
  }
}

void Ingest::restore_unknown(const std::vector<IngestItem>& items) {
  std::set<std::string> looked_up;
  for (const IngestItem& item : items) {
    if (item.kind == IngestItem::Kind::kDelete || item.kind == IngestItem::Kind::kRefusal) continue;
    if (runs_.find(item.run_id) != nullptr || !looked_up.insert(item.run_id).second) continue;
    RestoredState state = store_.load_run_state(item.run_id);
    if (state.runs.empty()) continue;  // a new run
    restore_runs(state);
    std::uint64_t reports = 0;
    for (const RestoredAgent& a : state.agents) reports = std::max(reports, a.last_seq);
    log_info("runs: run '", item.run_id, "' restored from the store (", state.agents.size(),
             " agents, highest seq ", reports, ")");
  }
}

std::set<std::string> Ingest::fence(Shard& shard, const std::vector<IngestItem>& items) {
  std::set<std::string> lost;
  if (!runs_move()) return lost;
  // Every run the transaction may write: the items' runs, and the shard's runs whose waiting
  // steps may be merged or whose engine state saved (not the idle ones: their rows stay as
  // they are, however many runs the server took since it started).
  std::set<std::string> ids;
  for (const IngestItem& item : items) {
    if (item.kind != IngestItem::Kind::kDelete) ids.insert(item.run_id);
  }
  runs_.for_each(
      [&](RunState& run) {
        if (run.merge.waiting() || policy_.unsaved(run)) ids.insert(run.id);
      },
      shard.index);
  if (ids.empty()) return lost;
  const std::vector<std::string> asked(ids.begin(), ids.end());
  const std::set<std::string> owned =
      options_.ownership->confirm(store_.transaction_connection(), asked);
  for (const std::string& id : asked) {
    if (owned.contains(id)) continue;
    lost.insert(id);
    if (runs_.find(id) != nullptr) {
      log_info("runs: run '", id, "' moved to another server: forgotten here");
    }
    forget(shard, id, moved_away(id));
  }
  return lost;
}

void Ingest::drop_run(const std::string& run_id, bool taken) {
  Shard& owner = shard_of(run_id);
  {
    std::lock_guard lock(owner.mu);
    owner.pending_forget.emplace_back(run_id,
                                      taken ? std::optional(moved_away(run_id)) : std::nullopt);
  }
  owner.cv.notify_one();
}

void Ingest::start() {
  log_info("ingest: ", shards_.size(), shards_.size() == 1 ? " shard" : " shards", ", queue bound ",
           options_.max_queued_bytes >> 20, " MiB");
  for (const std::unique_ptr<Shard>& shard : shards_) {
    shard->next_retention = std::chrono::steady_clock::now();
    shard->next_refresh = shard->next_retention;
    shard->thread = std::thread([this, s = shard.get()] { run(*s); });
  }
}

Ingest::Shard& Ingest::shard_of(const std::string& run_id) {
  return *shards_[runs_.shard_of(run_id)];
}

bool Ingest::submit(IngestItem item) {
  Shard& shard = shard_of(item.run_id);
  return enqueue(shard, std::move(item));
}

bool Ingest::enqueue(Shard& shard, IngestItem item) {
  {
    std::lock_guard lock(shard.mu);
    if (shard.stopping || shard.stopped) return false;
    // Charged under the shard's lock, so that whoever drops or settles the item releases what
    // was charged.
    budget_.charge(item.bytes);
    shard.queue.push_back(std::move(item));
  }
  shard.cv.notify_one();
  return true;
}

bool Ingest::delete_run(const std::string& run_id, std::function<void(const DeleteOutcome&)> done) {
  IngestItem item;
  item.kind = IngestItem::Kind::kDelete;
  item.run_id = run_id;
  item.deleted = std::move(done);
  return submit(std::move(item));
}

void Ingest::stop() {
  bool running = false;
  for (const std::unique_ptr<Shard>& shard : shards_) {
    {
      std::lock_guard lock(shard->mu);
      if (!shard->thread.joinable()) continue;
      shard->stopping = true;
      running = true;
    }
    shard->cv.notify_one();
  }
  if (!running) return;
  for (const std::unique_ptr<Shard>& shard : shards_) {
    if (shard->thread.joinable()) shard->thread.join();
  }
  // Shutdown: the WAL folded into the database file, once every shard saved its state.
  try {
    std::lock_guard store(store_mu_);
    store_.checkpoint();
  } catch (const std::exception& e) {
    log_warning("store maintenance: ", e.what());
  }
}

void Ingest::run(Shard& shard) {
  std::vector<IngestItem> items;
  for (;;) {
    // Steps waiting for their ranks are checked while there are any, even with nothing queued.
    bool merges_waiting = false;
    runs_.for_each([&](RunState& run) { merges_waiting = merges_waiting || run.merge.waiting(); },
                   shard.index);
    // Retention runs on shard 0 only.
    auto wake =
        shard.index == 0 ? std::min(shard.next_retention, shard.next_refresh) : shard.next_refresh;
    if (merges_waiting) wake = std::min(wake, shard.next_merge_check);
    bool forget_now = false;
    {
      std::unique_lock lock(shard.mu);
      shard.cv.wait_until(lock, wake, [&] {
        return !shard.queue.empty() || !shard.pending_forget.empty() || shard.stopping ||
               shard.stopped;
      });
      if (shard.stopped) return;
      if (shard.queue.empty() && shard.stopping) break;
      forget_now = !shard.pending_forget.empty();
      // A deletion is a transaction of its own: the items before it, or it alone.
      const std::size_t n = std::min(shard.queue.size(), options_.max_batch_items);
      for (std::size_t i = 0; i < n; ++i) {
        const bool deletion = shard.queue.front().kind == IngestItem::Kind::kDelete;
        if (deletion && !items.empty()) break;
        items.push_back(std::move(shard.queue.front()));
        shard.queue.pop_front();
        if (deletion) break;
      }
    }
    if (!items.empty() && items.front().kind == IngestItem::Kind::kDelete) {
      remove_run(shard, items.front());
    } else if (!items.empty() ||
               (merges_waiting && std::chrono::steady_clock::now() >= shard.next_merge_check)) {
      process(shard, items);
    } else if (forget_now) {
      std::lock_guard store(store_mu_);
      forget_pending(shard);
    }
    release(items);
    items.clear();
    if (!shard.stopped) maintenance(shard, false);
  }
  maintenance(shard, true);
}

void Ingest::process(Shard& shard, std::vector<IngestItem>& items) {
  // Digested before the transaction, so that other shards may write meanwhile (a duplicate's
  // digest is wasted; they are rare).
  std::vector<ReportDigest> digests(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (items[i].kind == IngestItem::Kind::kReport) {
      digests[i] = digest_report(*items[i].report, policy_.reads_all_tensors(),
                                 policy_.reads_quantizers());
    }
  }
  if (options_.test_item_delay.count() > 0) {
    std::this_thread::sleep_for(options_.test_item_delay * items.size());
  }
  Batch batch;
  batch.digests = &digests;
  std::chrono::steady_clock::time_point t0;
  std::int64_t now_ns = 0;
  {
    std::unique_lock store(store_mu_);
    t0 = std::chrono::steady_clock::now();
    now_ns = proto::unix_now_ns();
    try {
      forget_pending(shard);
      if (store_.reconnect_if_broken()) log_info("store: connected again");
      restore_unknown(items);
      store_.begin();
      batch.lost = fence(shard, items);
      write(shard, items, batch, now_ns);
      store_.commit();
    } catch (const std::exception& e) {
      store_.rollback();
      store.unlock();
      fail(shard, items, e.what());
      return;
    }
  }
  const auto t1 = std::chrono::steady_clock::now();
  metrics_.commit(std::chrono::duration<double>(t1 - t0).count(), batch.stored.size());
  publish(shard, batch, now_ns);
}

void Ingest::write(Shard& shard, std::vector<IngestItem>& items, Batch& batch,
                   std::int64_t now_ns) {
  // (run, rank) -> the agent's latest counters
  std::map<std::pair<RunState*, std::uint32_t>, const v1::AgentCounters*> progressed;
  struct Delta {
    RunState* run;
    TensorTotals totals;
  };
  std::unordered_map<std::string, Delta> deltas;  // by run \0 name \0 role
  std::string delta_key;

  for (std::size_t index = 0; index < items.size(); ++index) {
    IngestItem& item = items[index];
    if (batch.lost.contains(item.run_id)) continue;
    if (item.kind == IngestItem::Kind::kRefusal) {
      // Noted only for a run that is still known (and so stored).
      if (runs_.find(item.run_id) != nullptr) {
        store_.add_agent_notice(item.run_id, item.rank, item.notice);
      }
      continue;
    }
    if (batch.orphans.contains(item.sink.get())) continue;
    // A Hello (re)creates its run; anything else belongs to the run its stream's Hello made.
    RunState* known =
        item.kind == IngestItem::Kind::kHello ? &runs_.get(item.run_id) : runs_.find(item.run_id);
    if (known == nullptr) {
      // The run was deleted under the stream, which forget() normally ends first: end it now
      // rather than fail the commit.
      batch.orphans.emplace(item.sink.get(), item.sink);
      continue;
    }
    RunState& run = *known;
    switch (item.kind) {
      case IngestItem::Kind::kHello: {
        if (run.last_seq.empty()) {  // a new run (a known one has the seq of its agents)
          log_info("runs: run '", run.id, "' is settled by ingest shard ", run.shard);
        }
        runs_.mark_active(run);
        store_.upsert_run(*item.hello, now_ns);
        store_.upsert_agent(*item.hello, now_ns);
        run.last_seq.try_emplace(item.rank, 0);
        run.merge.set_layout(item.hello->world_size(), item.hello->gradients_sharded());
        policy_.on_hello(run, *item.hello);
        {
          std::unique_lock series = runs_.lock_series();
          metrics_.on_hello(run, *item.hello);
        }
        Batch::SinkResult& settled = batch.settle(item, run);
        settled.hello = true;
        settled.last_policy_seq = item.hello->last_policy_seq();
        break;
      }
      case IngestItem::Kind::kReport: {
        runs_.mark_active(run);
        std::uint64_t& last_seq = run.last_seq[item.rank];
        const v1::StepReport& r = *item.report;
        batch.received.push_back(item.received);
        if (r.seq() <= last_seq) {
          ++batch.duplicates[&run];
          batch.settle(item, run);
          break;
        }
        if (r.seq() > last_seq + 1) {
          batch.gaps.push_back({&run, item.rank, r.seq() - last_seq - 1});
        }
        batch.previous_seq.push_back({&run, item.rank, last_seq});
        last_seq = r.seq();
        const std::int64_t id = store_.insert_report(r, item.payload, item.received_ns);
        if (id == 0) {  // the unique index knew it: a duplicate the seq map had not seen
          ++batch.duplicates[&run];
          batch.settle(item, run);
          break;
        }
        const Batch::Stored& stored = batch.stored.emplace_back(
            Batch::Stored{&run, &r, id, std::move((*batch.digests)[index])});
        const v1::AgentCounters*& counters = progressed[{&run, item.rank}];
        if (r.has_agent()) counters = &r.agent();
        for (const v1::PolicyOutcome& o : r.policy_outcomes()) {
          std::int64_t policy_id = 0;
          try {
            policy_id = std::stoll(o.policy_id());
          } catch (const std::exception&) {
            continue;  // not one of ours
          }
          store_.upsert_application(policy_id, r.rank(), r.step(), o.applied(), o.reason());
        }
        for (const std::string& notice : r.notices()) {
          store_.add_agent_notice(item.run_id, item.rank, notice);
        }
        for (const std::string& notice : item.notices) {
          store_.add_agent_notice(item.run_id, item.rank, notice);
        }
        for (const TensorDigest& t : stored.digest.tensors) {
          delta_key.assign(item.run_id).append(1, '\0').append(t.name).append(1, '\0');
          delta_key.push_back(static_cast<char>('0' + t.role));
          Delta& delta = deltas[delta_key];
          TensorTotals& d = delta.totals;
          if (d.samples == 0) {
            delta.run = &run;
            d.run_id = item.run_id;
            d.name = t.name;
            d.role = t.role;
          }
          add_totals(d, sample_totals(t, r.step()));
        }
        batch.settle(item, run);
        break;
      }
      case IngestItem::Kind::kReject: {
        std::uint64_t& last_seq = run.last_seq[item.rank];
        store_.insert_rejection(item.run_id, item.rank, item.seq, item.violation.field,
                                item.violation.reason, item.violation.message, now_ns);
        if (item.seq > last_seq) {
          batch.previous_seq.push_back({&run, item.rank, last_seq});
          last_seq = item.seq;
        }
        progressed.try_emplace({&run, item.rank}, nullptr);
        batch.settle(item, run);
        break;
      }
      case IngestItem::Kind::kDelete:
        break;  // taken alone by run()
      case IngestItem::Kind::kRefusal:
        break;  // above
    }
  }

  // Policy: the committed reports in commit order, merged over the ranks of their run; the
  // merged steps and their decisions are stored in the same transaction, so a decision exists
  // exactly when the reports that caused it do.
  const auto now = std::chrono::steady_clock::now();
  for (Batch::Stored& s : batch.stored) {
    RunState& run = *s.run;
    const auto connected = [&] { return streams_.connected_ranks(run.id); };
    for (MergedStep& m : run.merge.add(rank_step(*s.report, s.id, std::move(s.digest.step_input)),
                                       now, connected)) {
      settle_merged(run, m, batch, now_ns);
    }
  }
  if (now >= shard.next_merge_check) {
    shard.next_merge_check = now + kMergeCheckInterval;
    runs_.for_each(
        [&](RunState& run) {
          if (!run.merge.waiting()) return;
          for (MergedStep& m : run.merge.flush(now, streams_.connected_ranks(run.id))) {
            settle_merged(run, m, batch, now_ns);
          }
        },
        shard.index);
  }
  for (const PolicySnapshot& s :
       policy_.snapshots(std::chrono::steady_clock::now(), false, shard.index)) {
    store_.save_policy_state(s.run_id, std::string(policy_.mode_name()), s.state, s.last_report_id,
                             s.last_merged_id, now_ns);
  }
  std::vector<const TensorTotals*> rows;
  rows.reserve(deltas.size());
  for (const auto& [k, delta] : deltas) rows.push_back(&delta.totals);
  store_.add_tensor_totals(rows);
  for (auto& [k, delta] : deltas) {
    const TensorTotals& d = delta.totals;
    TensorTotals& total = delta.run->totals[{d.name, d.role}];
    if (total.samples == 0) {
      total.run_id = d.run_id;
      total.name = d.name;
      total.role = d.role;
    }
    add_totals(total, d);
    delta.run->top_stale = true;
  }
  for (const auto& [agent, counters] : progressed) {
    const auto& [run, rank] = agent;
    store_.set_agent_progress(run->id, rank, run->last_seq[rank], now_ns, counters);
  }
}

void Ingest::settle_merged(RunState& run, MergedStep& step, Batch& batch, std::int64_t now_ns) {
  const std::int64_t merged_id = store_.insert_merged_step(run.id, step);
  for (EngineUpdate& e : policy_.observe(run, step, merged_id, now_ns, &batch.policy_errors)) {
    const std::int64_t id = store_.insert_decision(e.update.run_id(), e.engine_id, e.update);
    e.update.set_policy_id(std::to_string(id));
    store_.set_decision_update(id, e.update);
    batch.decisions.emplace_back(&run, std::move(e.update));
  }
  if (run.merge.world_size() > 1) {
    batch.merged.push_back(Batch::Merged{
        &run, step.partial, std::move(step.divergences), step.offender_rank.value_or(0),
        step.first_offender ? static_cast<int>(step.first_offender->role()) : 0});
  }
}

void Ingest::publish(Shard& shard, Batch& batch, std::int64_t now_ns) {
  (void)now_ns;
  // The runs' series may be taken off /metrics by another shard (mark_active) meanwhile.
  std::unique_lock series = runs_.lock_series();
  for (const Batch::Stored& s : batch.stored) {
    metrics_.on_report(*s.run, *s.report, s.digest);
    metrics_.on_quantizers(*s.run, *s.report, options_.top_k);
  }
  for (const Batch::Merged& m : batch.merged) {
    metrics_.merged_step(*m.run, m.partial, m.divergences, m.offender_rank, m.offender_role);
    for (const v1::RankDivergence& d : m.divergences) {
      log_warning("ranks: run '", m.run->id, "' step ", d.step(), ": the ranks disagree on ",
                  d.field());
    }
  }
  for (const auto& [run, n] : batch.duplicates) {
    metrics_.duplicates(*run, n);
    run->duplicates.fetch_add(n, std::memory_order_relaxed);
  }
  for (const Batch::Gap& g : batch.gaps) metrics_.seq_gap(*g.run, g.rank, g.missing);
  for (int i = 0; i < batch.policy_errors; ++i) metrics_.policy_error();

  // An agent that sees Ack(n) has seen every decision its reports up to n caused: a stream
  // settled in this batch gets the batch's decisions of its run with its Ack, before it (a
  // stream whose Hello settled gets the policy in force instead, which folds them in); the
  // run's other streams get them now.
  std::map<RunState*, std::vector<v1::PolicyUpdate>> decided;
  for (const auto& [run, u] : batch.decisions) {
    const std::optional<v1::PolicyUpdate> before = policy_.current(*run);
    policy_.set_current(*run, u);
    metrics_.policy_decision(*run, policy_.mode_name(),
                             decision_kind(u, before ? &*before : nullptr), u);
    log_info("policy: run '", u.run_id(), "' decision ", u.policy_id(), " from step ",
             u.effective_from_step(), ": ", u.reason());
    decided[run].push_back(u);
  }
  series.unlock();
  const std::vector<v1::PolicyUpdate> none;
  for (auto& [ptr, result] : batch.sinks) {
    std::vector<v1::PolicyUpdate> fold;
    const std::vector<v1::PolicyUpdate>* before_ack = &none;
    if (result.hello) {
      // An agent that holds every decision up to the fold's seq needs nothing resent.
      std::optional<v1::PolicyUpdate> current = policy_.current(*result.run);
      if (current && (current->seq() == 0 || result.last_policy_seq < current->seq())) {
        fold.push_back(std::move(*current));
      }
      before_ack = &fold;
    } else if (auto it = decided.find(result.run); it != decided.end()) {
      before_ack = &it->second;
    }
    result.sink->on_settled(result.run->last_seq[result.rank], result.items, *before_ack);
  }
  for (const auto& [run, updates] : decided) {
    for (const std::shared_ptr<StreamSink>& s : streams_.of_run(run->id)) {
      if (batch.sinks.contains(s.get())) continue;
      for (const v1::PolicyUpdate& u : updates) s->on_policy(u);
    }
  }
  const auto now = std::chrono::steady_clock::now();
  for (const auto& t : batch.received) {
    metrics_.ack_delay(std::chrono::duration<double>(now - t).count());
  }
  if (!batch.orphans.empty()) {
    std::vector<std::shared_ptr<StreamSink>> orphans;
    for (auto& [ptr, sink] : batch.orphans) orphans.push_back(sink);
    end_streams(shard, orphans,
                "the stream's run is not known (deleted); reconnecting starts it again");
  }
}

void Ingest::fail(Shard& shard, std::vector<IngestItem>& items, const std::string& message) {
  // Nothing of the batch is stored, and what the shard holds of its runs (settled seqs, merges,
  // engines, totals) may be ahead of the store: every run of the shard is forgotten and its
  // streams end UNAVAILABLE, unacknowledged. The agents keep those reports in their spools and
  // send them again when they reconnect; each run is restored from the store at its next Hello,
  // which fails the same way, and costs nothing more, while the store is away.
  log_error("store: commit failed, nothing of the batch is stored: ", message,
            "; the agents send it again once the store answers");
  metrics_.store_failure();
  const std::string why = "store failed: " + message;
  std::map<const StreamSink*, std::shared_ptr<StreamSink>> sinks;
  for (IngestItem& item : items) {
    if (item.kind == IngestItem::Kind::kDelete) {
      item.deleted(DeleteOutcome{DeleteOutcome::Result::kFailed, 0, 0, why});
    } else if (item.sink) {
      sinks.emplace(item.sink.get(), item.sink);
    }
  }
  std::vector<std::string> runs;
  runs_.for_each([&](RunState& run) { runs.push_back(run.id); }, shard.index);
  for (const std::string& run_id : runs) {
    for (const std::shared_ptr<StreamSink>& s : streams_.of_run(run_id)) {
      sinks.emplace(s.get(), s);
    }
  }
  // Told first, so that they end UNAVAILABLE (a passing outage) rather than as deleted.
  for (auto& [ptr, sink] : sinks) sink->on_store_failure(why);
  for (const std::string& run_id : runs) forget(shard, run_id, why);
}

void Ingest::release(const std::vector<IngestItem>& items) {
  std::uint64_t bytes = 0;
  for (const IngestItem& item : items) bytes += item.bytes;
  if (bytes > 0) budget_.release(bytes);
}

void Ingest::remove_run(Shard& shard, IngestItem& item) {
  std::optional<std::int64_t> reports;
  {
    std::lock_guard store(store_mu_);
    try {
      forget_pending(shard);
      store_.begin();
      reports = store_.delete_run(item.run_id);
      store_.commit();
    } catch (const std::exception& e) {
      // Nothing else was in the transaction: the run is still whole, and the server goes on.
      store_.rollback();
      log_error("store: deleting run '", item.run_id, "' failed: ", e.what());
      item.deleted(DeleteOutcome{DeleteOutcome::Result::kFailed, 0, 0, e.what()});
      return;
    }
  }
  if (!reports) {
    item.deleted(DeleteOutcome{DeleteOutcome::Result::kNotFound, 0, 0, ""});
    return;
  }
  const std::size_t ended =
      forget(shard, item.run_id,
             "run '" + item.run_id + "' was deleted on the server; reconnecting starts it again");
  log_info("runs: deleted run '", item.run_id, "' (", *reports, " reports, ", ended,
           " streams ended)");
  item.deleted(DeleteOutcome{DeleteOutcome::Result::kDeleted, *reports, ended, ""});
}

void Ingest::forget_pending(Shard& shard) {
  std::vector<std::pair<std::string, std::optional<std::string>>> runs;
  {
    std::lock_guard lock(shard.mu);
    runs.swap(shard.pending_forget);
  }
  for (const auto& [run_id, why] : runs) {
    if (why) {
      forget(shard, run_id, *why);
    } else {
      runs_.forget(run_id);  // the streams stay: restore_unknown brings the run back
    }
  }
}

std::size_t Ingest::forget(Shard& shard, const std::string& run_id, const std::string& why) {
  runs_.forget(run_id);
  return end_streams(shard, streams_.of_run(run_id), why);
}

std::size_t Ingest::end_streams(Shard& shard, const std::vector<std::shared_ptr<StreamSink>>& ended,
                                const std::string& why) {
  if (ended.empty()) return 0;
  // Once told, a stream submits nothing more; what it submitted before is still queued and was
  // for the run that is gone.
  std::set<const StreamSink*> gone;
  for (const std::shared_ptr<StreamSink>& s : ended) {
    s->on_run_deleted(why);
    gone.insert(s.get());
  }
  std::vector<IngestItem> dropped;
  {
    std::lock_guard lock(shard.mu);
    for (auto it = shard.queue.begin(); it != shard.queue.end();) {
      if (gone.contains(it->sink.get())) {
        dropped.push_back(std::move(*it));
        it = shard.queue.erase(it);
      } else {
        ++it;
      }
    }
  }
  release(dropped);
  return ended.size();
}

void Ingest::refresh_top_tensors(RunState& run) {
  std::vector<const TensorTotals*> ranked;
  for (const auto& [key, t] : run.totals) {
    if (tensor_score(t) > 0) ranked.push_back(&t);
  }
  const std::size_t k = std::min(options_.top_k, ranked.size());
  std::partial_sort(ranked.begin(), ranked.begin() + static_cast<std::ptrdiff_t>(k), ranked.end(),
                    [](const TensorTotals* a, const TensorTotals* b) {
                      const double sa = tensor_score(*a);
                      const double sb = tensor_score(*b);
                      return sa != sb ? sa > sb : a->name < b->name;
                    });
  std::vector<TensorTotals> top;
  for (std::size_t i = 0; i < k; ++i) top.push_back(*ranked[i]);
  metrics_.set_top_tensors(run, top);
}

void Ingest::maintenance(Shard& shard, bool force) {
  const auto now = std::chrono::steady_clock::now();
  try {
    if (force || now >= shard.next_refresh) {
      shard.next_refresh = now + options_.refresh_interval;
      // Only exported runs have series to refresh; the others catch up once active again.
      std::unique_lock series = runs_.lock_series();
      for (RunState* run : runs_.exported()) {
        if (run->shard != shard.index) continue;
        if (!run->totals.empty()) {
          if (run->top_stale) refresh_top_tensors(*run);
          run->top_stale = false;
          metrics_.policy_target(*run, policy_.target_scale(*run));
        }
        metrics_.set_agents_connected(*run, streams_.connected_ranks(run->id).size());
      }
      series.unlock();
      if (shard.index == 0) {
        std::lock_guard store(store_mu_);
        metrics_.store_live_bytes(store_.live_bytes());
      }
    }
    if (!force && shard.index == 0 && now >= shard.next_retention) {
      shard.next_retention = now + options_.retention_interval;
      if (options_.retention_max_age_ns > 0 || options_.retention_max_bytes > 0) retention();
    }
    if (force) {
      // Shutdown: the latest engine state of the shard's runs (Ingest::stop checkpoints).
      const std::vector<PolicySnapshot> snapshots =
          policy_.snapshots(std::chrono::steady_clock::now(), true, shard.index);
      if (!snapshots.empty()) {
        std::lock_guard store(store_mu_);
        try {
          store_.begin();
          const std::set<std::string> lost = fence(shard, {});
          for (const PolicySnapshot& s : snapshots) {
            if (lost.contains(s.run_id)) continue;
            store_.save_policy_state(s.run_id, std::string(policy_.mode_name()), s.state,
                                     s.last_report_id, s.last_merged_id, proto::unix_now_ns());
          }
          store_.commit();
        } catch (const std::exception&) {
          store_.rollback();
          throw;
        }
      }
    }
  } catch (const std::exception& e) {
    log_warning("store maintenance: ", e.what());
  }
}

void Ingest::retention() {
  std::lock_guard store(store_mu_);
  // A run with an agent connected is alive, however long it has been quiet.
  const RetentionResult r =
      store_.apply_retention(options_.retention_max_age_ns, options_.retention_max_bytes,
                             proto::unix_now_ns(), streams_.runs());
  // Forgotten by their own shards before those write again: they take the store lock first.
  for (const std::string& run_id : r.deleted_run_ids) {
    Shard& owner = shard_of(run_id);
    if (owner.index == 0) {
      forget(owner, run_id, "run '" + run_id + "' was deleted by retention");
      continue;
    }
    {
      std::lock_guard lock(owner.mu);
      owner.pending_forget.emplace_back(run_id, "run '" + run_id + "' was deleted by retention");
    }
    owner.cv.notify_one();
  }
  metrics_.retention_deleted(r.deleted_reports);
  if (r.deleted_reports > 0 || r.deleted_runs > 0) {
    log_info("retention: deleted ", r.deleted_reports, " reports and ", r.deleted_runs, " runs");
  }
}

}  // namespace ampscope::server
