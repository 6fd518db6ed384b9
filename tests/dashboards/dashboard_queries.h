// The Grafana dashboard's queries as PromQL a real Prometheus can run: the JSON read, every
// panel (rows' nested ones included), every panel target's and annotation's expression, and
// Grafana's variables replaced by values. Shared by the dashboard's artefact tests
// (dashboard_test.cc) and the two-server test (two_servers_test.cc).
#pragma once

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ampscope::testing {

// The source tree's dashboards/ folder, and the dashboard and alert rules the tests read there.
std::filesystem::path dashboards_dir();
std::filesystem::path dashboard_json();  // grafana/ampscope.json
std::filesystem::path alert_rules();     // prometheus/alerts.yml

// The file parsed; throws with the position on a syntax error, or when it cannot be read.
nlohmann::json load_json(const std::filesystem::path& path);

// Every panel, rows' nested panels included.
std::vector<nlohmann::json> all_panels(const nlohmann::json& dashboard);

// The templating variable `name`; null when the dashboard has none.
const nlohmann::json* find_variable(const nlohmann::json& dashboard, const std::string& name);
// A query variable's query (a string, or the "query" of an object).
std::string variable_query(const nlohmann::json& variable);

struct Query {
  std::string where;  // "panel 9 'Loss scale (log2)' B", "annotation 'Policy updates'", ...
  std::string expr;
};

// Every panel target's and annotation's expression.
std::vector<Query> dashboard_queries(const nlohmann::json& dashboard);

// Replaces Grafana's variables by values that keep the query valid PromQL: `values` first
// (say, {"run", "a|b"}), then the current value of custom variables, ".+" for query variables
// (they are used in regex matchers), and durations for the built-in intervals. Throws
// std::invalid_argument naming a variable the dashboard does not define.
std::string substitute_variables(const std::string& expr, const nlohmann::json& dashboard,
                                 const std::map<std::string, std::string>& values = {});

}  // namespace ampscope::testing
