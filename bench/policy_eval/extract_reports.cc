// ampscope_policy_eval_extract: one run's stored step reports and policy decisions, reduced to
// what the policy evaluation needs:
//
//   ampscope_policy_eval_extract --server HOST:PORT --run-id ID --out steps.jsonl
//                                [--decisions-out decisions.json]
//                                [--quantizers-out quantizers.json]
//
// steps.jsonl, one line per step, ascending: step, loss, loss_scale, scale_after, found_inf,
// skipped, val_loss (null where not evaluated), policy_applied (ids of the updates the agent
// applied at that step), fp32_layers, and the underflow of the gradients the loss scale
// multiplies (activation and weight gradients as measured in the backward pass, before
// unscaling). Each such gradient is counted once, in the format it passes through at its scale
// (TensorStats.held, else targets[0].format, the compute format):
//  - grad_numel: values that pass through a 16-bit format, of which
//    - grad_underflow: held wider than that format (the FP32 weight gradients that autocast
//      rounds to FP16): targets[0].underflow, values that round to zero at the step's scale;
//    - grad_zeros16: stored in that format itself (activation gradients): their underflow has
//      already happened, an underflowed value is stored as 0, so the zeros are the underflow
//      plus the few exact zeros the model makes.
//  - grad_numel_wide: values that never leave FP32 (held FP32: wte's total gradient, LayerNorm
//    and wpe gradients); nothing of theirs underflows at these scales, and they stay out of
//    the underflow ratio, whose share is of what passes through the 16-bit format.
//  - grad_unmeasured: gradients whose sample lacked the count that is needed (a counts-level
//    sample without targets); the step's underflow is then incomplete.
// act_grad_numel and act_grad_zeros split out the activation gradients.
// FP8/FP4 runs add bf16_gemms (StepReport.bf16_gemms: the layers whose GEMMs ran in BF16 at that
// step), quantizers (QuantizerStats of a recipe applied) and quantizers_what_if (a recipe only
// measured on the input of a layer in BF16).
//
// decisions.json: {"complete": bool, "decisions": [...]}, every stored decision of the run,
// oldest first (policy_id, effective_from_step, decided_at_step, loss_scale, fp32_tensors,
// bf16_gemms: the complete BF16 set when the decision sets one, else null; reason,
// applied_step: where rank 0 applied it, null if it did not); complete is false when the server
// returned only its latest kLimit decisions.
//
// quantizers.json: every quantiser of the run summed over its reports, one entry per (name,
// what_if), sorted by name: layer, recipe (the latest), reports, values, underflow, saturated,
// overflow, signal_sq, error_sq, and of the reports carrying a loss cost their count
// (loss_costs), sum and sum of squares; the statistics the server's per-layer precision reads.
//
// It reads the server's Query service (GetReports with tensors, GetRun), the same API
// `ampscope tail` and `show` use (through their QueryClient); the `ampscope` tool prints no
// per-tensor counts, hence this small client.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "query_client.h"

