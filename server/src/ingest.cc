#include "ingest.h"

#include <algorithm>

#include "ampscope/proto/stats_codec.h"
#include "log.h"

namespace ampscope::server {
namespace {

std::int64_t unix_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Ranking of the per-tensor series: tensors with non-finite values first, then by the larger of
// their overflow and underflow shares.
double tensor_score(const TensorTotals& t) {
  const double values = static_cast<double>(std::max<std::uint64_t>(t.values, 1));
  const double ratio =
      std::max(static_cast<double>(t.overflow), static_cast<double>(t.underflow)) / values;
  return (t.nonfinite > 0 ? 2.0 : 0.0) + std::min(ratio, 1.0);
}

}  // namespace

// Everything one transaction produced, for after the commit.
struct Ingest::Batch {
  struct SinkResult {
    std::shared_ptr<StreamSink> sink;
    std::string agent;  // agent_key
    int items = 0;
    bool hello = false;
    std::string run_id;
  };
  std::map<const StreamSink*, SinkResult> sinks;
  std::vector<std::pair<std::string, std::uint64_t>> previous_seq;  // to undo on failure
  std::vector<const v1::StepReport*> stored;
  std::map<std::string, std::uint64_t> duplicates;
  std::vector<std::pair<std::string, std::pair<std::uint32_t, std::uint64_t>>> gaps;
  std::vector<v1::PolicyUpdate> decisions;
  std::vector<std::chrono::steady_clock::time_point> received;
  int policy_errors = 0;

