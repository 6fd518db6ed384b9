// The web UI's series: a run's steps cut into as many buckets as the page has points. Each
// series is one statement, an index-only scan of the steps in range in step order (the
// covering index reports_series, report_counts' primary key), folded into its buckets as the
// rows arrive; no payload is read. The lists (skips, offenders, decisions, tensors, agents,
// divergences) are get_run's, bounded and cut to the range.
#include <algorithm>
#include <array>
#include <limits>
#include <map>

#include "ampscope/vocabulary.h"
#include "store.h"

namespace ampscope::server {
namespace {

// A read transaction: every statement of one answer sees the same committed state.
class ReadSnapshot {
 public:
  explicit ReadSnapshot(Connection& c) : c_(c) { c_.begin_read(); }
  ~ReadSnapshot() {
    try {
      c_.commit();
    } catch (const StoreError&) {
      // A read transaction has nothing to lose; the next BEGIN starts afresh.
    }
  }
  ReadSnapshot(const ReadSnapshot&) = delete;
  ReadSnapshot& operator=(const ReadSnapshot&) = delete;

 private:
  Connection& c_;
};

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

// --- The alerts' window ----------------------------------------------------------------------
// A run's reports received since a time: those with id >= first_report_since() (report ids
// follow commit order and so, closely enough for a ten-minute window, the receive time) and a
// step from the run's first such report on, so that the window is a step range of the indexes.
std::int64_t first_report_since(Connection& c, std::int64_t since_ns) {
  std::int64_t lo = c.query_int("SELECT coalesce(min(id), 0) FROM reports");
  std::int64_t hi = c.query_int("SELECT coalesce(max(id), 0) FROM reports") + 1;
  Statement at =
      c.prepare("SELECT id, received_ns FROM reports WHERE id >= ?1 ORDER BY id LIMIT 1");
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
  return lo;
}

// The step of the run's first report with id >= first_id; nullopt without one. `+run` keeps
// SQLite on the rowid range (PostgreSQL reads it as the same number).
std::optional<std::int64_t> window_first_step(Connection& c, std::int64_t run,
                                              std::int64_t first_id) {
  Statement s =
      c.prepare("SELECT step FROM reports WHERE +run = ?1 AND id >= ?2 ORDER BY id LIMIT 1");
  s.bind(1, run).bind(2, first_id);
  return s.step() ? std::optional<std::int64_t>(s.column_int(0)) : std::nullopt;
}

// Adds up the window's rows; the series scans feed it when the window lies in their range.
class WindowFold {
 public:
  WindowFold(std::int64_t first_id, std::int64_t first_step)
      : first_id_(first_id), first_step_(first_step) {}
  std::int64_t first_id() const { return first_id_; }
  std::int64_t first_step() const { return first_step_; }
  bool holds(std::int64_t id, std::int64_t step) const {
    return id >= first_id_ && step >= first_step_;
  }
  // Rows in step order, ranks ascending within a step.
  void add_report(std::int64_t step, bool skipped, bool loss_not_finite, double loss_scale) {
    if (step != last_step_) {
      ++recent_.steps;
      recent_.last_loss_scale = loss_scale;  // the lowest rank's
      last_step_ = step;
    }
    if (skipped && skipped_at_ != step) {
      ++recent_.skipped_steps;
      skipped_at_ = step;
    }
    recent_.nonfinite_loss = recent_.nonfinite_loss || loss_not_finite;
  }
  void add_counts(const ReportCounts& row) {
    auto it = std::find_if(recent_.counts.begin(), recent_.counts.end(), [&](const auto& c) {
      return c.role == row.role && c.format == row.format;
    });
    if (it == recent_.counts.end())
      it = recent_.counts.insert(it, ReportCounts{row.role, row.format});
    it->checked += row.checked;
    it->underflow += row.underflow;
    it->overflow += row.overflow;
    it->subnormal += row.subnormal;
    it->nonfinite += row.nonfinite;
  }
  RecentReports finish(Connection& c, std::int64_t run) {
    std::sort(recent_.counts.begin(), recent_.counts.end(), [](const auto& a, const auto& b) {
      return std::make_pair(a.role, a.format) < std::make_pair(b.role, b.format);
    });
    Statement s = c.prepare(
        "SELECT count(DISTINCT step) FROM rank_divergences WHERE run = ?1 AND step >= ?2");
    s.bind(1, run).bind(2, first_step_);
    if (s.step()) recent_.divergent_steps = s.column_int(0);
    return std::move(recent_);
  }

