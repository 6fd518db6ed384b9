#include "tail_command.h"

#include <cmath>
#include <iomanip>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "ampscope/proto/vocabulary_codec.h"
#include "ampscope/vocabulary.h"
#include "query_client.h"

namespace ampscope::cli {
namespace {

using nlohmann::ordered_json;

struct TailArgs {
  ServerArgs server;
  std::string run_id;
  unsigned lines = 10;
  bool follow = false;
  double interval_s = 1.0;
  std::optional<unsigned> rank;
  std::optional<unsigned> count;
  bool tensors = false;
};

class Tail {
 public:
  explicit Tail(const TailArgs& args) : args_(args), client_(args.server) {}

  void run() {
    // The last `lines` reports; with none wanted, only the position to follow from.
    v1::GetReportsRequest first = request();
    first.set_latest(true);
    first.set_limit(std::max(1u, args_.lines));
    const v1::GetReportsResponse latest = client_.get_reports(first);
    for (const v1::StoredReport& r : latest.reports()) {
      after_ = std::max(after_, r.report_id());
      if (args_.lines > 0 && !print(r)) return;
    }
    std::cout.flush();
    while (args_.follow) {
      std::this_thread::sleep_for(std::chrono::milliseconds(
          static_cast<std::int64_t>(std::max(0.05, args_.interval_s) * 1000)));
      v1::GetReportsRequest next = request();
      next.set_after_report_id(after_);
      next.set_limit(1000);
      const v1::GetReportsResponse batch = client_.get_reports(next);
      for (const v1::StoredReport& r : batch.reports()) {
        after_ = std::max(after_, r.report_id());
        if (!print(r)) return;
      }
      std::cout.flush();
    }
  }

 private:
  v1::GetReportsRequest request() const {
    v1::GetReportsRequest q;
    q.set_run_id(args_.run_id);
    q.set_order(v1::REPORT_ORDER_ARRIVAL);
    if (args_.rank) q.set_rank(*args_.rank);
    q.set_include_tensors(args_.tensors);
    return q;
  }

  // False once --count reports were printed.
  bool print(const v1::StoredReport& r) {
    if (args_.server.json) {
      print_report_json(std::cout, r, args_.tensors);
    } else {
      print_report_text(std::cout, r);
    }
    ++printed_;
    return !args_.count || printed_ < *args_.count;
  }

