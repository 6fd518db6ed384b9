#include "metrics.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "ampscope/proto/quantizer_codec.h"
#include "ampscope/proto/vocabulary_codec.h"
#include "ampscope/recipe.h"
#include "validation.h"

namespace ampscope::server {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Counter;
using prometheus::Family;
using prometheus::Gauge;
using prometheus::Histogram;

constexpr std::array<const char*, 3> kNonfiniteKinds = {"nan", "pos_inf", "neg_inf"};

Histogram::BucketBoundaries gradient_buckets() {
  Histogram::BucketBoundaries b;
  for (int e = kGradBucketMinLog2; e <= kGradBucketMaxLog2; ++e) b.push_back(std::ldexp(1.0, e));
  return b;
}

void increment(Counter* c, double v) {
  if (v > 0) c->Increment(v);
}

}  // namespace

std::string_view role_label(int role) {
  const auto r = role > 0 && role < kRoleSlots
                     ? proto::from_proto(static_cast<v1::TensorRole>(role))
                     : std::nullopt;
  return r ? role_name(*r) : "unspecified";
}

std::string_view format_label(int format) {
  const auto f = format > 0 && format < kFormatSlots
                     ? proto::from_proto(static_cast<v1::Format>(format))
                     : std::nullopt;
  return f ? format_name(*f) : "unspecified";
}

