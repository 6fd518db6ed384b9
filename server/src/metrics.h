// The Prometheus exporter (every metric is listed in docs/metrics.md).
//
// Families are built once into one long-lived registry. Series are created the first time a
// (run, rank[, role[, format]]) appears and their Counter&/Gauge& are cached in plain structs,
// so the hot path never looks labels up. A run's cached series (RunSeries) hang off its
// RunState (run_registry.h); destroying them removes them from the families, so a run that is
// forgotten leaves /metrics. Per-tensor series exist only for the top-K tensors of each run
// (set_top_tensors replaces them), per-quantiser series for the top-K quantisers (on_quantizers).
// A report's series are fed from its digest (report_digest.h),
// summed per role and format so each series is touched once. The gradient magnitude
// distribution is a histogram with power-of-two buckets fed with pre-bucketed counts
// (ObserveMultiple).
//
// Thread safety: the per-run/per-report methods are called by the ingest thread only; the
// server-level counters (streams, auth, rejections) from any thread (prometheus-cpp metrics are
// atomic, and their series are created in the constructor).
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ampscope/v1/query.pb.h"
#include "ampscope/v1/telemetry.pb.h"
#include "report_digest.h"
#include "run_registry.h"
#include "store.h"

namespace ampscope::server {

// The families, shared by Metrics and every RunSeries (which removes its series from them).
struct MetricFamilies;

// Where a caller was refused (the `surface` label of ampscope_auth_failures_total): the gRPC
// port, the web UI's listener or /metrics; a missing or wrong token or, with mutual TLS, a
// refused client certificate.
enum class AuthSurface { grpc, webui, metrics };

class Metrics {
 public:
  explicit Metrics(std::string version);
  ~Metrics();

  std::shared_ptr<prometheus::Registry> registry() const;

  // Any thread.
  void stream_opened();
  void stream_closed();
  void auth_failure(AuthSurface surface);
  void rejected(std::string_view reason);
  // A part of a report (a tensor, a name, a notice) refused alone; the rest was stored.
  void refused_part(std::string_view reason);
  void ack_delay(double seconds);
  // The ingest queue's bound (ingest_budget.h): bytes queued, streams waiting, and the pauses
  // so far (a running total); called by the budget under its lock, so never concurrently.
  void ingest_backlog(std::uint64_t queued_bytes, std::size_t paused_streams, std::uint64_t pauses);

  // Ingest thread.
  void commit(double seconds, std::size_t reports);
  void store_failure();
  void store_live_bytes(std::uint64_t bytes);
  void retention_deleted(std::int64_t reports);
  void policy_error();
  // Per run: the series live in `run.series`, and exist only while the run is exported
  // (RunRegistry::mark_active); for any other run these do nothing.
  void duplicates(RunState& run, std::uint64_t n);
  void seq_gap(RunState& run, std::uint32_t rank, std::uint64_t missing);
  // Per-rank series known from the Hello (the scaler's minimum).
  void on_hello(RunState& run, const v1::Hello& hello);
  // A stored report and its digest (report_digest.h).
  void on_report(RunState& run, const v1::StepReport& report, const ReportDigest& digest);
  // A step of a run of several ranks merged over them (rank_merge.h): partial or not, where its
  // ranks disagreed (one increment per field), and its first offender, counted once for the
  // step under the rank that reported it (`offender_role`: a v1::TensorRole, 0 when none).
  void merged_step(RunState& run, bool partial, const std::vector<v1::RankDivergence>& divergences,
                   std::uint32_t offender_rank = 0, int offender_role = 0);
  void set_top_tensors(RunState& run, const std::vector<TensorTotals>& top);
  // A stored report's quantisers (StepReport.quantizers): each one's latest sample is kept, and
  // the run's `top_k` worst (by the larger of its underflow and saturated shares, then by name)
  // have the ampscope_quantizer_* series; a quantiser leaving the top-K, or whose recipe label
  // changes, loses its series. At most kMaxQuantizersTracked quantisers per run are tracked.
  void on_quantizers(RunState& run, const v1::StepReport& report, std::size_t top_k);
  void set_agents_connected(RunState& run, std::size_t n);
  // A decision as sent (the policy in force folds it): its kind and reason, the scale it set,
  // the FP32 set's size and, when it carries one, the BF16 set's.
  void policy_decision(RunState& run, std::string_view mode, std::string_view kind,
                       const v1::PolicyUpdate& update);
  void policy_target(RunState& run, std::optional<double> target_scale);

 private:
  // The run's series, created when missing; null when the run is not exported.
  RunSeries* run_series(RunState& run);

  std::shared_ptr<MetricFamilies> f_;
  // Server-level series, created up front.
  prometheus::Gauge* streams_active_;
  prometheus::Counter* streams_opened_;
  std::array<prometheus::Counter*, 3> auth_failures_{};  // by AuthSurface
  std::map<std::string, prometheus::Counter*, std::less<>> rejected_;
  std::map<std::string, prometheus::Counter*, std::less<>> refused_parts_;
  prometheus::Histogram* ack_delay_;
  prometheus::Histogram* commit_seconds_;
  prometheus::Counter* commits_;
  prometheus::Counter* store_failures_;
  prometheus::Gauge* store_bytes_;
  prometheus::Gauge* ingest_queued_bytes_;
  prometheus::Gauge* ingest_paused_streams_;
  prometheus::Counter* ingest_read_pauses_;
  prometheus::Counter* retention_deleted_;
  prometheus::Counter* policy_errors_;
};

// "weight", "activation_grad", ...; "unspecified" for 0.
std::string_view role_label(int role);
// "fp32", "fp16", "bf16", "e4m3", "e5m2", "e2m1", "e3m2", "e2m3"; "unspecified" for 0.
std::string_view format_label(int format);
// The `recipe` label of a recipe's canonical text: its scaling and element format
// ("delayed_e4m3", "mx_e2m1", "nvfp4_e2m1", "current_e5m2", "tile_e4m3"), so that a delayed
// recipe's scale, which changes every step, never makes a new series; "unspecified" for text
// parse_recipe refuses.
std::string recipe_label(std::string_view recipe);
inline constexpr std::size_t kMaxQuantizersTracked = 4096;

}  // namespace ampscope::server
