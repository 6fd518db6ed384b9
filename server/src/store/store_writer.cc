// The write side of the store: one connection, statements prepared once, many writes per
// transaction (group commit: on PostgreSQL too, one transaction per batch). Everything here
// runs on the ingest thread. The SQL is the dialect both back ends accept (db.h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "ampscope/proto/stats_codec.h"
#include "policy_merge.h"
#include "store.h"

namespace ampscope::server {

struct StoreWriter::Statements {
  explicit Statements(Connection& c)
      : upsert_run(c.prepare(
            "INSERT INTO runs (run_id, world_size, precision, trainer, compute_format, hello, "
            "first_seen_ns, last_seen_ns) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7) "
            "ON CONFLICT (run_id) DO UPDATE SET world_size = ?2, precision = ?3, trainer = ?4, "
            "compute_format = ?5, hello = ?6, last_seen_ns = ?7")),
        run_id_of(c.prepare("SELECT id FROM runs WHERE run_id = ?1")),
        touch_run(c.prepare("UPDATE runs SET last_seen_ns = " + sql_greatest("last_seen_ns", "?2") +
                            " WHERE id = ?1")),
        upsert_agent(c.prepare(
            "INSERT INTO agents (run, rank, host, trainer, agent_version, first_seen_ns, "
            "last_seen_ns, data_parallel_size, gradients_sharded, policy_agreement, "
            "last_policy_seq) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6, ?7, ?8, ?9, ?10) "
            "ON CONFLICT (run, rank) DO UPDATE SET host = ?3, trainer = ?4, agent_version = ?5, "
            "last_seen_ns = ?6, data_parallel_size = ?7, gradients_sharded = ?8, "
            "policy_agreement = ?9, last_policy_seq = ?10")),
        agent_progress(c.prepare("UPDATE agents SET last_seq = " + sql_greatest("last_seq", "?3") +
                                 ", last_seen_ns = ?4, counters = coalesce(?5, counters) "
                                 "WHERE run = ?1 AND rank = ?2")),
        // The policy seq an agent holds: its Hello's, then the highest its reports say it
        // applied (StepReport.policy_seq), so that a run's agents list follows the updates.
        agent_policy_seq(c.prepare(
            "UPDATE agents SET last_policy_seq = " + sql_greatest("last_policy_seq", "?3") +
            " WHERE run = ?1 AND rank = ?2")),
        agent_notice(c.prepare(
            "INSERT INTO agent_notices (run, rank, text) SELECT ?1, ?2, ?3 "
            "WHERE (SELECT count(*) FROM agent_notices WHERE run = ?1 AND rank = ?2) < 16 "
            "ON CONFLICT DO NOTHING")),
        insert_report(c.prepare(
            "INSERT INTO reports (run, rank, seq, step, loss, loss_scale, scale_after, "
            "found_inf, skipped, offender, n_tensors, received_ns, payload, step_time_s, "
            "val_loss, tensor_core_active_ratio) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, "
            "?10, ?11, ?12, ?13, ?14, ?15, ?16) ON CONFLICT (run, rank, seq) DO NOTHING "
            "RETURNING id")),
        insert_counts(prepare_report_counts(c)),
        insert_rejection(c.prepare(
            "INSERT INTO rejections (run, rank, seq, field, reason, message, received_ns) "
            "VALUES ((SELECT id FROM runs WHERE run_id = ?1), ?2, ?3, ?4, ?5, ?6, ?7)")),
        insert_decision(c.prepare(
            "INSERT INTO policy_decisions (run, engine_id, effective_from_step, decided_ns, "
            "reason, \"update\") VALUES (?1, ?2, ?3, ?4, ?5, ?6) RETURNING id")),
        set_decision_update(c.prepare("UPDATE policy_decisions SET \"update\" = ?2 WHERE id = ?1")),
        insert_merged(c.prepare(
            "INSERT INTO merged_steps (run, step, partial, ranks, report_ids, max_report_id, "
            "found_inf, skipped, loss, tokens, offender_rank, offender) VALUES (?1, ?2, ?3, ?4, "
            "?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12) RETURNING id")),
        insert_divergence(
            c.prepare("INSERT INTO rank_divergences (run, step, field, divergence) VALUES "
                      "(?1, ?2, ?3, ?4) ON CONFLICT (run, step, field) DO UPDATE SET "
                      "divergence = excluded.divergence")),
        upsert_application(c.prepare(
            "INSERT INTO policy_applications (policy, rank, step, applied, reason) VALUES "
            "(?1, ?2, ?3, ?4, ?5) ON CONFLICT (policy, rank) DO UPDATE SET step = ?3, "
            "applied = ?4, reason = ?5")),
        save_policy(c.prepare(
            "INSERT INTO policy_state (run, mode, state, last_report_id, saved_ns, "
            "last_merged_id) VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (run) DO UPDATE SET "
            "mode = ?2, state = ?3, last_report_id = ?4, saved_ns = ?5, last_merged_id = ?6")),
        delete_reports(c.prepare("DELETE FROM reports WHERE run = ?1")),
        delete_applications(c.prepare("DELETE FROM policy_applications WHERE policy IN "
                                      "(SELECT id FROM policy_decisions WHERE run = ?1)")),
        delete_agents(c.prepare("DELETE FROM agents WHERE run = ?1")),
        delete_notices(c.prepare("DELETE FROM agent_notices WHERE run = ?1")),
        delete_tensors(c.prepare("DELETE FROM tensor_totals WHERE run = ?1")),
        delete_policy_state(c.prepare("DELETE FROM policy_state WHERE run = ?1")),
        delete_decisions(c.prepare("DELETE FROM policy_decisions WHERE run = ?1")),
        delete_merged(c.prepare("DELETE FROM merged_steps WHERE run = ?1")),
        delete_divergences(c.prepare("DELETE FROM rank_divergences WHERE run = ?1")),
        delete_rejections(c.prepare("DELETE FROM rejections WHERE run = ?1")),
        delete_run(c.prepare("DELETE FROM runs WHERE id = ?1")),
        insert_history(c.prepare(
            "INSERT INTO tensor_history (report, run, rank, step, name, role, phase, stats) "
            "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)")),
        add_quantizer(prepare_add_quantizer(c)),
        delete_quantizers(c.prepare("DELETE FROM quantizer_totals WHERE run = ?1")) {}

