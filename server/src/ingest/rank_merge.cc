#include "rank_merge.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string_view>
#include <unordered_map>

#include "report_digest.h"

namespace ampscope::server {
namespace {

// Recently merged steps remembered per run, to tell a late report from a re-run step.
constexpr std::size_t kRememberedSteps = 1024;

std::string number_text(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}

std::string bool_text(bool v) { return v ? "true" : "false"; }

BinadeHistogram add_histograms(const BinadeHistogram& a, const BinadeHistogram& b) {
  if (a.empty()) return b;
  if (b.empty()) return a;
  BinadeHistogram sum;
  sum.min_exponent = std::min(a.min_exponent, b.min_exponent);
  sum.counts.assign(
      static_cast<std::size_t>(std::max(a.max_exponent(), b.max_exponent()) - sum.min_exponent + 1),
      0);
  for (const BinadeHistogram* h : {&a, &b}) {
    for (std::size_t i = 0; i < h->counts.size(); ++i) {
      sum.counts[static_cast<std::size_t>(h->min_exponent - sum.min_exponent) + i] += h->counts[i];
    }
  }
  return sum;
}

std::optional<std::uint64_t> add_counts(std::optional<std::uint64_t> a,
                                        std::optional<std::uint64_t> b) {
  if (!a || !b) return std::nullopt;
  return *a + *b;
}

// One tensor measured on several ranks (each holding part of the values): one tensor.
void add_tensor(policy::TensorInput& into, const policy::TensorInput& more) {
  if (more.histogram) {
    into.histogram = add_histograms(into.histogram.value_or(BinadeHistogram{}), *more.histogram);
  }
  if (more.max_abs) into.max_abs = std::max(into.max_abs.value_or(0.0), *more.max_abs);
  into.numel += more.numel;
  into.nan += more.nan;
  into.pos_inf += more.pos_inf;
  into.neg_inf += more.neg_inf;
  into.overflow = add_counts(into.overflow, more.overflow);
  into.underflow = add_counts(into.underflow, more.underflow);
}

// Weight gradients that are not shards, shown more than once in a step: each rank's own
// before the all-reduce, each micro-batch's piece (a tied LM head's), or the replicas every
// rank holds after it. Each passed through its format on its own, so the one reaching highest
// (the most non-finite values first) is what bounds the scale; replicas are equal anyway.
void keep_extreme(policy::TensorInput& into, const policy::TensorInput& more) {
  const auto rank = [](const policy::TensorInput& t) {
    return std::pair(t.nonfinite(), t.max_abs.value_or(0.0));
  };
  if (rank(more) > rank(into)) into = more;
}

bool same_tensor(const policy::TensorInput& a, const policy::TensorInput& b) {
  return a.name == b.name && a.role == b.role && a.scale == b.scale && a.storage == b.storage &&
         a.target == b.target;
}

// What a replicated weight gradient looks like on one rank, for comparing ranks: its counts,
// and its histogram when every rank measured one (ranks may sample a step differently).
std::string weight_grad_fingerprint(const policy::TensorInput& t, bool with_histogram) {
  std::string s = t.name + ": max|x| " + number_text(t.max_abs.value_or(0.0)) + ", nonfinite " +
                  std::to_string(t.nonfinite());
  if (with_histogram && t.histogram) {
    s += ", histogram 2^" + std::to_string(t.histogram->min_exponent);
    for (std::uint64_t c : t.histogram->counts) s += " " + std::to_string(c);
  }
  return s;
}

// The engine's input of the step: every rank's tensors, one entry per tensor (found through
// an index by name: a step of 256 ranks x 200 tensors is 51,200 lookups).
policy::StepInput merge_inputs(const std::vector<RankStep>& ranks, bool gradients_sharded) {
  policy::StepInput in = ranks.front().input;  // the lowest rank's header
  in.tensors.clear();
  in.quantizers.clear();
  std::unordered_multimap<std::string_view, std::size_t> by_name;  // -> index in in.tensors
  for (const RankStep& r : ranks) {
    in.loss_scale = std::min(in.loss_scale, r.input.loss_scale);
    in.scale_after = std::min(in.scale_after, r.input.scale_after);
    in.found_inf = in.found_inf || r.input.found_inf;
    in.skipped = in.skipped || r.input.skipped;
    // Every rank's: the engine counts a layer once per step, whatever the ranks say of it.
    in.quantizers.insert(in.quantizers.end(), r.input.quantizers.begin(),
                         r.input.quantizers.end());
    for (const policy::TensorInput& t : r.input.tensors) {
      const bool replica = !gradients_sharded && t.role == TensorRole::kWeightGrad;
      policy::TensorInput* same = nullptr;
      for (auto [it, end] = by_name.equal_range(t.name); it != end; ++it) {
        if (same_tensor(in.tensors[it->second], t)) {
          same = &in.tensors[it->second];
          break;
        }
      }
      if (same == nullptr) {
        in.tensors.push_back(t);
        // Keys view the names in `ranks`, which outlive the index.
        by_name.emplace(std::string_view(t.name), in.tensors.size() - 1);
      } else if (replica) {
        keep_extreme(*same, t);
      } else {
        add_tensor(*same, t);
      }
    }
  }
  return in;
}

// The field as each rank reported it; a divergence when they are not all the same.
template <typename F>
void compare(const std::vector<RankStep>& ranks, std::int64_t step, const char* field, F&& value_of,
             std::vector<v1::RankDivergence>* out) {
  v1::RankDivergence d;
  d.set_step(step);
  d.set_field(field);
  bool differ = false;
  for (const RankStep& r : ranks) {
    v1::RankValue* v = d.add_values();
    v->set_rank(r.rank);
    v->set_value(value_of(r));
    differ = differ || v->value() != d.values(0).value();
  }
  if (differ) out->push_back(std::move(d));
}

bool same_values(const policy::TensorInput& a, const policy::TensorInput& b, bool histograms) {
  return a.max_abs.value_or(0.0) == b.max_abs.value_or(0.0) && a.nonfinite() == b.nonfinite() &&
         (!histograms || *a.histogram == *b.histogram);
}

// The weight gradients every replica holds alike: those measured after unscaling, which
// follows the all-reduce, compared tensor by tensor where every rank measured the tensor
// (counts, and histograms where every rank has one: ranks may sample a step differently).
// Backward-phase weight gradients may be a rank's own (ampscope-train measures them before
// the all-reduce) and are not compared. One divergence naming the tensors that differ (at
// most kMaxNamed), each rank's fingerprints of them.
void compare_weight_grads(const std::vector<RankStep>& ranks, std::int64_t step,
                          std::vector<v1::RankDivergence>* out) {
  constexpr std::size_t kMaxNamed = 4;
  std::unordered_map<std::string_view, std::vector<const policy::TensorInput*>> by_name;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    for (const policy::TensorInput& t : ranks[i].input.tensors) {
      if (t.role != TensorRole::kWeightGrad || t.phase != TensorPhase::kAfterUnscale) continue;
      auto& on_ranks = by_name[t.name];
      on_ranks.resize(ranks.size(), nullptr);
      on_ranks[i] = &t;
    }
  }
  std::vector<std::string_view> names;
  for (const auto& [name, on_ranks] : by_name) {
    if (std::find(on_ranks.begin(), on_ranks.end(), nullptr) != on_ranks.end()) continue;
    const bool histograms = std::all_of(on_ranks.begin(), on_ranks.end(),
                                        [](const policy::TensorInput* t) { return t->histogram; });
    // Named, not the binding: lambdas capture structured bindings only from clang 16 on.
    const policy::TensorInput& first = *on_ranks[0];
    if (!std::all_of(on_ranks.begin(), on_ranks.end(), [&](const policy::TensorInput* t) {
          return same_values(*t, first, histograms);
        })) {
      names.push_back(name);
    }
  }
  if (names.empty()) return;
  std::sort(names.begin(), names.end());
  v1::RankDivergence d;
  d.set_step(step);
  d.set_field("weight_grads");
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    std::string s;
    for (std::size_t n = 0; n < std::min(names.size(), kMaxNamed); ++n) {
      const auto& on_ranks = by_name.at(names[n]);
      const bool histograms =
          std::all_of(on_ranks.begin(), on_ranks.end(),
                      [](const policy::TensorInput* t) { return t->histogram; });
      s += (s.empty() ? "" : "; ") + weight_grad_fingerprint(*on_ranks[i], histograms);
    }
    if (names.size() > kMaxNamed) {
      s += "; and " + std::to_string(names.size() - kMaxNamed) + " more tensors";
    }
    v1::RankValue* v = d.add_values();
    v->set_rank(ranks[i].rank);
    v->set_value(std::move(s));
  }
  out->push_back(std::move(d));
}