namespace {

using nlohmann::ordered_json;
namespace v1 = ampscope::v1;

struct StepRow {
  const v1::StepReport* report = nullptr;
  std::uint64_t grad_tensors = 0, grad_numel = 0, grad_underflow = 0, grad_zeros16 = 0;
  std::uint64_t grad_numel_wide = 0, grad_unmeasured = 0;
  std::uint64_t act_grad_numel = 0, act_grad_zeros = 0;
  std::uint64_t quantizers = 0, quantizers_what_if = 0;
  std::vector<std::string> policy_applied;
};

// One quantiser's reports summed over the run (applied and what-if apart).
struct QuantizerSum {
  std::string layer, recipe;
  std::uint64_t reports = 0, values = 0, underflow = 0, saturated = 0, overflow = 0;
  double signal_sq = 0.0, error_sq = 0.0;
  std::uint64_t loss_costs = 0;  // reports carrying a loss cost
  double loss_cost_sum = 0.0, loss_cost_sq_sum = 0.0;
};
using QuantizerSums = std::map<std::pair<std::string, bool>, QuantizerSum>;

using ampscope::cli::json_number;

bool is_scaled_gradient(const v1::TensorStats& t) {
  const bool grad = t.role() == v1::TENSOR_ROLE_ACTIVATION_GRAD ||
                    t.role() == v1::TENSOR_ROLE_WEIGHT_GRAD;
  return grad && t.phase() != v1::TENSOR_PHASE_AFTER_UNSCALE;
}

// The narrowest format the values pass through at the scale they carry (stats.proto: held).
v1::Format passes_through(const v1::TensorStats& t) {
  if (t.has_held()) return t.held();
  if (t.targets_size() > 0) return t.targets(0).format();
  return t.dtype();
}

bool is_wide(v1::Format f) { return f == v1::FORMAT_FP32 || f == v1::FORMAT_UNSPECIFIED; }

// targets[i] that asks how the values round into `f` as they are (scale_log2 0), or null.
const v1::TargetCounts* target_for(const v1::TensorStats& t, v1::Format f) {
  for (const auto& c : t.targets()) {
    if (c.format() == f && c.scale_log2() == 0) return &c;
  }
  return nullptr;
}

void add_tensor(const v1::TensorStats& t, StepRow& row) {
  ++row.grad_tensors;
  if (t.role() == v1::TENSOR_ROLE_ACTIVATION_GRAD) {
    row.act_grad_numel += t.numel();
    row.act_grad_zeros += t.zeros();
  }
  const v1::Format through = passes_through(t);
  if (is_wide(through)) {
    row.grad_numel_wide += t.numel();
  } else if (t.dtype() == through) {
    row.grad_numel += t.numel();
    row.grad_zeros16 += t.zeros();
  } else if (const v1::TargetCounts* c = target_for(t, through)) {
    row.grad_numel += t.numel();
    row.grad_underflow += c->underflow();
  } else {
    ++row.grad_unmeasured;
  }
}

void add_quantizer(const v1::QuantizerStats& q, StepRow& row, QuantizerSums& sums) {
  ++(q.what_if() ? row.quantizers_what_if : row.quantizers);
  QuantizerSum& s = sums[{q.name(), q.what_if()}];
  s.layer = q.layer();
  s.recipe = q.recipe();
  ++s.reports;
  s.values += q.values();
  s.underflow += q.underflow();
  s.saturated += q.saturated();
  s.overflow += q.overflow();
  s.signal_sq += q.signal_sq();
  s.error_sq += q.error_sq();
  if (q.has_loss_cost()) {
    ++s.loss_costs;
    s.loss_cost_sum += q.loss_cost();
    s.loss_cost_sq_sum += q.loss_cost() * q.loss_cost();
  }
}

void add_report(const v1::StepReport& r, StepRow& row, QuantizerSums& sums) {
  row.report = &r;
  for (const auto& o : r.policy_outcomes()) {
    if (o.applied()) row.policy_applied.push_back(o.policy_id());
  }
  for (const auto& t : r.tensors()) {
    if (is_scaled_gradient(t)) add_tensor(t, row);
  }
  for (const auto& q : r.quantizers()) add_quantizer(q, row, sums);
}

ordered_json step_json(std::int64_t step, const StepRow& row) {
  const auto& r = *row.report;
  ordered_json j;
  j["step"] = step;
  j["loss"] = json_number(r.loss());
  j["loss_scale"] = json_number(r.loss_scale());
  j["scale_after"] = json_number(r.scale_after());
  j["found_inf"] = r.found_inf();
  j["skipped"] = r.skipped();
  j["val_loss"] = r.has_val_loss() ? json_number(r.val_loss()) : ordered_json(nullptr);
  j["policy_applied"] = row.policy_applied;
  j["fp32_layers"] = std::vector<std::string>(r.fp32_layers().begin(), r.fp32_layers().end());
  j["grad_tensors"] = row.grad_tensors;
  j["grad_numel"] = row.grad_numel;
  j["grad_underflow"] = row.grad_underflow;
  j["grad_zeros16"] = row.grad_zeros16;
  j["grad_numel_wide"] = row.grad_numel_wide;
  j["grad_unmeasured"] = row.grad_unmeasured;
  j["act_grad_numel"] = row.act_grad_numel;
  j["act_grad_zeros"] = row.act_grad_zeros;
  j["bf16_gemms"] = std::vector<std::string>(r.bf16_gemms().begin(), r.bf16_gemms().end());
  j["quantizers"] = row.quantizers;
  j["quantizers_what_if"] = row.quantizers_what_if;
  return j;
}

ordered_json quantizers_json(const QuantizerSums& sums) {
  ordered_json out = ordered_json::array();
  for (const auto& [key, s] : sums) {
    ordered_json j;
    j["name"] = key.first;
    j["what_if"] = key.second;
    j["layer"] = s.layer;
    j["recipe"] = s.recipe;
    j["reports"] = s.reports;
    j["values"] = s.values;
    j["underflow"] = s.underflow;
    j["saturated"] = s.saturated;
    j["overflow"] = s.overflow;
    j["signal_sq"] = json_number(s.signal_sq);
    j["error_sq"] = json_number(s.error_sq);
    j["loss_costs"] = s.loss_costs;
    j["loss_cost_sum"] = json_number(s.loss_cost_sum);
    j["loss_cost_sq_sum"] = json_number(s.loss_cost_sq_sum);
    out.push_back(std::move(j));
  }
  return out;
}

int write_json(const ordered_json& j, const std::string& path) {
  std::ofstream out(path);
  out << j.dump() << "\n";
  if (!out) {
    std::cerr << "ampscope_policy_eval_extract: cannot write " << path << "\n";
    return 1;
  }
  return 0;
}

int write_steps(ampscope::cli::QueryClient& client, const std::string& run_id,
                const std::string& out_path, const std::string& quantizers_path) {
  std::vector<v1::GetReportsResponse> pages;  // own the reports the rows point at
  std::map<std::int64_t, StepRow> rows;
  QuantizerSums sums;
  std::string token;
  do {
    v1::GetReportsRequest q;
    q.set_run_id(run_id);
    q.set_rank(0);
    q.set_limit(500);
    q.set_include_tensors(true);
    q.set_order(v1::REPORT_ORDER_STEP);
    q.set_page_token(token);
    pages.push_back(client.get_reports(q));
    token = pages.back().next_page_token();
    for (const auto& stored : pages.back().reports()) {
      add_report(stored.report(), rows[stored.report().step()], sums);
    }
  } while (!token.empty());
  if (rows.empty()) {
    std::cerr << "ampscope_policy_eval_extract: run " << run_id << " has no reports\n";
    return 1;
  }
  std::ofstream out(out_path);
  for (const auto& [step, row] : rows) out << step_json(step, row).dump() << "\n";
  if (!out) {
    std::cerr << "ampscope_policy_eval_extract: cannot write " << out_path << "\n";
    return 1;
  }
  return quantizers_path.empty() ? 0 : write_json(quantizers_json(sums), quantizers_path);
}

// GetRun's most decisions per answer (the latest ones).
constexpr std::uint32_t kLimit = 1000;

ordered_json decision_json(const v1::PolicyDecision& d) {
  const v1::PolicyUpdate& u = d.update();
  ordered_json j;
  j["policy_id"] = u.policy_id();
  j["effective_from_step"] = u.effective_from_step();
  j["decided_at_step"] = u.decided_at_step();
  j["loss_scale"] = u.has_loss_scale() ? json_number(u.loss_scale()) : ordered_json(nullptr);
  j["fp32_tensors"] = u.fp32_tensors_set() ? ordered_json(std::vector<std::string>(
                                                 u.fp32_tensors().begin(), u.fp32_tensors().end()))
                                           : ordered_json(nullptr);
  j["bf16_gemms"] = u.bf16_gemms_set() ? ordered_json(std::vector<std::string>(
                                           u.bf16_gemms().begin(), u.bf16_gemms().end()))
                                       : ordered_json(nullptr);
  j["reason"] = u.reason();
  j["applied_step"] = nullptr;
  for (const auto& a : d.applications()) {
    if (a.rank() == 0 && a.applied()) {
      j["applied_step"] = a.step();
      break;
    }
  }
  return j;
}

int write_decisions(ampscope::cli::QueryClient& client, const std::string& run_id,
                    const std::string& out_path) {
  v1::GetRunRequest q;
  q.set_run_id(run_id);
  q.set_limit(kLimit);
  const v1::GetRunResponse run = client.get_run(q);
  ordered_json j;
  j["complete"] = static_cast<std::uint32_t>(run.policy_decisions_size()) < kLimit;
  j["decisions"] = ordered_json::array();
  for (const auto& d : run.policy_decisions()) j["decisions"].push_back(decision_json(d));
  return write_json(j, out_path);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"One run's step reports and policy decisions, reduced for the policy evaluation"};
  ampscope::cli::ServerArgs server;
  std::string run_id, out, decisions_out, quantizers_out;
  ampscope::cli::add_server_options(&app, server);
  app.add_option("--run-id", run_id, "run to read")->required();
  app.add_option("--out", out, "JSON-lines file of the steps to write")->required();
  app.add_option("--decisions-out", decisions_out, "JSON file of the policy decisions to write");
  app.add_option("--quantizers-out", quantizers_out,
                 "JSON file of the run's quantisers, summed per name and what-if, to write");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    ampscope::cli::QueryClient client(server);
    if (const int rc = write_steps(client, run_id, out, quantizers_out); rc != 0) return rc;
    return decisions_out.empty() ? 0 : write_decisions(client, run_id, decisions_out);
  } catch (const ampscope::cli::ServerError& e) {
    std::cerr << "ampscope_policy_eval_extract: " << e.what() << "\n";
    return 1;
  }
}
