// The store: runs, agents, reports (the raw StepReport plus the columns queries need; the flight
// recorder's history a report carries in rows of its own), per-tensor and per-quantiser totals
// (StepReport.quantizers summed per run and (name, role, phase)), policy decisions
// with their reasons and the agents' outcomes, the policy engines' saved state, and rejections.
// One schema, two back ends under the database layer of db.h: SQLite (store/sqlite: a file,
// WAL; the default) and PostgreSQL (store/postgres: libpq, for several servers sharing one
// database). Each back end versions its schema with forward-only migrations of its own
// (store/sqlite/store_schema.cc, store/postgres/pg_schema.cc); the queries here are written once.
//
// StoreWriter is used by the ingest thread only: it groups many writes into one transaction
// (group commit) and is the only connection of its server that writes. StoreReader serves
// queries from any thread on its own connection (SQLite's WAL readers and PostgreSQL's MVCC
// never block the writer).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "ampscope/v1/query.pb.h"
#include "ampscope/v1/telemetry.pb.h"
#include "db.h"
#include "rank_merge.h"

namespace ampscope::server {

// The schema versions this server writes, per back end.
inline constexpr int kSchemaVersion = 8;          // SQLite (PRAGMA user_version)
inline constexpr int kPostgresSchemaVersion = 4;  // PostgreSQL (table ampscope_schema)
int current_schema_version(Backend backend);

struct StoreOptions {
  // `--db`: a file path (SQLite), or a PostgreSQL connection string: a postgresql:// or
  // postgres:// URI, or libpq's "key=value ..." form (backend_of() tells them apart).
  std::string path;
  // FULL: a commit survives power loss (fsync per group commit). NORMAL: survives a crash of the
  // server process (kill -9) but may lose the latest commits on power loss. SQLite only:
  // PostgreSQL's durability is its own settings' (synchronous_commit).
  bool sync_full = true;
  // PostgreSQL's password when not empty (read from --db-password-file); otherwise libpq's
  // PGPASSWORD, PGPASSFILE or ~/.pgpass, or a password in `path`.
  std::string password{};
};
Backend backend_of(std::string_view location);
// `location` as it may be logged: a PostgreSQL password in it masked.
std::string printable_location(const std::string& location);
// The contents of a password file (its first line), refused (StoreError) when group or others
// may read it, as libpq refuses such a ~/.pgpass.
std::string read_password_file(const std::string& path);

// Who opens a connection: the writer (creates the database, migrates it), a reader (queries
// only), or SQLite's checkpointer.
enum class StoreRole { kWriter, kReader, kCheckpointer };
std::unique_ptr<Connection> open_store(const StoreOptions& options, StoreRole role);

// Brings the schema to current_schema_version(): SQLite's migrations or PostgreSQL's (under an
// advisory lock, so that servers starting together migrate once). Throws StoreError when the
// database was written by a newer server.
void migrate(Connection& c);
int schema_version(Connection& c);
// Each back end's own (store/sqlite/store_schema.cc, store/postgres/pg_schema.cc).
void migrate_sqlite(Connection& c);
int sqlite_schema_version(Connection& c);
void migrate_postgres(Connection& c);
int postgres_schema_version(Connection& c);

// What the store remembers across restarts.
struct RestoredRun {
  std::string run_id;
  v1::Hello hello;  // the latest Hello of the run (rank and host of whichever agent sent it)
  std::int64_t last_seen_ns = 0;
};
struct RestoredAgent {
  std::string run_id;
  std::uint32_t rank = 0;
  std::uint64_t last_seq = 0;
};
struct RestoredPolicy {
  std::string run_id;
  std::string state;                // PolicyEngine::save_state()
  std::int64_t last_report_id = 0;  // reports up to this id are merged (or were dropped)
  std::int64_t last_merged_id = 0;  // merged steps up to this id are reflected in `state`
};
// A step merged over the ranks of a run, as stored (rank_merge.h has the merge itself).
struct StoredMerge {
  std::int64_t id = 0;
  std::int64_t step = 0;
  bool partial = false;
  std::vector<std::uint32_t> ranks;
  std::vector<std::int64_t> report_ids;  // same order as ranks
};
struct TensorTotals {
  std::string run_id;
  std::string name;
  int role = 0;    // v1::TensorRole
  int format = 0;  // v1::Format of targets[0]
  std::uint64_t samples = 0;
  std::uint64_t values = 0;
  std::uint64_t overflow = 0;
  std::uint64_t underflow = 0;
  std::uint64_t nonfinite = 0;
  double max_abs = 0.0;  // unscaled
  std::int64_t last_step = 0;
};
struct RestoredState {
  std::vector<RestoredRun> runs;  // least recently seen first
  std::vector<RestoredAgent> agents;
  std::vector<RestoredPolicy> policies;
  std::vector<TensorTotals> tensors;
  std::map<std::string, v1::PolicyUpdate> current_updates;  // the policy in force, per run
};

// A report's tensors summed per (role, targets[0].format), the rows of report_counts: each
// tensor's targets[0] counts, `checked` its finite nonzero values (TensorTotals.values), and its
// non-finite values (tensors without targets are under format 0, with nothing checked).
struct ReportCounts {
  int role = 0;    // v1::TensorRole
  int format = 0;  // v1::Format of targets[0]; 0 without targets
  std::uint64_t checked = 0;
  std::uint64_t underflow = 0;
  std::uint64_t overflow = 0;
  std::uint64_t subnormal = 0;
  std::uint64_t nonfinite = 0;
};
// In the order of the groups' first tensors.
std::vector<ReportCounts> count_report(const v1::StepReport& report);
// The report's rows of report_counts, through a statement prepare_report_counts() made (the
// writer's for new reports, the migration's for stored ones).
Statement prepare_report_counts(Connection& c);
void insert_report_counts(Statement& insert, std::int64_t report, std::int64_t run,
                          const v1::StepReport& r);
// The columns of reports taken from optional fields: NULL when absent or not finite.
struct ReportColumns {
  std::optional<double> val_loss;
  std::optional<double> tensor_core_active_ratio;
};
ReportColumns report_columns(const v1::StepReport& r);

struct RetentionResult {
  std::int64_t deleted_reports = 0;
  std::int64_t deleted_runs = 0;
  std::vector<std::string> deleted_run_ids;  // the runs that went, for the caller to forget
};

class StoreWriter {
 public:
  explicit StoreWriter(const StoreOptions& options);
  ~StoreWriter();