std::vector<v1::RankDivergence> divergences(const std::vector<RankStep>& ranks, std::int64_t step,
                                            bool gradients_sharded) {
  std::vector<v1::RankDivergence> out;
  if (ranks.size() < 2) return out;
  compare(
      ranks, step, "loss_scale", [](const RankStep& r) { return number_text(r.input.loss_scale); },
      &out);
  compare(
      ranks, step, "scale_after",
      [](const RankStep& r) { return number_text(r.input.scale_after); }, &out);
  compare(
      ranks, step, "found_inf", [](const RankStep& r) { return bool_text(r.input.found_inf); },
      &out);
  compare(
      ranks, step, "skipped", [](const RankStep& r) { return bool_text(r.input.skipped); }, &out);
  compare(
      ranks, step, "policy_seq", [](const RankStep& r) { return std::to_string(r.policy_seq); },
      &out);
  // A rank that handled no update at the step says so rather than showing an empty value.
  compare(
      ranks, step, "policy_outcomes",
      [](const RankStep& r) {
        return r.policy_outcomes.empty() ? std::string("none") : r.policy_outcomes;
      },
      &out);
  if (!gradients_sharded) compare_weight_grads(ranks, step, &out);
  return out;
}

}  // namespace

RankStep rank_step(const v1::StepReport& report, std::int64_t report_id, policy::StepInput input) {
  RankStep r;
  r.rank = report.rank();
  r.report_id = report_id;
  r.loss = report.loss();
  r.tokens = report.tokens();
  r.policy_seq = report.policy_seq();
  std::vector<std::string> outcomes;
  for (const v1::PolicyOutcome& o : report.policy_outcomes()) {
    outcomes.push_back(o.policy_id() + (o.applied() ? ":applied" : ":refused"));
  }
  std::sort(outcomes.begin(), outcomes.end());
  for (const std::string& o : outcomes) {
    r.policy_outcomes += (r.policy_outcomes.empty() ? "" : " ") + o;
  }
  if (report.has_first_offender()) r.first_offender = report.first_offender();
  r.input = std::move(input);
  return r;
}