  // One sample into quantizer_totals: sums add up (the loss cost's over the samples that carry
  // one), extremes widen (an absent scale range, NULL, takes the other side's), and the latest
  // step's sample sets the "latest" columns.
  static Statement prepare_add_quantizer(Connection& c) {
    const auto latest = [](const char* column) {
      return std::string(column) + " = CASE WHEN excluded.last_step >= q.last_step THEN excluded." +
             column + " ELSE q." + column + " END, ";
    };
    const auto sum = [](const char* column) {
      return std::string(column) + " = q." + column + " + excluded." + column + ", ";
    };
    // NULL-safe: CASE WHEN b IS NULL OR a <op> b THEN a ELSE b END (NULL when both are).
    const auto extreme = [](const char* column, const char* op) {
      return std::string(column) + " = CASE WHEN excluded." + column + " IS NULL OR q." + column +
             " " + op + " excluded." + column + " THEN q." + column + " ELSE excluded." + column +
             " END, ";
    };
    std::string sql =
        "INSERT INTO quantizer_totals AS q (run, name, role, phase, recipe, element, samples, "
        "\"values\", nonfinite, underflow, subnormal, saturated, overflow, signal_sq, error_sq, "
        "amax, last_amax, scale_min, scale_max, last_scale, scale_min_exponent, "
        "scale_max_exponent, blocks, zero_blocks, saturated_blocks, nan_blocks, last_step, "
        "loss_cost_samples, loss_cost_sum, loss_cost_sq_sum) "
        "VALUES (?1, ?2, ?3, ?4, ?5, ?6, 1, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?15, ?16, "
        "?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25, ?26, ?27) "
        "ON CONFLICT (run, name, role, phase) DO UPDATE SET ";
    sql += latest("recipe") + latest("element") + latest("last_amax") + latest("last_scale");
    sql += "samples = q.samples + 1, ";
    for (const char* c : {"\"values\"", "nonfinite", "underflow", "subnormal", "saturated",
                          "overflow", "signal_sq", "error_sq", "blocks", "zero_blocks",
                          "saturated_blocks", "nan_blocks", "loss_cost_samples",
                          "loss_cost_sum", "loss_cost_sq_sum"}) {
      sql += sum(c);
    }
    sql += extreme("amax", ">=") + extreme("scale_min", "<=") + extreme("scale_max", ">=") +
           extreme("scale_min_exponent", "<=") + extreme("scale_max_exponent", ">=");
    sql += "last_step = " + sql_greatest("q.last_step", "excluded.last_step");
    return c.prepare(sql);
  }

  // Tensor totals upserted per statement at most, kTensorColumns parameters each.
  static constexpr std::size_t kTensorRows = 50;
  static constexpr std::size_t kTensorColumns = 11;

  // An upsert of `rows` deltas into tensor_totals.
  static Statement prepare_add_tensors(Connection& c, std::size_t rows) {
    std::string sql =
        "INSERT INTO tensor_totals (run, name, role, format, samples, \"values\", overflow, "
        "underflow, nonfinite, max_abs, last_step) VALUES ";
    for (std::size_t row = 0; row < rows; ++row) {
      sql += row == 0 ? "(" : ", (";
      for (std::size_t column = 1; column <= kTensorColumns; ++column) {
        sql += (column == 1 ? "?" : ", ?") + std::to_string(row * kTensorColumns + column);
      }
      sql += ")";
    }
    // As add_totals: the latest format of a sample that had one; a batch whose samples had no
    // target (a weight gradient after unscaling) keeps the stored one. The stored row's columns
    // named by the table's name (on PostgreSQL a bare name could also be the proposed row's).
    sql +=
        " ON CONFLICT (run, name, role) DO UPDATE SET "
        "format = CASE WHEN excluded.format != 0 THEN excluded.format "
        "ELSE tensor_totals.format END, "
        "samples = tensor_totals.samples + excluded.samples, "
        "\"values\" = tensor_totals.\"values\" + excluded.\"values\", "
        "overflow = tensor_totals.overflow + excluded.overflow, "
        "underflow = tensor_totals.underflow + excluded.underflow, "
        "nonfinite = tensor_totals.nonfinite + excluded.nonfinite, "
        "max_abs = " +
        sql_greatest("tensor_totals.max_abs", "excluded.max_abs") +
        ", last_step = " + sql_greatest("tensor_totals.last_step", "excluded.last_step");
    return c.prepare(sql);
  }

