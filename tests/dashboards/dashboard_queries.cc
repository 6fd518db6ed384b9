#include "dashboard_queries.h"

#include <algorithm>
#include <fstream>
#include <regex>
#include <stdexcept>

#ifndef AMPSCOPE_DASHBOARDS_DIR
#error "AMPSCOPE_DASHBOARDS_DIR must name the source tree's dashboards/ directory"
#endif

namespace ampscope::testing {

using nlohmann::json;

std::filesystem::path dashboards_dir() { return AMPSCOPE_DASHBOARDS_DIR; }
std::filesystem::path dashboard_json() { return dashboards_dir() / "grafana" / "ampscope.json"; }
std::filesystem::path alert_rules() { return dashboards_dir() / "prometheus" / "alerts.yml"; }

json load_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  return json::parse(in);  // throws with the position on a syntax error
}

std::vector<json> all_panels(const json& dashboard) {
  std::vector<json> out;
  for (const json& p : dashboard.at("panels")) {
    out.push_back(p);
    for (const json& child : p.value("panels", json::array())) out.push_back(child);
  }
  return out;
}

const json* find_variable(const json& dashboard, const std::string& name) {
  for (const json& v : dashboard.at("templating").at("list")) {
    if (v.value("name", "") == name) return &v;
  }
  return nullptr;
}

std::string variable_query(const json& variable) {
  const json& q = variable.at("query");
  return q.is_string() ? q.get<std::string>() : q.at("query").get<std::string>();
}

std::vector<Query> dashboard_queries(const json& dashboard) {
  std::vector<Query> out;
  for (const json& p : all_panels(dashboard)) {
    for (const json& t : p.value("targets", json::array())) {
      if (!t.contains("expr")) continue;
      out.push_back({"panel " + std::to_string(p.at("id").get<int>()) + " '" +
                         p.value("title", "") + "' " + t.value("refId", ""),
                     t.at("expr").get<std::string>()});
    }
  }
  for (const json& a : dashboard.at("annotations").at("list")) {
    if (a.contains("expr")) {
      out.push_back({"annotation '" + a.value("name", "") + "'", a.at("expr").get<std::string>()});
    }
  }
  return out;
}

std::string substitute_variables(const std::string& expr, const json& dashboard,
                                 const std::map<std::string, std::string>& values) {
  static const std::regex kVariable(R"(\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\])");
  static const std::map<std::string, std::string> kBuiltins = {{"__rate_interval", "1m"},
                                                               {"__interval", "1m"},
                                                               {"__range", "1h"},
                                                               {"__range_s", "3600"},
                                                               {"__interval_ms", "60000"}};
  std::string out;
  auto begin = expr.cbegin();
  for (std::sregex_iterator it(expr.begin(), expr.end(), kVariable), end; it != end; ++it) {
    const std::smatch& m = *it;
    const std::string name = m[1].matched ? m[1] : m[2].matched ? m[2] : m[3];
    out.append(begin, m[0].first);
    begin = m[0].second;
    if (std::all_of(name.begin(), name.end(), ::isdigit)) {  // "$1" of label_replace
      out += m.str();
    } else if (auto v = values.find(name); v != values.end()) {
      out += v->second;
    } else if (auto b = kBuiltins.find(name); b != kBuiltins.end()) {
      out += b->second;
    } else if (const json* var = find_variable(dashboard, name)) {
      const std::string type = var->value("type", "");
      if (type == "custom" || type == "constant" || type == "interval") {
        const json& value = var->at("current").at("value");
        out += value.is_array() ? value.at(0).get<std::string>() : value.get<std::string>();
      } else {
        out += ".+";
      }
    } else {
      throw std::invalid_argument("unknown variable $" + name + " in: " + expr);
    }
  }
  out.append(begin, expr.cend());
  return out;
}

}  // namespace ampscope::testing