struct MetricFamilies {
  explicit MetricFamilies(std::shared_ptr<prometheus::Registry> owner)
      : registry(std::move(owner)),
        build_info(BuildGauge()
                       .Name("ampscope_build_info")
                       .Help("Constant 1, labelled with the server version")
                       .Register(*registry)),
        streams_active(BuildGauge()
                           .Name("ampscope_streams_active")
                           .Help("Open Attach streams (agents connected)")
                           .Register(*registry)),
        streams_opened(BuildCounter()
                           .Name("ampscope_streams_opened_total")
                           .Help("Attach streams opened")
                           .Register(*registry)),
        auth_failures(BuildCounter()
                          .Name("ampscope_auth_failures_total")
                          .Help("Callers refused for a missing or wrong token or client "
                                "certificate, by surface (grpc, webui, metrics)")
                          .Register(*registry)),
        rejected(BuildCounter()
                     .Name("ampscope_reports_rejected_total")
                     .Help("Messages refused by validation, by rule")
                     .Register(*registry)),
        refused_parts(BuildCounter()
                          .Name("ampscope_report_parts_refused_total")
                          .Help("Parts of reports (a tensor, a name, a notice) refused by "
                                "validation, by rule; the rest of each report was stored")
                          .Register(*registry)),
        duplicates(BuildCounter()
                       .Name("ampscope_reports_duplicate_total")
                       .Help("Replayed reports dropped because (run, rank, seq) was stored")
                       .Register(*registry)),
        seq_gaps(BuildCounter()
                     .Name("ampscope_report_seq_gaps_total")
                     .Help("Sequence numbers an agent skipped (reports it never sent)")
                     .Register(*registry)),
        ack_delay(BuildHistogram()
                      .Name("ampscope_ack_delay_seconds")
                      .Help("Time from reading a report to acknowledging its commit")
                      .Register(*registry)),
        commit_seconds(BuildHistogram()
                           .Name("ampscope_store_commit_duration_seconds")
                           .Help("Duration of one group commit (write and sync)")
                           .Register(*registry)),
        commits(BuildCounter()
                    .Name("ampscope_store_commits_total")
                    .Help("Group commits to the store")
                    .Register(*registry)),
        store_failures(BuildCounter()
                           .Name("ampscope_store_failures_total")
                           .Help("Group commits or restores the store failed (nothing of them "
                                 "acknowledged; the agents send it again)")
                           .Register(*registry)),
        ingest_queued_bytes(BuildGauge()
                                .Name("ampscope_ingest_queued_bytes")
                                .Help("Wire bytes of received reports not yet committed and "
                                      "acknowledged (bounded by --ingest-queue-bytes)")
                                .Register(*registry)),
        ingest_paused_streams(BuildGauge()
                                  .Name("ampscope_ingest_paused_streams")
                                  .Help("Streams not read because the ingest queue is full")
                                  .Register(*registry)),
        ingest_read_pauses(BuildCounter()
                               .Name("ampscope_ingest_read_pauses_total")
                               .Help("Times a stream was not read because the ingest queue was "
                                     "full")
                               .Register(*registry)),
        store_bytes(BuildGauge()
                        .Name("ampscope_store_live_bytes")
                        .Help("Bytes of live data in the store (pages in use)")
                        .Register(*registry)),
        retention_deleted(BuildCounter()
                              .Name("ampscope_retention_deleted_reports_total")
                              .Help("Reports deleted by the age or size retention limits")
                              .Register(*registry)),
        policy_errors(BuildCounter()
                          .Name("ampscope_policy_errors_total")
                          .Help("Reports the policy engine refused (logged with the field)")
                          .Register(*registry)),
        tensor_stats(BuildCounter()
                         .Name("ampscope_tensor_stats_total")
                         .Help("TensorStats stored")
                         .Register(*registry)),
        steps(BuildCounter()
                  .Name("ampscope_steps_total")
                  .Help("Step reports stored")
                  .Register(*registry)),
        skipped(BuildCounter()
                    .Name("ampscope_skipped_steps_total")
                    .Help("Steps whose optimizer update was skipped")
                    .Register(*registry)),
        found_inf(BuildCounter()
                      .Name("ampscope_found_inf_steps_total")
                      .Help("Steps whose gradients held NaN or Inf at the check")
                      .Register(*registry)),
        step_seconds(BuildCounter()
                         .Name("ampscope_step_seconds_total")
                         .Help("Wall time of the reported steps")
                         .Register(*registry)),
        tokens(BuildCounter()
                   .Name("ampscope_tokens_total")
                   .Help("Tokens in the reported steps")
                   .Register(*registry)),
        agent_dropped(BuildCounter()
                          .Name("ampscope_agent_dropped_reports_total")
                          .Help("Reports the agent dropped because its queue and spool were full")
                          .Register(*registry)),
        step(BuildGauge()
                 .Name("ampscope_step")
                 .Help("Latest reported step index")
                 .Register(*registry)),
        loss(BuildGauge()
                 .Name("ampscope_loss")
                 .Help("Training loss of the latest reported step (NaN when not finite)")
                 .Register(*registry)),
        loss_scale(BuildGauge()
                       .Name("ampscope_loss_scale")
                       .Help("Loss scale after the latest reported step")
                       .Register(*registry)),
        val_loss(BuildGauge()
                     .Name("ampscope_validation_loss")
                     .Help("Validation loss of the latest evaluated step (NaN when not finite)")
                     .Register(*registry)),
        loss_scale_min(BuildGauge()
                           .Name("ampscope_loss_scale_min")
                           .Help("The scaler's lowest loss scale (its Hello or a policy update); "
                                 "absent when it has none")
                           .Register(*registry)),
        grad_norm(BuildGauge()
                      .Name("ampscope_grad_norm")
                      .Help("Global gradient L2 norm (unscaled) of the latest reported step")
                      .Register(*registry)),
        lr(BuildGauge()
               .Name("ampscope_learning_rate")
               .Help("Learning rate of the latest reported step")
               .Register(*registry)),
        tc_ratio(BuildGauge()
                     .Name("ampscope_tensor_core_active_ratio")
                     .Help("Share of cycles the tensor pipes were active, latest sampled step")
                     .Register(*registry)),
        spool_bytes(BuildGauge()
                        .Name("ampscope_agent_spool_bytes")
                        .Help("Bytes in the agent's on-disk spool")
                        .Register(*registry)),
        nonfinite(BuildCounter()
                      .Name("ampscope_nonfinite_values_total")
                      .Help("NaN, +Inf and -Inf elements observed, by tensor role")
                      .Register(*registry)),
        first_offenders(BuildCounter()
                            .Name("ampscope_first_offenders_total")
                            .Help("Steps whose first non-finite tensor had this role")
                            .Register(*registry)),
        checked(BuildCounter()
                    .Name("ampscope_checked_values_total")
                    .Help("Finite nonzero elements checked against the target format "
                          "(targets[0])")
                    .Register(*registry)),
        overflow(BuildCounter()
                     .Name("ampscope_overflow_values_total")
                     .Help("Elements that overflow the target format at the scale in use")
                     .Register(*registry)),
        underflow(BuildCounter()
                      .Name("ampscope_underflow_values_total")
                      .Help("Nonzero elements that round to zero in the target format")
                      .Register(*registry)),
        subnormal(BuildCounter()
                      .Name("ampscope_subnormal_values_total")
                      .Help("Elements that round to a subnormal of the target format")
                      .Register(*registry)),
        overflow_ratio(BuildGauge()
                           .Name("ampscope_overflow_ratio")
                           .Help("Overflowing share of checked elements, latest step")
                           .Register(*registry)),
        underflow_ratio(BuildGauge()
                            .Name("ampscope_underflow_ratio")
                            .Help("Underflowing share of checked elements, latest step")
                            .Register(*registry)),
        gradient(BuildHistogram()
                     .Name("ampscope_gradient_magnitude")
                     .Help("Unscaled gradient magnitudes |g|, power-of-two buckets (from the "
                           "binade histograms; _sum approximates each binade by 1.5 * 2^e)")
                     .Register(*registry)),
        tensor_underflow(BuildGauge()
                             .Name("ampscope_tensor_underflow_ratio")
                             .Help("Underflowing share of a top-K tensor's checked elements, "
                                   "over the run")
                             .Register(*registry)),
        tensor_overflow(BuildGauge()
                            .Name("ampscope_tensor_overflow_ratio")
                            .Help("Overflowing share of a top-K tensor's checked elements, "
                                  "over the run")
                            .Register(*registry)),
        tensor_nonfinite(BuildGauge()
                             .Name("ampscope_tensor_nonfinite_values")
                             .Help("Non-finite elements of a top-K tensor over the run")
                             .Register(*registry)),
        tensor_max_abs(BuildGauge()
                           .Name("ampscope_tensor_max_abs")
                           .Help("Largest unscaled |x| of a top-K tensor over the run")
                           .Register(*registry)),
        quantizer_underflow(BuildGauge()
                                .Name("ampscope_quantizer_underflow_ratio")
                                .Help("Share of a top-K quantiser's finite values that its "
                                      "recipe rounds to zero, latest sample")
                                .Register(*registry)),
        quantizer_saturated(BuildGauge()
                                .Name("ampscope_quantizer_saturated_ratio")
                                .Help("Share of a top-K quantiser's finite values that its "
                                      "recipe clamps to the element's max, latest sample")
                                .Register(*registry)),
        quantizer_sqnr(BuildGauge()
                           .Name("ampscope_quantizer_sqnr_db")
                           .Help("Signal-to-quantisation-noise ratio of a top-K quantiser, dB, "
                                 "latest sample (+Inf: exact)")
                           .Register(*registry)),
        quantizer_amax(BuildGauge()
                           .Name("ampscope_quantizer_amax")
                           .Help("Largest finite |x| a top-K quantiser saw, latest sample")
                           .Register(*registry)),
        quantizer_scale(BuildGauge()
                            .Name("ampscope_quantizer_scale")
                            .Help("Per-tensor scale of a top-K quantiser (current and delayed: "
                                  "the multiplier; nvfp4: the decode scale), latest sample")
                            .Register(*registry)),
        quantizer_loss_cost(BuildGauge()
                                .Name("ampscope_quantizer_loss_cost_nats")
                                .Help("First-order loss change a top-K quantiser's recipe causes "
                                      "through its layer's output, nats per step, latest "
                                      "measured sample")
                                .Register(*registry)),
        agents_connected(BuildGauge()
                             .Name("ampscope_agents_connected")
                             .Help("Agents of the run with an open stream")
                             .Register(*registry)),
        policy_decisions(BuildCounter()
                             .Name("ampscope_policy_decisions_total")
                             .Help("Policy decisions pushed, by mode and kind "
                                   "(scale, params, fp32_fallback, gemm_precision)")
                             .Register(*registry)),
        policy_last(BuildGauge()
                        .Name("ampscope_policy_last_decision_info")
                        .Help("Constant 1, labelled with the latest decision's reason")
                        .Register(*registry)),
        policy_scale(BuildGauge()
                         .Name("ampscope_policy_loss_scale")
                         .Help("Loss scale of the latest policy decision that set one")
                         .Register(*registry)),
        policy_target(BuildGauge()
                          .Name("ampscope_policy_target_loss_scale")
                          .Help("Scale the headroom evaluation wants now (also in observe mode)")
                          .Register(*registry)),
        policy_fp32(BuildGauge()
                        .Name("ampscope_policy_fp32_tensors")
                        .Help("Tensors the policy keeps in FP32")
                        .Register(*registry)),
        policy_bf16(BuildGauge()
                        .Name("ampscope_policy_bf16_gemms")
                        .Help("Layers whose GEMMs the policy runs in BF16 instead of the recipe")
                        .Register(*registry)),
        partial_steps(BuildCounter()
                          .Name("ampscope_partial_steps_total")
                          .Help("Steps merged without every rank's report (deadline passed, "
                                "a rank's stream ended)")
                          .Register(*registry)),
        rank_divergence(BuildCounter()
                            .Name("ampscope_rank_divergence_total")
                            .Help("Steps on which the ranks of a run disagreed, by field")
                            .Register(*registry)) {}

