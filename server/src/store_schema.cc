// The store's schema and its migrations. PRAGMA user_version holds the version; migration i
// takes a database from version i to i + 1 inside one transaction, so a crash mid-migration
// leaves the previous version intact. Migrations are append-only: a released one never
// changes, a change of layout is a new migration.
#include <array>
#include <string>

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

constexpr std::array<const char*, kSchemaVersion> kMigrations = {kMigration1, kMigration2,
                                                                 kMigration3};

}  // namespace

int schema_version(Connection& c) { return static_cast<int>(c.query_int("PRAGMA user_version")); }

void migrate(Connection& c) {
  int version = schema_version(c);
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
    c.exec("PRAGMA user_version = " + std::to_string(version + 1));
    tx.commit();
  }
}

}  // namespace ampscope::server
