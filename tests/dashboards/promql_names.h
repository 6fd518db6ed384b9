// The metric names a PromQL expression reads, found by a small lexer: identifiers that are not
// keywords, not function or aggregation names (followed by '('), and not inside label matchers,
// grouping lists, strings or range brackets; plus `__name__="..."` matchers. The expressions
// are also checked for syntax by promtool (dashboard_test), so the lexer need not be a parser.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ampscope::testing {

// In order of first appearance, without duplicates.
std::vector<std::string> promql_metric_names(std::string_view expr);

// Grafana's template-variable query `label_values(SELECTOR, LABEL)` (or `label_values(LABEL)`):
// the metric names SELECTOR reads. Other variable queries are treated as PromQL.
std::vector<std::string> grafana_variable_metric_names(std::string_view query);

}  // namespace ampscope::testing
