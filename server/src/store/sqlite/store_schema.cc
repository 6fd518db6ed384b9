// The SQLite store's schema and its migrations. PRAGMA user_version holds the version; migration i
// takes a database from version i to i + 1 inside one transaction, so a crash mid-migration
// leaves the previous version intact. Migrations are append-only: a released one never
// changes, a change of layout is a new migration.
#include <array>
#include <string>
#include <tuple>
#include <vector>

#include "store.h"

namespace ampscope::server {
namespace {

// Version 0 -> 1: the initial schema.
constexpr const char* kMigration1 = R"sql(
CREATE TABLE runs (
  id              INTEGER PRIMARY KEY,
  run_id          TEXT NOT NULL UNIQUE,
  world_size      INTEGER NOT NULL,
  precision       TEXT NOT NULL DEFAULT '',
  trainer         TEXT NOT NULL DEFAULT '',
  compute_format  INTEGER NOT NULL DEFAULT 0,
  hello           BLOB NOT NULL,          -- the latest Hello (ampscope.v1.Hello)
  first_seen_ns   INTEGER NOT NULL,
  last_seen_ns    INTEGER NOT NULL
);

CREATE TABLE agents (
  run             INTEGER NOT NULL,
  rank            INTEGER NOT NULL,
  host            TEXT NOT NULL DEFAULT '',
  trainer         TEXT NOT NULL DEFAULT '',
  agent_version   TEXT NOT NULL DEFAULT '',
  last_seq        INTEGER NOT NULL DEFAULT 0,  -- highest settled seq (stored, duplicate, rejected)
  first_seen_ns   INTEGER NOT NULL,
  last_seen_ns    INTEGER NOT NULL,
  counters        BLOB,                         -- the latest ampscope.v1.AgentCounters
  PRIMARY KEY (run, rank)
) WITHOUT ROWID;

CREATE TABLE agent_notices (
  run             INTEGER NOT NULL,
  rank            INTEGER NOT NULL,
  text            TEXT NOT NULL,
  PRIMARY KEY (run, rank, text)
) WITHOUT ROWID;

CREATE TABLE reports (
  id              INTEGER PRIMARY KEY,          -- commit order
  run             INTEGER NOT NULL,
  rank            INTEGER NOT NULL,
  seq             INTEGER NOT NULL,
  step            INTEGER NOT NULL,
  loss            REAL,                         -- NULL when not finite
  loss_scale      REAL NOT NULL,
  scale_after     REAL NOT NULL,
  found_inf       INTEGER NOT NULL,
  skipped         INTEGER NOT NULL,
  offender        TEXT,                         -- first_offender.tensor, NULL when none
  n_tensors       INTEGER NOT NULL,
  received_ns     INTEGER NOT NULL,
  payload         BLOB NOT NULL,                -- the ampscope.v1.StepReport as received
  UNIQUE (run, rank, seq)
);
CREATE INDEX reports_by_step ON reports (run, step, rank);
CREATE INDEX reports_skipped ON reports (run, skipped, step) WHERE skipped != 0;
CREATE INDEX reports_offender ON reports (run, step) WHERE offender IS NOT NULL;

CREATE TABLE tensor_totals (
  run             INTEGER NOT NULL,
  name            TEXT NOT NULL,
  role            INTEGER NOT NULL,
  format          INTEGER NOT NULL,
  samples         INTEGER NOT NULL,
  "values"        INTEGER NOT NULL,
  overflow        INTEGER NOT NULL,
  underflow       INTEGER NOT NULL,
  nonfinite       INTEGER NOT NULL,
  max_abs         REAL NOT NULL,
  last_step       INTEGER NOT NULL,
  PRIMARY KEY (run, name, role)
) WITHOUT ROWID;

CREATE TABLE policy_decisions (
  id              INTEGER PRIMARY KEY,          -- PolicyUpdate.policy_id on the wire
  run             INTEGER NOT NULL,
  engine_id       INTEGER NOT NULL,             -- the engine's own 1, 2, 3, ... per run
  effective_from_step INTEGER NOT NULL,
  decided_ns      INTEGER NOT NULL,
  reason          TEXT NOT NULL,
  "update"        BLOB NOT NULL                 -- ampscope.v1.PolicyUpdate
);
CREATE INDEX policy_decisions_by_run ON policy_decisions (run, id);

CREATE TABLE policy_applications (
  policy          INTEGER NOT NULL,
  rank            INTEGER NOT NULL,
  step            INTEGER NOT NULL,
  applied         INTEGER NOT NULL,
  reason          TEXT NOT NULL DEFAULT '',
  PRIMARY KEY (policy, rank)
) WITHOUT ROWID;

CREATE TABLE policy_state (
  run             INTEGER PRIMARY KEY,
  mode            TEXT NOT NULL,
  state           TEXT NOT NULL,                -- PolicyEngine::save_state()
  last_report_id  INTEGER NOT NULL,
  saved_ns        INTEGER NOT NULL
);

CREATE TABLE rejections (
  id              INTEGER PRIMARY KEY,
  run             INTEGER,                      -- NULL when the run was never seen
  rank            INTEGER NOT NULL,
  seq             INTEGER NOT NULL,
  field           TEXT NOT NULL,
  reason          TEXT NOT NULL,
  message         TEXT NOT NULL,
  received_ns     INTEGER NOT NULL
);
CREATE INDEX rejections_by_run ON rejections (run, id);
)sql";

// Version 1 -> 2: multi-rank runs. The agents' parallel layout, each report's step time, the
// steps merged over the ranks of a run (in the order the policy engine observed them; the
// engine's saved state says the last one it reflects) and the ranks' disagreements.
constexpr const char* kMigration2 = R"sql(
ALTER TABLE agents ADD COLUMN data_parallel_size INTEGER NOT NULL DEFAULT 0;
ALTER TABLE agents ADD COLUMN gradients_sharded INTEGER NOT NULL DEFAULT 0;
ALTER TABLE agents ADD COLUMN policy_agreement INTEGER NOT NULL DEFAULT 0;
ALTER TABLE agents ADD COLUMN last_policy_seq INTEGER NOT NULL DEFAULT 0;
ALTER TABLE reports ADD COLUMN step_time_s REAL;
ALTER TABLE policy_state ADD COLUMN last_merged_id INTEGER NOT NULL DEFAULT 0;

CREATE TABLE merged_steps (
  id              INTEGER PRIMARY KEY,          -- the order the policy engine observed them
  run             INTEGER NOT NULL,
  step            INTEGER NOT NULL,
  partial         INTEGER NOT NULL,             -- some rank's report did not arrive in time
  ranks           TEXT NOT NULL,                -- the ranks merged: "0 1"
  report_ids      TEXT NOT NULL,                -- their reports' ids, same order
  max_report_id   INTEGER NOT NULL,
  found_inf       INTEGER NOT NULL,
  skipped         INTEGER NOT NULL,
  loss            REAL,                         -- NULL when not finite
  tokens          INTEGER NOT NULL,
  offender_rank   INTEGER,                      -- the first offender's, NULL when none
  offender        TEXT
);
CREATE INDEX merged_steps_by_run ON merged_steps (run, id);
CREATE INDEX merged_steps_partial ON merged_steps (run, step) WHERE partial != 0;

CREATE TABLE rank_divergences (
  run             INTEGER NOT NULL,
  step            INTEGER NOT NULL,
  field           TEXT NOT NULL,
  divergence      BLOB NOT NULL,                -- ampscope.v1.RankDivergence
  PRIMARY KEY (run, step, field)
) WITHOUT ROWID;
)sql";