  std::shared_ptr<prometheus::Registry> registry;  // owns the families below
  Family<Gauge>& build_info;
  Family<Gauge>& streams_active;
  Family<Counter>& streams_opened;
  Family<Counter>& auth_failures;
  Family<Counter>& rejected;
  Family<Counter>& refused_parts;
  Family<Counter>& duplicates;
  Family<Counter>& seq_gaps;
  Family<Histogram>& ack_delay;
  Family<Histogram>& commit_seconds;
  Family<Counter>& commits;
  Family<Counter>& store_failures;
  Family<Gauge>& ingest_queued_bytes;
  Family<Gauge>& ingest_paused_streams;
  Family<Counter>& ingest_read_pauses;
  Family<Gauge>& store_bytes;
  Family<Counter>& retention_deleted;
  Family<Counter>& policy_errors;
  Family<Counter>& tensor_stats;
  Family<Counter>& steps;
  Family<Counter>& skipped;
  Family<Counter>& found_inf;
  Family<Counter>& step_seconds;
  Family<Counter>& tokens;
  Family<Counter>& agent_dropped;
  Family<Gauge>& step;
  Family<Gauge>& loss;
  Family<Gauge>& loss_scale;
  Family<Gauge>& val_loss;
  Family<Gauge>& loss_scale_min;
  Family<Gauge>& grad_norm;
  Family<Gauge>& lr;
  Family<Gauge>& tc_ratio;
  Family<Gauge>& spool_bytes;
  Family<Counter>& nonfinite;
  Family<Counter>& first_offenders;
  Family<Counter>& checked;
  Family<Counter>& overflow;
  Family<Counter>& underflow;
  Family<Counter>& subnormal;
  Family<Gauge>& overflow_ratio;
  Family<Gauge>& underflow_ratio;
  Family<Histogram>& gradient;
  Family<Gauge>& tensor_underflow;
  Family<Gauge>& tensor_overflow;
  Family<Gauge>& tensor_nonfinite;
  Family<Gauge>& tensor_max_abs;
  Family<Gauge>& quantizer_underflow;
  Family<Gauge>& quantizer_saturated;
  Family<Gauge>& quantizer_sqnr;
  Family<Gauge>& quantizer_amax;
  Family<Gauge>& quantizer_scale;
  Family<Gauge>& quantizer_loss_cost;
  Family<Gauge>& agents_connected;
  Family<Counter>& policy_decisions;
  Family<Gauge>& policy_last;
  Family<Gauge>& policy_scale;
  Family<Gauge>& policy_target;
  Family<Gauge>& policy_fp32;
  Family<Gauge>& policy_bf16;
  Family<Counter>& partial_steps;
  Family<Counter>& rank_divergence;
};

// A run's cached series. Everything created through it is removed from its family when it is
// destroyed (RemoveSeries), so a run that is forgotten or evicted leaves /metrics entirely.
struct RunSeries {
  struct Format {
    Counter* checked;
    Counter* overflow;
    Counter* underflow;
    Counter* subnormal;
    Gauge* overflow_ratio;
    Gauge* underflow_ratio;
  };
  struct Role {
    std::array<Counter*, 3> nonfinite{};
    Counter* first_offenders = nullptr;
    std::array<std::unique_ptr<Format>, kFormatSlots> formats;
  };
  struct Rank {
    std::string rank;
    Counter* steps;
    Counter* skipped;
    Counter* found_inf;
    Counter* step_seconds;
    Counter* tokens;
    Counter* agent_dropped;
    Counter* seq_gaps;
    Gauge* step;
    Gauge* loss;
    Gauge* loss_scale;
    Gauge* grad_norm;
    Gauge* lr;
    Gauge* tc_ratio = nullptr;        // created at the first measured value
    Gauge* val_loss = nullptr;        // created at the first evaluation
    Gauge* loss_scale_min = nullptr;  // created when the scaler has a minimum
    Gauge* spool_bytes;
    std::uint64_t agent_dropped_seen = 0;
    std::array<std::unique_ptr<Role>, kRoleSlots> roles;
  };
  struct TensorSeries {
    Gauge* underflow;
    Gauge* overflow;
    Gauge* nonfinite;
    Gauge* max_abs;
  };

