// Per-layer precision of FP8/FP4 runs: which layers' GEMMs leave the recipe for BF16 and come
// back, and delayed scaling's amax history and margin. Reading order: record_gemms() (what each
// quantiser report says, per layer and step) -> update_bf16_set() (moves that did not take
// effect undone, then back to the recipe, then to BF16, worst first, under the cap) ->
// update_delayed().
//
// Limits (docs/policy.md, "Per-layer precision (FP8/FP4)"): a report is harmful when a share of
// its finite values underflowed, or saturated and overflowed, above a limit, or when its SQNR
// is below the element format's nominal rounding SQNR less a margin. The nominal SQNR takes the
// relative rounding error of m mantissa bits as uniform in +-2^-(m+1): its mean square is
// 4^-(m+1) / 3, so SQNR = 10 log10(3 * 4^(m+1)) dB (E4M3 and E2M3 28.9, E5M2 and E3M2 22.8, E2M1
// 16.8). Gaussian data measure 1.8 to 3.6 dB above it under every recipe, so a floor one mantissa
// bit (6.02 dB) below it is crossed only when the scale wastes the format's range.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "ampscope/policy/policy_engine.h"

namespace ampscope::policy {
namespace {

constexpr std::uint8_t kHarm = 1;
constexpr int kMaxDwellDoublings = 6;  // a dwell grows to at most 64 x min_dwell_steps
constexpr double kSwapFactor = 2.0;    // a waiting layer's cost over a BF16 one's: they swap

// One number printed by `spec` (a printf conversion of one double).
std::string printed(const char* spec, double v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, spec, v);
  return buf;
}

std::string percent(double share) { return printed("%.1f%%", 100.0 * share); }
std::string number(double v) { return printed("%.4g", v); }
// A severity (1 at the limit) as a share of the limit: "1.2%".
std::string share(double severity) {
  return printed(severity < 0.1 ? "%.2g%%" : "%.0f%%", 100.0 * severity);
}
std::string signed_number(double v) { return printed("%+.3g", v); }
std::string dB(double v) { return printed("%.1f dB", v); }

double nominal_sqnr_db(Format element) {
  const int m = format_info(element).mantissa_bits;
  return 10.0 * std::log10(3.0 * std::ldexp(1.0, 2 * (m + 1)));
}

// The worst limit `q` breaks, with every limit scaled by `factor` (1 to demote, the stricter
// promote_factor to promote); nullopt when it keeps them all. Non-finite inputs are the
// tensor's, not the recipe's, and are not counted. With `above` 0: the limit it comes nearest
// to, broken or not (the cause a loss-cost move names).
std::optional<std::pair<std::string, double>> assess(const QuantizerInput& in,
                                                     const GemmPrecisionParams& p,
                                                     double factor, double above = 1.0) {
  const RecipeCounts& q = in.counts;
  if (q.values == 0) return std::nullopt;
  const double n = static_cast<double>(q.values);
  std::optional<std::pair<std::string, double>> worst;
  auto consider = [&](std::string what, double severity) {
    if (severity > above && (!worst || severity > worst->second)) {
      worst = {std::move(what), severity};
    }
  };
  const double underflow = static_cast<double>(q.underflow) / n;
  consider(in.name + " underflow " + percent(underflow) + " of finite values",
           underflow / (p.max_underflow_share * factor));
  const double saturated = static_cast<double>(q.saturated + q.overflow) / n;
  consider(in.name + " saturated " + percent(saturated) + " of finite values",
           saturated / (p.max_saturated_share * factor));
  if (q.signal_sq > 0.0 && q.error_sq > 0.0) {
    const double sqnr = q.sqnr_db();
    const double floor = nominal_sqnr_db(q.recipe.element) - p.sqnr_margin_db * factor;
    consider(in.name + " SQNR " + dB(sqnr) + (sqnr < floor ? " below the " : " above the ") +
                 dB(floor) + " floor",
             std::pow(10.0, (floor - sqnr) / 10.0));
  }
  return worst;
}

// Under delayed scaling: the amax past what the scale s covers (max_finite / s), or values
// saturated or overflowed by it. nullopt when the scale held.
std::optional<std::pair<std::string, double>> delayed_spike(const QuantizerInput& in) {
  const RecipeCounts& q = in.counts;
  const double max_elem = format_info(q.recipe.element).max_finite;
  const double reach = q.tensor_scale > 0.0 ? max_elem / q.tensor_scale : 0.0;
  const bool past = q.tensor_scale > 0.0 && q.amax > reach;
  if (!past && q.saturated + q.overflow == 0) return std::nullopt;
  std::string what = in.name + " amax " + number(q.amax) + " past the delayed scale's reach " +
                     number(reach) + " (" + number(max_elem) + " / " + number(q.tensor_scale) +
                     "), " + std::to_string(q.saturated + q.overflow) + " values saturated";
  return std::pair{std::move(what), reach > 0.0 ? q.amax / reach : 1.0};
}

// "+0.003 +- 0.0002 nats of loss per step (first order, mean of 16 measured steps, 2 standard
// errors)": the cost's mean and the margin the decision allowed for its noise.
std::string cost_text(int steps, double mean, double se, const GemmPrecisionParams& p) {
  return signed_number(mean) + " +- " + number(p.loss_cost_z * se) +
         " nats of loss per step (first order, mean of " + std::to_string(steps) +
         " measured steps +- " + number(p.loss_cost_z) + " standard errors)";
}

// Reported steps with the recipe applied, from a move's effective step on, after which the
// move is taken as not done: the steps a scale decision is given to show (apply_grace_steps).
int unheeded_steps(const EngineConfig& c) { return std::max(1, c.apply_grace_steps); }

}  // namespace