  SinkResult& settle(const IngestItem& item, const std::string& agent) {
    SinkResult& r = sinks[item.sink.get()];
    if (!r.sink) {
      r.sink = item.sink;
      r.agent = agent;
      r.run_id = item.run_id;
    }
    ++r.items;
    return r;
  }
};

Ingest::Ingest(StoreWriter& store, Metrics& metrics, PolicyHost& policy, StreamTable& streams,
               IngestOptions options)
    : store_(store),
      metrics_(metrics),
      policy_(policy),
      streams_(streams),
      options_(std::move(options)) {}

Ingest::~Ingest() { stop(); }

std::string Ingest::agent_key(const std::string& run_id, std::uint32_t rank) {
  std::string key = run_id;
  key += '\0';
  key += std::to_string(rank);
  return key;
}

void Ingest::restore() {
  RestoredState state = store_.load_state();
  for (const RestoredAgent& a : state.agents) {
    agents_[agent_key(a.run_id, a.rank)].last_seq = a.last_seq;
  }
  for (TensorTotals& t : state.tensors) {
    const std::string run_id = t.run_id;
    totals_[run_id][{t.name, t.role}] = std::move(t);
    top_dirty_[run_id] = true;
  }
  std::map<std::string, const RestoredPolicy*> saved;
  for (const RestoredPolicy& p : state.policies) saved[p.run_id] = &p;
  for (const RestoredRun& run : state.runs) {
    known_runs_.insert(run.run_id);
    const auto s = saved.find(run.run_id);
    const auto c = state.current_updates.find(run.run_id);
    policy_.restore_run(
        run, s == saved.end() ? nullptr : s->second,
        c == state.current_updates.end() ? std::nullopt
                                         : std::optional<v1::PolicyUpdate>(c->second),
        [&](std::int64_t after) { return store_.reports_after(run.run_id, after); });
  }
  log_info("store: restored ", state.runs.size(), " runs, ", state.agents.size(), " agents");
}

void Ingest::start() {
  next_retention_ = std::chrono::steady_clock::now();
  next_refresh_ = next_retention_;
  thread_ = std::thread([this] { run(); });
}

bool Ingest::submit(IngestItem item) {
  {
    std::lock_guard lock(mu_);
    if (stopping_ || stopped_) return false;
    queue_.push_back(std::move(item));
  }
  cv_.notify_one();
  return true;
}

void Ingest::stop() {
  {
    std::lock_guard lock(mu_);
    if (!thread_.joinable()) return;
    stopping_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

std::uint64_t Ingest::duplicates(const std::string& run_id) const {
  std::lock_guard lock(mu_);
  auto it = duplicates_.find(run_id);
  return it == duplicates_.end() ? 0 : it->second;
}

void Ingest::on_failure(std::function<void(const std::string&)> callback) {
  on_failure_ = std::move(callback);
}

void Ingest::run() {
  std::vector<IngestItem> items;
  for (;;) {
    {
      std::unique_lock lock(mu_);
      cv_.wait_until(lock, std::min(next_retention_, next_refresh_),
                     [&] { return !queue_.empty() || stopping_ || stopped_; });
      if (stopped_) return;
      if (queue_.empty() && stopping_) break;
      const std::size_t n = std::min(queue_.size(), options_.max_batch_items);
      for (std::size_t i = 0; i < n; ++i) {
        items.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    if (!items.empty()) process(items);
    items.clear();
    if (!stopped_) maintenance(false);
  }
  maintenance(true);
}

void Ingest::process(std::vector<IngestItem>& items) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::int64_t now_ns = unix_ns();
  Batch batch;
  try {
    store_.begin();
    write(items, batch, now_ns);
    store_.commit();
  } catch (const std::exception& e) {
    store_.rollback();
    fail(items, batch, e.what());
    return;
  }
  const auto t1 = std::chrono::steady_clock::now();
  metrics_.commit(std::chrono::duration<double>(t1 - t0).count(), batch.stored.size());
  publish(batch, now_ns);
}

void Ingest::write(std::vector<IngestItem>& items, Batch& batch, std::int64_t now_ns) {
  std::map<std::string, const v1::AgentCounters*> progressed;  // agent_key -> latest counters
  std::map<std::string, std::pair<std::string, std::uint32_t>> identities;
  std::unordered_map<std::string, TensorTotals> deltas;  // by run \0 name \0 role
  std::string delta_key;
  std::vector<std::int64_t> stored_ids;

  auto advance = [&](const std::string& key, AgentState& a, std::uint64_t seq) {
    batch.previous_seq.emplace_back(key, a.last_seq);
    a.last_seq = seq;
  };

  for (IngestItem& item : items) {
    const std::string key = agent_key(item.run_id, item.rank);
    identities.emplace(key, std::make_pair(item.run_id, item.rank));
    switch (item.kind) {
      case IngestItem::Kind::kHello: {
        known_runs_.insert(item.run_id);
        store_.upsert_run(*item.hello, now_ns);
        store_.upsert_agent(*item.hello, now_ns);
        agents_.try_emplace(key);
        policy_.on_hello(*item.hello);
        metrics_.on_hello(*item.hello);
        batch.settle(item, key).hello = true;
        break;
      }
      case IngestItem::Kind::kReport: {
        AgentState& a = agents_[key];
        const v1::StepReport& r = *item.report;
        batch.received.push_back(item.received);
        if (r.seq() <= a.last_seq) {
          ++batch.duplicates[item.run_id];
          batch.settle(item, key);
          break;
        }
        if (r.seq() > a.last_seq + 1) {
          batch.gaps.push_back({item.run_id, {item.rank, r.seq() - a.last_seq - 1}});
        }
        advance(key, a, r.seq());
        const std::int64_t id = store_.insert_report(r, item.payload, item.received_ns);
        if (id == 0) {  // the unique index knew it: a duplicate the seq map had not seen
          ++batch.duplicates[item.run_id];
          batch.settle(item, key);
          break;
        }
        batch.stored.push_back(&r);
        stored_ids.push_back(id);
        const v1::AgentCounters*& counters = progressed[key];
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
        for (const v1::TensorStats& t : r.tensors()) {
          delta_key.assign(item.run_id).append(1, '\0').append(t.name()).append(1, '\0');
          delta_key.push_back(static_cast<char>('0' + t.role()));
          TensorTotals& d = deltas[delta_key];
          if (d.samples == 0) {
            d.run_id = item.run_id;
            d.name = t.name();
            d.role = t.role();
          }
          ++d.samples;
          d.nonfinite += proto::nonfinite(t);
          d.max_abs = std::max(d.max_abs, t.max_abs() / t.scale());
          d.last_step = std::max(d.last_step, r.step());
          if (t.targets_size() > 0) {
            d.format = t.targets(0).format();
            d.values += proto::finite_nonzero(t);
            d.overflow += t.targets(0).overflow();
            d.underflow += t.targets(0).underflow();
          }
        }
        batch.settle(item, key);
        break;
      }
      case IngestItem::Kind::kReject: {
        AgentState& a = agents_[key];
        store_.insert_rejection(item.run_id, item.rank, item.seq, item.violation.field,
                                item.violation.reason, item.violation.message, now_ns);
        if (item.seq > a.last_seq) advance(key, a, item.seq);
        progressed.try_emplace(key, nullptr);
        batch.settle(item, key);
        break;
      }
    }
  }

  // Policy: the committed reports in commit order; decisions are stored in the same
  // transaction, so a decision exists exactly when the reports that caused it do.
  for (std::size_t i = 0; i < batch.stored.size(); ++i) {
    for (EngineUpdate& e :
         policy_.observe(*batch.stored[i], stored_ids[i], now_ns, &batch.policy_errors)) {
      const std::int64_t id = store_.insert_decision(e.update.run_id(), e.engine_id, e.update);
      e.update.set_policy_id(std::to_string(id));
      store_.set_decision_update(id, e.update);
      batch.decisions.push_back(std::move(e.update));
    }
  }
  for (const PolicySnapshot& s : policy_.snapshots(std::chrono::steady_clock::now(), false)) {
    store_.save_policy_state(s.run_id, std::string(policy_.mode_name()), s.state, s.last_report_id,
                             now_ns);
  }
  for (auto& [k, d] : deltas) {
    store_.add_tensor_totals(d);
    TensorTotals& total = totals_[d.run_id][{d.name, d.role}];
    if (total.samples == 0) {
      total.run_id = d.run_id;
      total.name = d.name;
      total.role = d.role;
    }
    total.format = d.format != 0 ? d.format : total.format;
    total.samples += d.samples;
    total.values += d.values;
    total.overflow += d.overflow;
    total.underflow += d.underflow;
    total.nonfinite += d.nonfinite;
    total.max_abs = std::max(total.max_abs, d.max_abs);
    total.last_step = std::max(total.last_step, d.last_step);
    top_dirty_[d.run_id] = true;
  }
  for (const auto& [key, counters] : progressed) {
    const auto& [run_id, rank] = identities[key];
    store_.set_agent_progress(run_id, rank, agents_[key].last_seq, now_ns, counters);
  }
}

void Ingest::publish(Batch& batch, std::int64_t now_ns) {
  (void)now_ns;
  for (const v1::StepReport* r : batch.stored) metrics_.on_report(*r);
  for (const auto& [run_id, n] : batch.duplicates) metrics_.duplicates(run_id, n);
  for (const auto& [run_id, gap] : batch.gaps) metrics_.seq_gap(run_id, gap.first, gap.second);
  for (int i = 0; i < batch.policy_errors; ++i) metrics_.policy_error();
  if (!batch.duplicates.empty()) {
    std::lock_guard lock(mu_);
    for (const auto& [run_id, n] : batch.duplicates) duplicates_[run_id] += n;
  }

  // Decisions first: an agent that sees Ack(n) has seen every decision the reports up to n
  // caused.
  for (const v1::PolicyUpdate& u : batch.decisions) {
    policy_.set_current(u.run_id(), u);
    metrics_.policy_decision(
        u.run_id(), policy_.mode_name(), decision_kind(u), u.reason(),
        u.has_loss_scale() ? std::optional<double>(u.loss_scale()) : std::nullopt,
        u.has_min_scale() ? std::optional<double>(u.min_scale()) : std::nullopt,
        static_cast<std::size_t>(u.fp32_tensors_size()));
    log_info("policy: run '", u.run_id(), "' decision ", u.policy_id(), " from step ",
             u.effective_from_step(), ": ", u.reason());
    for (const std::shared_ptr<StreamSink>& s : streams_.of_run(u.run_id())) s->on_policy(u);
  }
  for (auto& [ptr, result] : batch.sinks) {
    result.sink->on_settled(agents_[result.agent].last_seq, result.items);
    if (result.hello) {
      if (std::optional<v1::PolicyUpdate> current = policy_.current(result.run_id)) {
        result.sink->on_policy(*current);
      }
    }
  }
  const auto now = std::chrono::steady_clock::now();
  for (const auto& t : batch.received) {
    metrics_.ack_delay(std::chrono::duration<double>(now - t).count());
  }
}

void Ingest::fail(std::vector<IngestItem>& items, Batch& batch, const std::string& message) {
  // Undo in reverse so that each agent ends at its seq before the batch.
  for (auto it = batch.previous_seq.rbegin(); it != batch.previous_seq.rend(); ++it) {
    agents_[it->first].last_seq = it->second;
  }
  log_error("store: commit failed, nothing of the batch is stored: ", message);
  {
    std::lock_guard lock(mu_);
    stopped_ = true;
  }
  std::map<const StreamSink*, std::shared_ptr<StreamSink>> sinks;
  for (IngestItem& item : items) sinks.emplace(item.sink.get(), item.sink);
  {
    std::lock_guard lock(mu_);
    for (IngestItem& item : queue_) sinks.emplace(item.sink.get(), item.sink);
    queue_.clear();
  }
  for (auto& [ptr, sink] : sinks) sink->on_store_failure("store failed: " + message);
  if (on_failure_) on_failure_(message);
}

void Ingest::refresh_top_tensors(const std::string& run_id) {
  const auto& all = totals_[run_id];
  std::vector<const TensorTotals*> ranked;
  for (const auto& [key, t] : all) {
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
  metrics_.set_top_tensors(run_id, top);
}

void Ingest::maintenance(bool force) {
  const auto now = std::chrono::steady_clock::now();
  try {
    if (force || now >= next_refresh_) {
      next_refresh_ = now + options_.refresh_interval;
      for (auto& [run_id, dirty] : top_dirty_) {
        if (dirty) refresh_top_tensors(run_id);
        dirty = false;
        metrics_.policy_target(run_id, policy_.target_scale(run_id));
      }
      for (const std::string& run_id : known_runs_) {
        metrics_.set_agents_connected(run_id, streams_.connected_ranks(run_id).size());
      }
      metrics_.store_live_bytes(store_.live_bytes());
    }
    if (!force && now >= next_retention_) {
      next_retention_ = now + options_.retention_interval;
      if (options_.retention_max_age_ns > 0 || options_.retention_max_bytes > 0) {
        const RetentionResult r = store_.apply_retention(options_.retention_max_age_ns,
                                                         options_.retention_max_bytes, unix_ns());
        metrics_.retention_deleted(r.deleted_reports);
        if (r.deleted_reports > 0 || r.deleted_runs > 0) {
          log_info("retention: deleted ", r.deleted_reports, " reports and ", r.deleted_runs,
                   " runs");
        }
      }
    }
    if (force) {
      // Shutdown: the latest engine state, then the WAL folded into the database file.
      const std::vector<PolicySnapshot> snapshots =
          policy_.snapshots(std::chrono::steady_clock::now(), true);
      if (!snapshots.empty()) {
        store_.begin();
        for (const PolicySnapshot& s : snapshots) {
          store_.save_policy_state(s.run_id, std::string(policy_.mode_name()), s.state,
                                   s.last_report_id, unix_ns());
        }
        store_.commit();
      }
      store_.checkpoint();
    }
  } catch (const std::exception& e) {
    if (force) store_.rollback();
    log_warning("store maintenance: ", e.what());
  }
}

}  // namespace ampscope::server