  RestoredState load_state();
  // The same for one run (empty when the store does not know it): a server that takes a run
  // over from another restores it from what that one committed.
  RestoredState load_run_state(const std::string& run_id);
  // Reports of `run_id` with id > after_id, oldest first, for replaying into a policy engine.
  std::vector<std::pair<std::int64_t, v1::StepReport>> reports_after(const std::string& run_id,
                                                                     std::int64_t after_id);

  // Merged steps of `run_id` with id > after_merged_id or holding a report with id >
  // after_report_id, oldest first.
  std::vector<StoredMerge> merges_since(const std::string& run_id, std::int64_t after_merged_id,
                                        std::int64_t after_report_id);

  // A new connection when the last one broke (PostgreSQL went away): true when it made one.
  // Throws StoreError while the database cannot be reached. Outside a transaction.
  bool reconnect_if_broken();

  // Group commit: begin(), any writes, commit(). A failed commit throws and rolls back.
  void begin();
  void commit();
  void rollback();
  // The connection, for a statement of another owner's table (the run leases' fencing check)
  // inside the current transaction. Between begin() and commit() only.
  Connection& transaction_connection();

  void upsert_run(const v1::Hello& hello, std::int64_t now_ns);
  void upsert_agent(const v1::Hello& hello, std::int64_t now_ns);
  void set_agent_progress(const std::string& run_id, std::uint32_t rank, std::uint64_t last_seq,
                          std::int64_t now_ns, const v1::AgentCounters* counters);
  void add_agent_notice(const std::string& run_id, std::uint32_t rank, const std::string& text);
  // Returns the report id. The stored payload leaves StepReport.history out: its tensors go
  // into tensor_history, tied to the report.
  std::int64_t insert_report(const v1::StepReport& report, const std::string& payload,
                             std::int64_t received_ns);
  void add_tensor_totals(const TensorTotals& delta);
  // The same for many tensors, in multi-row statements (a group commit's 200 tensors in 4
  // statements instead of 200). No two deltas may be of the same (run, name, role).
  void add_tensor_totals(const std::vector<const TensorTotals*>& deltas);
  // A merged step (rank_merge.h) and its divergences; returns the merged step's id.
  std::int64_t insert_merged_step(const std::string& run_id, const MergedStep& step);
  void insert_rejection(const std::string& run_id, std::uint32_t rank, std::uint64_t seq,
                        const std::string& field, const std::string& reason,
                        const std::string& message, std::int64_t now_ns);
  // Returns the decision's id, which is its policy_id on the wire.
  std::int64_t insert_decision(const std::string& run_id, std::uint64_t engine_id,
                               const v1::PolicyUpdate& update);
  void set_decision_update(std::int64_t id, const v1::PolicyUpdate& update);
  void upsert_application(std::int64_t policy_id, std::uint32_t rank, std::int64_t step,
                          bool applied, const std::string& reason);
  void save_policy_state(const std::string& run_id, const std::string& mode,
                         const std::string& state, std::int64_t last_report_id,
                         std::int64_t last_merged_id, std::int64_t now_ns);

