// The web UI's series: a run's steps cut into as many buckets as the page has points, each
// series aggregated in SQL (GROUP BY the bucket, one statement per series) over index-only
// scans (reports_series, report_counts), so that a long run's page costs what its width costs
// plus one pass over the steps in range. The lists (skips, offenders, decisions, tensors,
// agents, divergences) are get_run's, bounded and cut to the range.
#include <algorithm>
#include <array>
#include <limits>

#include "ampscope/vocabulary.h"
#include "store.h"

namespace ampscope::server {
namespace {

// A read transaction: every statement of one answer sees the same committed state.
class ReadSnapshot {
 public:
  explicit ReadSnapshot(Connection& c) : c_(c) { c_.exec("BEGIN"); }
  ~ReadSnapshot() {
    try {
      c_.exec("COMMIT");
    } catch (const StoreError&) {
      // A read transaction has nothing to lose; the next BEGIN starts afresh.
    }
  }
  ReadSnapshot(const ReadSnapshot&) = delete;
  ReadSnapshot& operator=(const ReadSnapshot&) = delete;

 private:
  Connection& c_;
};

std::optional<double> optional_double(const Statement& s, int col) {
  return s.column_is_null(col) ? std::nullopt : std::optional<double>(s.column_double(col));
}

// The run's first and last step, and whether it has a report at all.
struct StepExtent {
  std::int64_t first = 0;
  std::int64_t last = 0;
  bool any = false;
};

StepExtent step_extent(Connection& c, std::int64_t run) {
  Statement s = c.prepare("SELECT min(step), max(step), count(*) FROM reports WHERE run = ?1");
  s.bind(1, run);
  StepExtent e;
  if (s.step() && s.column_int(2) > 0) e = {s.column_int(0), s.column_int(1), true};
  return e;
}

StepBuckets buckets_for(const StepExtent& extent, const SeriesRequest& q) {
  if (!extent.any && !(q.from && q.to)) return StepBuckets{};
  return StepBuckets::cut(q.from.value_or(extent.first), q.to.value_or(extent.last), q.width);
}

// ?2 = from, ?3 = to, ?4 = bucket_steps in every statement below; ?1 = the run.
void bind_range(Statement& s, std::int64_t run, const StepBuckets& r) {
  s.bind(1, run).bind(2, r.from).bind(3, r.to).bind(4, r.bucket_steps);
}

std::vector<StepPoint> step_points(Connection& c, std::int64_t run, const StepBuckets& r) {
  // The latest val_loss and the lowest rank's scale at the bucket's last step are looked up
  // per bucket, in the same covering index.
  Statement s = c.prepare(
      "SELECT g.first, g.last, g.reports, g.loss, g.loss_min, g.loss_max, g.scale_min, "
      "g.scale_max, g.skipped, g.found_inf, "
      "(SELECT loss_scale FROM reports l WHERE l.run = ?1 AND l.step = g.last ORDER BY l.rank "
      "LIMIT 1), "
      "(SELECT val_loss FROM reports v WHERE v.run = ?1 AND v.step >= g.first AND "
      "v.step <= g.last AND v.val_loss IS NOT NULL ORDER BY v.step DESC, v.rank LIMIT 1) "
      "FROM (SELECT (step - ?2) / ?4 AS bucket, min(step) AS first, max(step) AS last, "
      "count(*) AS reports, avg(loss) AS loss, min(loss) AS loss_min, max(loss) AS loss_max, "
      "min(loss_scale) AS scale_min, max(loss_scale) AS scale_max, "
      "count(DISTINCT CASE WHEN skipped != 0 THEN step END) AS skipped, "
      "count(DISTINCT CASE WHEN found_inf != 0 THEN step END) AS found_inf "
      "FROM reports WHERE run = ?1 AND step >= ?2 AND step <= ?3 GROUP BY bucket) g "
      "ORDER BY g.bucket");
  bind_range(s, run, r);
  std::vector<StepPoint> out;
  while (s.step()) {
    StepPoint& p = out.emplace_back();
    p.step = s.column_int(0);
    p.last_step = s.column_int(1);
    p.reports = s.column_int(2);
    p.loss = optional_double(s, 3);
    p.loss_min = optional_double(s, 4);
    p.loss_max = optional_double(s, 5);
    p.scale_min = s.column_double(6);
    p.scale_max = s.column_double(7);
    p.skipped = s.column_int(8);
    p.found_inf = s.column_int(9);
    p.scale_last = s.column_double(10);
    p.val_loss = optional_double(s, 11);
  }
  return out;
}

std::vector<CountSeries> count_series(Connection& c, std::int64_t run, const StepBuckets& r) {
  Statement s = c.prepare(
      "SELECT role, format, min(step), sum(checked), sum(underflow), sum(overflow), "
      "sum(subnormal), sum(nonfinite) FROM report_counts WHERE run = ?1 AND step >= ?2 AND "
      "step <= ?3 GROUP BY role, format, (step - ?2) / ?4 ORDER BY role, format, min(step)");
  bind_range(s, run, r);
  std::vector<CountSeries> out;
  while (s.step()) {
    const int role = static_cast<int>(s.column_int(0));
    const int format = static_cast<int>(s.column_int(1));
    if (out.empty() || out.back().role != role || out.back().format != format) {
      out.push_back(CountSeries{role, format, {}});
    }
    CountPoint& p = out.back().points.emplace_back();
    p.step = s.column_int(2);
    p.checked = static_cast<std::uint64_t>(s.column_int(3));
    p.underflow = static_cast<std::uint64_t>(s.column_int(4));
    p.overflow = static_cast<std::uint64_t>(s.column_int(5));
    p.subnormal = static_cast<std::uint64_t>(s.column_int(6));
    p.nonfinite = static_cast<std::uint64_t>(s.column_int(7));
  }
  return out;
}

std::vector<RankSeries> rank_series(Connection& c, std::int64_t run, const StepBuckets& r) {
  Statement s = c.prepare(
      "SELECT rank, min(step), avg(step_time_s), avg(tensor_core_active_ratio) FROM reports "
      "WHERE run = ?1 AND step >= ?2 AND step <= ?3 GROUP BY rank, (step - ?2) / ?4 "
      "ORDER BY rank, min(step)");
  bind_range(s, run, r);
  std::vector<RankSeries> out;
  while (s.step()) {
    const auto rank = static_cast<std::uint32_t>(s.column_int(0));
    if (out.empty() || out.back().rank != rank) out.push_back(RankSeries{rank, {}});
    out.back().points.push_back(
        RankPoint{s.column_int(1), optional_double(s, 2), optional_double(s, 3)});
  }
  return out;
}

// The latest FULL sample of the tensor per phase, in one bucket.
using PhaseSamples = std::array<std::optional<TensorSample>, kNumTensorPhases>;

// A later step first; at one step the lower rank, and a report before the flight recorder.
bool later(const TensorSample& a, const TensorSample& b) {
  if (a.step != b.step) return a.step > b.step;
  if (a.rank != b.rank) return a.rank < b.rank;
  return !a.from_flight_recorder && b.from_flight_recorder;
}

void offer(PhaseSamples& best, TensorSample sample) {
  const int phase = static_cast<int>(sample.stats.phase());
  if (phase < 0 || phase >= kNumTensorPhases) return;
  std::optional<TensorSample>& slot = best[static_cast<std::size_t>(phase)];
  if (!slot || later(sample, *slot)) slot = std::move(sample);
}

}  // namespace

StepBuckets StepBuckets::cut(std::int64_t from, std::int64_t to, std::int64_t width) {
  StepBuckets b;
  b.from = from;
  b.to = to;
  if (to < from || width <= 0) {
    b.to = from - 1;
    return b;
  }
  // ceil((to - from + 1) / width) written so that it cannot overflow for any from <= to.
  const auto span = static_cast<std::uint64_t>(to) - static_cast<std::uint64_t>(from);
  const auto w = static_cast<std::uint64_t>(width);
  b.bucket_steps = static_cast<std::int64_t>(span / w + 1);
  b.buckets = static_cast<std::int64_t>(span / static_cast<std::uint64_t>(b.bucket_steps) + 1);
  return b;
}

std::optional<RunView> StoreReader::run_series(const std::string& run_id,
                                                 const SeriesRequest& q) {
  std::lock_guard lock(mu_);
  ReadSnapshot snapshot(*conn_);
  const std::optional<std::int64_t> run = run_key(run_id);
  if (!run) return std::nullopt;
  RunView out;
  fill_summary(*run, &out.summary);
  {
    Statement s = conn_->prepare("SELECT coalesce(max(id), 0) FROM reports WHERE run = ?1");
    s.bind(1, *run);
    if (s.step()) out.max_report_id = s.column_int(0);
  }
  const StepExtent extent{out.summary.first_step(), out.summary.last_step(),
                          out.summary.reports() > 0};
  out.range = buckets_for(extent, q);
  const StepBuckets& r = out.range;
  if (r.buckets > 0) {
    out.steps = step_points(*conn_, *run, r);
    out.counts = count_series(*conn_, *run, r);
    out.ranks = rank_series(*conn_, *run, r);
    out.skips = skipped_steps(*run, r.from, r.to, kSeriesSkips, /*latest=*/true);
    out.offenders = first_offenders(*run, r.from, r.to, kSeriesOffenders, /*latest=*/true);
    out.scale_changes = scale_timeline(*run, r.from, r.to);
  }
  out.decisions = decisions(*run, kSeriesDecisions);
  out.tensors = tensor_records(
      *run,
      "1 ORDER BY nonfinite DESC, overflow * 1.0 / max(\"values\", 1) DESC, "
      "underflow * 1.0 / max(\"values\", 1) DESC, name",
      kSeriesTensors);
  out.agents = agents(*run);
  out.divergences = divergences(*run, kSeriesDivergences);
  return out;
}

std::optional<TensorSeries> StoreReader::tensor_series(const std::string& run_id,
                                                       const TensorRequest& q) {
  std::lock_guard lock(mu_);
  ReadSnapshot snapshot(*conn_);
  const std::optional<std::int64_t> run = run_key(run_id);
  if (!run) return std::nullopt;
  TensorSeries out;
  const StepExtent extent = step_extent(*conn_, *run);
  out.first_step = extent.first;
  out.last_step = extent.last;
  out.range = buckets_for(extent, q.range);
  const StepBuckets& r = out.range;

  // Bounded by the width, not by the run's length: per bucket at most kProbeReports payloads
  // are parsed (the bucket's last reports, from its last step backwards) and at most
  // kProbeHistory flight-recorder rows read (the index on (run, name, step) finds them), so a
  // column costs the same in a 1,000-step run and in a 10,000,000-step one. A bucket whose last
  // reports carry no FULL sample of the tensor and no history row has no column.
  constexpr std::int64_t kProbeReports = 4;
  constexpr std::int64_t kProbeHistory = 8;
  Statement reports = conn_->prepare(
      "SELECT step, rank, payload FROM reports WHERE run = ?1 AND step >= ?2 AND step <= ?3 "
      "ORDER BY step DESC, rank LIMIT ?4");
  Statement history = conn_->prepare(
      std::string("SELECT step, rank, stats FROM tensor_history WHERE run = ?1 AND name = ?2 "
                  "AND step >= ?3 AND step <= ?4 AND role = ?5") +
      (q.phase ? " AND phase = ?6" : "") + " ORDER BY step DESC, rank LIMIT ?7");
  std::vector<PhaseSamples> buckets;
  std::optional<TensorSample> latest;  // over every bucket and phase
  for (std::int64_t b = 0; b < r.buckets; ++b) {
    const std::int64_t lo = r.from + b * r.bucket_steps;
    const std::int64_t hi = std::min(r.to, lo + (r.bucket_steps - 1));
    PhaseSamples& best = buckets.emplace_back();
    const auto matches = [&](const v1::TensorStats& t) {
      return t.level() == v1::STATS_LEVEL_FULL && t.name() == q.name &&
             static_cast<int>(t.role()) == q.role &&
             (!q.phase || static_cast<int>(t.phase()) == *q.phase);
    };
    reports.bind(1, *run).bind(2, lo).bind(3, hi).bind(4, kProbeReports);
    while (reports.step()) {
      v1::StepReport report;
      const std::string_view blob = reports.column_blob(2);
      if (!report.ParseFromArray(blob.data(), static_cast<int>(blob.size()))) continue;
      for (v1::TensorStats& t : *report.mutable_tensors()) {
        if (!matches(t)) continue;  // the last match of a phase in the step wins (offer)
        offer(best, TensorSample{reports.column_int(0),
                                 static_cast<std::uint32_t>(reports.column_int(1)), false,
                                 std::move(t)});
      }
    }
    reports.reset();
    history.bind(1, *run).bind(2, q.name).bind(3, lo).bind(4, hi).bind(5, std::int64_t{q.role});
    if (q.phase) history.bind(6, std::int64_t{*q.phase});
    history.bind(7, kProbeHistory);
    while (history.step()) {
      TensorSample sample{history.column_int(0),
                          static_cast<std::uint32_t>(history.column_int(1)), true, {}};
      const std::string_view blob = history.column_blob(2);
      if (!sample.stats.ParseFromArray(blob.data(), static_cast<int>(blob.size())) ||
          !matches(sample.stats)) {
        continue;
      }
      offer(best, std::move(sample));
    }
    history.reset();
    for (const std::optional<TensorSample>& s : best) {
      if (s && (!latest || later(*s, *latest))) latest = *s;
    }
  }
  out.phase = q.phase.value_or(latest ? static_cast<int>(latest->stats.phase()) : 0);
  for (PhaseSamples& best : buckets) {
    std::optional<TensorSample>& s = best[static_cast<std::size_t>(out.phase)];
    if (s) out.columns.push_back(std::move(*s));
  }
  return out;
}

std::optional<std::int64_t> StoreReader::max_report_id(const std::string& run_id) {
  std::lock_guard lock(mu_);
  const std::optional<std::int64_t> run = run_key(run_id);
  if (!run) return std::nullopt;
  Statement s = conn_->prepare("SELECT coalesce(max(id), 0) FROM reports WHERE run = ?1");
  s.bind(1, *run);
  return s.step() ? s.column_int(0) : 0;
}

std::map<std::string, RecentReports> StoreReader::recent_reports(std::int64_t since_ns) {
  std::lock_guard lock(mu_);
  ReadSnapshot snapshot(*conn_);
  // Report ids follow commit order and so, closely enough for a ten-minute window, the
  // receive time: the first id received since then is found by bisection on the rowid, and
  // each run's window is a rowid range (`+run` keeps SQLite on that range).
  std::int64_t lo = conn_->query_int("SELECT coalesce(min(id), 0) FROM reports");
  std::int64_t hi = conn_->query_int("SELECT coalesce(max(id), 0) FROM reports") + 1;
  Statement at = conn_->prepare(
      "SELECT id, received_ns FROM reports WHERE id >= ?1 ORDER BY id LIMIT 1");
  while (lo < hi) {
    // Is the first report at or after `mid` recent (or is there none)? Ids that do not exist
    // between `mid` and the one found answer the same.
    const std::int64_t mid = lo + (hi - lo) / 2;
    at.bind(1, mid);
    const bool found = at.step();
    const std::int64_t id = found ? at.column_int(0) : hi;
    const bool recent = !found || at.column_int(1) >= since_ns;
    at.reset();
    if (recent) {
      hi = mid;
    } else {
      lo = id + 1;
    }
  }
  const std::int64_t first_id = lo;

  std::map<std::string, RecentReports> out;
  Statement runs = conn_->prepare("SELECT id, run_id FROM runs WHERE last_seen_ns >= ?1");
  runs.bind(1, since_ns);
  Statement steps = conn_->prepare(
      "SELECT count(DISTINCT step), count(DISTINCT CASE WHEN skipped != 0 THEN step END), "
      "coalesce(max(loss IS NULL), 0), min(step) FROM reports WHERE id >= ?2 AND +run = ?1");
  Statement scale = conn_->prepare(
      "SELECT loss_scale FROM reports WHERE id >= ?2 AND +run = ?1 ORDER BY step DESC, rank "
      "LIMIT 1");
  Statement counts = conn_->prepare(
      "SELECT role, format, sum(checked), sum(underflow), sum(overflow), sum(subnormal), "
      "sum(nonfinite) FROM report_counts WHERE run = ?1 AND step >= ?3 AND report >= ?2 "
      "GROUP BY role, format ORDER BY role, format");
  Statement divergent = conn_->prepare(
      "SELECT count(DISTINCT step) FROM rank_divergences WHERE run = ?1 AND step >= ?2");
  while (runs.step()) {
    const std::int64_t run = runs.column_int(0);
    RecentReports recent;
    steps.bind(1, run).bind(2, first_id);
    const bool any = steps.step() && steps.column_int(0) > 0;
    if (any) {
      recent.steps = steps.column_int(0);
      recent.skipped_steps = steps.column_int(1);
      recent.nonfinite_loss = steps.column_int(2) != 0;
      const std::int64_t first_step = steps.column_int(3);
      scale.bind(1, run).bind(2, first_id);
      if (scale.step()) recent.last_loss_scale = scale.column_double(0);
      scale.reset();
      counts.bind(1, run).bind(2, first_id).bind(3, first_step);
      while (counts.step()) {
        recent.counts.push_back(ReportCounts{static_cast<int>(counts.column_int(0)),
                                             static_cast<int>(counts.column_int(1)),
                                             static_cast<std::uint64_t>(counts.column_int(2)),
                                             static_cast<std::uint64_t>(counts.column_int(3)),
                                             static_cast<std::uint64_t>(counts.column_int(4)),
                                             static_cast<std::uint64_t>(counts.column_int(5)),
                                             static_cast<std::uint64_t>(counts.column_int(6))});
      }
      counts.reset();
      divergent.bind(1, run).bind(2, first_step);
      if (divergent.step()) recent.divergent_steps = divergent.column_int(0);
      divergent.reset();
    }
    steps.reset();
    out.emplace(runs.column_text(1), std::move(recent));
  }
  return out;
}

}  // namespace ampscope::server