// Version 2 -> 3: the flight recorder's history (StepReport.history), one row per tensor of a
// past step, kept with the report that carried it (whose stored payload leaves the history
// out): the row goes when that report goes (delete_run, retention).
constexpr const char* kMigration3 = R"sql(
CREATE TABLE tensor_history (
  report          INTEGER NOT NULL,             -- reports.id of the report that carried it
  run             INTEGER NOT NULL,
  rank            INTEGER NOT NULL,
  step            INTEGER NOT NULL,             -- the past step
  name            TEXT NOT NULL,
  role            INTEGER NOT NULL,
  phase           INTEGER NOT NULL,
  stats           BLOB NOT NULL                 -- ampscope.v1.TensorStats, level FULL
);
CREATE INDEX tensor_history_by_tensor ON tensor_history (run, name, step);
CREATE INDEX tensor_history_by_report ON tensor_history (report);
CREATE TRIGGER reports_take_history AFTER DELETE ON reports BEGIN
  DELETE FROM tensor_history WHERE report = OLD.id;
END;
)sql";

// Version 3 -> 4: the web UI's series. Each report's validation loss and tensor-core ratio as
// columns, and its tensors' counts summed per (role, targets[0] format) in report_counts, so
// that a run's series are aggregated in SQL without parsing payloads. reports_series covers
// every column the step and rank series read (a column stored after the payload would cost a
// walk through the payload's overflow pages per row); it starts with reports_by_step's
// columns and replaces it. report_counts is clustered by (run, step) for range scans; its
// rows go with their report.
constexpr const char* kMigration4 = R"sql(
ALTER TABLE reports ADD COLUMN val_loss REAL;                   -- NULL when absent or not finite
ALTER TABLE reports ADD COLUMN tensor_core_active_ratio REAL;   -- NULL when absent
CREATE INDEX reports_series ON reports (run, step, rank, loss, loss_scale, skipped, found_inf,
                                        val_loss, step_time_s, tensor_core_active_ratio);