void PolicyEngine::GemmFinding::keep(std::int64_t at, std::string what, std::string of_recipe,
                                     double worse) {
  if (at < step || (at == step && worse <= severity)) return;
  *this = {std::move(what), std::move(of_recipe), worse, at};
}

void PolicyEngine::CostWindow::add(std::int64_t step, double cost, int window) {
  auto pos = std::lower_bound(steps.begin(), steps.end(), step);
  const auto idx = static_cast<std::size_t>(pos - steps.begin());
  if (pos != steps.end() && *pos == step) {
    sums[idx] += cost;  // another rank or micro-step of the same step
    counts[idx] += 1;
    return;
  }
  const auto keep = static_cast<std::size_t>(window) + 1;  // the complete ones and the latest
  if (steps.size() >= keep && idx == 0) return;  // too old
  const auto at = static_cast<std::ptrdiff_t>(idx);
  steps.insert(pos, step);
  sums.insert(sums.begin() + at, cost);
  counts.insert(counts.begin() + at, 1);
  if (steps.size() > keep) {
    steps.erase(steps.begin());
    sums.erase(sums.begin());
    counts.erase(counts.begin());
  }
}

PolicyEngine::CostWindow::Complete PolicyEngine::CostWindow::complete(std::int64_t latest,
                                                                      int window) const {
  const auto end = static_cast<std::size_t>(
      std::lower_bound(steps.begin(), steps.end(), latest) - steps.begin());
  const std::size_t begin = end > static_cast<std::size_t>(window) ? end - window : 0;
  Complete c;
  for (std::size_t i = begin; i < end; ++i) c.mean += sums[i] / counts[i];
  c.steps = static_cast<int>(end - begin);
  if (c.steps == 0) return c;
  c.mean /= c.steps;
  if (c.steps < 2) return c;
  double ss = 0.0;
  for (std::size_t i = begin; i < end; ++i) ss += std::pow(sums[i] / counts[i] - c.mean, 2);
  c.se = std::sqrt(ss / (c.steps - 1) / c.steps);
  return c;
}

PolicyEngine::GemmTrack& PolicyEngine::gemm_track(const std::string& layer) {
  auto it = std::lower_bound(gemm_tracks_.begin(), gemm_tracks_.end(), layer,
                             [](const GemmTrack& k, const std::string& n) { return k.layer < n; });
  if (it == gemm_tracks_.end() || it->layer != layer) {
    GemmTrack fresh;
    fresh.layer = layer;
    it = gemm_tracks_.insert(it, std::move(fresh));
  }
  return *it;
}

bool PolicyEngine::add_gemm_layers(const std::vector<std::string>& layers) {
  if (!config_.gemm_precision.enabled) return false;
  const std::size_t before = gemm_tracks_.size();
  for (const std::string& layer : layers) {
    if (!layer.empty()) gemm_track(layer);
  }
  return gemm_tracks_.size() != before;
}