 private:
  std::int64_t first_id_, first_step_;
  std::int64_t last_step_ = -1;
  std::int64_t skipped_at_ = -1;
  RecentReports recent_;
};

ReportCounts counts_at(const Statement& s, int col) {
  return ReportCounts{static_cast<int>(s.column_int(col)),
                      static_cast<int>(s.column_int(col + 1)),
                      static_cast<std::uint64_t>(s.column_int(col + 2)),
                      static_cast<std::uint64_t>(s.column_int(col + 3)),
                      static_cast<std::uint64_t>(s.column_int(col + 4)),
                      static_cast<std::uint64_t>(s.column_int(col + 5)),
                      static_cast<std::uint64_t>(s.column_int(col + 6))};
}

// The window of a run on its own scans (when no series scan covers it).
RecentReports scan_window(Connection& c, std::int64_t run, std::int64_t first_id) {
  const std::optional<std::int64_t> first_step = window_first_step(c, run, first_id);
  if (!first_step) return {};
  WindowFold fold(first_id, *first_step);
  Statement steps = c.prepare(
      "SELECT step, skipped, CASE WHEN loss IS NULL THEN 1 ELSE 0 END, loss_scale FROM reports "
      "WHERE run = ?1 AND "
      "step >= ?3 AND id >= ?2 ORDER BY step, rank");
  steps.bind(1, run).bind(2, first_id).bind(3, *first_step);
  while (steps.step()) {
    fold.add_report(steps.column_int(0), steps.column_int(1) != 0, steps.column_int(2) != 0,
                    steps.column_double(3));
  }
  Statement counts = c.prepare(
      "SELECT role, format, checked, underflow, overflow, subnormal, nonfinite FROM "
      "report_counts WHERE run = ?1 AND step >= ?3 AND report >= ?2");
  counts.bind(1, run).bind(2, first_id).bind(3, *first_step);
  while (counts.step()) fold.add_counts(counts_at(counts, 0));
  return fold.finish(c, run);
}

// ?1 = the run, ?2 = from, ?3 = to in every statement below.
void bind_range(Statement& s, std::int64_t run, const StepBuckets& r) {
  s.bind(1, run).bind(2, r.from).bind(3, r.to);
}

// Each series is one index-ordered scan of the range (reports_series, report_counts' primary
// key: no sort, no payload) folded into buckets as its rows arrive in step order. SQLite's
// GROUP BY on the bucket expression sorts every row of the range first (it cannot know the
// expression follows the index): on 100,000 steps that sort was 4 to 10 times the scan.
std::int64_t bucket_of(const StepBuckets& r, std::int64_t step) {
  return (step - r.from) / r.bucket_steps;
}

// `window`: adds the rows of the alerts' window to it too (null: none).
std::vector<StepPoint> step_points(Connection& c, std::int64_t run, const StepBuckets& r,
                                   WindowFold* window) {
  Statement s = c.prepare(
      "SELECT step, loss, loss_scale, skipped, found_inf, val_loss, id FROM reports "
      "WHERE run = ?1 AND step >= ?2 AND step <= ?3 ORDER BY step, rank");
  bind_range(s, run, r);
  std::vector<StepPoint> out;
  std::int64_t bucket = -1;
  double loss_sum = 0;
  std::int64_t losses = 0;
  std::int64_t val_step = -1;
  std::int64_t skipped_at = -1;    // the last step counted as skipped
  std::int64_t found_inf_at = -1;  // ... as found_inf
  const auto close = [&] {
    if (losses > 0) out.back().loss = loss_sum / static_cast<double>(losses);
  };
  while (s.step()) {
    const std::int64_t step = s.column_int(0);
    const double scale = s.column_double(2);
    const bool new_step = out.empty() || step != out.back().last_step;
    if (const std::int64_t b = bucket_of(r, step); b != bucket) {
      if (!out.empty()) close();
      bucket = b;
      out.push_back(StepPoint{step, step, 0, {}, {}, {}, {}, scale, scale, scale, 0, 0});
      loss_sum = 0;
      losses = 0;
      val_step = -1;
    }
    StepPoint& p = out.back();
    ++p.reports;
    if (new_step) {
      p.last_step = step;
      p.scale_last = scale;  // the lowest rank's: rows come by rank within a step
    }
    if (!s.column_is_null(1)) {
      const double loss = s.column_double(1);
      loss_sum += loss;
      ++losses;
      p.loss_min = std::min(p.loss_min.value_or(loss), loss);
      p.loss_max = std::max(p.loss_max.value_or(loss), loss);
    }
    p.scale_min = std::min(p.scale_min, scale);
    p.scale_max = std::max(p.scale_max, scale);
    // Distinct steps: a step's later ranks add nothing once one of them counted it.
    if (s.column_int(3) != 0 && skipped_at != step) {
      ++p.skipped;
      skipped_at = step;
    }
    if (s.column_int(4) != 0 && found_inf_at != step) {
      ++p.found_inf;
      found_inf_at = step;
    }
    if (!s.column_is_null(5) && step > val_step) {
      p.val_loss = s.column_double(5);
      val_step = step;
    }
    if (window != nullptr && window->holds(s.column_int(6), step)) {
      window->add_report(step, s.column_int(3) != 0, s.column_is_null(1), scale);
    }
  }
  if (!out.empty()) close();
  return out;
}

std::vector<CountSeries> count_series(Connection& c, std::int64_t run, const StepBuckets& r,
                                      WindowFold* window) {
  Statement s = c.prepare(
      "SELECT step, report, role, format, checked, underflow, overflow, subnormal, nonfinite "
      "FROM report_counts WHERE run = ?1 AND step >= ?2 AND step <= ?3 ORDER BY step");
  bind_range(s, run, r);
  // A run has a handful of (role, format) series: a linear search beats a map per row.
  std::vector<CountSeries> out;
  std::vector<std::int64_t> buckets;  // of each series' last point
  while (s.step()) {
    const std::int64_t step = s.column_int(0);
    const ReportCounts row = counts_at(s, 2);
    if (window != nullptr && window->holds(s.column_int(1), step)) window->add_counts(row);
    const int role = row.role;
    const int format = row.format;
    std::size_t i = 0;
    while (i < out.size() && (out[i].role != role || out[i].format != format)) ++i;
    if (i == out.size()) {
      out.push_back(CountSeries{role, format, {}});
      buckets.push_back(-1);
    }
    CountSeries& cs = out[i];
    if (const std::int64_t b = bucket_of(r, step); b != buckets[i]) {
      cs.points.push_back(CountPoint{step});
      buckets[i] = b;
    }
    CountPoint& p = cs.points.back();
    p.checked += row.checked;
    p.underflow += row.underflow;
    p.overflow += row.overflow;
    p.subnormal += row.subnormal;
    p.nonfinite += row.nonfinite;
  }
  std::sort(out.begin(), out.end(), [](const CountSeries& a, const CountSeries& b) {
    return std::make_pair(a.role, a.format) < std::make_pair(b.role, b.format);
  });
  return out;
}

std::vector<RankSeries> rank_series(Connection& c, std::int64_t run, const StepBuckets& r) {
  Statement s = c.prepare(
      "SELECT rank, step, step_time_s, tensor_core_active_ratio FROM reports "
      "WHERE run = ?1 AND step >= ?2 AND step <= ?3 ORDER BY step, rank");
  bind_range(s, run, r);
  struct Sums {
    std::int64_t bucket = -1;
    double time = 0, ratio = 0;
    std::int64_t times = 0, ratios = 0;
  };
  std::map<std::uint32_t, std::pair<RankSeries, Sums>> ranks;
  const auto close = [](RankSeries& rs, Sums& sums) {
    if (rs.points.empty()) return;
    RankPoint& p = rs.points.back();
    if (sums.times > 0) p.step_time_s = sums.time / static_cast<double>(sums.times);
    if (sums.ratios > 0) p.tensor_core_active_ratio = sums.ratio / static_cast<double>(sums.ratios);
    sums = Sums{sums.bucket};
  };
  while (s.step()) {
    const auto rank = static_cast<std::uint32_t>(s.column_int(0));
    const std::int64_t step = s.column_int(1);
    auto& [rs, sums] = ranks[rank];
    rs.rank = rank;
    if (const std::int64_t b = bucket_of(r, step); b != sums.bucket) {
      close(rs, sums);
      sums.bucket = b;
      rs.points.push_back(RankPoint{step, {}, {}});
    }
    if (!s.column_is_null(2)) {
      sums.time += s.column_double(2);
      ++sums.times;
    }
    if (!s.column_is_null(3)) {
      sums.ratio += s.column_double(3);
      ++sums.ratios;
    }
  }
  std::vector<RankSeries> out;  // by rank
  for (auto& [rank, series] : ranks) {
    close(series.first, series.second);
    out.push_back(std::move(series.first));
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

// The latest sample of each quantiser in one bucket, by name.
using QuantizerSamples = std::map<std::string, QuantizerSample>;

void offer(QuantizerSamples& best, QuantizerSample sample) {
  auto [it, fresh] = best.try_emplace(sample.stats.name());
  QuantizerSample& slot = it->second;
  const bool newer = sample.step != slot.step ? sample.step > slot.step : sample.rank < slot.rank;
  if (fresh || newer) slot = std::move(sample);
}

// StepReport.bf16_gemms of the run's latest report, lowest rank at that step.
void latest_bf16_gemms(Connection& c, std::int64_t run, RunView* out) {
  Statement s = c.prepare(
      "SELECT step, payload FROM reports WHERE run = ?1 ORDER BY step DESC, rank LIMIT 1");
  s.bind(1, run);
  if (!s.step()) return;
  v1::StepReport report;
  const std::string_view blob = s.column_blob(1);
  if (!report.ParseFromArray(blob.data(), static_cast<int>(blob.size()))) return;
  out->bf16_gemms.assign(report.bf16_gemms().begin(), report.bf16_gemms().end());
  out->bf16_gemms_step = s.column_int(0);
}

}  // namespace

bool quantizes_tensor(std::string_view quantizer, std::string_view tensor) {
  if (quantizer.substr(0, tensor.size()) != tensor) return false;
  const std::string_view rest = quantizer.substr(tensor.size());
  return rest.empty() || rest.front() == '@' || rest.substr(0, 2) == " [";
}

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

std::optional<RunView> StoreReader::run_series(const std::string& run_id, const SeriesRequest& q,
                                               std::optional<std::int64_t> alerts_since_ns) {
  const auto lock = lock_connected();
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
  // The alerts' window rides on the series' scans when they cover it (the page's live view: the
  // range runs to the last step), and is scanned on its own otherwise.
  std::optional<WindowFold> window;
  std::optional<std::int64_t> first_id;
  if (alerts_since_ns) {
    first_id = first_report_since(*conn_, *alerts_since_ns);
    if (const std::optional<std::int64_t> first_step = window_first_step(*conn_, *run, *first_id);
        !first_step) {
      out.recent = RecentReports{};
    } else if (r.buckets > 0 && *first_step >= r.from && extent.last <= r.to) {
      window.emplace(*first_id, *first_step);
    }
  }
  WindowFold* fold = window ? &*window : nullptr;
  if (r.buckets > 0) {
    out.steps = step_points(*conn_, *run, r, fold);
    out.counts = count_series(*conn_, *run, r, fold);
    out.ranks = rank_series(*conn_, *run, r);
    out.skips = skipped_steps(*run, r.from, r.to, kSeriesSkips, /*latest=*/true);
    out.offenders = first_offenders(*run, r.from, r.to, kSeriesOffenders, /*latest=*/true);
    out.scale_changes = scale_timeline(*run, r.from, r.to);
    // In the range, as the markers drawn on it: a long run's latest decisions would leave a
    // zoomed-in earlier range without any.
    out.decisions = decisions(*run, kSeriesDecisions, r.from, r.to);
  } else {
    out.decisions = decisions(*run, kSeriesDecisions);
  }
  out.tensors = tensor_records(*run,
                               "TRUE ORDER BY nonfinite DESC, overflow * 1.0 / " +
                                   sql_greatest("\"values\"", "1") + " DESC, underflow * 1.0 / " +
                                   sql_greatest("\"values\"", "1") + " DESC, name",
                               kSeriesTensors);
  out.agents = agents(*run);
  out.divergences = divergences(*run, kSeriesDivergences);
  out.quantizers = quantizer_records(*run);
  latest_bf16_gemms(*conn_, *run, &out);
  if (window) {
    out.recent = window->finish(*conn_, *run);
  } else if (first_id && !out.recent) {
    out.recent = scan_window(*conn_, *run, *first_id);
  }
  return out;
}

std::optional<TensorSeries> StoreReader::tensor_series(const std::string& run_id,
                                                       const TensorRequest& q) {
  const auto lock = lock_connected();
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
    // Compared as a distance: lo + bucket_steps - 1 may pass the largest int64 in the last one.
    const std::int64_t hi = r.to - lo < r.bucket_steps - 1 ? r.to : lo + (r.bucket_steps - 1);
    PhaseSamples& best = buckets.emplace_back();
    QuantizerSamples quantizers;
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
        offer(best,
              TensorSample{reports.column_int(0), static_cast<std::uint32_t>(reports.column_int(1)),
                           false, std::move(t)});
      }
      for (v1::QuantizerStats& z : *report.mutable_quantizers()) {
        if (static_cast<int>(z.role()) != q.role || !quantizes_tensor(z.name(), q.name)) continue;
        offer(quantizers, QuantizerSample{reports.column_int(0),
                                          static_cast<std::uint32_t>(reports.column_int(1)),
                                          report.loss_scale(), std::move(z)});
      }
    }
    reports.reset();
    history.bind(1, *run).bind(2, q.name).bind(3, lo).bind(4, hi).bind(5, std::int64_t{q.role});
    if (q.phase) history.bind(6, std::int64_t{*q.phase});
    history.bind(7, kProbeHistory);
    while (history.step()) {
      TensorSample sample{
          history.column_int(0), static_cast<std::uint32_t>(history.column_int(1)), true, {}};
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
    for (auto& [name, sample] : quantizers) out.quantizers.push_back(std::move(sample));
  }
  // By name, then step (the buckets are ascending).
  std::stable_sort(out.quantizers.begin(), out.quantizers.end(),
                   [](const QuantizerSample& a, const QuantizerSample& b) {
                     return a.stats.name() < b.stats.name();
                   });
  for (v1::QuantizerRecord& r : quantizer_records(*run)) {
    if (static_cast<int>(r.role()) == q.role && quantizes_tensor(r.name(), q.name)) {
      out.quantizer_totals.push_back(std::move(r));
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
  const auto lock = lock_connected();
  const std::optional<std::int64_t> run = run_key(run_id);
  if (!run) return std::nullopt;
  Statement s = conn_->prepare("SELECT coalesce(max(id), 0) FROM reports WHERE run = ?1");
  s.bind(1, *run);
  return s.step() ? s.column_int(0) : 0;
}

std::map<std::string, RecentReports> StoreReader::recent_reports(
    std::int64_t since_ns, const std::optional<std::string>& run_id) {
  const auto lock = lock_connected();
  ReadSnapshot snapshot(*conn_);
  const std::int64_t first_id = first_report_since(*conn_, since_ns);
  std::map<std::string, RecentReports> out;
  Statement runs =
      conn_->prepare(std::string("SELECT id, run_id FROM runs WHERE last_seen_ns >= ?1") +
                     (run_id ? " AND run_id = ?2" : ""));
  runs.bind(1, since_ns);
  if (run_id) runs.bind(2, *run_id);
  while (runs.step()) {
    out[runs.column_text(1)] = scan_window(*conn_, runs.column_int(0), first_id);
  }
  return out;
}

}  // namespace ampscope::server