  // Deletes every row of the run, in the caller's transaction. The number of its reports that
  // went, or nullopt when the store does not know the run.
  std::optional<std::int64_t> delete_run(const std::string& run_id);

  // Deletes reports older than max_age_ns (0: no age limit) and then, while the live data
  // exceeds max_bytes (0: no size limit), the oldest reports, in chunks; runs with no report
  // left and not seen within max_age_ns go too (as delete_run does it), except those in
  // `keep` (runs with an agent connected). Runs its own transactions.
  RetentionResult apply_retention(std::int64_t max_age_ns, std::uint64_t max_bytes,
                                  std::int64_t now_ns, const std::set<std::string>& keep = {});
  std::uint64_t live_bytes();
  // Moves SQLite's WAL into the database file (at shutdown); nothing on PostgreSQL.
  void checkpoint();

 private:
  RestoredState load(std::optional<std::int64_t> run_key);  // nullopt: every run
  std::int64_t run_key(const std::string& run_id);          // cached; throws for an unknown run
  std::int64_t delete_run_rows(std::int64_t run);           // returns the reports deleted
  void insert_history(std::int64_t run, std::int64_t report, const v1::StepReport& r);
  void add_quantizer(std::int64_t run, std::int64_t step, const v1::QuantizerStats& q);
  struct Statements;
  const StoreOptions options_;
  std::unique_ptr<Connection> conn_;
  std::unique_ptr<Statements> st_;
  std::map<std::string, std::int64_t> run_keys_;
  // Runs whose last_seen_ns this transaction raised, to the time given: raising it again to an
  // earlier or equal time changes nothing (one UPDATE per run per group commit, not per rank).
  std::map<std::int64_t, std::int64_t> touched_runs_;
  bool in_transaction_ = false;
};

// Moves SQLite's WAL into the database file on its own thread and connection, so that the ingest
// thread never pays for a checkpoint in its commit latency (the writer connection's automatic
// checkpoint is off). PASSIVE checkpoints never block the writer or readers. On PostgreSQL
// (whose own checkpointer does this) it starts no thread.
class Checkpointer {
 public:
  Checkpointer(const std::string& path, std::chrono::milliseconds interval);
  ~Checkpointer();  // stops the thread