MergedStep merge_ranks(std::vector<RankStep> ranks, bool gradients_sharded, bool partial) {
  std::sort(ranks.begin(), ranks.end(),
            [](const RankStep& a, const RankStep& b) { return a.rank < b.rank; });
  MergedStep m;
  m.step = ranks.front().input.step;
  m.partial = partial;
  double loss_sum = 0.0;
  bool loss_finite = true;
  for (const RankStep& r : ranks) {
    m.ranks.push_back(r.rank);
    m.report_ids.push_back(r.report_id);
    m.tokens += r.tokens;
    loss_sum += r.loss;
    loss_finite = loss_finite && std::isfinite(r.loss);
    // Ranks are in ascending order: a later rank wins only with a strictly earlier tensor.
    if (r.first_offender &&
        (!m.first_offender || r.first_offender->order() < m.first_offender->order())) {
      m.first_offender = r.first_offender;
      m.offender_rank = r.rank;
    }
  }
  m.loss = loss_finite ? loss_sum / static_cast<double>(ranks.size()) : std::nan("");
  m.divergences = divergences(ranks, m.step, gradients_sharded);
  m.input = merge_inputs(ranks, gradients_sharded);
  m.input.first_offender.reset();
  if (m.first_offender) m.input.first_offender = to_offender(*m.first_offender);
  return m;
}