  const TailArgs& args_;
  QueryClient client_;
  std::uint64_t after_ = 0;
  unsigned printed_ = 0;
};

}  // namespace

void print_report_text(std::ostream& out, const v1::StoredReport& stored) {
  const v1::StepReport& r = stored.report();
  out << "step " << std::left << std::setw(8) << r.step() << "rank " << std::setw(4) << r.rank()
      << "loss " << std::setw(10) << std::setprecision(5) << r.loss() << "scale "
      << format_scale(r.loss_scale());
  if (r.scale_after() != r.loss_scale()) out << " -> " << format_scale(r.scale_after());
  out << "  grad_norm " << std::setprecision(4) << r.grad_norm() << "  " << std::setprecision(3)
      << r.step_time_s() * 1000 << " ms";
  if (r.has_val_loss()) out << "  val_loss " << std::setprecision(5) << r.val_loss();
  if (r.found_inf()) out << "  FOUND_INF";
  if (r.skipped()) out << "  SKIPPED";
  if (r.has_first_offender()) {
    out << "  first offender " << r.first_offender().tensor() << " ("
        << role_name(r.first_offender().role()) << ", order " << r.first_offender().order()
        << ", micro-step " << r.first_offender().micro_step() << ")";
  }
  for (const v1::PolicyOutcome& o : r.policy_outcomes()) {
    out << "  policy " << o.policy_id() << (o.applied() ? " applied" : " refused");
  }
  out << "\n";
}

namespace {
// A tensor's identity and counts (the histogram and per-target counts are left out).
ordered_json tensor_json(const v1::TensorStats& t) {
  ordered_json j;
  j["name"] = t.name();
  j["role"] = role_name(t.role());
  j["phase"] = std::string(phase_name(proto::from_proto(t.phase())));
  j["dtype"] = format_name(t.dtype());
  j["held"] = t.has_held() ? ordered_json(format_name(t.held())) : ordered_json(nullptr);
  j["order"] = t.order();
  j["micro_step"] = t.micro_step();
  j["scale"] = json_number(t.scale());
  j["level"] = t.level() == v1::STATS_LEVEL_FULL ? "full" : "counts";
  j["numel"] = t.numel();
  j["zeros"] = t.zeros();
  j["nan"] = t.nan();
  j["pos_inf"] = t.pos_inf();
  j["neg_inf"] = t.neg_inf();
  j["max_abs"] = json_number(t.max_abs());
  return j;
}
}  // namespace

void print_report_json(std::ostream& out, const v1::StoredReport& stored, bool tensors) {
  const v1::StepReport& r = stored.report();
  ordered_json j;
  j["report_id"] = stored.report_id();
  j["received_unix_ns"] = stored.received_unix_ns();
  j["run_id"] = r.run_id();
  j["rank"] = r.rank();
  j["seq"] = r.seq();
  j["step"] = r.step();
  j["loss"] = json_number(r.loss());
  j["loss_scale"] = json_number(r.loss_scale());
  j["scale_after"] = json_number(r.scale_after());
  j["found_inf"] = r.found_inf();
  j["skipped"] = r.skipped();
  j["grad_norm"] = json_number(r.grad_norm());
  j["lr"] = json_number(r.lr());
  j["step_time_s"] = json_number(r.step_time_s());
  j["tokens"] = r.tokens();
  j["optimizer_steps"] = r.optimizer_steps();
  j["policy_seq"] = r.policy_seq();
  j["val_loss"] = r.has_val_loss() ? json_number(r.val_loss()) : ordered_json(nullptr);
  j["tensor_core_active_ratio"] = r.has_tensor_core_active_ratio()
                                      ? json_number(r.tensor_core_active_ratio())
                                      : ordered_json(nullptr);
  if (r.has_first_offender()) {
    j["first_offender"] = ordered_json{{"tensor", r.first_offender().tensor()},
                                       {"role", role_name(r.first_offender().role())},
                                       {"order", r.first_offender().order()},
                                       {"micro_step", r.first_offender().micro_step()}};
  } else {
    j["first_offender"] = nullptr;
  }
  ordered_json outcomes = ordered_json::array();
  for (const v1::PolicyOutcome& o : r.policy_outcomes()) {
    outcomes.push_back(ordered_json{
        {"policy_id", o.policy_id()}, {"applied", o.applied()}, {"reason", o.reason()}});
  }
  j["policy_outcomes"] = std::move(outcomes);
  // The layers this step computed in FP32 (the policy's overrides) and its GEMMs in BF16.
  j["fp32_layers"] = r.fp32_layers();
  j["bf16_gemms"] = r.bf16_gemms();
  if (tensors) {
    ordered_json list = ordered_json::array();
    for (const v1::TensorStats& t : r.tensors()) list.push_back(tensor_json(t));
    j["tensors"] = std::move(list);
  }
  out << j.dump() << "\n";
}

void add_tail_command(CLI::App& app) {
  auto args = std::make_shared<TailArgs>();
  CLI::App* cmd =
      app.add_subcommand("tail", "The latest step reports of a run; --follow for new ones");
  cmd->add_option("run", args->run_id, "Run id (see 'ampscope runs')")->required();
  add_server_options(cmd, args->server);
  cmd->add_option("-n,--lines", args->lines, "Reports to show first (0: none)")
      ->capture_default_str();
  cmd->add_flag("-f,--follow", args->follow, "Keep printing reports as they are stored");
  cmd->add_option("--interval", args->interval_s, "Seconds between polls with --follow")
      ->capture_default_str();
  cmd->add_option("--rank", args->rank, "Only this rank");
  cmd->add_option("--count", args->count, "Exit after printing this many reports");
  cmd->add_flag("--tensors", args->tensors,
                "With --json: each report's tensors (name, role, phase, format, counts)");
  cmd->callback([args] { Tail(*args).run(); });
}

}  // namespace ampscope::cli