  // A quantiser's latest sample, kept for every quantiser of the run (at most
  // kMaxQuantizersTracked) so that the top-K can be chosen; only the top-K have series.
  using QuantizerKey = std::tuple<std::string, int, int>;  // (name, role, phase)
  struct QuantizerLatest {
    std::string recipe;  // recipe_label()
    bool has_scale = false;  // a per-tensor scale (current, delayed, nvfp4's tensor scale)
    double underflow_ratio = 0, saturated_ratio = 0, sqnr_db = 0, amax = 0, scale = 0;
    std::optional<double> loss_cost;  // the latest sample that carried one
    double score() const { return std::max(underflow_ratio, saturated_ratio); }
  };
  struct QuantizerSeries {
    std::string recipe;  // the label the series carry
    Gauge* underflow;
    Gauge* saturated;
    Gauge* sqnr;
    Gauge* amax;
    Gauge* scale = nullptr;      // recipes with a per-tensor scale only
    Gauge* loss_cost = nullptr;  // from the first sample with a loss cost
  };

  RunSeries(std::shared_ptr<MetricFamilies> families, const std::string& run_id);
  ~RunSeries();
  RunSeries(const RunSeries&) = delete;
  RunSeries& operator=(const RunSeries&) = delete;

  Rank& rank(std::uint32_t rank);
  Role& role(Rank& rank, int role);
  Format& format(Rank& rank, int role, int format);
  // Sets (min_scale > 0) or removes (0: none) ampscope_loss_scale_min of `rank`.
  void set_loss_scale_min(Rank& rank, double min_scale);
  void remove_tensor(const TensorSeries& t);
  void remove_quantizer(const QuantizerSeries& q);

  std::shared_ptr<MetricFamilies> f;
  std::string run_id;
  Counter* tensor_stats;
  Counter* duplicates;
  Gauge* agents_connected;
  std::array<Histogram*, 2> gradient{};  // activation_grad, weight_grad
  std::unordered_map<std::uint32_t, std::unique_ptr<Rank>> ranks;
  std::map<std::pair<std::string, int>, TensorSeries> tensors;        // (name, role) of the top-K
  std::map<QuantizerKey, QuantizerLatest> quantizer_latest;
  std::map<QuantizerKey, QuantizerSeries> quantizers;                 // the top-K
  std::map<std::pair<std::string, std::string>, Counter*> decisions;  // by (mode, kind)
  Gauge* policy_last = nullptr;
  Gauge* policy_scale = nullptr;
  Gauge* policy_target = nullptr;
  Gauge* policy_fp32 = nullptr;
  Gauge* policy_bf16 = nullptr;
  Counter* partial_steps = nullptr;            // created at the run's first merged step
  std::map<std::string, Counter*> divergence;  // by field, created at its first divergence
};

void RemoveSeries::operator()(RunSeries* series) const { delete series; }

namespace {

template <typename T>
void remove(Family<T>& family, T* series) {
  if (series != nullptr) family.Remove(series);
}

}  // namespace

RunSeries::RunSeries(std::shared_ptr<MetricFamilies> families, const std::string& id)
    : f(std::move(families)), run_id(id) {
  const prometheus::Labels run{{"run", run_id}};
  tensor_stats = &f->tensor_stats.Add(run);
  duplicates = &f->duplicates.Add(run);
  agents_connected = &f->agents_connected.Add(run);
  const Histogram::BucketBoundaries buckets = gradient_buckets();
  gradient[0] = &f->gradient.Add({{"run", run_id}, {"role", "activation_grad"}}, buckets);
  gradient[1] = &f->gradient.Add({{"run", run_id}, {"role", "weight_grad"}}, buckets);
}

RunSeries::~RunSeries() {
  remove(f->tensor_stats, tensor_stats);
  remove(f->duplicates, duplicates);
  remove(f->agents_connected, agents_connected);
  for (Histogram* h : gradient) remove(f->gradient, h);
  for (auto& [id, r] : ranks) {
    remove(f->steps, r->steps);
    remove(f->skipped, r->skipped);
    remove(f->found_inf, r->found_inf);
    remove(f->step_seconds, r->step_seconds);
    remove(f->tokens, r->tokens);
    remove(f->agent_dropped, r->agent_dropped);
    remove(f->seq_gaps, r->seq_gaps);
    remove(f->step, r->step);
    remove(f->loss, r->loss);
    remove(f->loss_scale, r->loss_scale);
    remove(f->grad_norm, r->grad_norm);
    remove(f->lr, r->lr);
    remove(f->tc_ratio, r->tc_ratio);
    remove(f->val_loss, r->val_loss);
    remove(f->loss_scale_min, r->loss_scale_min);
    remove(f->spool_bytes, r->spool_bytes);
    for (const std::unique_ptr<Role>& role : r->roles) {
      if (!role) continue;
      for (Counter* c : role->nonfinite) remove(f->nonfinite, c);
      remove(f->first_offenders, role->first_offenders);
      for (const std::unique_ptr<Format>& fs : role->formats) {
        if (!fs) continue;
        remove(f->checked, fs->checked);
        remove(f->overflow, fs->overflow);
        remove(f->underflow, fs->underflow);
        remove(f->subnormal, fs->subnormal);
        remove(f->overflow_ratio, fs->overflow_ratio);
        remove(f->underflow_ratio, fs->underflow_ratio);
      }
    }
  }
  for (const auto& [key, t] : tensors) remove_tensor(t);
  for (const auto& [key, q] : quantizers) remove_quantizer(q);
  for (const auto& [key, c] : decisions) remove(f->policy_decisions, c);
  remove(f->policy_last, policy_last);
  remove(f->policy_scale, policy_scale);
  remove(f->policy_target, policy_target);
  remove(f->policy_fp32, policy_fp32);
  remove(f->policy_bf16, policy_bf16);
  remove(f->partial_steps, partial_steps);
  for (const auto& [field, c] : divergence) remove(f->rank_divergence, c);
}