void PolicyEngine::record_gemms(const StepInput& in) {
  const GemmPrecisionParams& p = config_.gemm_precision;
  if (!p.enabled) return;
  for (const QuantizerInput& q : in.quantizers) {
    const RecipeCounts& c = q.counts;
    if (c.recipe.scaling == Scaling::kDelayed && !q.what_if) {
      amax_history_seen_ = std::max(amax_history_seen_, static_cast<int>(q.amax_history.size()));
      const float top = q.amax_history.empty()
                            ? 0.0f
                            : *std::max_element(q.amax_history.begin(), q.amax_history.end());
      if (top > 0.0f && c.tensor_scale > 0.0) {
        // s = max_elem / max(history) / 2^margin, so the margin is the binades s stays below
        // the scale the history alone gives.
        const double ratio = format_info(c.recipe.element).max_finite / top / c.tensor_scale;
        amax_margin_seen_ = std::clamp(static_cast<int>(std::lround(std::log2(ratio))), 0, 64);
      }
      if (in.step >= delayed_from_step_) {
        const auto spike = delayed_spike(q);
        delayed_spikes_.add(in.step, spike ? kHarm : 0, p.window_reports);
        if (spike) delayed_worst_.keep(in.step, spike->first, to_string(c.recipe), spike->second);
      }
    }
    if (q.layer.empty()) continue;
    GemmTrack& k = gemm_track(q.layer);
    const bool in_bf16 = std::binary_search(bf16_set_.begin(), bf16_set_.end(), q.layer);
    if (q.loss_cost) k.costed = true;
    if (q.what_if) {
      // Evidence for the way back: counted only from the move's effective step on.
      if (!in_bf16 || k.bf16_from_step < 0 || in.step < k.bf16_from_step) continue;
      k.what_if.add(in.step, assess(q, p, p.promote_factor) ? kHarm : 0, p.promote_reports);
      if (q.loss_cost) k.what_if_cost.add(in.step, *q.loss_cost, p.loss_cost_reports);
    } else if (!in_bf16) {
      // A layer already moved reports the recipe applied until its move takes effect: that
      // evidence was counted when it was moved.
      const auto harm = assess(q, p, 1.0);
      k.applied.add(in.step, harm ? kHarm : 0, p.window_reports);
      if (harm) k.worst.keep(in.step, harm->first, to_string(c.recipe), harm->second);
      if (const auto near = assess(q, p, 1.0, 0.0)) {
        k.cause.keep(in.step, near->first, to_string(c.recipe), near->second);
      }
      if (q.loss_cost) k.cost.add(in.step, *q.loss_cost, p.loss_cost_reports);
    } else if (k.bf16_from_step >= 0 && in.step >= k.bf16_from_step) {
      // In BF16 from this step on by the engine's account, yet the recipe was applied.
      k.unheeded.add(in.step, kHarm, unheeded_steps(config_));
    }
  }
}

bool PolicyEngine::drop_unheeded_moves(std::vector<std::string>* why) {
  const GemmPrecisionParams& p = config_.gemm_precision;
  bool changed = false;
  for (GemmTrack& k : gemm_tracks_) {
    // A move that took effect shows in what-if reports; one whose layer reported only the recipe
    // applied for as many steps as a scale decision is given to show did not (the agent refused
    // the update, or the trainer cannot move that layer). Out of the set, so that the set is
    // what the run does, and held for a dwell that doubles with each such move.
    if (k.bf16_from_step < 0 || !k.what_if.steps.empty() ||
        static_cast<int>(k.unheeded.steps.size()) < unheeded_steps(config_)) {
      continue;
    }
    const std::int64_t hold = p.min_dwell_steps << std::min(k.refusals, kMaxDwellDoublings);
    why->push_back("recipe " + k.layer + ": its move to BF16 from step " +
                   std::to_string(k.bf16_from_step) + " did not take effect (the recipe applied " +
                   "in " + std::to_string(k.unheeded.steps.size()) +
                   " reported steps since, none in BF16: the agent refused the update or the " +
                   "trainer cannot move this layer); not moved again before step " +
                   std::to_string(latest_step_ + hold));
    bf16_set_.erase(std::lower_bound(bf16_set_.begin(), bf16_set_.end(), k.layer));
    k.applied.clear();
    k.cost.clear();
    k.unheeded.clear();
    k.worst = {};
    k.cause = {};
    k.bf16_from_step = -1;
    k.refusals += 1;
    k.held_until = latest_step_ + hold;
    changed = true;
  }
  return changed;
}

