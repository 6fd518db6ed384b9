// The query side of the store: one read-only connection (SQLite's WAL readers and PostgreSQL's
// MVCC see the last committed state and never block the ingest thread), serialised by a mutex.
// The SQL is the dialect both back ends accept (db.h).
#include <algorithm>
#include <charconv>
#include <limits>
#include <set>
#include <sstream>

#include "ampscope/proto/flight_event.h"
#include "ampscope/proto/quantizer_codec.h"
#include "policy_merge.h"
#include "policy_wire.h"
#include "store.h"

namespace ampscope::server {
namespace {

constexpr std::uint32_t clamp_limit(std::uint32_t requested, std::uint32_t fallback,
                                    std::uint32_t most) {
  return requested == 0 ? fallback : std::min(requested, most);
}

template <typename Message>
bool parse_blob(std::string_view blob, Message* m) {
  return m->ParseFromArray(blob.data(), static_cast<int>(blob.size()));
}

std::string describe_skip(const v1::SkippedStep& s) {
  std::string why = s.found_inf() ? "found_inf" : "skipped without found_inf";
  why += " at scale " + std::to_string(static_cast<long long>(s.loss_scale()));
  if (s.loss_scale() != static_cast<double>(static_cast<long long>(s.loss_scale()))) {
    why += " (" + std::to_string(s.loss_scale()) + ")";
  }
  if (s.has_first_offender()) {
    const v1::FirstOffender& f = s.first_offender();
    std::string role = v1::TensorRole_Name(f.role());
    if (role.rfind("TENSOR_ROLE_", 0) == 0) role = role.substr(12);
    std::transform(role.begin(), role.end(), role.begin(), ::tolower);
    why += "; first offender " + f.tensor() + " (" + role + ", order " + std::to_string(f.order()) +
           ", micro-step " + std::to_string(f.micro_step()) + ") on rank " +
           std::to_string(s.offender_rank());
  }
  if (s.scale_after() != s.loss_scale()) {
    why += "; scale -> " + std::to_string(static_cast<long long>(s.scale_after()));
  }
  return why;
}

// Why a tensor offended in its step (proto::offended), one line; empty when it did not.
std::string describe_offence(const v1::TensorStats& t) {
  if (proto::nonfinite(t) > 0) {
    return "nan " + std::to_string(t.nan()) + ", +inf " + std::to_string(t.pos_inf()) + ", -inf " +
           std::to_string(t.neg_inf());
  }
  if (!proto::offended(t)) return {};
  std::string format = v1::Format_Name(t.targets(0).format());
  if (format.rfind("FORMAT_", 0) == 0) format = format.substr(7);
  std::transform(format.begin(), format.end(), format.begin(), ::tolower);
  std::ostringstream os;
  os.precision(3);
  os << "underflow " << proto::underflow_ratio(t) * 100 << "% in " << format;
  return os.str();
}

// A followed tensor: (rank, name, role, phase), the series GetStepHistory matches on.
struct SeriesKey {
  std::uint32_t rank = 0;
  std::string name;
  int role = 0;
  int phase = 0;
  auto operator<=>(const SeriesKey&) const = default;
};

SeriesKey key_of(std::uint32_t rank, const v1::TensorStats& t) {
  return {rank, t.name(), static_cast<int>(t.role()), static_cast<int>(t.phase())};
}

constexpr int kMaxStepTensors = 64;
constexpr int kMaxHistorySamples = 65536;

}  // namespace

std::string make_page_token(const ReportPosition& last) {
  return std::to_string(last.step) + ":" + std::to_string(last.rank);
}

std::optional<ReportPosition> parse_page_token(std::string_view token) {
  const auto colon = token.find(':');
  if (colon == std::string_view::npos) return std::nullopt;
  const char* b = token.data();
  const char* e = b + token.size();
  ReportPosition p;
  const auto r1 = std::from_chars(b, b + colon, p.step);
  const auto r2 = std::from_chars(b + colon + 1, e, p.rank);
  if (r1.ec != std::errc() || r1.ptr != b + colon || p.step < 0 || r2.ec != std::errc() ||
      r2.ptr != e) {
    return std::nullopt;
  }
  return p;
}

StoreReader::StoreReader(const std::string& path) : StoreReader(StoreOptions{path}) {}

StoreReader::StoreReader(const StoreOptions& options)
    : options_(options), conn_(open_store(options, StoreRole::kReader)) {}

std::unique_lock<std::mutex> StoreReader::lock_connected() {
  std::unique_lock lock(mu_);
  if (conn_->broken()) conn_ = open_store(options_, StoreRole::kReader);  // throws while away
  return lock;
}

StoreReader::~StoreReader() = default;

std::optional<std::int64_t> StoreReader::run_key(const std::string& run_id) {
  Statement s = conn_->prepare("SELECT id FROM runs WHERE run_id = ?1");
  s.bind(1, run_id);
  if (!s.step()) return std::nullopt;
  return s.column_int(0);
}

void StoreReader::fill_summary(std::int64_t run, v1::RunSummary* out) {
  {
    Statement s = conn_->prepare(
        "SELECT run_id, world_size, precision, trainer, compute_format, first_seen_ns, "
        "last_seen_ns FROM runs WHERE id = ?1");
    s.bind(1, run);
    if (s.step()) {
      out->set_run_id(s.column_text(0));
      out->set_world_size(static_cast<std::uint32_t>(s.column_int(1)));
      out->set_precision(s.column_text(2));
      out->set_trainer(s.column_text(3));
      out->set_compute_format(static_cast<v1::Format>(s.column_int(4)));
      out->set_first_seen_unix_ns(s.column_int(5));
      out->set_last_seen_unix_ns(s.column_int(6));
    }
  }
  {
    Statement s = conn_->prepare(
        "SELECT count(*), count(DISTINCT step), min(step), max(step) FROM reports "
        "WHERE run = ?1");
    s.bind(1, run);
    if (s.step()) {
      out->set_reports(static_cast<std::uint64_t>(s.column_int(0)));
      out->set_steps(static_cast<std::uint64_t>(s.column_int(1)));
      out->set_first_step(s.column_int(2));
      out->set_last_step(s.column_int(3));
    }
  }
  {
    Statement s =
        conn_->prepare("SELECT count(DISTINCT step) FROM reports WHERE run = ?1 AND skipped != 0");
    s.bind(1, run);
    if (s.step()) out->set_skipped_steps(static_cast<std::uint64_t>(s.column_int(0)));
  }
  {
    Statement s = conn_->prepare(
        "SELECT scale_after, loss FROM reports WHERE run = ?1 ORDER BY step DESC, rank ASC "
        "LIMIT 1");
    s.bind(1, run);
    if (s.step()) {
      out->set_loss_scale(s.column_double(0));
      out->set_loss(s.column_is_null(1) ? std::numeric_limits<double>::quiet_NaN()
                                        : s.column_double(1));
    }
  }
  {
    Statement s = conn_->prepare(
        "SELECT (SELECT count(*) FROM merged_steps WHERE run = ?1 AND partial != 0), "
        "(SELECT count(DISTINCT step) FROM rank_divergences WHERE run = ?1)");
    s.bind(1, run);
    if (s.step()) {
      out->set_partial_steps(static_cast<std::uint64_t>(s.column_int(0)));
      out->set_divergent_steps(static_cast<std::uint64_t>(s.column_int(1)));
    }
  }
  {
    Statement s = conn_->prepare("SELECT count(*) FROM rejections WHERE run = ?1");
    s.bind(1, run);
    if (s.step()) out->set_rejected_reports(static_cast<std::uint64_t>(s.column_int(0)));
  }
  {
    Statement s = conn_->prepare("SELECT mode FROM policy_state WHERE run = ?1");
    s.bind(1, run);
    // The text policy::mode_name wrote (save_policy_state).
    if (s.step()) {
      if (const auto mode = policy::parse_mode(s.column_text(0))) {
        out->set_policy_mode(mode_to_wire(*mode));
      }
    }
  }
}

std::vector<v1::RunSummary> StoreReader::list_runs(std::uint32_t limit) {
  const auto lock = lock_connected();
  std::vector<std::int64_t> keys;
  {
    Statement s = conn_->prepare("SELECT id FROM runs ORDER BY last_seen_ns DESC LIMIT ?1");
    s.bind(1, std::int64_t{clamp_limit(limit, 100, 10000)});
    while (s.step()) keys.push_back(s.column_int(0));
  }
  std::vector<v1::RunSummary> runs(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) fill_summary(keys[i], &runs[i]);
  return runs;
}

std::vector<v1::PolicyDecision> StoreReader::decisions(std::int64_t run, std::uint32_t limit,
                                                       std::int64_t from, std::int64_t to) {
  std::vector<v1::PolicyDecision> out;
  std::vector<std::int64_t> ids;
  {
    Statement s = conn_->prepare(
        "SELECT id, \"update\" FROM policy_decisions WHERE run = ?1 AND "
        "effective_from_step >= ?3 AND effective_from_step <= ?4 ORDER BY id DESC LIMIT ?2");
    s.bind(1, run).bind(2, std::int64_t{limit}).bind(3, from).bind(4, to);
    while (s.step()) {
      v1::PolicyDecision d;
      parse_blob(s.column_blob(1), d.mutable_update());
      ids.push_back(s.column_int(0));
      out.push_back(std::move(d));
    }
  }
  std::reverse(out.begin(), out.end());
  std::reverse(ids.begin(), ids.end());
  Statement s = conn_->prepare(
      "SELECT rank, step, applied, reason FROM policy_applications WHERE policy = ?1 "
      "ORDER BY rank");
  for (std::size_t i = 0; i < ids.size(); ++i) {
    s.bind(1, ids[i]);
    while (s.step()) {
      v1::PolicyApplication* a = out[i].add_applications();
      a->set_rank(static_cast<std::uint32_t>(s.column_int(0)));
      a->set_step(s.column_int(1));
      a->set_applied(s.column_int(2) != 0);
      a->set_reason(s.column_text(3));
    }
    s.reset();
  }
  return out;
}

std::vector<v1::AgentInfo> StoreReader::agents(std::int64_t run) {
  std::vector<v1::AgentInfo> out;
  Statement s = conn_->prepare(
      "SELECT a.rank, a.host, a.trainer, a.agent_version, a.last_seq, a.last_seen_ns, "
      "a.counters, a.data_parallel_size, a.gradients_sharded, a.policy_agreement, "
      "a.last_policy_seq, (SELECT avg(step_time_s) FROM reports r WHERE r.run = a.run AND "
      "r.rank = a.rank) FROM agents a WHERE a.run = ?1 ORDER BY a.rank");
  s.bind(1, run);
  Statement n = conn_->prepare(
      "SELECT text FROM agent_notices WHERE run = ?1 AND rank = ?2 ORDER BY text LIMIT 16");
  while (s.step()) {
    v1::AgentInfo* a = &out.emplace_back();
    a->set_rank(static_cast<std::uint32_t>(s.column_int(0)));
    a->set_host(s.column_text(1));
    a->set_trainer(s.column_text(2));
    a->set_agent_version(s.column_text(3));
    a->set_last_seq(static_cast<std::uint64_t>(s.column_int(4)));
    a->set_last_seen_unix_ns(s.column_int(5));
    if (!s.column_is_null(6)) parse_blob(s.column_blob(6), a->mutable_counters());
    a->set_data_parallel_size(static_cast<std::uint32_t>(s.column_int(7)));
    a->set_gradients_sharded(s.column_int(8) != 0);
    a->set_policy_agreement(static_cast<v1::PolicyAgreement>(s.column_int(9)));
    a->set_last_policy_seq(static_cast<std::uint64_t>(s.column_int(10)));
    if (!s.column_is_null(11)) a->set_mean_step_time_s(s.column_double(11));
    n.bind(1, run).bind(2, std::int64_t{a->rank()});
    while (n.step()) a->add_notices(n.column_text(0));
    n.reset();
  }
  return out;
}

std::vector<v1::SkippedStep> StoreReader::skipped_steps(std::int64_t run, std::int64_t from,
                                                        std::int64_t to, std::uint32_t limit,
                                                        bool latest) {
  // The step's merged first offender (rank_merge.h: earliest in execution order, then lowest
  // rank), the one the policy engine saw: its rank and the ids of the merged reports. The
  // latest merge of the step (a step run again after a resume is merged again).
  const Dialect dialect = dialect_of(*conn_);
  Statement merged = conn_->prepare(
      "SELECT offender_rank, ranks, report_ids FROM merged_steps " +
      dialect.index_hint("merged_steps_offender") +
      " WHERE run = ?1 AND step = ?2 AND offender_rank IS NOT NULL ORDER BY id DESC LIMIT 1");
  Statement payload_of = conn_->prepare("SELECT payload FROM reports WHERE id = ?1");
  const auto merged_offender = [&](std::int64_t step, v1::SkippedStep* k) {
    merged.bind(1, run).bind(2, step);
    std::optional<std::int64_t> report;
    std::uint32_t offender_rank = 0;
    if (merged.step()) {
      offender_rank = static_cast<std::uint32_t>(merged.column_int(0));
      std::istringstream ranks(merged.column_text(1));
      std::istringstream ids(merged.column_text(2));
      std::uint32_t r = 0;
      std::int64_t id = 0;
      while (ranks >> r && ids >> id) {
        if (r == offender_rank) report = id;
      }
    }
    merged.reset();
    if (!report) return false;
    payload_of.bind(1, *report);
    v1::StepReport r;
    const bool found =
        payload_of.step() && parse_blob(payload_of.column_blob(0), &r) && r.has_first_offender();
    payload_of.reset();
    if (!found) return false;
    *k->mutable_first_offender() = r.first_offender();
    k->set_offender_rank(offender_rank);
    return true;
  };

  // The lowest rank that skipped each step.
  Statement s = conn_->prepare(
      // The partial indexes hold only the rows asked for; without them SQLite prefers the
      // covering index for the step order and reads every row of the range to filter it.
      "SELECT step, rank, loss_scale, scale_after, found_inf, payload FROM reports " +
      dialect.index_hint("reports_skipped") +
      " WHERE run = ?1 AND skipped != 0 AND step >= ?2 AND step <= ?3 ORDER BY " +
      (latest ? "step DESC, rank" : "step, rank"));
  s.bind(1, run).bind(2, from).bind(3, to);
  std::vector<v1::SkippedStep> out;
  while (s.step() && out.size() < limit) {
    if (!out.empty() && s.column_int(0) == out.back().step()) continue;
    v1::SkippedStep& k = out.emplace_back();
    k.set_step(s.column_int(0));
    k.set_rank(static_cast<std::uint32_t>(s.column_int(1)));
    k.set_loss_scale(s.column_double(2));
    k.set_scale_after(s.column_double(3));
    k.set_found_inf(s.column_int(4) != 0);
    // Without a merge that found one (a store older than merged steps, a step still waiting
    // for its ranks): the skipping rank's own.
    if (!merged_offender(k.step(), &k)) {
      v1::StepReport r;
      if (parse_blob(s.column_blob(5), &r) && r.has_first_offender()) {
        *k.mutable_first_offender() = r.first_offender();
        k.set_offender_rank(k.rank());
      }
    }
    k.set_why(describe_skip(k));
  }
  if (latest) std::reverse(out.begin(), out.end());
  return out;
}

std::vector<v1::OffenderEvent> StoreReader::first_offenders(std::int64_t run, std::int64_t from,
                                                            std::int64_t to, std::uint32_t limit,
                                                            bool latest) {
  Statement s = conn_->prepare(
      "SELECT step, rank, payload FROM reports " +
      dialect_of(*conn_).index_hint("reports_offender") +
      " WHERE run = ?1 AND offender IS NOT NULL AND step >= ?2 AND step <= ?3 ORDER BY " +
      (latest ? "step DESC, rank DESC" : "step, rank") + " LIMIT ?4");
  s.bind(1, run).bind(2, from).bind(3, to).bind(4, std::int64_t{limit});
  std::vector<v1::OffenderEvent> out;
  while (s.step()) {
    v1::StepReport r;
    if (!parse_blob(s.column_blob(2), &r)) continue;
    v1::OffenderEvent& e = out.emplace_back();
    e.set_step(s.column_int(0));
    e.set_rank(static_cast<std::uint32_t>(s.column_int(1)));
    *e.mutable_offender() = r.first_offender();
  }
  if (latest) std::reverse(out.begin(), out.end());
  return out;
}

std::vector<v1::ScalePoint> StoreReader::scale_timeline(std::int64_t run, std::int64_t from,
                                                        std::int64_t to) {
  Statement s = conn_->prepare(
      "SELECT step, loss_scale FROM reports WHERE run = ?1 AND rank = "
      "(SELECT min(rank) FROM reports WHERE run = ?1) AND step >= ?2 AND step <= ?3 "
      "ORDER BY step");
  s.bind(1, run).bind(2, from).bind(3, to);
  std::vector<v1::ScalePoint> points;
  while (s.step()) {
    const double scale = s.column_double(1);
    if (points.empty() || points.back().loss_scale() != scale) {
      v1::ScalePoint& p = points.emplace_back();
      p.set_step(s.column_int(0));
      p.set_loss_scale(scale);
    }
  }
  constexpr std::size_t kMaxScalePoints = 1000;
  if (points.size() > kMaxScalePoints) {
    points.erase(points.begin(), points.end() - kMaxScalePoints);
  }
  return points;
}

std::vector<v1::TensorRecord> StoreReader::tensor_records(std::int64_t run,
                                                          const std::string& where_order,
                                                          std::uint32_t limit) {
  Statement s = conn_->prepare(
      "SELECT name, role, format, samples, \"values\", overflow, underflow, nonfinite, max_abs, "
      "last_step FROM tensor_totals WHERE run = ?1 AND " +
      where_order + " LIMIT ?2");
  s.bind(1, run).bind(2, std::int64_t{limit});
  std::vector<v1::TensorRecord> out;
  while (s.step()) {
    v1::TensorRecord& t = out.emplace_back();
    t.set_name(s.column_text(0));
    t.set_role(static_cast<v1::TensorRole>(s.column_int(1)));
    t.set_format(static_cast<v1::Format>(s.column_int(2)));
    t.set_samples(static_cast<std::uint64_t>(s.column_int(3)));
    t.set_values(static_cast<std::uint64_t>(s.column_int(4)));
    t.set_overflow(static_cast<std::uint64_t>(s.column_int(5)));
    t.set_underflow(static_cast<std::uint64_t>(s.column_int(6)));
    t.set_nonfinite(static_cast<std::uint64_t>(s.column_int(7)));
    const double values = static_cast<double>(t.values());
    t.set_overflow_ratio(values > 0 ? static_cast<double>(t.overflow()) / values : 0.0);
    t.set_underflow_ratio(values > 0 ? static_cast<double>(t.underflow()) / values : 0.0);
    t.set_max_abs(s.column_double(8));
    t.set_last_step(s.column_int(9));
  }
  return out;
}

std::vector<v1::QuantizerRecord> StoreReader::quantizer_records(std::int64_t run) {
  Statement s = conn_->prepare(
      "SELECT name, role, phase, recipe, element, samples, \"values\", nonfinite, underflow, "
      "subnormal, saturated, overflow, signal_sq, error_sq, amax, last_amax, scale_min, "
      "scale_max, last_scale, scale_min_exponent, scale_max_exponent, blocks, zero_blocks, "
      "saturated_blocks, nan_blocks, last_step, loss_cost_samples, loss_cost_sum, "
      "loss_cost_sq_sum FROM quantizer_totals WHERE run = ?1 "
      "ORDER BY name, role, phase LIMIT ?2");
  s.bind(1, run).bind(2, static_cast<std::int64_t>(kMaxQuantizerRecords));
  std::vector<v1::QuantizerRecord> out;
  const auto count = [&](int column) { return static_cast<std::uint64_t>(s.column_int(column)); };
  while (s.step()) {
    v1::QuantizerRecord& q = out.emplace_back();
    q.set_name(s.column_text(0));
    q.set_role(static_cast<v1::TensorRole>(s.column_int(1)));
    q.set_phase(static_cast<v1::TensorPhase>(s.column_int(2)));
    q.set_recipe(s.column_text(3));
    q.set_element(static_cast<v1::Format>(s.column_int(4)));
    q.set_samples(count(5));
    q.set_values(count(6));
    q.set_nonfinite(count(7));
    q.set_underflow(count(8));
    q.set_subnormal(count(9));
    q.set_saturated(count(10));
    q.set_overflow(count(11));
    const double values = static_cast<double>(q.values());
    q.set_underflow_ratio(values > 0 ? static_cast<double>(q.underflow()) / values : 0.0);
    q.set_saturated_ratio(values > 0 ? static_cast<double>(q.saturated()) / values : 0.0);
    q.set_sqnr_db(proto::sqnr_db(s.column_double(12), s.column_double(13)));
    q.set_amax(s.column_double(14));
    q.set_last_amax(s.column_double(15));
    if (!s.column_is_null(16)) {
      q.set_tensor_scale_min(s.column_double(16));
      q.set_tensor_scale_max(s.column_double(17));
    }
    q.set_last_tensor_scale(s.column_double(18));
    if (!s.column_is_null(19)) {
      q.set_has_scale_binades(true);
      q.set_scale_min_exponent(static_cast<std::int32_t>(s.column_int(19)));
      q.set_scale_max_exponent(static_cast<std::int32_t>(s.column_int(20)));
    }
    q.set_blocks(count(21));
    q.set_zero_blocks(count(22));
    q.set_saturated_blocks(count(23));
    q.set_nan_blocks(count(24));
    q.set_last_step(s.column_int(25));
    q.set_loss_cost_samples(count(26));
    const proto::MeanAndStddev cost =
        proto::mean_and_stddev(q.loss_cost_samples(), s.column_double(27), s.column_double(28));
    q.set_loss_cost_mean(cost.mean);
    q.set_loss_cost_stddev(cost.stddev);
  }
  return out;
}

std::vector<v1::RankDivergence> StoreReader::divergences(std::int64_t run, std::uint32_t limit) {
  // The latest `limit`, listed by step.
  Statement s = conn_->prepare(
      "SELECT divergence FROM (SELECT step, field, divergence FROM rank_divergences "
      "WHERE run = ?1 ORDER BY step DESC, field DESC LIMIT ?2) AS latest ORDER BY step, field");
  s.bind(1, run).bind(2, std::int64_t{limit});
  std::vector<v1::RankDivergence> out;
  while (s.step()) parse_blob(s.column_blob(0), &out.emplace_back());
  return out;
}

std::optional<v1::GetRunResponse> StoreReader::get_run(const std::string& run_id,
                                                       std::uint32_t requested_limit) {
  const auto lock = lock_connected();
  const std::optional<std::int64_t> run = run_key(run_id);
  if (!run) return std::nullopt;
  const std::uint32_t limit = clamp_limit(requested_limit, 20, 1000);
  v1::GetRunResponse out;
  fill_summary(*run, out.mutable_summary());

  for (v1::AgentInfo& a : agents(*run)) *out.add_agents() = std::move(a);
  const std::int64_t all_steps = std::numeric_limits<std::int64_t>::max();
  for (v1::SkippedStep& k : skipped_steps(*run, 0, all_steps, limit, /*latest=*/false)) {
    *out.add_skipped_steps() = std::move(k);
  }
  for (v1::OffenderEvent& e : first_offenders(*run, 0, all_steps, limit, /*latest=*/false)) {
    *out.add_first_offenders() = std::move(e);
  }
  for (v1::ScalePoint& p : scale_timeline(*run, 0, all_steps)) {
    *out.add_scale_timeline() = std::move(p);
  }
  // A ratio over no values is NULL on both back ends (PostgreSQL would fail on it), listed last.
  for (v1::TensorRecord& t : tensor_records(*run,
                                            "underflow > 0 ORDER BY underflow * 1.0 / "
                                            "NULLIF(\"values\", 0) DESC NULLS LAST, name",
                                            limit)) {
    *out.add_worst_underflow() = std::move(t);
  }
  for (v1::TensorRecord& t :
       tensor_records(*run,
                      "(overflow > 0 OR nonfinite > 0) ORDER BY overflow * 1.0 / " +
                          sql_greatest("\"values\"", "1") + " DESC, nonfinite DESC, name",
                      limit)) {
    *out.add_worst_overflow() = std::move(t);
  }
  for (v1::PolicyDecision& d : decisions(*run, limit)) {
    *out.add_policy_decisions() = std::move(d);
  }
  for (v1::QuantizerRecord& q : quantizer_records(*run)) *out.add_quantizers() = std::move(q);
  for (v1::RankDivergence& d : divergences(*run, limit)) {
    *out.add_rank_divergences() = std::move(d);
  }
  {
    Statement s = conn_->prepare(
        "SELECT step, ranks FROM (SELECT id, step, ranks FROM merged_steps WHERE run = ?1 AND "
        "partial != 0 ORDER BY step DESC, id DESC LIMIT ?2) AS latest ORDER BY step, id");
    s.bind(1, *run).bind(2, std::int64_t{limit});
    while (s.step()) {
      v1::PartialStep* p = out.add_partial_steps();
      p->set_step(s.column_int(0));
      std::istringstream ranks(s.column_text(1));
      for (std::uint32_t r; ranks >> r;) p->add_ranks(r);
    }
  }
  return out;
}

std::optional<v1::GetReportsResponse> StoreReader::get_reports(const v1::GetReportsRequest& q) {
  const auto lock = lock_connected();
  const std::optional<std::int64_t> run = run_key(q.run_id());
  if (!run) return std::nullopt;
  const std::int64_t limit = clamp_limit(q.limit(), 1000, 10000);
  const bool arrival = q.order() == v1::REPORT_ORDER_ARRIVAL;

  std::string sql =
      "SELECT id, received_ns, payload, step, rank FROM reports WHERE run = ?1 "
      "AND step >= ?2";
  if (q.to_step() > 0) sql += " AND step <= ?3";
  if (q.has_rank()) sql += " AND rank = ?4";
  if (arrival) {
    sql += " AND id > ?5";
  } else if (!q.page_token().empty()) {
    sql += " AND (step > ?6 OR (step = ?6 AND rank > ?7))";
  }
  const char* direction = q.latest() ? " DESC" : "";
  sql += arrival ? std::string(" ORDER BY id") + direction
                 : std::string(" ORDER BY step") + direction + ", rank" + direction;
  sql += " LIMIT ?8";

  Statement s = conn_->prepare(sql);
  s.bind(1, *run).bind(2, q.from_step());
  if (q.to_step() > 0) s.bind(3, q.to_step());
  if (q.has_rank()) s.bind(4, std::int64_t{q.rank()});
  if (arrival) {
    // Report ids are BIGINT keys (SQLite rowids), at most 2^63-1: nothing comes after a larger one
    // (bound as int64 it would be negative and select every report).
    if (q.after_report_id() > std::uint64_t{std::numeric_limits<std::int64_t>::max()}) {
      return v1::GetReportsResponse();
    }
    s.bind(5, static_cast<std::int64_t>(q.after_report_id()));
  }
  if (!arrival && !q.page_token().empty()) {
    const std::optional<ReportPosition> after = parse_page_token(q.page_token());
    if (!after) return v1::GetReportsResponse();  // refused by the Query service before
    s.bind(6, after->step).bind(7, std::int64_t{after->rank});
  }
  s.bind(8, limit + (q.latest() ? 0 : 1));

  v1::GetReportsResponse out;
  std::int64_t last_step = 0;
  std::int64_t last_rank = 0;
  bool more = false;
  while (s.step()) {
    if (out.reports_size() == limit) {
      more = true;
      break;
    }
    v1::StoredReport* r = out.add_reports();
    r->set_report_id(static_cast<std::uint64_t>(s.column_int(0)));
    r->set_received_unix_ns(s.column_int(1));
    parse_blob(s.column_blob(2), r->mutable_report());
    if (!q.include_tensors()) {
      r->mutable_report()->clear_tensors();
      r->mutable_report()->clear_quantizers();
    }
    last_step = s.column_int(3);
    last_rank = s.column_int(4);
  }
  if (q.latest()) {
    std::reverse(out.mutable_reports()->begin(), out.mutable_reports()->end());
  } else if (more && !arrival) {
    out.set_next_page_token(make_page_token({last_step, static_cast<std::uint32_t>(last_rank)}));
  }
  return out;
}

std::optional<v1::GetPolicyResponse> StoreReader::get_policy(const std::string& run_id) {
  const auto lock = lock_connected();
  const std::optional<std::int64_t> run = run_key(run_id);
  if (!run) return std::nullopt;
  v1::GetPolicyResponse out;
  v1::RunSummary summary;
  fill_summary(*run, &summary);
  out.set_mode(summary.policy_mode());
  for (v1::PolicyDecision& d : decisions(*run, 100)) *out.add_history() = std::move(d);
  // The policy in force: every decision folded in order (all of them, not only the last 100).
  Statement s =
      conn_->prepare("SELECT \"update\" FROM policy_decisions WHERE run = ?1 ORDER BY id");
  s.bind(1, *run);
  bool any = false;
  while (s.step()) {
    v1::PolicyUpdate u;
    if (parse_blob(s.column_blob(0), &u)) {
      merge_policy_update(out.mutable_current(), u);
      any = true;
    }
  }
  if (!any) out.clear_current();
  return out;
}

std::optional<v1::GetStepHistoryResponse> StoreReader::get_step_history(
    const v1::GetStepHistoryRequest& q) {
  const auto lock = lock_connected();
  const std::optional<std::int64_t> run = run_key(q.run_id());
  if (!run) return std::nullopt;
  const std::int64_t back = clamp_limit(q.steps(), 16, 1024);
  const std::int64_t from = std::max<std::int64_t>(0, q.step() - back);
  const std::set<std::string> asked(q.tensors().begin(), q.tensors().end());

  v1::GetStepHistoryResponse out;
  // Every candidate first; the answer keeps those with history before those without.
  std::vector<v1::StepTensor> candidates;
  std::vector<SeriesKey> followed;  // same order as candidates
  std::set<std::uint32_t> ranks;
  Statement at = conn_->prepare(
      "SELECT payload, rank FROM reports WHERE run = ?1 AND step = ?2 ORDER BY rank, id");
  at.bind(1, *run).bind(2, q.step());
  while (at.step()) {
    v1::StepReport r;
    if (!parse_blob(at.column_blob(0), &r)) continue;
    const auto rank = static_cast<std::uint32_t>(at.column_int(1));
    for (const v1::TensorStats& t : r.tensors()) {
      std::string why = describe_offence(t);
      if (asked.empty() ? why.empty() : !asked.contains(t.name())) continue;
      const SeriesKey key = key_of(rank, t);
      if (std::find(followed.begin(), followed.end(), key) != followed.end()) continue;
      v1::StepTensor& st = candidates.emplace_back();
      st.set_rank(rank);
      *st.mutable_stats() = t;
      st.set_why(std::move(why));
      followed.push_back(key);
      ranks.insert(rank);
    }
    r.clear_tensors();
    r.clear_quantizers();
    r.clear_history();
    *out.add_reports() = std::move(r);
  }

  // Every full sample of a followed series in [from, step): the history rows, and the full
  // samples of the reports themselves.
  std::map<SeriesKey, std::vector<v1::HistorySample>> samples;
  for (const SeriesKey& k : followed) samples[k];
  Statement h = conn_->prepare(
      "SELECT step, stats FROM tensor_history WHERE run = ?1 AND name = ?2 AND step >= ?3 AND "
      "step < ?4 AND rank = ?5 AND role = ?6 AND phase = ?7 ORDER BY step");
  for (const SeriesKey& k : followed) {
    h.bind(1, *run).bind(2, k.name).bind(3, from).bind(4, q.step());
    h.bind(5, std::int64_t{k.rank}).bind(6, std::int64_t{k.role}).bind(7, std::int64_t{k.phase});
    while (h.step()) {
      v1::HistorySample sample;
      sample.set_step(h.column_int(0));
      sample.set_rank(k.rank);
      sample.set_from_flight_recorder(true);
      if (parse_blob(h.column_blob(1), sample.mutable_stats())) {
        samples[k].push_back(std::move(sample));
      }
    }
    h.reset();
  }
  Statement before = conn_->prepare(
      "SELECT payload, rank, step FROM reports WHERE run = ?1 AND step >= ?2 AND step < ?3 "
      "ORDER BY step, rank, id");
  before.bind(1, *run).bind(2, from).bind(3, q.step());
  while (!followed.empty() && before.step()) {
    const auto rank = static_cast<std::uint32_t>(before.column_int(1));
    if (!ranks.contains(rank)) continue;
    v1::StepReport r;
    if (!parse_blob(before.column_blob(0), &r)) continue;
    for (const v1::TensorStats& t : r.tensors()) {
      if (t.level() != v1::STATS_LEVEL_FULL) continue;
      const auto it = samples.find(key_of(rank, t));
      if (it == samples.end()) continue;
      v1::HistorySample& sample = it->second.emplace_back();
      sample.set_step(before.column_int(2));
      sample.set_rank(rank);
      *sample.mutable_stats() = t;
    }
  }

  // The tensors with history first (each group in the step's order), at most kMaxStepTensors.
  std::vector<std::size_t> order(candidates.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_partition(order.begin(), order.end(),
                        [&](std::size_t i) { return !samples[followed[i]].empty(); });
  if (order.size() > static_cast<std::size_t>(kMaxStepTensors)) order.resize(kMaxStepTensors);
  for (std::size_t i : order) {
    *out.add_tensors() = std::move(candidates[i]);
    std::vector<v1::HistorySample>& list = samples[followed[i]];
    std::stable_sort(list.begin(), list.end(), [](const auto& a, const auto& b) {
      return std::make_pair(a.step(), a.stats().micro_step()) <
             std::make_pair(b.step(), b.stats().micro_step());
    });
    for (v1::HistorySample& sample : list) {
      if (out.history_size() == kMaxHistorySamples) break;
      *out.add_history() = std::move(sample);
    }
  }
  return out;
}

}  // namespace ampscope::server