void RunSeries::remove_tensor(const TensorSeries& t) {
  remove(f->tensor_underflow, t.underflow);
  remove(f->tensor_overflow, t.overflow);
  remove(f->tensor_nonfinite, t.nonfinite);
  remove(f->tensor_max_abs, t.max_abs);
}

void RunSeries::remove_quantizer(const QuantizerSeries& q) {
  remove(f->quantizer_underflow, q.underflow);
  remove(f->quantizer_saturated, q.saturated);
  remove(f->quantizer_sqnr, q.sqnr);
  remove(f->quantizer_amax, q.amax);
  remove(f->quantizer_scale, q.scale);
  remove(f->quantizer_loss_cost, q.loss_cost);
}

RunSeries::Rank& RunSeries::rank(std::uint32_t rank) {
  auto it = ranks.find(rank);
  if (it != ranks.end()) return *it->second;
  auto s = std::make_unique<Rank>();
  s->rank = std::to_string(rank);
  const prometheus::Labels l{{"run", run_id}, {"rank", s->rank}};
  s->steps = &f->steps.Add(l);
  s->skipped = &f->skipped.Add(l);
  s->found_inf = &f->found_inf.Add(l);
  s->step_seconds = &f->step_seconds.Add(l);
  s->tokens = &f->tokens.Add(l);
  s->agent_dropped = &f->agent_dropped.Add(l);
  s->seq_gaps = &f->seq_gaps.Add(l);
  s->step = &f->step.Add(l);
  s->loss = &f->loss.Add(l);
  s->loss_scale = &f->loss_scale.Add(l);
  s->grad_norm = &f->grad_norm.Add(l);
  s->lr = &f->lr.Add(l);
  s->spool_bytes = &f->spool_bytes.Add(l);
  return *ranks.emplace(rank, std::move(s)).first->second;
}

RunSeries::Role& RunSeries::role(Rank& rank, int role) {
  std::unique_ptr<Role>& slot = rank.roles[role];
  if (slot) return *slot;
  slot = std::make_unique<Role>();
  const std::string role_name(role_label(role));
  for (std::size_t k = 0; k < kNonfiniteKinds.size(); ++k) {
    slot->nonfinite[k] = &f->nonfinite.Add(
        {{"run", run_id}, {"rank", rank.rank}, {"role", role_name}, {"kind", kNonfiniteKinds[k]}});
  }
  slot->first_offenders =
      &f->first_offenders.Add({{"run", run_id}, {"rank", rank.rank}, {"role", role_name}});
  return *slot;
}

RunSeries::Format& RunSeries::format(Rank& rank, int role_id, int format) {
  std::unique_ptr<Format>& slot = role(rank, role_id).formats[format];
  if (slot) return *slot;
  const prometheus::Labels l{{"run", run_id},
                             {"rank", rank.rank},
                             {"role", std::string(role_label(role_id))},
                             {"format", std::string(format_label(format))}};
  slot = std::make_unique<Format>(Format{&f->checked.Add(l), &f->overflow.Add(l),
                                         &f->underflow.Add(l), &f->subnormal.Add(l),
                                         &f->overflow_ratio.Add(l), &f->underflow_ratio.Add(l)});
  return *slot;
}

void RunSeries::set_loss_scale_min(Rank& rank, double min_scale) {
  if (min_scale > 0.0) {
    if (rank.loss_scale_min == nullptr) {
      rank.loss_scale_min = &f->loss_scale_min.Add({{"run", run_id}, {"rank", rank.rank}});
    }
    rank.loss_scale_min->Set(min_scale);
  } else if (rank.loss_scale_min != nullptr) {
    f->loss_scale_min.Remove(rank.loss_scale_min);
    rank.loss_scale_min = nullptr;
  }
}

Metrics::Metrics(std::string version)
    : f_(std::make_shared<MetricFamilies>(std::make_shared<prometheus::Registry>())) {
  f_->build_info.Add({{"version", std::move(version)}}).Set(1);
  streams_active_ = &f_->streams_active.Add({});
  streams_opened_ = &f_->streams_opened.Add({});
  auth_failures_ = {&f_->auth_failures.Add({{"surface", "grpc"}}),
                    &f_->auth_failures.Add({{"surface", "webui"}}),
                    &f_->auth_failures.Add({{"surface", "metrics"}})};
  for (std::string_view reason : kRejectReasons) {
    rejected_.emplace(std::string(reason), &f_->rejected.Add({{"reason", std::string(reason)}}));
    refused_parts_.emplace(std::string(reason),
                           &f_->refused_parts.Add({{"reason", std::string(reason)}}));
  }
  ack_delay_ = &f_->ack_delay.Add({}, Histogram::BucketBoundaries{0.001, 0.0025, 0.005, 0.01, 0.025,
                                                                  0.05, 0.1, 0.25, 0.5, 1, 2.5});
  commit_seconds_ =
      &f_->commit_seconds.Add({}, Histogram::BucketBoundaries{0.0005, 0.001, 0.0025, 0.005, 0.01,
                                                              0.025, 0.05, 0.1, 0.25, 0.5, 1});
  commits_ = &f_->commits.Add({});
  store_failures_ = &f_->store_failures.Add({});
  store_bytes_ = &f_->store_bytes.Add({});
  ingest_queued_bytes_ = &f_->ingest_queued_bytes.Add({});
  ingest_paused_streams_ = &f_->ingest_paused_streams.Add({});
  ingest_read_pauses_ = &f_->ingest_read_pauses.Add({});
  retention_deleted_ = &f_->retention_deleted.Add({});
  policy_errors_ = &f_->policy_errors.Add({});
}

