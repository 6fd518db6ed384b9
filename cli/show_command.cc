#include "show_command.h"

#include <cmath>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ampscope/proto/vocabulary_codec.h"
#include "display_width.h"
#include "query_client.h"
#include "step_history.h"

namespace ampscope::cli {
namespace {

using nlohmann::ordered_json;

struct ShowArgs {
  ServerArgs server;
  std::string run_id;
  unsigned limit = 10;
  std::optional<std::int64_t> step;  // --step: that step and what led to it
  unsigned steps_back = 16;
};

std::string percent(double ratio) {
  std::ostringstream os;
  os << std::setprecision(3) << ratio * 100 << "%";
  return os.str();
}

ordered_json offender_json(const v1::FirstOffender& f) {
  ordered_json j;
  j["tensor"] = f.tensor();
  j["role"] = role_name(f.role());
  j["order"] = f.order();
  j["micro_step"] = f.micro_step();
  return j;
}

ordered_json tensor_json(const v1::TensorRecord& t) {
  ordered_json j;
  j["name"] = t.name();
  j["role"] = role_name(t.role());
  j["format"] = format_name(t.format());
  j["samples"] = t.samples();
  j["values"] = t.values();
  j["underflow"] = t.underflow();
  j["overflow"] = t.overflow();
  j["nonfinite"] = t.nonfinite();
  j["underflow_ratio"] = t.underflow_ratio();
  j["overflow_ratio"] = t.overflow_ratio();
  j["max_abs"] = json_number(t.max_abs());
  j["last_step"] = t.last_step();
  return j;
}

ordered_json update_json(const v1::PolicyDecision& d) {
  const v1::PolicyUpdate& u = d.update();
  ordered_json j;
  j["policy_id"] = u.policy_id();
  j["mode"] = mode_name(u.mode());
  j["effective_from_step"] = u.effective_from_step();
  j["decided_at_step"] = u.decided_at_step();
  j["loss_scale"] = u.has_loss_scale() ? json_number(u.loss_scale()) : ordered_json(nullptr);
  if (u.has_growth_interval()) j["growth_interval"] = u.growth_interval();
  if (u.has_growth_factor()) j["growth_factor"] = u.growth_factor();
  if (u.has_backoff_factor()) j["backoff_factor"] = u.backoff_factor();
  if (u.has_hysteresis()) j["hysteresis"] = u.hysteresis();
  if (u.has_min_scale()) j["min_scale"] = u.min_scale();
  if (u.has_max_scale()) j["max_scale"] = u.max_scale();
  if (u.fp32_tensors_set()) {
    j["fp32_tensors"] =
        ordered_json(std::vector<std::string>(u.fp32_tensors().begin(), u.fp32_tensors().end()));
  }
  if (u.bf16_gemms_set()) {
    j["bf16_gemms"] =
        ordered_json(std::vector<std::string>(u.bf16_gemms().begin(), u.bf16_gemms().end()));
  }
  if (u.has_amax_history_length()) j["amax_history_length"] = u.amax_history_length();
  if (u.has_amax_margin()) j["amax_margin"] = u.amax_margin();
  j["reason"] = u.reason();
  ordered_json applied = ordered_json::array();
  for (const v1::PolicyApplication& a : d.applications()) {
    applied.push_back(ordered_json{
        {"rank", a.rank()}, {"step", a.step()}, {"applied", a.applied()}, {"reason", a.reason()}});
  }
  j["applications"] = std::move(applied);
  return j;
}

std::string describe_update(const v1::PolicyUpdate& u) {
  std::ostringstream os;
  const char* sep = "";
  auto field = [&](const char* name, const std::string& value) {
    os << sep << name << " " << value;
    sep = ", ";
  };
  if (u.has_loss_scale()) field("loss_scale", format_scale(u.loss_scale()));
  if (u.has_growth_interval()) field("growth_interval", std::to_string(u.growth_interval()));
  if (u.has_growth_factor()) field("growth_factor", format_scale(u.growth_factor()));
  if (u.has_backoff_factor()) field("backoff_factor", format_scale(u.backoff_factor()));
  if (u.has_hysteresis()) field("hysteresis", std::to_string(u.hysteresis()));
  if (u.has_min_scale()) field("min_scale", format_scale(u.min_scale()));
  if (u.has_max_scale()) field("max_scale", format_scale(u.max_scale()));
  if (u.fp32_tensors_set()) {
    std::string list;
    for (const std::string& t : u.fp32_tensors()) list += (list.empty() ? "" : " ") + t;
    field("fp32", list.empty() ? "(none)" : list);
  }
  if (u.bf16_gemms_set()) {
    std::string list;
    for (const std::string& l : u.bf16_gemms()) list += (list.empty() ? "" : " ") + l;
    field("bf16", list.empty() ? "(none)" : list);
  }
  if (u.has_amax_history_length()) {
    field("amax_history_length", std::to_string(u.amax_history_length()));
  }
  if (u.has_amax_margin()) field("amax_margin", std::to_string(u.amax_margin()));
  return os.str();
}

void print_tensors(std::ostream& out, const char* title,
                   const google::protobuf::RepeatedPtrField<v1::TensorRecord>& tensors) {
  out << "\n" << title << " (" << tensors.size() << "):\n";
  if (tensors.empty()) return;
  out << "  " << std::left << std::setw(36) << "TENSOR" << std::setw(17) << "ROLE" << std::setw(12)
      << "FORMAT" << std::setw(11) << "UNDERFLOW" << std::setw(11) << "OVERFLOW" << std::setw(11)
      << "NONFINITE"
      << "MAX|x| (unscaled)\n";
  for (const v1::TensorRecord& t : tensors) {
    std::ostringstream max_abs;
    max_abs << std::setprecision(4) << t.max_abs();
    out << "  " << pad_columns(t.name(), 36) << std::left << std::setw(17) << role_name(t.role())
        << std::setw(12) << format_name(t.format()) << std::setw(11) << percent(t.underflow_ratio())
        << std::setw(11) << percent(t.overflow_ratio()) << std::setw(11) << t.nonfinite()
        << max_abs.str() << "\n";
  }
}

std::string phase_name(v1::TensorPhase phase) {
  return std::string(ampscope::phase_name(proto::from_proto(phase)));
}

// What a quantiser's recipe scaled by: the per-tensor scale's range ("s 112..448"), the block
// scales' binades ("2^-9..2^-3"), or "-" when neither was seen.
std::string scale_range(const v1::QuantizerRecord& q) {
  const auto range = [](const std::string& lo, const std::string& hi) {
    return lo == hi ? lo : lo + ".." + hi;
  };
  if (q.has_scale_binades()) {
    return range("2^" + std::to_string(q.scale_min_exponent()),
                 "2^" + std::to_string(q.scale_max_exponent()));
  }
  if (q.tensor_scale_max() > 0.0) {
    return "s " + range(format_scale(q.tensor_scale_min()), format_scale(q.tensor_scale_max()));
  }
  return "-";
}

std::string sqnr_text(double db) {
  if (std::isnan(db)) return "-";
  if (std::isinf(db)) return "exact";
  std::ostringstream os;
  os << std::fixed << std::setprecision(1) << db << " dB";
  return os.str();
}

ordered_json quantizer_json(const v1::QuantizerRecord& q) {
  ordered_json j;
  j["name"] = q.name();
  j["role"] = role_name(q.role());
  j["phase"] = phase_name(q.phase());
  j["recipe"] = q.recipe();
  j["element"] = format_name(q.element());
  j["samples"] = q.samples();
  j["values"] = q.values();
  j["nonfinite"] = q.nonfinite();
  j["underflow"] = q.underflow();
  j["subnormal"] = q.subnormal();
  j["saturated"] = q.saturated();
  j["overflow"] = q.overflow();
  j["underflow_ratio"] = q.underflow_ratio();
  j["saturated_ratio"] = q.saturated_ratio();
  // JSON has no Inf: an exact round trip is null with "exact" true.
  j["sqnr_db"] = json_number(q.sqnr_db());
  j["exact"] = std::isinf(q.sqnr_db()) && q.sqnr_db() > 0;
  j["amax"] = json_number(q.amax());
  j["last_amax"] = json_number(q.last_amax());
  if (q.tensor_scale_max() > 0.0) {
    j["tensor_scale_min"] = json_number(q.tensor_scale_min());
    j["tensor_scale_max"] = json_number(q.tensor_scale_max());
    j["last_tensor_scale"] = json_number(q.last_tensor_scale());
  }
  if (q.has_scale_binades()) {
    j["scale_min_exponent"] = q.scale_min_exponent();
    j["scale_max_exponent"] = q.scale_max_exponent();
  }
  j["blocks"] = q.blocks();
  j["zero_blocks"] = q.zero_blocks();
  j["saturated_blocks"] = q.saturated_blocks();
  j["nan_blocks"] = q.nan_blocks();
  j["last_step"] = q.last_step();
  if (q.loss_cost_samples() > 0) {
    j["loss_cost_samples"] = q.loss_cost_samples();
    j["loss_cost_mean"] = json_number(q.loss_cost_mean());
    j["loss_cost_stddev"] = json_number(q.loss_cost_stddev());
  }
  return j;
}

// The loss cost over the run: mean +- two standard errors, nats per step ("-": not measured).
std::string loss_cost_text(const v1::QuantizerRecord& q) {
  if (q.loss_cost_samples() == 0) return "-";
  const double n = static_cast<double>(q.loss_cost_samples());
  std::ostringstream os;
  os << std::showpos << std::scientific << std::setprecision(1) << q.loss_cost_mean()
     << std::noshowpos << " +-" << 2.0 * q.loss_cost_stddev() / std::sqrt(n) << " (n "
     << q.loss_cost_samples() << ")";
  return os.str();
}

// The FP8/FP4 section: one line per quantised GEMM input, over the run.
void print_quantizers(std::ostream& out,
                      const google::protobuf::RepeatedPtrField<v1::QuantizerRecord>& quantizers) {
  out << "\nFP8/FP4 quantisers (" << quantizers.size() << "):\n";
  out << "  " << std::left << std::setw(36) << "TENSOR" << std::setw(17) << "ROLE" << std::setw(24)
      << "RECIPE" << std::setw(22) << "SCALE" << std::setw(11) << "AMAX" << std::setw(11)
      << "UNDERFLOW" << std::setw(11) << "SATURATED" << std::setw(11) << "SQNR"
      << "LOSS COST\n";
  for (const v1::QuantizerRecord& q : quantizers) {
    std::ostringstream amax;
    amax << std::setprecision(4) << q.amax();
    out << "  " << pad_columns(q.name(), 36) << std::left << std::setw(17) << role_name(q.role())
        << pad_columns(q.recipe(), 24) << std::setw(22) << scale_range(q) << std::setw(11)
        << amax.str() << std::setw(11) << percent(q.underflow_ratio()) << std::setw(11)
        << percent(q.saturated_ratio()) << std::setw(11) << sqnr_text(q.sqnr_db())
        << loss_cost_text(q) << "\n";
  }
}

std::string rank_values(const v1::RankDivergence& d) {
  std::string s;
  for (const v1::RankValue& v : d.values()) {
    s += (s.empty() ? "" : ", ") + ("rank " + std::to_string(v.rank()) + " " + v.value());
  }
  return s;
}

// The multi-rank sections: steps merged without every rank, and where the ranks disagreed.
void print_ranks_text(std::ostream& out, const v1::GetRunResponse& run) {
  const v1::RunSummary& s = run.summary();
  out << "\npartial steps (" << s.partial_steps() << "):\n";
  for (const v1::PartialStep& p : run.partial_steps()) {
    std::string ranks;
    for (std::uint32_t r : p.ranks()) ranks += (ranks.empty() ? "" : " ") + std::to_string(r);
    out << "  step " << std::left << std::setw(8) << p.step() << " merged from rank(s) " << ranks
        << " only\n";
  }
  out << "\nRank divergence (" << s.divergent_steps() << " steps):\n";
  for (const v1::RankDivergence& d : run.rank_divergences()) {
    out << "  step " << std::left << std::setw(8) << d.step() << std::setw(16) << d.field()
        << rank_values(d) << "\n";
  }
  out << "\nstep time per rank (mean):\n";
  for (const v1::AgentInfo& a : run.agents()) {
    std::ostringstream t;
    t << std::setprecision(4) << a.mean_step_time_s() << " s";
    out << "  rank " << std::left << std::setw(5) << a.rank() << t.str() << "\n";
  }
}

}  // namespace

void print_run_text(std::ostream& out, const v1::GetRunResponse& run) {
  const v1::RunSummary& s = run.summary();
  out << "run " << s.run_id() << "  (" << (s.precision().empty() ? "?" : s.precision()) << ", "
      << format_name(s.compute_format()) << ", " << s.world_size() << " rank"
      << (s.world_size() == 1 ? "" : "s") << ", " << s.agents_connected() << " connected)\n";
  out << "steps " << s.steps() << " (" << s.first_step() << ".." << s.last_step() << "), "
      << "reports " << s.reports() << ", skipped steps " << s.skipped_steps() << ", rejected "
      << s.rejected_reports() << ", duplicates " << s.duplicate_reports() << "\n";
  out << "loss scale " << format_scale(s.loss_scale()) << ", loss " << s.loss() << ", policy "
      << mode_name(s.policy_mode()) << ", last seen " << format_time_ago(s.last_seen_unix_ns())
      << "\n";

  out << "\nskipped steps (" << s.skipped_steps() << "):\n";
  for (const v1::SkippedStep& k : run.skipped_steps()) {
    out << "  step " << std::left << std::setw(8) << k.step() << " rank " << std::setw(4)
        << k.rank() << k.why() << "\n";
  }
  out << "\nfirst offenders (" << run.first_offenders_size() << "):\n";
  for (const v1::OffenderEvent& e : run.first_offenders()) {
    out << "  step " << std::left << std::setw(8) << e.step() << " rank " << std::setw(4)
        << e.rank() << e.offender().tensor() << " (" << role_name(e.offender().role()) << ", order "
        << e.offender().order() << ", micro-step " << e.offender().micro_step() << ")\n";
  }
  out << "\nscale timeline (" << run.scale_timeline_size() << " changes):\n";
  for (const v1::ScalePoint& p : run.scale_timeline()) {
    out << "  from step " << std::left << std::setw(8) << p.step() << format_scale(p.loss_scale())
        << "\n";
  }
  if (s.world_size() > 1) print_ranks_text(out, run);
  print_tensors(out, "worst tensors by underflow", run.worst_underflow());
  print_tensors(out, "worst tensors by overflow", run.worst_overflow());
  if (!run.quantizers().empty()) print_quantizers(out, run.quantizers());
  out << "\npolicy decisions (" << run.policy_decisions_size() << "):\n";
  for (const v1::PolicyDecision& d : run.policy_decisions()) {
    const v1::PolicyUpdate& u = d.update();
    out << "  #" << u.policy_id() << " from step " << u.effective_from_step() << ": "
        << describe_update(u) << "\n      why: " << u.reason() << "\n";
    for (const v1::PolicyApplication& a : d.applications()) {
      out << "      rank " << a.rank()
          << (a.applied() ? " applied it at step " : " refused it at step ") << a.step()
          << (a.reason().empty() ? "" : ": " + a.reason()) << "\n";
    }
  }
  out << "\nagents (" << run.agents_size() << "):\n";
  for (const v1::AgentInfo& a : run.agents()) {
    out << "  rank " << std::left << std::setw(5) << a.rank() << pad_columns(a.host(), 20)
        << (a.connected() ? "connected   " : "disconnected") << "  last seq " << a.last_seq()
        << ", seen " << format_time_ago(a.last_seen_unix_ns());
    if (a.counters().dropped_reports() > 0) {
      out << ", dropped " << a.counters().dropped_reports() << " reports";
    }
    out << "\n";
    if (s.world_size() > 1) {
      out << "      data parallel " << a.data_parallel_size() << ", gradients "
          << (a.gradients_sharded() ? "sharded" : "replicated") << ", policy agreement "
          << agreement_name(a.policy_agreement()) << ", holds policy seq " << a.last_policy_seq()
          << "\n";
    }
    for (const std::string& n : a.notices()) out << "      notice: " << n << "\n";
  }
}

void print_run_json(std::ostream& out, const v1::GetRunResponse& run) {
  const v1::RunSummary& s = run.summary();
  ordered_json j;
  j["run_id"] = s.run_id();
  j["steps"] = s.steps();
  j["reports"] = s.reports();
  j["first_step"] = s.first_step();
  j["last_step"] = s.last_step();
  j["world_size"] = s.world_size();
  j["precision"] = s.precision();
  j["compute_format"] = format_name(s.compute_format());
  j["agents_connected"] = s.agents_connected();
  j["loss_scale"] = json_number(s.loss_scale());
  j["loss"] = json_number(s.loss());
  j["policy_mode"] = mode_name(s.policy_mode());
  j["rejected_reports"] = s.rejected_reports();
  j["duplicate_reports"] = s.duplicate_reports();
  j["skipped_step_count"] = s.skipped_steps();
  j["partial_step_count"] = s.partial_steps();
  j["divergent_step_count"] = s.divergent_steps();
  ordered_json skipped = ordered_json::array();
  for (const v1::SkippedStep& k : run.skipped_steps()) {
    ordered_json e;
    e["step"] = k.step();
    e["rank"] = k.rank();
    e["loss_scale"] = json_number(k.loss_scale());
    e["scale_after"] = json_number(k.scale_after());
    e["found_inf"] = k.found_inf();
    ordered_json offender(nullptr);
    if (k.has_first_offender()) {
      // The step's merged first offender and the rank that reported it.
      offender = offender_json(k.first_offender());
      offender["rank"] = k.offender_rank();
    }
    e["first_offender"] = std::move(offender);
    e["why"] = k.why();
    skipped.push_back(std::move(e));
  }
  j["skipped_steps"] = std::move(skipped);
  ordered_json offenders = ordered_json::array();
  for (const v1::OffenderEvent& e : run.first_offenders()) {
    ordered_json o = offender_json(e.offender());
    o["step"] = e.step();
    o["rank"] = e.rank();
    offenders.push_back(std::move(o));
  }
  j["first_offenders"] = std::move(offenders);
  ordered_json timeline = ordered_json::array();
  for (const v1::ScalePoint& p : run.scale_timeline()) {
    timeline.push_back(ordered_json{{"step", p.step()}, {"loss_scale", json_number(p.loss_scale())}});
  }
  j["scale_timeline"] = std::move(timeline);
  ordered_json under = ordered_json::array();
  for (const v1::TensorRecord& t : run.worst_underflow()) under.push_back(tensor_json(t));
  j["worst_underflow"] = std::move(under);
  ordered_json over = ordered_json::array();
  for (const v1::TensorRecord& t : run.worst_overflow()) over.push_back(tensor_json(t));
  j["worst_overflow"] = std::move(over);
  ordered_json quantizers = ordered_json::array();
  for (const v1::QuantizerRecord& q : run.quantizers()) quantizers.push_back(quantizer_json(q));
  j["quantizers"] = std::move(quantizers);
  ordered_json updates = ordered_json::array();
  for (const v1::PolicyDecision& d : run.policy_decisions()) updates.push_back(update_json(d));
  j["policy_updates"] = std::move(updates);
  ordered_json agents = ordered_json::array();
  for (const v1::AgentInfo& a : run.agents()) {
    ordered_json e;
    e["rank"] = a.rank();
    e["host"] = a.host();
    e["connected"] = a.connected();
    e["last_seq"] = a.last_seq();
    e["last_seen_unix_ns"] = a.last_seen_unix_ns();
    e["dropped_reports"] = a.counters().dropped_reports();
    e["data_parallel_size"] = a.data_parallel_size();
    e["gradients_sharded"] = a.gradients_sharded();
    e["policy_agreement"] = agreement_name(a.policy_agreement());
    e["last_policy_seq"] = a.last_policy_seq();
    e["mean_step_time_s"] = json_number(a.mean_step_time_s());
    e["notices"] = ordered_json(std::vector<std::string>(a.notices().begin(), a.notices().end()));
    agents.push_back(std::move(e));
  }
  j["agents"] = std::move(agents);
  ordered_json partial = ordered_json::array();
  for (const v1::PartialStep& p : run.partial_steps()) {
    partial.push_back(ordered_json{
        {"step", p.step()},
        {"ranks", std::vector<std::uint32_t>(p.ranks().begin(), p.ranks().end())}});
  }
  j["partial_steps"] = std::move(partial);
  ordered_json divergences = ordered_json::array();
  for (const v1::RankDivergence& d : run.rank_divergences()) {
    ordered_json values = ordered_json::array();
    for (const v1::RankValue& v : d.values()) {
      values.push_back(ordered_json{{"rank", v.rank()}, {"value", v.value()}});
    }
    divergences.push_back(
        ordered_json{{"step", d.step()}, {"field", d.field()}, {"values", std::move(values)}});
  }
  j["rank_divergence"] = std::move(divergences);
  out << j.dump() << "\n";
}

void add_show_command(CLI::App& app) {
  auto args = std::make_shared<ShowArgs>();
  CLI::App* cmd = app.add_subcommand(
      "show",
      "What the server saw of one run: steps, skips and why, offenders, scale, FP8/FP4 "
      "quantisers, policy");
  cmd->add_option("run", args->run_id, "Run id (see 'ampscope runs')")->required();
  add_server_options(cmd, args->server);
  cmd->add_option("--limit", args->limit, "Entries per list (skipped steps, tensors, ...)")
      ->capture_default_str();
  cmd->add_option("--step", args->step,
                  "Show this step: what happened, and each offending tensor's binade histogram "
                  "over the steps before it (the flight recorder's history)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--steps-back", args->steps_back, "With --step: how many steps before it")
      ->capture_default_str();
  cmd->callback([args] {
    QueryClient client(args->server);
    if (args->step) {
      v1::GetStepHistoryRequest request;
      request.set_run_id(args->run_id);
      request.set_step(*args->step);
      request.set_steps(args->steps_back);
      const v1::GetStepHistoryResponse history = client.get_step_history(request);
      if (args->server.json) {
        print_step_json(std::cout, args->run_id, *args->step, history);
      } else {
        print_step_text(std::cout, args->run_id, *args->step, history, args->limit);
      }
      return;
    }
    v1::GetRunRequest request;
    request.set_run_id(args->run_id);
    request.set_limit(args->limit);
    const v1::GetRunResponse run = client.get_run(request);
    if (args->server.json) {
      print_run_json(std::cout, run);
    } else {
      print_run_text(std::cout, run);
    }
  });
}

}  // namespace ampscope::cli