bool PolicyEngine::update_bf16_set(std::vector<std::string>* why) {
  const GemmPrecisionParams& p = config_.gemm_precision;
  bool changed = false;
  const auto dwell_of = [&](const GemmTrack& k) {
    return p.min_dwell_steps << std::min(k.returns, kMaxDwellDoublings);
  };
  const auto dwelt = [&](const GemmTrack& k) {
    return k.bf16_from_step >= 0 && latest_step_ - k.bf16_from_step >= dwell_of(k);
  };
  const auto after = [&](const GemmTrack& k) {
    return " after " + std::to_string(latest_step_ - k.bf16_from_step) + " steps in BF16" +
           (k.returns > 0 ? " (dwell " + std::to_string(dwell_of(k)) + ", return " +
                                std::to_string(k.returns + 1) + ")"
                          : "");
  };
  // A layer in BF16 measures what the recipe would cost, m = D - K/2 to second order (D the
  // change in loss, K the curvature along the rounding error), while the recipe applied
  // measures D + K/2: the curvature dominates both (the evaluation's layers measured opposite
  // signs), so |m| estimates the cost with the recipe, and |m| + z se bounds it.
  const auto estimate = [&](const GemmTrack& k) -> std::optional<CostWindow::Complete> {
    const auto seen = k.what_if_cost.complete(latest_step_, p.loss_cost_reports);
    if (seen.steps < p.loss_cost_reports) return std::nullopt;
    return seen;
  };
  const auto bound = [&](const CostWindow::Complete& c) {
    return std::abs(c.mean) + p.loss_cost_z * c.se;
  };
  const auto held = [&](const GemmTrack& k, const CostWindow::Complete& c) {
    return std::max(bound(c), k.moved_cost);
  };
  const auto back = [&](GemmTrack& k) {
    bf16_set_.erase(std::lower_bound(bf16_set_.begin(), bf16_set_.end(), k.layer));
    k.applied.clear();
    k.what_if.clear();
    k.cost.clear();
    k.what_if_cost.clear();
    k.worst = {};
    k.cause = {};
    k.unheeded.clear();
    k.bf16_from_step = -1;
    k.returns += 1;
    changed = true;
  };
  changed = drop_unheeded_moves(why);
  const double return_limit = p.min_loss_cost * p.promote_factor;
  // Back to the recipe first, so that the room they leave can take a worse layer.
  for (GemmTrack& k : gemm_tracks_) {
    if (!dwelt(k)) continue;
    if (k.costed) {
      const auto seen = estimate(k);
      if (!seen || bound(*seen) > return_limit) continue;
      why->push_back("recipe " + k.layer + ": what-if " + k.cause.recipe + " would cost " +
                     cost_text(seen->steps, seen->mean, seen->se, p) + ", within +-" +
                     number(return_limit) + " (min_loss_cost x" + number(p.promote_factor) +
                     ")" + after(k));
    } else {
      const int seen = static_cast<int>(k.what_if.steps.size());
      if (seen < p.promote_reports || k.what_if.count(kHarm) > 0) continue;
      why->push_back("recipe " + k.layer + ": what-if " + k.worst.recipe + " within the limits x" +
                     number(p.promote_factor) + " (underflow " +
                     percent(p.max_underflow_share * p.promote_factor) + ", saturated " +
                     percent(p.max_saturated_share * p.promote_factor) + ", SQNR margin " +
                     dB(p.sqnr_margin_db * p.promote_factor) + ") in " + std::to_string(seen) +
                     "/" + std::to_string(seen) + " reports" + after(k));
    }
    back(k);
  }
  // Layers with a loss cost by it, the others by the limits.
  struct Candidate {
    GemmTrack* track;
    CostWindow::Complete cost;
  };
  std::vector<Candidate> candidates;
  for (GemmTrack& k : gemm_tracks_) {
    if (std::binary_search(bf16_set_.begin(), bf16_set_.end(), k.layer)) continue;
    if (latest_step_ < k.held_until) continue;  // its last move did not take effect
    const auto cost = k.cost.complete(latest_step_, p.loss_cost_reports);
    const bool costly = cost.steps >= p.loss_cost_reports &&
                        cost.mean - p.loss_cost_z * cost.se >= p.min_loss_cost;
    if (k.costed ? costly : k.applied.count(kHarm) >= p.min_reports) {
      candidates.push_back({&k, cost});
    }
  }
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& x, const Candidate& y) {
    const GemmTrack *a = x.track, *b = y.track;
    if (a->costed != b->costed) return a->costed;
    if (a->costed && x.cost.mean != y.cost.mean) return x.cost.mean > y.cost.mean;
    const int ha = a->applied.count(kHarm), hb = b->applied.count(kHarm);
    if (ha != hb) return ha > hb;
    if (a->worst.severity != b->worst.severity) return a->worst.severity > b->worst.severity;
    return a->layer < b->layer;
  });
  const auto cap = static_cast<std::size_t>(
      std::floor(p.max_bf16_share * static_cast<double>(gemm_tracks_.size()) + 1e-9));
  std::size_t room = cap > bf16_set_.size() ? cap - bf16_set_.size() : 0;
  // The cap full: the costliest waiting layer takes the room of the BF16 layer (past its dwell)
  // whose cost with the recipe is bounded lowest, when its own lower bound is over kSwapFactor
  // times that bound. A BF16 layer's bound is |m| + z se of its what-if costs, and at least
  // the lower bound it moved with (so that two costly layers do not trade places back).
  if (room == 0 && !candidates.empty() && candidates[0].track->costed) {
    GemmTrack* cheapest = nullptr;
    std::optional<CostWindow::Complete> cheapest_cost;
    for (GemmTrack& k : gemm_tracks_) {
      if (!k.costed || !dwelt(k)) continue;
      const auto seen = estimate(k);
      if (seen && (!cheapest_cost || held(k, *seen) < held(*cheapest, *cheapest_cost))) {
        cheapest = &k;
        cheapest_cost = seen;
      }
    }
    const CostWindow::Complete& c = candidates[0].cost;
    const double low = c.mean - p.loss_cost_z * c.se;
    if (cheapest != nullptr && low > kSwapFactor * held(*cheapest, *cheapest_cost)) {
      why->push_back("recipe " + cheapest->layer + ": what-if " + cheapest->cause.recipe +
                     " would cost " +
                     cost_text(cheapest_cost->steps, cheapest_cost->mean, cheapest_cost->se, p) +
                     ", at most " + number(held(*cheapest, *cheapest_cost)) +
                     " either way (and at its move), under 1/" +
                     number(kSwapFactor) + " of " + candidates[0].track->layer + "'s " +
                     number(low) + ": its room goes to that layer" + after(*cheapest));
      back(*cheapest);
      room = 1;
    }
  }
  const std::size_t moved = std::min(room, candidates.size());
  for (std::size_t i = 0; i < moved; ++i) {
    GemmTrack& k = *candidates[i].track;
    const CostWindow::Complete& cost = candidates[i].cost;
    if (k.costed) {
      why->push_back("bf16 " + k.layer + ": " + k.cause.recipe + " costs " +
                     cost_text(cost.steps, cost.mean, cost.se, p) + ", at least " +
                     number(p.min_loss_cost) + " (min_loss_cost), rank " +
                     std::to_string(i + 1) + " of " + std::to_string(candidates.size()) +
                     " (its inputs' nearest limit: " + k.cause.text + ", " +
                     share(k.cause.severity) + " of it)");
    } else {
      why->push_back("bf16 " + k.layer + ": " + k.worst.text + " in " +
                     std::to_string(k.applied.count(kHarm)) + "/" +
                     std::to_string(k.applied.steps.size()) + " reports (" + k.worst.recipe +
                     ")");
    }
    bf16_set_.insert(std::lower_bound(bf16_set_.begin(), bf16_set_.end(), k.layer), k.layer);
    k.what_if.clear();
    k.what_if_cost.clear();
    k.unheeded.clear();
    k.moved_cost = k.costed ? cost.mean - p.loss_cost_z * cost.se : 0.0;
    changed = true;
  }
  if (moved > 0 && moved < candidates.size()) {
    why->push_back("bf16 cap " + std::to_string(cap) + " of " +
                   std::to_string(gemm_tracks_.size()) + " layers (max_bf16_share " +
                   number(p.max_bf16_share) + ") reached: " + candidates[moved].track->layer +
                   " stays in the recipe");
  }
  return changed;
}