Metrics::~Metrics() = default;

std::shared_ptr<prometheus::Registry> Metrics::registry() const { return f_->registry; }

void Metrics::stream_opened() {
  streams_opened_->Increment();
  streams_active_->Increment();
}

void Metrics::stream_closed() { streams_active_->Decrement(); }

void Metrics::auth_failure(AuthSurface surface) {
  auth_failures_[static_cast<std::size_t>(surface)]->Increment();
}

void Metrics::rejected(std::string_view reason) {
  if (auto it = rejected_.find(reason); it != rejected_.end()) it->second->Increment();
}

void Metrics::refused_part(std::string_view reason) {
  if (auto it = refused_parts_.find(reason); it != refused_parts_.end()) it->second->Increment();
}

void Metrics::ack_delay(double seconds) { ack_delay_->Observe(seconds); }

void Metrics::commit(double seconds, std::size_t reports) {
  (void)reports;
  commit_seconds_->Observe(seconds);
  commits_->Increment();
}

void Metrics::store_failure() { store_failures_->Increment(); }

void Metrics::ingest_backlog(std::uint64_t queued_bytes, std::size_t paused_streams,
                             std::uint64_t pauses) {
  ingest_queued_bytes_->Set(static_cast<double>(queued_bytes));
  ingest_paused_streams_->Set(static_cast<double>(paused_streams));
  const double counted = ingest_read_pauses_->Value();
  if (static_cast<double>(pauses) > counted) {
    ingest_read_pauses_->Increment(static_cast<double>(pauses) - counted);
  }
}

void Metrics::store_live_bytes(std::uint64_t bytes) {
  store_bytes_->Set(static_cast<double>(bytes));
}

void Metrics::retention_deleted(std::int64_t reports) {
  increment(retention_deleted_, static_cast<double>(reports));
}

void Metrics::policy_error() { policy_errors_->Increment(); }

RunSeries* Metrics::run_series(RunState& run) {
  if (!run.exported) return nullptr;
  if (!run.series) {
    run.series.reset(new RunSeries(f_, run.id));
    run.top_stale = true;  // the new series have no top-K tensors yet
  }
  return run.series.get();
}

void Metrics::duplicates(RunState& run, std::uint64_t n) {
  if (RunSeries* s = run_series(run)) increment(s->duplicates, static_cast<double>(n));
}

void Metrics::seq_gap(RunState& run, std::uint32_t rank, std::uint64_t missing) {
  if (RunSeries* s = run_series(run)) {
    increment(s->rank(rank).seq_gaps, static_cast<double>(missing));
  }
}

void Metrics::on_hello(RunState& run, const v1::Hello& hello) {
  if (RunSeries* s = run_series(run)) {
    s->set_loss_scale_min(s->rank(hello.rank()), hello.scaler().min_scale());
  }
}

void Metrics::on_report(RunState& state, const v1::StepReport& r, const ReportDigest& d) {
  RunSeries* exported = run_series(state);
  if (exported == nullptr) return;
  RunSeries& run = *exported;
  RunSeries::Rank& rank = run.rank(r.rank());
  rank.steps->Increment();
  if (r.skipped()) rank.skipped->Increment();
  if (r.found_inf()) rank.found_inf->Increment();
  increment(rank.step_seconds, r.step_time_s());
  increment(rank.tokens, static_cast<double>(r.tokens()));
  rank.step->Set(static_cast<double>(r.step()));
  rank.loss->Set(r.loss());
  rank.loss_scale->Set(r.scale_after());
  rank.grad_norm->Set(r.grad_norm());
  rank.lr->Set(r.lr());
  if (r.has_val_loss()) {
    if (rank.val_loss == nullptr) {
      rank.val_loss = &f_->val_loss.Add({{"run", run.run_id}, {"rank", rank.rank}});
    }
    rank.val_loss->Set(r.val_loss());
  }
  if (r.has_tensor_core_active_ratio()) {
    if (rank.tc_ratio == nullptr) {
      rank.tc_ratio = &f_->tc_ratio.Add({{"run", run.run_id}, {"rank", rank.rank}});
    }
    rank.tc_ratio->Set(r.tensor_core_active_ratio());
  }
  if (r.has_agent()) {
    // The agent's counter is cumulative per agent process; a smaller value means it restarted.
    const std::uint64_t dropped = r.agent().dropped_reports();
    const std::uint64_t delta =
        dropped >= rank.agent_dropped_seen ? dropped - rank.agent_dropped_seen : dropped;
    increment(rank.agent_dropped, static_cast<double>(delta));
    rank.agent_dropped_seen = dropped;
    rank.spool_bytes->Set(static_cast<double>(r.agent().spool_bytes()));
  }
  // A run of several ranks counts the first offender of each merged step once (merged_step):
  // a NaN born on one rank reaches the others through the all-reduce, later in the step.
  if (d.first_offender_role != 0 && state.merge.world_size() <= 1) {
    run.role(rank, d.first_offender_role).first_offenders->Increment();
  }
  increment(run.tensor_stats, r.tensors_size());

  for (int role = 1; role < kRoleSlots; ++role) {
    const RoleDigest& s = d.roles[role];
    if (!s.seen) continue;
    RunSeries::Role& rs = run.role(rank, role);
    for (int k = 0; k < 3; ++k) increment(rs.nonfinite[k], static_cast<double>(s.nonfinite[k]));
    for (int fmt = 0; fmt < kFormatSlots; ++fmt) {
      const RoleDigest::Target& v = s.targets[fmt];
      if (!v.seen) continue;
      RunSeries::Format& fs = run.format(rank, role, fmt);
      const double checked = static_cast<double>(v.checked);
      increment(fs.checked, checked);
      increment(fs.overflow, static_cast<double>(v.overflow));
      increment(fs.underflow, static_cast<double>(v.underflow));
      increment(fs.subnormal, static_cast<double>(v.subnormal));
      fs.overflow_ratio->Set(checked > 0 ? static_cast<double>(v.overflow) / checked : 0.0);
      fs.underflow_ratio->Set(checked > 0 ? static_cast<double>(v.underflow) / checked : 0.0);
    }
  }
  for (int g = 0; g < 2; ++g) {
    const GradientDigest& gd = d.gradient[g];
    if (!gd.buckets.empty()) run.gradient[g]->ObserveMultiple(gd.buckets, gd.sum);
  }
}