void RankMerger::set_layout(std::uint32_t world_size, bool gradients_sharded) {
  world_size_ = std::max<std::uint32_t>(world_size, 1);
  sharded_ = gradients_sharded;
}

std::vector<MergedStep> RankMerger::add(RankStep rank, Clock::time_point now,
                                        const ConnectedRanks& connected, bool* late) {
  if (late != nullptr) *late = false;
  std::vector<MergedStep> out;
  const std::int64_t step = rank.input.step;
  if (world_size_ <= 1) {
    std::vector<RankStep> one;
    one.push_back(std::move(rank));
    out.push_back(merge_ranks(std::move(one), sharded_, false));
    return out;
  }
  if (auto done = merged_.find(step); done != merged_.end()) {
    const bool rerun =
        std::find(done->second.begin(), done->second.end(), rank.rank) != done->second.end();
    if (!rerun) {  // its step went without it
      if (late != nullptr) *late = true;
      return out;
    }
    merged_.erase(done);  // the run went back (resumed from a checkpoint): a new step
  }
  auto [it, fresh] = pending_.try_emplace(step);
  if (fresh) {
    it->second.since = now;
    if (connected) it->second.connected = connected();
  }
  it->second.ranks.insert_or_assign(rank.rank, std::move(rank));
  if (it->second.ranks.size() >= world_size_) out.push_back(finish(it, false));
  while (pending_.size() > max_pending_steps()) {
    out.push_back(finish(pending_.begin(), true));
  }
  return out;
}

std::size_t RankMerger::max_pending_steps() const {
  if (options_.max_pending_steps > 0) return options_.max_pending_steps;
  return std::max(MergeOptions::kMinAutoPendingSteps,
                  MergeOptions::kAutoPendingReports / std::max<std::uint32_t>(world_size_, 1));
}

std::vector<MergedStep> RankMerger::flush(Clock::time_point now,
                                          const std::set<std::uint32_t>& connected) {
  std::vector<MergedStep> out;
  for (auto it = pending_.begin(); it != pending_.end();) {
    const Pending& p = it->second;
    bool gone = true;  // every missing rank had a stream when the step began and has none now
    for (std::uint32_t r = 0; r < world_size_ && gone; ++r) {
      if (p.ranks.contains(r)) continue;
      gone = p.connected.contains(r) && !connected.contains(r);
    }
    if (gone || now - p.since >= options_.deadline) {
      auto next = std::next(it);
      out.push_back(finish(it, true));
      it = next;
    } else {
      ++it;
    }
  }
  return out;
}

std::optional<RankMerger::Clock::time_point> RankMerger::next_deadline() const {
  std::optional<Clock::time_point> next;
  for (const auto& [step, p] : pending_) {
    const Clock::time_point due = p.since + options_.deadline;
    if (!next || due < *next) next = due;
  }
  return next;
}

std::optional<std::int64_t> RankMerger::first_waiting_report() const {
  std::optional<std::int64_t> first;
  for (const auto& [step, p] : pending_) {
    for (const auto& [rank, r] : p.ranks) {
      if (!first || r.report_id < *first) first = r.report_id;
    }
  }
  return first;
}

void RankMerger::remember(std::int64_t step, std::vector<std::uint32_t> ranks) {
  merged_.insert_or_assign(step, std::move(ranks));
  while (merged_.size() > kRememberedSteps) merged_.erase(merged_.begin());
}

MergedStep RankMerger::finish(PendingMap::iterator it, bool partial) {
  std::vector<RankStep> ranks;
  for (auto& [rank, r] : it->second.ranks) ranks.push_back(std::move(r));
  pending_.erase(it);
  MergedStep m = merge_ranks(std::move(ranks), sharded_, partial);
  remember(m.step, m.ranks);
  return m;
}

}  // namespace ampscope::server
