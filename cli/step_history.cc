#include "step_history.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <iomanip>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "ampscope/proto/vocabulary_codec.h"
#include "ampscope/vocabulary.h"
#include "query_client.h"

namespace ampscope::cli {
namespace {

using nlohmann::ordered_json;

std::string phase_text(v1::TensorPhase phase) {
  return std::string(phase_name(proto::from_proto(phase)));
}

std::string flight_event_text(v1::FlightEvent e) {
  switch (e) {
    case v1::FLIGHT_EVENT_NONFINITE:
      return "non-finite";
    case v1::FLIGHT_EVENT_SKIPPED:
      return "skipped step";
    case v1::FLIGHT_EVENT_UNDERFLOW:
      return "underflow";
    default:
      return "";
  }
}

std::string number(double x) {
  std::ostringstream os;
  os << std::setprecision(3) << x;
  return os.str();
}

// The history samples of the tensor at the step: same rank, name, role and phase.
std::vector<const v1::HistorySample*> samples_of(const v1::StepTensor& t,
                                                 const v1::GetStepHistoryResponse& h) {
  std::vector<const v1::HistorySample*> out;
  for (const v1::HistorySample& s : h.history()) {
    if (s.rank() == t.rank() && s.stats().name() == t.stats().name() &&
        s.stats().role() == t.stats().role() && s.stats().phase() == t.stats().phase()) {
      out.push_back(&s);
    }
  }
  return out;
}

// The binades a sample's values carry from their loss scale (scale 2^k: k binades up).
int scale_shift(const v1::TensorStats& s) {
  if (!(s.scale() > 0.0) || !std::isfinite(s.scale())) return 0;
  return static_cast<int>(std::lround(std::log2(s.scale())));
}

// The occupied binades of the unscaled values.
std::string binade_range(const v1::TensorStats& s) {
  const v1::BinadeHistogram& h = s.histogram();
  if (h.counts().empty()) return "(none)";
  const int lo = h.min_exponent() - scale_shift(s);
  return "[" + std::to_string(lo) + ", " + std::to_string(lo + h.counts_size() - 1) + "]";
}

std::string describe_report(const v1::StepReport& r) {
  std::ostringstream os;
  os << "rank " << r.rank() << ": loss " << number(r.loss()) << ", loss scale "
     << format_scale(r.loss_scale());
  if (r.scale_after() != r.loss_scale()) os << " -> " << format_scale(r.scale_after());
  if (r.found_inf()) os << ", found_inf";
  if (r.skipped()) os << ", skipped";
  if (r.has_first_offender()) {
    os << "; first offender " << r.first_offender().tensor() << " ("
       << role_name(r.first_offender().role()) << ", order " << r.first_offender().order()
       << ", micro-step " << r.first_offender().micro_step() << ")";
  }
  if (r.flight_event() != v1::FLIGHT_EVENT_UNSPECIFIED) {
    os << "; flight recorder sent its history (" << flight_event_text(r.flight_event()) << ")";
  }
  return os.str();
}

void print_line(std::ostream& out, const std::string& step, const v1::TensorStats& s, int lo,
                int hi, const std::string& source) {
  const int shift = scale_shift(s);
  out << "  " << std::left << std::setw(10) << step << std::setw(7) << s.micro_step()
      << std::setw(12) << binade_range(s) << "|" << sparkline(s.histogram(), lo + shift, hi + shift)
      << "|  " << std::setw(10) << number(s.max_abs() / s.scale()) << std::setw(10)
      << number(s.min_abs_nonzero() / s.scale());
  const std::uint64_t nonfinite = s.nan() + s.pos_inf() + s.neg_inf();
  if (nonfinite > 0) {
    out << "nan " << s.nan() << " +inf " << s.pos_inf() << " -inf " << s.neg_inf() << "  ";
  }
  out << source << "\n";
}

void print_tensor(std::ostream& out, const v1::StepTensor& t, std::int64_t step,
                  const v1::GetStepHistoryResponse& h) {
  const v1::TensorStats& at = t.stats();
  out << "\n"
      << at.name() << "  (" << role_name(at.role()) << ", " << phase_text(at.phase()) << ", "
      << format_name(at.dtype()) << ", rank " << t.rank() << ", micro-step " << at.micro_step()
      << ")" << (t.why().empty() ? "" : ": " + t.why()) << "\n";
  const std::vector<const v1::HistorySample*> past = samples_of(t, h);
  // One binade range for every line, so that a shift shows as a shift.
  int lo = std::numeric_limits<int>::max();
  int hi = std::numeric_limits<int>::min();
  const auto widen = [&](const v1::TensorStats& s) {
    const v1::BinadeHistogram& b = s.histogram();
    if (b.counts().empty()) return;
    lo = std::min(lo, b.min_exponent() - scale_shift(s));
    hi = std::max(hi, b.min_exponent() + b.counts_size() - 1 - scale_shift(s));
  };
  for (const v1::HistorySample* s : past) widen(s->stats());
  if (at.level() == v1::STATS_LEVEL_FULL) widen(at);
  if (lo > hi) lo = hi = 0;
  out << "  x / loss scale; histogram between the bars, one character per binade of log2|x| "
      << lo << ".." << hi << "\n";
  out << "  " << std::left << std::setw(10) << "STEP" << std::setw(7) << "MICRO" << std::setw(12)
      << "BINADES"
      << "|" << std::string(static_cast<std::size_t>(hi - lo + 1), ' ') << "|  " << std::setw(10)
      << "MAX|x|" << std::setw(10) << "MIN|x|>0"
      << "\n";
  for (const v1::HistorySample* s : past) {
    print_line(out, std::to_string(s->step()), s->stats(), lo, hi,
               s->from_flight_recorder() ? "recorder" : "report");
  }
  if (at.level() == v1::STATS_LEVEL_FULL) {
    print_line(out, std::to_string(step) + " <-", at, lo, hi, "this step");
  } else {
    out << "  " << std::left << std::setw(10) << std::to_string(step) + " <-" << std::setw(7)
        << at.micro_step() << "counts only: numel " << at.numel() << ", nan " << at.nan()
        << ", +inf " << at.pos_inf() << ", -inf " << at.neg_inf() << ", max|x| "
        << number(at.max_abs() / at.scale()) << "\n";
  }
}

ordered_json stats_json(const v1::TensorStats& s) {
  ordered_json j;
  j["micro_step"] = s.micro_step();
  j["numel"] = s.numel();
  j["zeros"] = s.zeros();
  j["nan"] = s.nan();
  j["pos_inf"] = s.pos_inf();
  j["neg_inf"] = s.neg_inf();
  j["scale"] = json_number(s.scale());  // the values below are as stored: divide by it
  j["max_abs"] = json_number(s.max_abs());
  j["min_abs_nonzero"] = json_number(s.min_abs_nonzero());
  j["level"] = s.level() == v1::STATS_LEVEL_FULL ? "full" : "counts";
  j["min_exponent"] = s.histogram().min_exponent();
  j["counts"] = std::vector<std::uint64_t>(s.histogram().counts().begin(),
                                           s.histogram().counts().end());
  return j;
}

}  // namespace

std::string sparkline(const v1::BinadeHistogram& histogram, int lo, int hi) {
  static constexpr std::array<const char*, 8> kBars = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
  std::uint64_t most = 0;
  for (std::uint64_t c : histogram.counts()) most = std::max(most, c);
  std::string out;
  for (int e = lo; e <= hi; ++e) {
    const int i = e - histogram.min_exponent();
    const std::uint64_t c = i >= 0 && i < histogram.counts_size() ? histogram.counts(i) : 0;
    if (c == 0) {
      out += ' ';
      continue;
    }
    const double share =
        std::log1p(static_cast<double>(c)) / std::log1p(static_cast<double>(most));
    out += kBars[std::clamp(static_cast<int>(std::ceil(share * 8.0)) - 1, 0, 7)];
  }
  return out;
}

void print_step_text(std::ostream& out, const std::string& run_id, std::int64_t step,
                     const v1::GetStepHistoryResponse& h, std::size_t limit) {
  out << "run " << run_id << ", step " << step << "\n";
  if (h.reports().empty()) out << "  nothing stored of this step\n";
  for (const v1::StepReport& r : h.reports()) out << "  " << describe_report(r) << "\n";
  if (h.tensors().empty() && !h.reports().empty()) {
    out << "  no tensor offended at this step (non-finite, or underflow above 5%)\n";
  }
  // Tensors with history in full; the others one line each, after them.
  std::vector<const v1::StepTensor*> without;
  std::size_t shown = 0, not_shown = 0;
  for (const v1::StepTensor& t : h.tensors()) {
    if (samples_of(t, h).empty()) {
      without.push_back(&t);
    } else if (shown < limit) {
      print_tensor(out, t, step, h);
      ++shown;
    } else {
      ++not_shown;
    }
  }
  if (not_shown > 0) {
    out << "\n" << not_shown << " more tensors with history (--limit " << limit
        << " shows " << limit << ")\n";
  }
  if (without.empty()) return;
  out << "\nwithout full statistics of the steps before " << step << " (" << without.size()
      << "):\n";
  for (std::size_t i = 0; i < without.size() && i < limit; ++i) {
    const v1::StepTensor* t = without[i];
    out << "  " << t->stats().name() << "  (" << role_name(t->stats().role()) << ", "
        << phase_text(t->stats().phase()) << ", rank " << t->rank() << ", micro-step "
        << t->stats().micro_step() << ")" << (t->why().empty() ? "" : ": " + t->why()) << "\n";
  }
  if (without.size() > limit) out << "  ... " << without.size() - limit << " more\n";
}

void print_step_json(std::ostream& out, const std::string& run_id, std::int64_t step,
                     const v1::GetStepHistoryResponse& h) {
  ordered_json j;
  j["run_id"] = run_id;
  j["step"] = step;
  ordered_json reports = ordered_json::array();
  for (const v1::StepReport& r : h.reports()) {
    ordered_json e;
    e["rank"] = r.rank();
    e["loss"] = json_number(r.loss());
    e["loss_scale"] = json_number(r.loss_scale());
    e["scale_after"] = json_number(r.scale_after());
    e["found_inf"] = r.found_inf();
    e["skipped"] = r.skipped();
    e["first_offender"] = r.has_first_offender() ? ordered_json(r.first_offender().tensor())
                                                 : ordered_json(nullptr);
    if (r.has_first_offender()) {
      e["first_offender_role"] = role_name(r.first_offender().role());
      e["first_offender_order"] = r.first_offender().order();
      e["first_offender_micro_step"] = r.first_offender().micro_step();
    }
    e["flight_event"] = flight_event_text(r.flight_event());
    reports.push_back(std::move(e));
  }
  j["reports"] = std::move(reports);
  ordered_json tensors = ordered_json::array();
  for (const v1::StepTensor& t : h.tensors()) {
    ordered_json e;
    e["name"] = t.stats().name();
    e["role"] = role_name(t.stats().role());
    e["phase"] = phase_text(t.stats().phase());
    e["rank"] = t.rank();
    e["why"] = t.why();
    e["at_step"] = stats_json(t.stats());
    ordered_json past = ordered_json::array();
    for (const v1::HistorySample* s : samples_of(t, h)) {
      ordered_json p = stats_json(s->stats());
      p["step"] = s->step();
      p["rank"] = s->rank();
      p["from_flight_recorder"] = s->from_flight_recorder();
      past.push_back(std::move(p));
    }
    e["history"] = std::move(past);
    tensors.push_back(std::move(e));
  }
  j["tensors"] = std::move(tensors);
  out << j.dump() << "\n";
}

}  // namespace ampscope::cli