DROP INDEX reports_by_step;

CREATE TABLE report_counts (
  run             INTEGER NOT NULL,
  step            INTEGER NOT NULL,
  report          INTEGER NOT NULL,             -- reports.id
  rank            INTEGER NOT NULL,
  role            INTEGER NOT NULL,             -- ampscope.v1.TensorRole
  format          INTEGER NOT NULL,             -- ampscope.v1.Format of targets[0]; 0: none
  checked         INTEGER NOT NULL,             -- finite nonzero values (with targets only)
  underflow       INTEGER NOT NULL,
  overflow        INTEGER NOT NULL,
  subnormal       INTEGER NOT NULL,
  nonfinite       INTEGER NOT NULL,             -- nan + pos_inf + neg_inf
  PRIMARY KEY (run, step, report, role, format)
) WITHOUT ROWID;
CREATE TRIGGER reports_take_counts AFTER DELETE ON reports BEGIN
  DELETE FROM report_counts WHERE run = OLD.run AND step = OLD.step AND report = OLD.id;
END;
)sql";

// Version 4 -> 5: a step's merged first offender found by step (a skipped step's explanation
// names it, and the rank that reported it). Partial: only merged steps that had one.
constexpr const char* kMigration5 = R"sql(
CREATE INDEX merged_steps_offender ON merged_steps (run, step) WHERE offender_rank IS NOT NULL;
)sql";

// Version 5 -> 6: run ownership among servers that share the store (cluster/lease_ownership.h):
// one lease row per run owned by a server, its address for redirects, its epoch (raised at
// every change of owner) and its expiry on the store's clock.
constexpr const char* kMigration6 = R"sql(
CREATE TABLE run_leases (
  run_id        TEXT PRIMARY KEY,
  owner_id      TEXT NOT NULL,
  owner_address TEXT NOT NULL,
  epoch         INTEGER NOT NULL,
  expires_ms    INTEGER NOT NULL
);
)sql";

// Version 6 -> 7: what the quantisers measured (StepReport.quantizers), summed per run and
// quantiser (name, role, phase) as tensor_totals sums tensors: the counts, the SQNR sums and
// block counts, the extremes of amax and of the scales, and the latest sample's recipe, amax
// and scale. Reports stored before have no quantisers: nothing to fill.
constexpr const char* kMigration7 = R"sql(
CREATE TABLE quantizer_totals (
  run               INTEGER NOT NULL,
  name              TEXT NOT NULL,
  role              INTEGER NOT NULL,   -- ampscope.v1.TensorRole
  phase             INTEGER NOT NULL,   -- ampscope.v1.TensorPhase
  recipe            TEXT NOT NULL,      -- the latest sample's, canonical text
  element           INTEGER NOT NULL,   -- ampscope.v1.Format of the latest sample's recipe
  samples           INTEGER NOT NULL,
  "values"          INTEGER NOT NULL,   -- finite values quantised
  nonfinite         INTEGER NOT NULL,
  underflow         INTEGER NOT NULL,
  subnormal         INTEGER NOT NULL,
  saturated         INTEGER NOT NULL,
  overflow          INTEGER NOT NULL,
  signal_sq         REAL NOT NULL,      -- sums: the run's SQNR
  error_sq          REAL NOT NULL,
  amax              REAL NOT NULL,      -- the largest
  last_amax         REAL NOT NULL,      -- the latest sample's
  scale_min         REAL,               -- tensor_scale range, per-tensor recipes; NULL: none
  scale_max         REAL,
  last_scale        REAL NOT NULL,      -- the latest sample's tensor_scale
  scale_min_exponent INTEGER,           -- block scales' binade range; NULL: none
  scale_max_exponent INTEGER,
  blocks            INTEGER NOT NULL,
  zero_blocks       INTEGER NOT NULL,
  saturated_blocks  INTEGER NOT NULL,
  nan_blocks        INTEGER NOT NULL,
  last_step         INTEGER NOT NULL,
  PRIMARY KEY (run, name, role, phase)
) WITHOUT ROWID;
)sql";

