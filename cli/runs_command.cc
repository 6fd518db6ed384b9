#include "runs_command.h"

#include <iomanip>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "query_client.h"

namespace ampscope::cli {
namespace {

struct RunsArgs {
  ServerArgs server;
  unsigned limit = 100;
};

struct DeleteArgs {
  ServerArgs server;
  std::string run_id;
};

void add_delete_command(CLI::App* runs) {
  auto args = std::make_shared<DeleteArgs>();
  CLI::App* cmd = runs->add_subcommand(
      "delete",
      "Delete a run on the server: its stored reports, agents, policy decisions and state, and "
      "its metric series. Agents still streaming it are disconnected; when they reconnect the run "
      "starts again.");
  cmd->add_option("RUN", args->run_id, "Run id (see 'ampscope runs')")->required();
  add_server_options(cmd, args->server);
  cmd->callback([args] {
    QueryClient client(args->server);
    v1::DeleteRunRequest request;
    request.set_run_id(args->run_id);
    const v1::DeleteRunResponse r = client.delete_run(request);
    if (args->server.json) {
      nlohmann::ordered_json j;
      j["run_id"] = args->run_id;
      j["deleted_reports"] = r.deleted_reports();
      j["streams_ended"] = r.streams_ended();
      std::cout << j.dump() << "\n";
    } else {
      std::cout << "deleted run '" << args->run_id << "': " << r.deleted_reports() << " reports"
                << (r.streams_ended() > 0
                        ? ", " + std::to_string(r.streams_ended()) + " agent streams ended"
                        : std::string())
                << "\n";
    }
  });
}

}  // namespace

void print_runs_text(std::ostream& out, const v1::ListRunsResponse& runs) {
  if (runs.runs_size() == 0) {
    out << "no runs yet\n";
    return;
  }
  out << std::left << std::setw(28) << "RUN" << std::setw(7) << "RANKS" << std::setw(8) << "AGENTS"
      << std::setw(10) << "STEPS" << std::setw(9) << "SKIPPED" << std::setw(12) << "LAST STEP"
      << std::setw(12) << "SCALE" << std::setw(12) << "LOSS" << std::setw(15) << "POLICY"
      << "LAST SEEN\n";
  for (const v1::RunSummary& r : runs.runs()) {
    std::ostringstream loss;
    loss << std::setprecision(5) << r.loss();
    out << std::left << std::setw(28) << r.run_id() << std::setw(7) << r.world_size()
        << std::setw(8) << r.agents_connected() << std::setw(10) << r.steps() << std::setw(9)
        << r.skipped_steps() << std::setw(12) << r.last_step() << std::setw(12)
        << format_scale(r.loss_scale()) << std::setw(12) << loss.str() << std::setw(15)
        << mode_name(r.policy_mode()) << format_time_ago(r.last_seen_unix_ns()) << "\n";
  }
}

void print_runs_json(std::ostream& out, const v1::ListRunsResponse& runs) {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const v1::RunSummary& r : runs.runs()) {
    nlohmann::ordered_json j;
    j["run_id"] = r.run_id();
    j["world_size"] = r.world_size();
    j["precision"] = r.precision();
    j["trainer"] = r.trainer();
    j["compute_format"] = format_name(r.compute_format());
    j["agents_connected"] = r.agents_connected();
    j["reports"] = r.reports();
    j["steps"] = r.steps();
    j["first_step"] = r.first_step();
    j["last_step"] = r.last_step();
    j["skipped_steps"] = r.skipped_steps();
    j["loss_scale"] = json_number(r.loss_scale());
    j["loss"] = json_number(r.loss());
    j["policy_mode"] = mode_name(r.policy_mode());
    j["rejected_reports"] = r.rejected_reports();
    j["duplicate_reports"] = r.duplicate_reports();
    j["first_seen_unix_ns"] = r.first_seen_unix_ns();
    j["last_seen_unix_ns"] = r.last_seen_unix_ns();
    list.push_back(std::move(j));
  }
  nlohmann::ordered_json doc;
  doc["runs"] = std::move(list);
  out << doc.dump() << "\n";
}

void add_runs_command(CLI::App& app) {
  auto args = std::make_shared<RunsArgs>();
  CLI::App* cmd = app.add_subcommand("runs", "List the runs ampscope-server knows");
  add_server_options(cmd, args->server);
  cmd->add_option("--limit", args->limit, "Most recently active runs to list")
      ->capture_default_str();
  add_delete_command(cmd);
  cmd->callback([args, cmd] {
    if (cmd->got_subcommand("delete")) return;  // `runs delete` did the work
    QueryClient client(args->server);
    v1::ListRunsRequest request;
    request.set_limit(args->limit);
    const v1::ListRunsResponse runs = client.list_runs(request);
    if (args->server.json) {
      print_runs_json(std::cout, runs);
    } else {
      print_runs_text(std::cout, runs);
    }
  });
}

}  // namespace ampscope::cli
