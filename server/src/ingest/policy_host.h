// The server side of the policy engine (server/policy, a pure library): one PolicyEngine per
// run, fed with the run's merged steps (rank_merge.h: one per step, however many ranks) in the
// order they were merged and stored, its decisions turned into PolicyUpdates, its state saved
// into the store and restored (snapshot + replay of the steps merged after it, and the reports
// still waiting for their ranks back into the run's RankMerger) when the server restarts. Each
// run's engine lives in its RunState (run_registry.h), so it goes when the run is forgotten.
//
// Thread safety: each run's engine is used by the run's ingest shard only (mode() and
// mode_name() are immutable, the rest of PolicyHost holds no state of its own).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ampscope/policy/policy_engine.h"
#include "ampscope/v1/telemetry.pb.h"
#include "report_digest.h"
#include "run_registry.h"
#include "store.h"

namespace ampscope::server {

struct EngineUpdate {
  std::uint64_t engine_id = 0;  // the engine's own decision number, the update's seq
  v1::PolicyUpdate update;      // policy_id not set yet
};

struct PolicySnapshot {
  std::string run_id;
  std::string state;
  std::int64_t last_report_id = 0;  // reports up to it are merged (or waiting, see snapshots)
  std::int64_t last_merged_id = 0;  // merged steps up to it are in the state
};

// A run's policy state, held by its RunState.
struct RunPolicy {
  std::optional<policy::PolicyEngine> engine;
  std::optional<v1::ScalerConfig> hello_scaler;  // as the run's agents last said it
  std::int64_t last_report_id = 0;               // the latest report of a step the engine observed
  std::int64_t last_merged_id = 0;               // the latest merged step the engine observed
  std::chrono::steady_clock::time_point saved_at{};
  bool dirty = false;
  bool force_save = false;
  // The policy in force: every stored decision folded in (merge_policy_update).
  std::optional<v1::PolicyUpdate> current;
};

class PolicyHost {
 public:
  // `config` is validated by the caller (policy::validate). `runs` is walked for snapshots.
  PolicyHost(policy::EngineConfig config, std::chrono::milliseconds snapshot_interval,
             RunRegistry& runs);

  std::string_view mode_name() const { return policy::mode_name(config_.mode); }
  v1::PolicyMode mode() const;

  // What was stored after a snapshot: the merged steps with id > after_merged_id or holding a
  // report with id > after_report_id, and the reports with id > after_report_id.
  struct Replay {
    std::vector<StoredMerge> merges;
    std::vector<std::pair<std::int64_t, v1::StepReport>> reports;
  };
  using ReplayAfter =
      std::function<Replay(std::int64_t after_merged_id, std::int64_t after_report_id)>;
  // At start: the run's engine from its snapshot (or fresh from its Hello when there is none,
  // or when the configuration changed), brought up to date with the steps merged after it; the
  // reports merged into no step go back into the run's RankMerger, as if the server had not
  // stopped.
  void restore_run(RunState& run, const RestoredRun& restored, const RestoredPolicy* saved,
                   const std::optional<v1::PolicyUpdate>& current, const ReplayAfter& replay);

  // A Hello: creates the run's engine, or tells it the run's scaler.
  void on_hello(RunState& run, const v1::Hello& hello);

  // Whether the engine reads every tensor of a report (FP32 fallback) or only the loss-scaled
  // ones: what digest_report() must put in its input.
  bool reads_all_tensors() const { return config_.fp32_fallback.enabled; }
  // Whether it reads a report's quantisers (per-layer precision).
  bool reads_quantizers() const { return config_.gemm_precision.enabled; }

  // Feeds one merged step, stored as `merged_id`. Returns the decisions as PolicyUpdates
  // without policy_id (the store assigns it). A step the engine refuses is logged and counted
  // in *errors.
  std::vector<EngineUpdate> observe(RunState& run, const MergedStep& step, std::int64_t merged_id,
                                    std::int64_t now_ns, int* errors);

  // The run's engine has state its last snapshot does not hold (snapshots() may save it).
  bool unsaved(const RunState& run) const;

  // Engines whose state should be saved now: every `snapshot_interval`, after a decision, and
  // all of them when `all`; those of the runs of `shard` (RunRegistry::shard_of).
  std::vector<PolicySnapshot> snapshots(std::chrono::steady_clock::time_point now, bool all,
                                        std::size_t shard = RunRegistry::kAllShards);

  // The policy in force for a run: every decision folded in (merge_policy_update), sent to an
  // agent after its Hello. Set once a decision is stored.
  void set_current(RunState& run, const v1::PolicyUpdate& update);
  std::optional<v1::PolicyUpdate> current(const RunState& run) const;
  // 2^target_log2 of the latest evaluation, when there is one.
  std::optional<double> target_scale(const RunState& run) const;

 private:
  static RunPolicy& policy_of(RunState& run);
  bool create_engine(const std::string& run_id, RunPolicy& rp, const v1::Hello& hello);

  policy::EngineConfig config_;
  std::chrono::milliseconds snapshot_interval_;
  RunRegistry& runs_;
};

// Conversions between the wire and the engine's types (exposed for tests); a report's are in
// report_digest.h.
policy::ScalerConfig to_engine_scaler(const v1::ScalerConfig& scaler);
// Which complete sets the update carries: those the server's configuration manages (an empty
// list would otherwise clear what the operator set on the trainer).
struct ManagedSets {
  bool fp32_tensors = false;
  bool bf16_gemms = false;
};
v1::PolicyUpdate to_policy_update(const policy::PolicyDecision& decision, const std::string& run_id,
                                  v1::PolicyMode mode, ManagedSets sets,
                                  std::int64_t decided_at_step, std::int64_t now_ns);
// "scale", "params", "gemm_precision" or "fp32_fallback": the label of
// ampscope_policy_decisions_total. `before` is the policy in force before the update (nullptr:
// none), which tells a changed set from one carried unchanged.
std::string_view decision_kind(const v1::PolicyUpdate& update, const v1::PolicyUpdate* before);

}  // namespace ampscope::server