void Metrics::set_top_tensors(RunState& state, const std::vector<TensorTotals>& top) {
  RunSeries* exported = run_series(state);
  if (exported == nullptr) return;
  RunSeries& run = *exported;
  const std::string& run_id = state.id;
  std::map<std::pair<std::string, int>, const TensorTotals*> wanted;
  for (const TensorTotals& t : top) wanted[{t.name, t.role}] = &t;
  for (auto it = run.tensors.begin(); it != run.tensors.end();) {
    if (wanted.contains(it->first)) {
      ++it;
      continue;
    }
    run.remove_tensor(it->second);
    it = run.tensors.erase(it);
  }
  for (const auto& [key, t] : wanted) {
    auto it = run.tensors.find(key);
    if (it == run.tensors.end()) {
      const prometheus::Labels l{{"run", run_id},
                                 {"tensor", t->name},
                                 {"role", std::string(role_label(t->role))},
                                 {"format", std::string(format_label(t->format))}};
      const prometheus::Labels no_format{
          {"run", run_id}, {"tensor", t->name}, {"role", std::string(role_label(t->role))}};
      it = run.tensors
               .emplace(key, RunSeries::TensorSeries{&f_->tensor_underflow.Add(l),
                                                     &f_->tensor_overflow.Add(l),
                                                     &f_->tensor_nonfinite.Add(no_format),
                                                     &f_->tensor_max_abs.Add(no_format)})
               .first;
    }
    const double values = static_cast<double>(t->values);
    it->second.underflow->Set(values > 0 ? static_cast<double>(t->underflow) / values : 0.0);
    it->second.overflow->Set(values > 0 ? static_cast<double>(t->overflow) / values : 0.0);
    it->second.nonfinite->Set(static_cast<double>(t->nonfinite));
    it->second.max_abs->Set(t->max_abs);
  }
}

std::string recipe_label(std::string_view recipe) {
  const std::optional<Recipe> r = parse_recipe(recipe);
  if (!r) return "unspecified";
  return std::string(scaling_name(r->scaling)) + "_" + std::string(format_name(r->element));
}