 private:
  void run();
  std::unique_ptr<Connection> conn_;
  std::chrono::milliseconds interval_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

// GetReportsResponse.next_page_token of REPORT_ORDER_STEP: "<step>:<rank>" of the last report
// returned, both decimal. parse_page_token gives nullopt for any text this server does not
// issue (a negative step, a rank beyond uint32, anything else), which the Query service refuses
// with INVALID_ARGUMENT.
struct ReportPosition {
  std::int64_t step = 0;
  std::uint32_t rank = 0;
};
std::string make_page_token(const ReportPosition& last);
std::optional<ReportPosition> parse_page_token(std::string_view token);

// --- The web UI's series (store_series.cc) ------------------------------------------------
// Steps [from, to] cut for a chart `width` points wide: bucket_steps = ceil((to - from + 1) /
// width), and bucket b holds the steps [from + b * bucket_steps, from + (b + 1) * bucket_steps).
// Empty (buckets 0) when to < from.
struct StepBuckets {
  std::int64_t from = 0;
  std::int64_t to = -1;
  std::int64_t bucket_steps = 1;
  std::int64_t buckets = 0;
  static StepBuckets cut(std::int64_t from, std::int64_t to, std::int64_t width);
};
struct SeriesRequest {
  std::optional<std::int64_t> from;  // default: the run's first step
  std::optional<std::int64_t> to;    // default: the run's last step
  std::int64_t width = 1000;         // > 0
};
// One non-empty bucket of the step series, over every rank's reports in it.
struct StepPoint {
  std::int64_t step = 0;       // the bucket's first step with a report
  std::int64_t last_step = 0;  // its last
  std::int64_t reports = 0;
  std::optional<double> loss, loss_min, loss_max;       // finite losses only
  std::optional<double> val_loss;                       // the latest in the bucket
  double scale_min = 0, scale_max = 0, scale_last = 0;  // loss_scale used
  std::int64_t skipped = 0;                             // distinct skipped steps
  std::int64_t found_inf = 0;                           // distinct steps with found_inf
};
struct CountPoint {
  std::int64_t step = 0;  // the bucket's first step with a report
  std::uint64_t checked = 0, underflow = 0, overflow = 0, subnormal = 0, nonfinite = 0;
};
struct CountSeries {
  int role = 0;    // v1::TensorRole
  int format = 0;  // v1::Format; 0 without targets
  std::vector<CountPoint> points;
};
struct RankPoint {
  std::int64_t step = 0;
  std::optional<double> step_time_s, tensor_core_active_ratio;  // means over the bucket
};
struct RankSeries {
  std::uint32_t rank = 0;
  std::vector<RankPoint> points;
};
// A run's reports received since a time (server clock), for the alert conditions.
struct RecentReports {
  std::int64_t steps = 0;          // distinct steps
  std::int64_t skipped_steps = 0;  // distinct skipped steps
  bool nonfinite_loss = false;
  std::optional<double> last_loss_scale;  // loss_scale of the latest step (lowest rank)
  std::vector<ReportCounts> counts;       // summed per (role, format)
  std::int64_t divergent_steps = 0;       // rank divergences at the window's steps
};
struct RunView {
  v1::RunSummary summary;  // without the live facts
  std::int64_t max_report_id = 0;
  StepBuckets range;
  std::vector<StepPoint> steps;
  std::vector<CountSeries> counts;  // by role, then format
  std::vector<RankSeries> ranks;
  std::vector<v1::SkippedStep> skips;         // in range, the latest kSeriesSkips, by step
  std::vector<v1::ScalePoint> scale_changes;  // in range
  std::vector<v1::PolicyDecision>
      decisions;  // in the range: the latest kSeriesDecisions, oldest first
  std::vector<v1::OffenderEvent> offenders;  // in range, the latest kSeriesOffenders, by step
  std::vector<v1::TensorRecord> tensors;     // the kSeriesTensors worst
  std::vector<v1::AgentInfo> agents;
  std::vector<v1::RankDivergence> divergences;  // the latest kSeriesDivergences, by step
  std::optional<RecentReports> recent;          // when asked for: the alerts' window
  std::vector<v1::QuantizerRecord> quantizers;  // every quantiser's totals (quantizer_totals)
  // StepReport.bf16_gemms of the run's latest report (lowest rank), and its step.
  std::vector<std::string> bf16_gemms;
  std::int64_t bf16_gemms_step = 0;
};
inline constexpr std::uint32_t kSeriesSkips = 2000;
inline constexpr std::uint32_t kSeriesDecisions = 1000;
inline constexpr std::uint32_t kSeriesOffenders = 1000;
inline constexpr std::uint32_t kSeriesTensors = 50;
inline constexpr std::uint32_t kSeriesDivergences = 1000;
inline constexpr std::uint32_t kMaxQuantizerRecords = 4096;  // GetRunResponse.quantizers
struct TensorRequest {
  std::string name;
  int role = 0;              // v1::TensorRole
  std::optional<int> phase;  // v1::TensorPhase; default: the phase of the latest FULL sample
  SeriesRequest range;
};
// A FULL sample of a tensor: from a report, or from the flight recorder's history.
struct TensorSample {
  std::int64_t step = 0;
  std::uint32_t rank = 0;
  bool from_flight_recorder = false;
  v1::TensorStats stats;
};
// A quantiser's sample as its report carried it, with the report's loss scale.
struct QuantizerSample {
  std::int64_t step = 0;
  std::uint32_t rank = 0;
  double loss_scale = 1.0;  // StepReport.loss_scale of the carrying report
  v1::QuantizerStats stats;
};
// True when quantiser `quantizer` measured tensor `tensor`: the same name, or the name followed
// by "@use" (a backward GEMM's own quantisation) or " [recipe]" (the agent's recipe_targets).
bool quantizes_tensor(std::string_view quantizer, std::string_view tensor);
struct TensorSeries {
  int phase = 0;  // v1::TensorPhase of the columns
  StepBuckets range;
  std::int64_t first_step = 0, last_step = 0;  // the run's
  std::vector<TensorSample> columns;           // at most one per bucket, ascending
  // The quantisers of the tensor (quantizes_tensor, the same role; any phase): per bucket the
  // latest sample of each, from the reports the columns were looked for in; by name, then
  // step. And their totals over the run, by name.
  std::vector<QuantizerSample> quantizers;
  std::vector<v1::QuantizerRecord> quantizer_totals;
};

// Queries, from any thread (serialised on one read connection).
class StoreReader {
 public:
  explicit StoreReader(const std::string& path);
  explicit StoreReader(const StoreOptions& options);
  ~StoreReader();