bool PolicyEngine::update_delayed(PolicyDecision* recipe, std::vector<std::string>* why) {
  const GemmPrecisionParams& p = config_.gemm_precision;
  const int spikes = delayed_spikes_.count(kHarm);
  if (spikes < p.spike_reports) return false;
  const int length = amax_history_length_.value_or(amax_history_seen_);
  const int margin = amax_margin_.value_or(amax_margin_seen_.value_or(0));
  std::string change;
  if (length > 1) {
    recipe->amax_history_length = std::max(1, length / 2);
    change = "amax history " + std::to_string(length) + " -> " +
             std::to_string(*recipe->amax_history_length) + " steps";
  } else if (margin < p.max_amax_margin) {
    recipe->amax_margin = margin + 1;
    change = "amax margin " + std::to_string(margin) + " -> " + std::to_string(margin + 1) +
             " binades (history already 1 step)";
  } else {
    return false;  // both at their bounds: nothing left to change
  }
  why->push_back("delayed: " + change + ": " + delayed_worst_.text + " in " +
                 std::to_string(spikes) + "/" + std::to_string(delayed_spikes_.steps.size()) +
                 " reports (" + delayed_worst_.recipe + ")");
  delayed_spikes_.clear();
  delayed_worst_ = {};
  return true;
}

}  // namespace ampscope::policy
