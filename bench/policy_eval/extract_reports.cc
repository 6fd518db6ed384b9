// ampscope_policy_eval_extract: one run's stored step reports, reduced to what the policy
// evaluation needs, as JSON lines (one per step, ascending):
//
//   ampscope_policy_eval_extract --server HOST:PORT --run-id ID --out steps.jsonl
//
// Each line: step, loss, loss_scale, scale_after, found_inf, skipped, val_loss (null where not
// evaluated), policy_applied (updates the agent applied at that step) and, over the gradients
// the loss scale multiplies (activation and weight gradients as measured in the backward pass,
// before unscaling): grad_tensors, grad_numel, grad_underflow and grad_zeros16.
//  - grad_underflow: targets[0].underflow of gradients held wider than the compute format (the
//    FP32 weight gradients of AMP): values that round to zero in FP16 at the step's scale.
//  - grad_zeros16: zeros of gradients stored in the 16-bit compute format itself (activation
//    gradients): their underflow has already happened, an underflowed value is stored as 0, so
//    the zeros are the underflow plus the few exact zeros the model makes.
// act_grad_numel and act_grad_zeros split out the activation gradients.
//
// It reads the server's Query service (GetReports with tensors), the same API `ampscope tail`
// uses (through its QueryClient); the `ampscope` tool prints no per-tensor counts, hence this
// small client.
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

struct StepRow {
  const ampscope::v1::StepReport* report = nullptr;
  std::uint64_t grad_tensors = 0, grad_numel = 0, grad_underflow = 0, grad_zeros16 = 0;
  std::uint64_t act_grad_numel = 0, act_grad_zeros = 0;
  int policy_applied = 0;
};

using ampscope::cli::json_number;

bool is_scaled_gradient(const ampscope::v1::TensorStats& t) {
  const bool grad = t.role() == ampscope::v1::TENSOR_ROLE_ACTIVATION_GRAD ||
                    t.role() == ampscope::v1::TENSOR_ROLE_WEIGHT_GRAD;
  return grad && t.phase() != ampscope::v1::TENSOR_PHASE_AFTER_UNSCALE;
}

void add_report(const ampscope::v1::StepReport& r, StepRow& row) {
  row.report = &r;
  for (const auto& o : r.policy_outcomes()) row.policy_applied += o.applied() ? 1 : 0;
  for (const auto& t : r.tensors()) {
    if (!is_scaled_gradient(t)) continue;
    ++row.grad_tensors;
    row.grad_numel += t.numel();
    const bool stored_narrow = t.targets_size() > 0 && t.dtype() == t.targets(0).format();
    if (stored_narrow) {
      row.grad_zeros16 += t.zeros();
    } else if (t.targets_size() > 0) {
      row.grad_underflow += t.targets(0).underflow();
    }
    if (t.role() == ampscope::v1::TENSOR_ROLE_ACTIVATION_GRAD) {
      row.act_grad_numel += t.numel();
      row.act_grad_zeros += t.zeros();
    }
  }
}

int run(const ampscope::cli::ServerArgs& server, const std::string& run_id,
        const std::string& out_path) {
  ampscope::cli::QueryClient client(server);
  std::vector<ampscope::v1::GetReportsResponse> pages;  // own the reports the rows point at
  std::map<std::int64_t, StepRow> rows;
  std::string token;
  do {
    ampscope::v1::GetReportsRequest q;
    q.set_run_id(run_id);
    q.set_rank(0);
    q.set_limit(500);
    q.set_include_tensors(true);
    q.set_order(ampscope::v1::REPORT_ORDER_STEP);
    q.set_page_token(token);
    pages.push_back(client.get_reports(q));
    token = pages.back().next_page_token();
    for (const auto& stored : pages.back().reports()) {
      add_report(stored.report(), rows[stored.report().step()]);
    }
  } while (!token.empty());
  if (rows.empty()) {
    std::cerr << "ampscope_policy_eval_extract: run " << run_id << " has no reports\n";
    return 1;
  }
  std::ofstream out(out_path);
  for (const auto& [step, row] : rows) {
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
    j["grad_tensors"] = row.grad_tensors;
    j["grad_numel"] = row.grad_numel;
    j["grad_underflow"] = row.grad_underflow;
    j["grad_zeros16"] = row.grad_zeros16;
    j["act_grad_numel"] = row.act_grad_numel;
    j["act_grad_zeros"] = row.act_grad_zeros;
    out << j.dump() << "\n";
  }
  if (!out) {
    std::cerr << "ampscope_policy_eval_extract: cannot write " << out_path << "\n";
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"One run's step reports, reduced for the policy evaluation, as JSON lines"};
  ampscope::cli::ServerArgs server;
  std::string run_id, out;
  ampscope::cli::add_server_options(&app, server);
  app.add_option("--run-id", run_id, "run to read")->required();
  app.add_option("--out", out, "JSON-lines file to write")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    return run(server, run_id, out);
  } catch (const ampscope::cli::ServerError& e) {
    std::cerr << "ampscope_policy_eval_extract: " << e.what() << "\n";
    return 1;
  }
}