void Metrics::on_quantizers(RunState& state, const v1::StepReport& report, std::size_t top_k) {
  if (report.quantizers_size() == 0) return;
  RunSeries* exported = run_series(state);
  if (exported == nullptr) return;
  RunSeries& run = *exported;
  for (const v1::QuantizerStats& q : report.quantizers()) {
    RunSeries::QuantizerKey key{q.name(), static_cast<int>(q.role()),
                                static_cast<int>(q.phase())};
    auto it = run.quantizer_latest.find(key);
    if (it == run.quantizer_latest.end()) {
      if (run.quantizer_latest.size() >= kMaxQuantizersTracked) continue;
      it = run.quantizer_latest.emplace(std::move(key), RunSeries::QuantizerLatest{}).first;
    }
    RunSeries::QuantizerLatest& l = it->second;
    const double values = static_cast<double>(q.values());
    l.recipe = recipe_label(q.recipe());
    l.has_scale = q.tensor_scale() > 0.0;  // 0 for tile and MX recipes (recipe.h)
    l.underflow_ratio = values > 0 ? static_cast<double>(q.underflow()) / values : 0.0;
    l.saturated_ratio = values > 0 ? static_cast<double>(q.saturated()) / values : 0.0;
    l.sqnr_db = proto::sqnr_db(q.signal_sq(), q.error_sq());
    l.amax = q.amax();
    l.scale = q.tensor_scale();
    if (q.has_loss_cost()) l.loss_cost = q.loss_cost();
  }
  // The top-K by the larger of the two shares, then by name: the layers an alert would name.
  std::vector<const std::pair<const RunSeries::QuantizerKey, RunSeries::QuantizerLatest>*> ranked;
  for (const auto& entry : run.quantizer_latest) ranked.push_back(&entry);
  const std::size_t k = std::min(top_k, ranked.size());
  std::partial_sort(ranked.begin(), ranked.begin() + static_cast<std::ptrdiff_t>(k), ranked.end(),
                    [](const auto* a, const auto* b) {
                      const double sa = a->second.score();
                      const double sb = b->second.score();
                      return sa != sb ? sa > sb : a->first < b->first;
                    });
  ranked.resize(k);
  std::map<RunSeries::QuantizerKey, const RunSeries::QuantizerLatest*> wanted;
  for (const auto* entry : ranked) wanted[entry->first] = &entry->second;
  for (auto it = run.quantizers.begin(); it != run.quantizers.end();) {
    const auto w = wanted.find(it->first);
    // A quantiser that left the top-K, or changed recipe (its label), loses its series.
    if (w != wanted.end() && w->second->recipe == it->second.recipe &&
        w->second->has_scale == (it->second.scale != nullptr)) {
      ++it;
      continue;
    }
    run.remove_quantizer(it->second);
    it = run.quantizers.erase(it);
  }
  for (const auto& entry : wanted) {
    // Named, not bound: a lambda cannot capture a structured binding before C++20's P1091
    // (clang 14).
    const RunSeries::QuantizerKey& key = entry.first;
    const RunSeries::QuantizerLatest* l = entry.second;
    auto it = run.quantizers.find(key);
    const auto labels = [&] {
      const auto& [name, role, phase] = key;
      return prometheus::Labels{
          {"run", state.id},
          {"tensor", name},
          {"role", std::string(role_label(role))},
          {"phase",
           std::string(phase_name(proto::from_proto(static_cast<v1::TensorPhase>(phase))))},
          {"recipe", l->recipe}};
    };
    if (it == run.quantizers.end()) {
      RunSeries::QuantizerSeries q{l->recipe,
                                   &f_->quantizer_underflow.Add(labels()),
                                   &f_->quantizer_saturated.Add(labels()),
                                   &f_->quantizer_sqnr.Add(labels()),
                                   &f_->quantizer_amax.Add(labels())};
      if (l->has_scale) q.scale = &f_->quantizer_scale.Add(labels());
      it = run.quantizers.emplace(key, q).first;
    }
    it->second.underflow->Set(l->underflow_ratio);
    it->second.saturated->Set(l->saturated_ratio);
    it->second.sqnr->Set(l->sqnr_db);
    it->second.amax->Set(l->amax);
    if (it->second.scale != nullptr) it->second.scale->Set(l->scale);
    if (l->loss_cost) {
      if (it->second.loss_cost == nullptr) {
        it->second.loss_cost = &f_->quantizer_loss_cost.Add(labels());
      }
      it->second.loss_cost->Set(*l->loss_cost);
    }
  }
}

void Metrics::set_agents_connected(RunState& run, std::size_t n) {
  if (RunSeries* s = run_series(run)) s->agents_connected->Set(static_cast<double>(n));
}

void Metrics::merged_step(RunState& state, bool partial,
                          const std::vector<v1::RankDivergence>& divergences,
                          std::uint32_t offender_rank, int offender_role) {
  RunSeries* exported = run_series(state);
  if (exported == nullptr) return;
  RunSeries& run = *exported;
  if (offender_role > 0 && offender_role < kRoleSlots) {
    run.role(run.rank(offender_rank), offender_role).first_offenders->Increment();
  }
  if (run.partial_steps == nullptr) run.partial_steps = &f_->partial_steps.Add({{"run", state.id}});
  if (partial) run.partial_steps->Increment();
  for (const v1::RankDivergence& d : divergences) {
    Counter*& c = run.divergence[d.field()];
    if (c == nullptr) c = &f_->rank_divergence.Add({{"run", state.id}, {"field", d.field()}});
    c->Increment();
  }
}

void Metrics::policy_decision(RunState& state, std::string_view mode, std::string_view kind,
                              const v1::PolicyUpdate& u) {
  RunSeries* exported = run_series(state);
  if (exported == nullptr) return;
  RunSeries& run = *exported;
  const std::string& run_id = state.id;
  const std::string& reason = u.reason();
  if (u.has_min_scale()) {
    for (auto& [rank_id, rank] : run.ranks) run.set_loss_scale_min(*rank, u.min_scale());
  }
  Counter*& decisions = run.decisions[{std::string(mode), std::string(kind)}];
  if (decisions == nullptr) {
    decisions = &f_->policy_decisions.Add(
        {{"run", run_id}, {"mode", std::string(mode)}, {"kind", std::string(kind)}});
  }
  decisions->Increment();
  if (run.policy_last != nullptr) f_->policy_last.Remove(run.policy_last);
  run.policy_last = &f_->policy_last.Add({{"run", run_id},
                                          {"mode", std::string(mode)},
                                          {"kind", std::string(kind)},
                                          {"reason", reason.substr(0, 200)}});
  run.policy_last->Set(1);
  if (u.has_loss_scale()) {
    if (run.policy_scale == nullptr) run.policy_scale = &f_->policy_scale.Add({{"run", run_id}});
    run.policy_scale->Set(u.loss_scale());
  }
  if (run.policy_fp32 == nullptr) run.policy_fp32 = &f_->policy_fp32.Add({{"run", run_id}});
  run.policy_fp32->Set(static_cast<double>(u.fp32_tensors_size()));
  if (u.bf16_gemms_set()) {
    if (run.policy_bf16 == nullptr) run.policy_bf16 = &f_->policy_bf16.Add({{"run", run_id}});
    run.policy_bf16->Set(static_cast<double>(u.bf16_gemms_size()));
  }
}

void Metrics::policy_target(RunState& state, std::optional<double> target_scale) {
  RunSeries* exported = run_series(state);
  if (!target_scale || exported == nullptr) return;
  RunSeries& run = *exported;
  if (run.policy_target == nullptr) {
    run.policy_target = &f_->policy_target.Add({{"run", state.id}});
  }
  run.policy_target->Set(*target_scale);
}

}  // namespace ampscope::server