// Version 7 -> 8: the quantisers' loss cost (QuantizerStats.loss_cost): how many samples
// carried one, and the sums of the cost and of its square (the run's mean and spread). The field
// came with this version: reports stored before carry none.
constexpr const char* kMigration8 = R"sql(
ALTER TABLE quantizer_totals ADD COLUMN loss_cost_samples INTEGER NOT NULL DEFAULT 0;
ALTER TABLE quantizer_totals ADD COLUMN loss_cost_sum REAL NOT NULL DEFAULT 0;
ALTER TABLE quantizer_totals ADD COLUMN loss_cost_sq_sum REAL NOT NULL DEFAULT 0;
)sql";

// Version 3 -> 4, after its SQL: the new columns and rows of every stored report, from its
// payload, in the migration's transaction (nothing is lost on upgrade).
void fill_report_counts(Connection& c) {
  // In chunks read before writing: a statement still reading a table that its connection
  // changes may see rows twice or not at all.
  constexpr std::int64_t kChunk = 512;
  Statement next = c.prepare(
      "SELECT id, run, payload FROM reports WHERE id > ?1 ORDER BY id "
      "LIMIT ?2");
  Statement columns =
      c.prepare("UPDATE reports SET val_loss = ?2, tensor_core_active_ratio = ?3 WHERE id = ?1");
  Statement counts = prepare_report_counts(c);
  std::vector<std::tuple<std::int64_t, std::int64_t, v1::StepReport>> chunk;
  for (std::int64_t after = 0, read = kChunk; read == kChunk; chunk.clear()) {
    next.bind(1, after).bind(2, kChunk);
    for (read = 0; next.step(); ++read) {
      after = next.column_int(0);
      v1::StepReport r;
      const std::string_view blob = next.column_blob(2);
      if (r.ParseFromArray(blob.data(), static_cast<int>(blob.size()))) {
        chunk.emplace_back(after, next.column_int(1), std::move(r));
      }
    }
    next.reset();
    for (const auto& [id, run, r] : chunk) {
      const ReportColumns extra = report_columns(r);
      if (extra.val_loss || extra.tensor_core_active_ratio) {
        columns.bind(1, id).bind(2, extra.val_loss).bind(3, extra.tensor_core_active_ratio).run();
      }
      insert_report_counts(counts, id, run, r);
    }
  }
}

constexpr std::array<const char*, kSchemaVersion> kMigrations = {
    kMigration1, kMigration2, kMigration3, kMigration4,
    kMigration5, kMigration6, kMigration7, kMigration8};
// The C++ step of a migration, run after its SQL in the same transaction; null: none.
constexpr std::array<void (*)(Connection&), kSchemaVersion> kMigrationSteps = {
    nullptr, nullptr, nullptr, fill_report_counts, nullptr, nullptr, nullptr, nullptr};

}  // namespace

int sqlite_schema_version(Connection& c) {
  return static_cast<int>(c.query_int("PRAGMA user_version"));
}

void migrate_sqlite(Connection& c) {
  int version = sqlite_schema_version(c);
  if (version > kSchemaVersion) {
    throw StoreError("store schema version " + std::to_string(version) +
                     " is newer than this server's " + std::to_string(kSchemaVersion) +
                     "; use a newer ampscope-server");
  }
  if (version == 0) {
    // Lets retention hand freed pages back to the file system; only settable before the
    // first table exists.
    c.exec("PRAGMA auto_vacuum = INCREMENTAL");
  }
  for (; version < kSchemaVersion; ++version) {
    Transaction tx(c);
    c.exec(kMigrations[version]);
    if (kMigrationSteps[version] != nullptr) kMigrationSteps[version](c);
    c.exec("PRAGMA user_version = " + std::to_string(version + 1));
    tx.commit();
  }
}

}  // namespace ampscope::server