  std::vector<v1::RunSummary> list_runs(std::uint32_t limit);
  // nullopt when the run is unknown.
  std::optional<v1::GetRunResponse> get_run(const std::string& run_id, std::uint32_t limit);
  // The request as the Query service checked it (a page_token parse_page_token accepts).
  std::optional<v1::GetReportsResponse> get_reports(const v1::GetReportsRequest& request);
  std::optional<v1::GetPolicyResponse> get_policy(const std::string& run_id);
  // The request as the Query service checked it (step >= 0, tensors within bounds).
  std::optional<v1::GetStepHistoryResponse> get_step_history(
      const v1::GetStepHistoryRequest& request);

  // The web UI's series (store_series.cc); nullopt when the run is unknown. Each series is one
  // index-only scan of the steps in range, so that the cost follows the steps in range and the
  // buckets asked for, never the payloads.
  // `alerts_since_ns`: also the run's reports received since then (RunView.recent).
  std::optional<RunView> run_series(const std::string& run_id, const SeriesRequest& request,
                                    std::optional<std::int64_t> alerts_since_ns = std::nullopt);
  std::optional<TensorSeries> tensor_series(const std::string& run_id,
                                            const TensorRequest& request);
  // The largest report id of the run (0 without reports); nullopt when the run is unknown.
  std::optional<std::int64_t> max_report_id(const std::string& run_id);
  // Per run seen since `since_ns` (or only `run_id`): its reports received since then. Runs
  // not seen are absent.
  std::map<std::string, RecentReports> recent_reports(
      std::int64_t since_ns, const std::optional<std::string>& run_id = std::nullopt);

 private:
  // Shared by get_run and the web UI's series. Steps in [from, to]; `latest`: the last `limit`
  // rows (listed by step) rather than the first.
  std::vector<v1::AgentInfo> agents(std::int64_t run);
  std::vector<v1::SkippedStep> skipped_steps(std::int64_t run, std::int64_t from, std::int64_t to,
                                             std::uint32_t limit, bool latest);
  std::vector<v1::OffenderEvent> first_offenders(std::int64_t run, std::int64_t from,
                                                 std::int64_t to, std::uint32_t limit, bool latest);
  // The changes of the lowest rank's loss scale in [from, to] (its first step's scale first),
  // the last kMaxScalePoints.
  std::vector<v1::ScalePoint> scale_timeline(std::int64_t run, std::int64_t from, std::int64_t to);
  // tensor_totals rows, ordered and filtered by `where_order` (SQL after "WHERE run = ?1 AND").
  // Every quantiser of the run (at most kMaxQuantizerRecords), by name, role and phase.
  std::vector<v1::QuantizerRecord> quantizer_records(std::int64_t run);
  std::vector<v1::TensorRecord> tensor_records(std::int64_t run, const std::string& where_order,
                                               std::uint32_t limit);
  std::vector<v1::RankDivergence> divergences(std::int64_t run, std::uint32_t limit);
  void fill_summary(std::int64_t run, v1::RunSummary* summary);
  // The latest `limit` decisions (oldest first) whose effective_from_step is in [from, to].
  std::vector<v1::PolicyDecision> decisions(
      std::int64_t run, std::uint32_t limit, std::int64_t from = 0,
      std::int64_t to = std::numeric_limits<std::int64_t>::max());
  std::optional<std::int64_t> run_key(const std::string& run_id);
  // mu_, with a new connection when the last one broke (PostgreSQL went away and came back);
  // throws StoreError while the database cannot be reached.
  std::unique_lock<std::mutex> lock_connected();
  const StoreOptions options_;
  std::mutex mu_;
  std::unique_ptr<Connection> conn_;
};

}  // namespace ampscope::server