  // The upsert of `rows` deltas, prepared at its first use.
  Statement& add_tensors(Connection& c, std::size_t rows) {
    auto it = add_tensors_by_rows.find(rows);
    if (it == add_tensors_by_rows.end()) {
      it = add_tensors_by_rows.emplace(rows, prepare_add_tensors(c, rows)).first;
    }
    return it->second;
  }

  Statement upsert_run, run_id_of, touch_run, upsert_agent, agent_progress, agent_policy_seq,
      agent_notice, insert_report, insert_counts, insert_rejection, insert_decision,
      set_decision_update, insert_merged, insert_divergence, upsert_application, save_policy;
  // A run's rows, every table; the runs row last.
  Statement delete_reports, delete_applications, delete_agents, delete_notices, delete_tensors,
      delete_policy_state, delete_decisions, delete_merged, delete_divergences, delete_rejections,
      delete_run;
  Statement insert_history;
  Statement add_quantizer, delete_quantizers;
  std::map<std::size_t, Statement> add_tensors_by_rows;  // 1..kTensorRows
};

StoreWriter::StoreWriter(const StoreOptions& options)
    : options_(options), conn_(open_store(options, StoreRole::kWriter)) {
  migrate(*conn_);
  st_ = std::make_unique<Statements>(*conn_);
}

bool StoreWriter::reconnect_if_broken() {
  if (!conn_->broken()) return false;
  // Both made before either is replaced: a database still away leaves the broken pair, which
  // fails every call cleanly until the next try.
  std::unique_ptr<Connection> fresh = open_store(options_, StoreRole::kWriter);
  auto statements = std::make_unique<Statements>(*fresh);
  st_ = std::move(statements);  // the old statements go before their connection
  conn_ = std::move(fresh);
  run_keys_.clear();
  return true;
}

StoreWriter::~StoreWriter() {
  if (in_transaction_) rollback();
}

RestoredState StoreWriter::load_state() { return load(std::nullopt); }

RestoredState StoreWriter::load_run_state(const std::string& run_id) {
  Statement s = conn_->prepare("SELECT id FROM runs WHERE run_id = ?1");
  s.bind(1, run_id);
  if (!s.step()) return {};
  const std::int64_t key = s.column_int(0);
  s.reset();
  return load(key);
}

RestoredState StoreWriter::load(std::optional<std::int64_t> only) {
  RestoredState state;
  std::map<std::int64_t, std::string> names;
  // Every run's rows, or one run's: the same queries with a WHERE on the run's key.
  const auto query = [&](std::string sql, const char* run_column, const char* order = "") {
    if (only) sql += std::string(" WHERE ") + run_column + " = ?1";
    Statement s = conn_->prepare(sql + order);
    if (only) s.bind(1, *only);
    return s;
  };
  {
    Statement s =
        query("SELECT id, run_id, hello, last_seen_ns FROM runs", "id", " ORDER BY last_seen_ns");
    while (s.step()) {
      RestoredRun r;
      r.run_id = s.column_text(1);
      const std::string_view blob = s.column_blob(2);
      r.hello.ParseFromArray(blob.data(), static_cast<int>(blob.size()));
      r.last_seen_ns = s.column_int(3);
      names[s.column_int(0)] = r.run_id;
      run_keys_[r.run_id] = s.column_int(0);
      state.runs.push_back(std::move(r));
    }
  }
  {
    Statement s = query("SELECT run, rank, last_seq FROM agents", "run");
    while (s.step()) {
      state.agents.push_back(RestoredAgent{names[s.column_int(0)],
                                           static_cast<std::uint32_t>(s.column_int(1)),
                                           static_cast<std::uint64_t>(s.column_int(2))});
    }
  }
  {
    Statement s =
        query("SELECT run, state, last_report_id, last_merged_id FROM policy_state", "run");
    while (s.step()) {
      state.policies.push_back(RestoredPolicy{names[s.column_int(0)], s.column_text(1),
                                              s.column_int(2), s.column_int(3)});
    }
  }
  {
    Statement s = query(
        "SELECT run, name, role, format, samples, \"values\", overflow, underflow, nonfinite, "
        "max_abs, last_step FROM tensor_totals",
        "run");
    while (s.step()) {
      TensorTotals t;
      t.run_id = names[s.column_int(0)];
      t.name = s.column_text(1);
      t.role = static_cast<int>(s.column_int(2));
      t.format = static_cast<int>(s.column_int(3));
      t.samples = static_cast<std::uint64_t>(s.column_int(4));
      t.values = static_cast<std::uint64_t>(s.column_int(5));
      t.overflow = static_cast<std::uint64_t>(s.column_int(6));
      t.underflow = static_cast<std::uint64_t>(s.column_int(7));
      t.nonfinite = static_cast<std::uint64_t>(s.column_int(8));
      t.max_abs = s.column_double(9);
      t.last_step = s.column_int(10);
      state.tensors.push_back(std::move(t));
    }
  }
  {
    // The policy in force: every decision of the run folded in order. Decisions stored before
    // PolicyUpdate.seq existed take theirs from the engine's number.
    Statement s =
        query("SELECT run, \"update\", engine_id FROM policy_decisions", "run", " ORDER BY id");
    while (s.step()) {
      v1::PolicyUpdate u;
      const std::string_view blob = s.column_blob(1);
      if (u.ParseFromArray(blob.data(), static_cast<int>(blob.size()))) {
        if (u.seq() == 0) u.set_seq(static_cast<std::uint64_t>(s.column_int(2)));
        merge_policy_update(&state.current_updates[names[s.column_int(0)]], u);
      }
    }
  }
  return state;
}

std::vector<std::pair<std::int64_t, v1::StepReport>> StoreWriter::reports_after(
    const std::string& run_id, std::int64_t after_id) {
  std::vector<std::pair<std::int64_t, v1::StepReport>> out;
  Statement s = conn_->prepare(
      "SELECT id, payload FROM reports WHERE run = ?1 AND id > ?2 "
      "ORDER BY id");
  s.bind(1, run_key(run_id)).bind(2, after_id);
  while (s.step()) {
    v1::StepReport r;
    const std::string_view blob = s.column_blob(1);
    if (r.ParseFromArray(blob.data(), static_cast<int>(blob.size()))) {
      out.emplace_back(s.column_int(0), std::move(r));
    }
  }
  return out;
}

namespace {

// The id an INSERT ... RETURNING id gave back; the statement is reset for reuse.
std::int64_t inserted_id(Statement& s) {
  if (!s.step()) {
    s.reset();
    throw StoreError("store: an INSERT returned no id");
  }
  const std::int64_t id = s.column_int(0);
  s.reset();
  return id;
}

template <typename T>
std::string join_numbers(const std::vector<T>& values) {
  std::string s;
  for (const T& v : values) s += (s.empty() ? "" : " ") + std::to_string(v);
  return s;
}

template <typename T>
std::vector<T> split_numbers(const std::string& text) {
  std::vector<T> out;
  std::istringstream in(text);
  for (T v; in >> v;) out.push_back(v);
  return out;
}

}  // namespace

std::vector<ReportCounts> count_report(const v1::StepReport& r) {
  std::vector<ReportCounts> groups;
  for (const v1::TensorStats& t : r.tensors()) {
    const int format = t.targets_size() > 0 ? static_cast<int>(t.targets(0).format()) : 0;
    auto it = std::find_if(groups.begin(), groups.end(), [&](const ReportCounts& g) {
      return g.role == static_cast<int>(t.role()) && g.format == format;
    });
    if (it == groups.end()) {
      it = groups.insert(groups.end(), ReportCounts{static_cast<int>(t.role()), format});
    }
    it->nonfinite += proto::nonfinite(t);
    if (t.targets_size() == 0) continue;
    const v1::TargetCounts& c = t.targets(0);
    it->checked += proto::finite_nonzero(t);  // TensorTotals.values' definition
    it->underflow += c.underflow();
    it->overflow += c.overflow();
    it->subnormal += c.subnormal();
  }
  return groups;
}

ReportColumns report_columns(const v1::StepReport& r) {
  const auto finite = [](bool present, double v) {
    return present && std::isfinite(v) ? std::optional<double>(v) : std::nullopt;
  };
  return {finite(r.has_val_loss(), r.val_loss()),
          finite(r.has_tensor_core_active_ratio(), r.tensor_core_active_ratio())};
}

Statement prepare_report_counts(Connection& c) {
  return c.prepare(
      "INSERT INTO report_counts (report, run, step, rank, role, format, checked, underflow, "
      "overflow, subnormal, nonfinite) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)");
}

void insert_report_counts(Statement& s, std::int64_t report, std::int64_t run,
                          const v1::StepReport& r) {
  for (const ReportCounts& g : count_report(r)) {
    s.bind(1, report)
        .bind(2, run)
        .bind(3, r.step())
        .bind(4, std::int64_t{r.rank()})
        .bind(5, std::int64_t{g.role})
        .bind(6, std::int64_t{g.format})
        .bind(7, static_cast<std::int64_t>(g.checked))
        .bind(8, static_cast<std::int64_t>(g.underflow))
        .bind(9, static_cast<std::int64_t>(g.overflow))
        .bind(10, static_cast<std::int64_t>(g.subnormal))
        .bind(11, static_cast<std::int64_t>(g.nonfinite))
        .run();
  }
}

std::vector<StoredMerge> StoreWriter::merges_since(const std::string& run_id,
                                                   std::int64_t after_merged_id,
                                                   std::int64_t after_report_id) {
  std::vector<StoredMerge> out;
  Statement s = conn_->prepare(
      "SELECT id, step, partial, ranks, report_ids FROM merged_steps WHERE run = ?1 AND "
      "(id > ?2 OR max_report_id > ?3) ORDER BY id");
  s.bind(1, run_key(run_id)).bind(2, after_merged_id).bind(3, after_report_id);
  while (s.step()) {
    StoredMerge m;
    m.id = s.column_int(0);
    m.step = s.column_int(1);
    m.partial = s.column_int(2) != 0;
    m.ranks = split_numbers<std::uint32_t>(s.column_text(3));
    m.report_ids = split_numbers<std::int64_t>(s.column_text(4));
    out.push_back(std::move(m));
  }
  return out;
}

void StoreWriter::begin() {
  conn_->begin_write();
  in_transaction_ = true;
  touched_runs_.clear();
}

void StoreWriter::commit() {
  conn_->commit();
  in_transaction_ = false;
  touched_runs_.clear();
}

Connection& StoreWriter::transaction_connection() {
  if (!in_transaction_) throw StoreError("transaction_connection() outside a transaction");
  return *conn_;
}

void StoreWriter::rollback() {
  in_transaction_ = false;
  touched_runs_.clear();
  try {
    conn_->rollback();
  } catch (const StoreError&) {
    // SQLite may have rolled back already (some I/O errors end the transaction themselves); a
    // lost PostgreSQL connection took the transaction with it.
  }
  // Keys of runs created in the rolled-back transaction are gone.
  run_keys_.clear();
}

std::int64_t StoreWriter::run_key(const std::string& run_id) {
  if (auto it = run_keys_.find(run_id); it != run_keys_.end()) return it->second;
  Statement& s = st_->run_id_of;
  s.bind(1, run_id);
  if (!s.step()) {
    s.reset();
    throw StoreError("store: unknown run '" + run_id + "'");
  }
  const std::int64_t key = s.column_int(0);
  s.reset();
  run_keys_[run_id] = key;
  return key;
}

void StoreWriter::upsert_run(const v1::Hello& hello, std::int64_t now_ns) {
  touched_runs_.clear();  // last_seen_ns is set, not raised
  const std::string blob = hello.SerializeAsString();
  st_->upsert_run.bind(1, hello.run_id())
      .bind(2, std::int64_t{hello.world_size()})
      .bind(3, hello.precision())
      .bind(4, hello.trainer())
      .bind(5, std::int64_t{hello.compute_format()})
      .bind_blob(6, blob.data(), blob.size())
      .bind(7, now_ns)
      .run();
}

void StoreWriter::upsert_agent(const v1::Hello& hello, std::int64_t now_ns) {
  st_->upsert_agent.bind(1, run_key(hello.run_id()))
      .bind(2, std::int64_t{hello.rank()})
      .bind(3, hello.host())
      .bind(4, hello.trainer())
      .bind(5, hello.agent_version())
      .bind(6, now_ns)
      .bind(7, std::int64_t{hello.data_parallel_size()})
      .bind(8, std::int64_t{hello.gradients_sharded()})
      .bind(9, std::int64_t{hello.policy_agreement()})
      .bind(10, static_cast<std::int64_t>(hello.last_policy_seq()))
      .run();
}

void StoreWriter::set_agent_progress(const std::string& run_id, std::uint32_t rank,
                                     std::uint64_t last_seq, std::int64_t now_ns,
                                     const v1::AgentCounters* counters) {
  const std::int64_t run = run_key(run_id);
  Statement& s = st_->agent_progress;
  s.bind(1, run).bind(2, std::int64_t{rank}).bind(3, static_cast<std::int64_t>(last_seq));
  s.bind(4, now_ns);
  if (counters != nullptr) {
    const std::string blob = counters->SerializeAsString();
    s.bind_blob(5, blob.data(), blob.size());
  } else {
    s.bind_null(5);
  }
  s.run();
  const auto touched = touched_runs_.find(run);
  if (touched != touched_runs_.end() && touched->second >= now_ns) return;
  st_->touch_run.bind(1, run).bind(2, now_ns).run();
  touched_runs_[run] = now_ns;
}

void StoreWriter::add_agent_notice(const std::string& run_id, std::uint32_t rank,
                                   const std::string& text) {
  st_->agent_notice.bind(1, run_key(run_id)).bind(2, std::int64_t{rank}).bind(3, text).run();
}

std::int64_t StoreWriter::insert_report(const v1::StepReport& r, const std::string& received,
                                        std::int64_t received_ns) {
  std::string without_history;
  if (r.history_size() > 0) {
    v1::StepReport copy(r);
    copy.clear_history();
    without_history = copy.SerializeAsString();
  }
  const std::string& payload = r.history_size() > 0 ? without_history : received;
  Statement& s = st_->insert_report;
  s.bind(1, run_key(r.run_id()))
      .bind(2, std::int64_t{r.rank()})
      .bind(3, static_cast<std::int64_t>(r.seq()))
      .bind(4, r.step());
  if (std::isfinite(r.loss())) {
    s.bind(5, r.loss());
  } else {
    s.bind_null(5);
  }
  s.bind(6, r.loss_scale())
      .bind(7, r.scale_after())
      .bind(8, std::int64_t{r.found_inf()})
      .bind(9, std::int64_t{r.skipped()});
  if (r.has_first_offender()) {
    s.bind(10, r.first_offender().tensor());
  } else {
    s.bind_null(10);
  }
  s.bind(11, std::int64_t{r.tensors_size()})
      .bind(12, received_ns)
      .bind_blob(13, payload.data(), payload.size())
      .bind(14, r.step_time_s());
  const ReportColumns columns = report_columns(r);
  s.bind(15, columns.val_loss).bind(16, columns.tensor_core_active_ratio);
  // No row back: the unique (run, rank, seq) already held it (ON CONFLICT DO NOTHING).
  const std::int64_t id = s.step() ? s.column_int(0) : 0;
  s.reset();
  if (id == 0) return 0;
  const std::int64_t run = run_key(r.run_id());
  insert_report_counts(st_->insert_counts, id, run, r);
  if (r.history_size() > 0) insert_history(run, id, r);
  for (const v1::QuantizerStats& q : r.quantizers()) add_quantizer(run, r.step(), q);
  if (r.policy_seq() > 0) {
    st_->agent_policy_seq.bind(1, run)
        .bind(2, std::int64_t{r.rank()})
        .bind(3, static_cast<std::int64_t>(r.policy_seq()))
        .run();
  }
  return id;
}

void StoreWriter::add_quantizer(std::int64_t run, std::int64_t step, const v1::QuantizerStats& q) {
  // Per-tensor recipes have a tensor scale (tile and MX: 0, none); block recipes a histogram.
  const bool has_scale = q.tensor_scale() > 0.0;
  const v1::BinadeHistogram& h = q.scale_histogram();
  const bool has_binades = h.counts_size() > 0;
  const auto count = [](std::uint64_t n) { return static_cast<std::int64_t>(n); };
  Statement& s = st_->add_quantizer;
  s.bind(1, run)
      .bind(2, q.name())
      .bind(3, std::int64_t{q.role()})
      .bind(4, std::int64_t{q.phase()})
      .bind(5, q.recipe())
      .bind(6, std::int64_t{q.element()})
      .bind(7, count(q.values()))
      .bind(8, count(q.nonfinite()))
      .bind(9, count(q.underflow()))
      .bind(10, count(q.subnormal()))
      .bind(11, count(q.saturated()))
      .bind(12, count(q.overflow()))
      .bind(13, q.signal_sq())
      .bind(14, q.error_sq())
      .bind(15, q.amax())
      .bind(16, has_scale ? std::optional<double>(q.tensor_scale()) : std::nullopt)
      .bind(17, q.tensor_scale())
      .bind(18, has_binades ? std::optional<std::int64_t>(h.min_exponent()) : std::nullopt)
      .bind(19, has_binades ? std::optional<std::int64_t>(h.min_exponent() + h.counts_size() - 1)
                            : std::nullopt)
      .bind(20, count(q.blocks()))
      .bind(21, count(q.zero_blocks()))
      .bind(22, count(q.saturated_blocks()))
      .bind(23, count(q.nan_blocks()))
      .bind(24, step)
      .bind(25, std::int64_t{q.has_loss_cost() ? 1 : 0})
      .bind(26, q.loss_cost())  // 0 when absent
      .bind(27, q.loss_cost() * q.loss_cost())
      .run();
}

void StoreWriter::insert_history(std::int64_t run, std::int64_t report, const v1::StepReport& r) {
  Statement& s = st_->insert_history;
  for (const v1::HistoryStep& h : r.history()) {
    for (const v1::TensorStats& t : h.tensors()) {
      const std::string blob = t.SerializeAsString();
      s.bind(1, report)
          .bind(2, run)
          .bind(3, std::int64_t{r.rank()})
          .bind(4, h.step())
          .bind(5, t.name())
          .bind(6, std::int64_t{t.role()})
          .bind(7, std::int64_t{t.phase()})
          .bind_blob(8, blob.data(), blob.size())
          .run();
    }
  }
}

namespace {

// One delta's values as the row at `row` (from 0) of an add_tensors statement.
void bind_tensor_row(Statement& s, std::size_t row, std::int64_t run, const TensorTotals& d,
                     std::size_t columns) {
  const int at = static_cast<int>(row * columns);
  s.bind(at + 1, run)
      .bind(at + 2, d.name)
      .bind(at + 3, std::int64_t{d.role})
      .bind(at + 4, std::int64_t{d.format})
      .bind(at + 5, static_cast<std::int64_t>(d.samples))
      .bind(at + 6, static_cast<std::int64_t>(d.values))
      .bind(at + 7, static_cast<std::int64_t>(d.overflow))
      .bind(at + 8, static_cast<std::int64_t>(d.underflow))
      .bind(at + 9, static_cast<std::int64_t>(d.nonfinite))
      .bind(at + 10, d.max_abs)
      .bind(at + 11, d.last_step);
}

}  // namespace

void StoreWriter::add_tensor_totals(const TensorTotals& delta) { add_tensor_totals({&delta}); }

void StoreWriter::add_tensor_totals(const std::vector<const TensorTotals*>& deltas) {
  for (std::size_t i = 0; i < deltas.size();) {
    const std::size_t rows = std::min(deltas.size() - i, Statements::kTensorRows);
    Statement& s = st_->add_tensors(*conn_, rows);
    for (std::size_t row = 0; row < rows; ++row, ++i) {
      bind_tensor_row(s, row, run_key(deltas[i]->run_id), *deltas[i], Statements::kTensorColumns);
    }
    s.run();
  }
}

void StoreWriter::insert_rejection(const std::string& run_id, std::uint32_t rank, std::uint64_t seq,
                                   const std::string& field, const std::string& reason,
                                   const std::string& message, std::int64_t now_ns) {
  st_->insert_rejection.bind(1, run_id)
      .bind(2, std::int64_t{rank})
      .bind(3, static_cast<std::int64_t>(seq))
      .bind(4, field)
      .bind(5, reason)
      .bind(6, message)
      .bind(7, now_ns)
      .run();
}

std::int64_t StoreWriter::insert_decision(const std::string& run_id, std::uint64_t engine_id,
                                          const v1::PolicyUpdate& update) {
  const std::string blob = update.SerializeAsString();
  st_->insert_decision.bind(1, run_key(run_id))
      .bind(2, static_cast<std::int64_t>(engine_id))
      .bind(3, update.effective_from_step())
      .bind(4, update.decided_unix_ns())
      .bind(5, update.reason())
      .bind_blob(6, blob.data(), blob.size());
  return inserted_id(st_->insert_decision);
}

std::int64_t StoreWriter::insert_merged_step(const std::string& run_id, const MergedStep& m) {
  const std::int64_t run = run_key(run_id);
  Statement& s = st_->insert_merged;
  s.bind(1, run)
      .bind(2, m.step)
      .bind(3, std::int64_t{m.partial})
      .bind(4, join_numbers(m.ranks))
      .bind(5, join_numbers(m.report_ids))
      .bind(6, *std::max_element(m.report_ids.begin(), m.report_ids.end()))
      .bind(7, std::int64_t{m.input.found_inf})
      .bind(8, std::int64_t{m.input.skipped})
      .bind(10, static_cast<std::int64_t>(m.tokens));
  if (std::isfinite(m.loss)) {
    s.bind(9, m.loss);
  } else {
    s.bind_null(9);
  }
  if (m.first_offender) {
    s.bind(11, std::int64_t{*m.offender_rank}).bind(12, m.first_offender->tensor());
  } else {
    s.bind_null(11).bind_null(12);
  }
  const std::int64_t id = inserted_id(s);
  for (const v1::RankDivergence& d : m.divergences) {
    const std::string blob = d.SerializeAsString();
    st_->insert_divergence.bind(1, run)
        .bind(2, d.step())
        .bind(3, d.field())
        .bind_blob(4, blob.data(), blob.size())
        .run();
  }
  return id;
}

void StoreWriter::set_decision_update(std::int64_t id, const v1::PolicyUpdate& update) {
  const std::string blob = update.SerializeAsString();
  st_->set_decision_update.bind(1, id).bind_blob(2, blob.data(), blob.size()).run();
}

void StoreWriter::upsert_application(std::int64_t policy_id, std::uint32_t rank, std::int64_t step,
                                     bool applied, const std::string& reason) {
  st_->upsert_application.bind(1, policy_id)
      .bind(2, std::int64_t{rank})
      .bind(3, step)
      .bind(4, std::int64_t{applied})
      .bind(5, reason)
      .run();
}

void StoreWriter::save_policy_state(const std::string& run_id, const std::string& mode,
                                    const std::string& state, std::int64_t last_report_id,
                                    std::int64_t last_merged_id, std::int64_t now_ns) {
  st_->save_policy.bind(1, run_key(run_id))
      .bind(2, mode)
      .bind(3, state)
      .bind(4, last_report_id)
      .bind(5, now_ns)
      .bind(6, last_merged_id)
      .run();
}

std::uint64_t StoreWriter::live_bytes() { return conn_->live_bytes(); }

std::int64_t StoreWriter::delete_run_rows(std::int64_t run) {
  st_->delete_reports.bind(1, run).run();
  const std::int64_t reports = conn_->changes();
  // Applications hang off the run's decisions: they go first.
  for (Statement* s :
       {&st_->delete_applications, &st_->delete_agents, &st_->delete_notices, &st_->delete_tensors,
        &st_->delete_quantizers, &st_->delete_policy_state, &st_->delete_decisions,
        &st_->delete_merged, &st_->delete_divergences, &st_->delete_rejections,
        &st_->delete_run}) {
    s->bind(1, run).run();
  }
  return reports;
}

std::optional<std::int64_t> StoreWriter::delete_run(const std::string& run_id) {
  std::int64_t key = 0;
  try {
    key = run_key(run_id);
  } catch (const StoreError&) {
    return std::nullopt;  // not in the store
  }
  const std::int64_t reports = delete_run_rows(key);
  run_keys_.erase(run_id);
  touched_runs_.erase(key);
  return reports;
}

RetentionResult StoreWriter::apply_retention(std::int64_t max_age_ns, std::uint64_t max_bytes,
                                             std::int64_t now_ns,
                                             const std::set<std::string>& keep) {
  RetentionResult result;
  constexpr std::int64_t kChunk = 2000;  // reports per transaction: short write locks
  if (max_age_ns > 0) {
    const std::int64_t cutoff = now_ns - max_age_ns;
    for (;;) {
      Transaction tx(*conn_);
      Statement del = conn_->prepare(
          "DELETE FROM reports WHERE id IN (SELECT id FROM reports WHERE received_ns < ?1 "
          "ORDER BY id LIMIT ?2)");
      del.bind(1, cutoff).bind(2, kChunk).run();
      const std::int64_t n = conn_->changes();
      conn_->prepare("DELETE FROM rejections WHERE received_ns < ?1").bind(1, cutoff).run();
      tx.commit();
      result.deleted_reports += n;
      if (n < kChunk) break;
    }
    Transaction tx(*conn_);
    // A run goes when nothing of it is left and no agent spoke within the age limit.
    Statement old = conn_->prepare(
        "SELECT id, run_id FROM runs WHERE last_seen_ns < ?1 AND NOT EXISTS "
        "(SELECT 1 FROM reports WHERE reports.run = runs.id)");
    old.bind(1, cutoff);
    std::vector<std::pair<std::int64_t, std::string>> gone;
    while (old.step()) {
      std::string run_id = old.column_text(1);
      if (!keep.contains(run_id)) gone.emplace_back(old.column_int(0), std::move(run_id));
    }
    for (const auto& [key, run_id] : gone) delete_run_rows(key);
    // And applications an agent reported for decisions the store never had.
    conn_->exec(
        "DELETE FROM policy_applications WHERE policy NOT IN "
        "(SELECT id FROM policy_decisions)");
    tx.commit();
    for (auto& [key, run_id] : gone) {
      run_keys_.erase(run_id);
      result.deleted_run_ids.push_back(std::move(run_id));
    }
    result.deleted_runs = static_cast<std::int64_t>(result.deleted_run_ids.size());
  }
  if (max_bytes > 0) {
    // Delete the oldest reports in steps sized from the average report, re-measuring after
    // each step: pages free up only as whole pages empty, so the size is never predicted.
    for (std::uint64_t live = live_bytes(); live > max_bytes; live = live_bytes()) {
      const std::int64_t count = conn_->query_int("SELECT count(*) FROM reports");
      if (count == 0) break;
      const double per_report = static_cast<double>(live) / static_cast<double>(count);
      const double excess = static_cast<double>(live - max_bytes);
      const std::int64_t n =
          std::clamp<std::int64_t>(static_cast<std::int64_t>(excess / per_report) + 1, 1, kChunk);
      Transaction tx(*conn_);
      conn_
          ->prepare(
              "DELETE FROM reports WHERE id IN (SELECT id FROM reports ORDER BY id "
              "LIMIT ?1)")
          .bind(1, n)
          .run();
      const std::int64_t deleted = conn_->changes();
      tx.commit();
      result.deleted_reports += deleted;
      if (deleted == 0) break;
    }
  }
  if (result.deleted_reports > 0) conn_->reclaim_space();
  return result;
}

void StoreWriter::checkpoint() { conn_->checkpoint(/*truncate=*/true); }

Checkpointer::Checkpointer(const std::string& path, std::chrono::milliseconds interval)
    : interval_(interval) {
  if (backend_of(path) != Backend::kSqlite) return;
  conn_ = open_store(StoreOptions{path}, StoreRole::kCheckpointer);
  thread_ = std::thread([this] { run(); });
}

Checkpointer::~Checkpointer() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Checkpointer::run() {
  std::unique_lock lock(mu_);
  while (!cv_.wait_for(lock, interval_, [&] { return stop_; })) {
    lock.unlock();
    try {
      conn_->checkpoint(/*truncate=*/false);
    } catch (const StoreError&) {
      // Busy or transient: the next round catches up; the final checkpoint is the writer's.
    }
    lock.lock();
  }
}

}  // namespace ampscope::server
