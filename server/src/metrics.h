// The Prometheus exporter (DESIGN.md "Metrics"; every metric is listed in the README).
//
// Families are built once into one long-lived registry. Series are created the first time a
// (run, rank[, role[, format]]) appears and their Counter&/Gauge& are cached in plain structs,
// so the hot path never looks labels up. Per-tensor series exist only for the top-K tensors of
// each run (set_top_tensors replaces them). The gradient magnitude distribution is a histogram
// with power-of-two buckets fed with pre-bucketed counts (ObserveMultiple).
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
#include <unordered_map>
#include <vector>

#include "ampscope/v1/telemetry.pb.h"
#include "store.h"

namespace ampscope::server {

// Buckets of ampscope_gradient_magnitude: le = 2^e for e in [kGradBucketMinLog2,
// kGradBucketMaxLog2] (the unscaled range of FP16/FP8 gradients under any usual loss scale),
// plus +Inf.
inline constexpr int kGradBucketMinLog2 = -64;
inline constexpr int kGradBucketMaxLog2 = 16;

class Metrics {
 public:
  explicit Metrics(std::string version);
  ~Metrics();

  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  // Any thread.
  void stream_opened();
  void stream_closed();
  void auth_failure();
  void rejected(std::string_view reason);
  void ack_delay(double seconds);

  // Ingest thread.
  void commit(double seconds, std::size_t reports);
  void duplicates(const std::string& run_id, std::uint64_t n);
  void seq_gap(const std::string& run_id, std::uint32_t rank, std::uint64_t missing);
  // Per-rank series known from the Hello (the scaler's minimum).
  void on_hello(const v1::Hello& hello);
  void on_report(const v1::StepReport& report);
  void set_top_tensors(const std::string& run_id, const std::vector<TensorTotals>& top);
  void set_agents_connected(const std::string& run_id, std::size_t n);
  void store_live_bytes(std::uint64_t bytes);
  void retention_deleted(std::int64_t reports);
  void policy_decision(const std::string& run_id, std::string_view mode, std::string_view kind,
                       const std::string& reason, std::optional<double> loss_scale,
                       std::optional<double> min_scale, std::size_t fp32_tensors);
  void policy_target(const std::string& run_id, std::optional<double> target_scale);
  void policy_error();

 private:
  struct FormatSeries;
  struct RoleSeries;
  struct RankSeries;
  struct RunSeries;
  RunSeries& run_series(const std::string& run_id);
  RankSeries& rank_series(RunSeries& run, std::uint32_t rank);
  RoleSeries& role_series(RunSeries& run, RankSeries& rank, int role);
  // Sets (min_scale > 0) or removes (0: none) ampscope_loss_scale_min of `rank`.
  void set_loss_scale_min(RunSeries& run, RankSeries& rank, double min_scale);
  FormatSeries& format_series(RunSeries& run, RankSeries& rank, int role, int format);

  std::shared_ptr<prometheus::Registry> registry_;
  struct Families;
  std::unique_ptr<Families> f_;
  std::unordered_map<std::string, std::unique_ptr<RunSeries>> runs_;
  // Server-level series, created up front.
  prometheus::Gauge* streams_active_;
  prometheus::Counter* streams_opened_;
  prometheus::Counter* auth_failures_;
  std::map<std::string, prometheus::Counter*, std::less<>> rejected_;
  prometheus::Histogram* ack_delay_;
  prometheus::Histogram* commit_seconds_;
  prometheus::Counter* commits_;
  prometheus::Gauge* store_bytes_;
  prometheus::Counter* retention_deleted_;
  prometheus::Counter* policy_errors_;
};

// "weight", "activation_grad", ...; "unspecified" for 0.
std::string_view role_label(int role);
// "fp32", "fp16", "bf16", "e4m3", "e5m2"; "unspecified" for 0.
std::string_view format_label(int format);

}  // namespace ampscope::server
