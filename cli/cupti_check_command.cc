#include "cupti_check_command.h"

#include <nlohmann/json.hpp>

#include <iomanip>
#include <iostream>
#include <memory>
#include <string>

#include "command.h"

namespace ampscope::cli {
namespace {

struct CuptiCheckArgs {
  std::vector<std::string> chips;
  bool json = false;
  bool list = false;
};

// Usable: the chosen tensor metric resolves and the configuration needs one pass (a training
// step cannot be replayed).
bool usable(const agent::CuptiChipCheck& c) { return !c.tensor_metric.empty() && c.passes == 1; }

void run(const CuptiCheckArgs& args) {
  if (!agent::cupti_built_in()) {
    throw InputError("cupti-check: this ampscope was built without CUPTI "
                     "(configure with a CUDA toolkit and AMPSCOPE_ENABLE_CUDA=ON)");
  }
  if (args.list) {
    const agent::CuptiChipCheck c = agent::check_chip("");
    for (const auto& chip : c.supported_chips) std::cout << chip << "\n";
    return;
  }
  if (args.chips.empty()) throw UsageError("cupti-check: give --chip NAME (or --list)");
  std::vector<agent::CuptiChipCheck> checks;
  for (const auto& chip : args.chips) checks.push_back(agent::check_chip(chip));
  if (args.json) {
    print_cupti_check_json(std::cout, checks);
  } else {
    for (const auto& c : checks) print_cupti_check_text(std::cout, c);
  }
  for (const auto& c : checks) {
    if (!usable(c)) {
      throw InputError("cupti-check: " + c.chip + ": " +
                       (c.error.empty() ? "no usable single-pass configuration" : c.error));
    }
  }
}

}  // namespace

void print_cupti_check_text(std::ostream& out, const agent::CuptiChipCheck& c) {
  out << "chip " << c.chip << ": ";
  if (!c.available) {
    out << c.error << "\n";
    return;
  }
  out << "supported (Profiler Host API, range profiler, offline)\n";
  std::size_t width = 0;
  for (const auto& m : c.candidates) width = std::max(width, m.name.size());
  out << "  metric" << std::string(width - 4, ' ') << "result\n";
  for (const auto& m : c.candidates) {
    out << "  " << std::left << std::setw(static_cast<int>(width) + 2) << m.name
        << (m.resolves ? "resolves" : "does not resolve (" + m.error + ")");
    if (m.name == c.tensor_metric) out << "  <- tensor_core_active_ratio";
    if (m.name == c.time_metric) out << "  <- GPU time";
    out << "\n";
  }
  if (c.passes > 0) {
    out << "  configuration: " << (c.time_metric.empty() ? 1 : 2) << " metrics, " << c.passes
        << (c.passes == 1 ? " pass" : " passes") << ", image " << c.config_image_bytes
        << " bytes\n";
  } else {
    out << "  configuration: " << c.error << "\n";
  }
}

void print_cupti_check_json(std::ostream& out, const std::vector<agent::CuptiChipCheck>& checks) {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const auto& c : checks) {
    nlohmann::ordered_json j;
    j["chip"] = c.chip;
    j["available"] = c.available;
    j["tensor_metric"] = c.tensor_metric;
    j["time_metric"] = c.time_metric;
    j["passes"] = c.passes;
    j["config_image_bytes"] = c.config_image_bytes;
    j["usable"] = usable(c);
    j["error"] = c.error;
    nlohmann::ordered_json cands = nlohmann::ordered_json::array();
    for (const auto& m : c.candidates) {
      cands.push_back({{"name", m.name}, {"resolves", m.resolves}, {"error", m.error}});
    }
    j["candidates"] = std::move(cands);
    list.push_back(std::move(j));
  }
  nlohmann::ordered_json doc;
  doc["chips"] = std::move(list);
  out << doc.dump() << "\n";
}

void add_cupti_check_command(CLI::App& app) {
  auto args = std::make_shared<CuptiCheckArgs>();
  CLI::App* cmd = app.add_subcommand(
      "cupti-check",
      "Show the CUPTI metrics the agent collects on a chip and whether they resolve (offline, "
      "no GPU needed)");
  cmd->add_option("--chip", args->chips, "Chip name: GA100, GH100, GB100, ... (repeatable)");
  cmd->add_flag("--list", args->list, "List the chips this CUPTI supports");
  cmd->add_flag("--json", args->json, "Print JSON instead of text");
  cmd->callback([args] { run(*args); });
}

}  // namespace ampscope::cli
