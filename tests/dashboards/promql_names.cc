#include "promql_names.h"

#include <algorithm>
#include <cctype>
#include <regex>
#include <set>

namespace ampscope::testing {
namespace {

bool ident_start(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':';
}
bool ident_char(char c) { return ident_start(c) || std::isdigit(static_cast<unsigned char>(c)); }

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// Index just past the string literal that starts at `i` (quote character at i).
std::size_t skip_string(std::string_view s, std::size_t i) {
  const char quote = s[i];
  for (++i; i < s.size(); ++i) {
    if (quote != '`' && s[i] == '\\') {
      ++i;
    } else if (s[i] == quote) {
      return i + 1;
    }
  }
  return s.size();
}

// Index just past the bracketed group that opens at `i` (s[i] is `open`), skipping strings.
std::size_t skip_group(std::string_view s, std::size_t i, char open, char close) {
  int depth = 0;
  for (; i < s.size(); ++i) {
    if (s[i] == '"' || s[i] == '\'' || s[i] == '`') {
      i = skip_string(s, i) - 1;
    } else if (s[i] == open) {
      ++depth;
    } else if (s[i] == close && --depth == 0) {
      return i + 1;
    }
  }
  return s.size();
}

std::size_t skip_space(std::string_view s, std::size_t i) {
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return i;
}

void add(std::vector<std::string>& names, std::set<std::string>& seen, std::string name) {
  if (seen.insert(name).second) names.push_back(std::move(name));
}

}  // namespace

std::vector<std::string> promql_metric_names(std::string_view s) {
  static const std::set<std::string> kKeywords = {"and",    "or",    "unless", "bool",
                                                  "offset", "atan2", "inf",    "nan"};
  static const std::set<std::string> kGrouping = {"by",       "without",    "on",
                                                  "ignoring", "group_left", "group_right"};
  static const std::regex kNameMatcher(R"re(__name__\s*=\s*"([^"]*)")re");
  std::vector<std::string> names;
  std::set<std::string> seen;
  std::size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (c == '"' || c == '\'' || c == '`') {
      i = skip_string(s, i);
    } else if (c == '#') {
      while (i < s.size() && s[i] != '\n') ++i;
    } else if (c == '{') {
      const std::size_t end = skip_group(s, i, '{', '}');
      const std::string matchers(s.substr(i, end - i));
      for (auto it = std::sregex_iterator(matchers.begin(), matchers.end(), kNameMatcher);
           it != std::sregex_iterator(); ++it) {
        add(names, seen, (*it)[1]);
      }
      i = end;
    } else if (c == '[') {
      i = skip_group(s, i, '[', ']');
    } else if (std::isdigit(static_cast<unsigned char>(c)) ||
               (c == '.' && i + 1 < s.size() &&
                std::isdigit(static_cast<unsigned char>(s[i + 1])))) {
      // Numbers and durations: 1, 0.5, 1e3, 0x1f, 5m, 1h30m.
      while (i < s.size() && (std::isalnum(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
    } else if (ident_start(c)) {
      std::size_t end = i;
      while (end < s.size() && ident_char(s[end])) ++end;
      const std::string word(s.substr(i, end - i));
      const std::size_t next = skip_space(s, end);
      bool call = next < s.size() && s[next] == '(';
      // An aggregation with its grouping first: `sum by (run) (x)`.
      if (!call && next < s.size() && ident_start(s[next])) {
        std::size_t w = next;
        while (w < s.size() && ident_char(s[w])) ++w;
        const std::string following = lower(std::string(s.substr(next, w - next)));
        call = following == "by" || following == "without";
      }
      if (kGrouping.contains(lower(word))) {
        i = call ? skip_group(s, next, '(', ')') : end;
        continue;
      }
      if (!call && !kKeywords.contains(lower(word))) add(names, seen, word);
      i = end;
    } else {
      ++i;
    }
  }
  return names;
}

std::vector<std::string> grafana_variable_metric_names(std::string_view query) {
  const std::size_t start = skip_space(query, 0);
  static constexpr std::string_view kLabelValues = "label_values";
  if (query.substr(start, kLabelValues.size()) != kLabelValues) return promql_metric_names(query);
  std::size_t open = skip_space(query, start + kLabelValues.size());
  if (open >= query.size() || query[open] != '(') return promql_metric_names(query);
  const std::size_t close = skip_group(query, open, '(', ')') - 1;
  const std::string_view args = query.substr(open + 1, close - open - 1);
  // The last top-level comma separates the selector from the label.
  std::size_t comma = std::string_view::npos;
  int depth = 0;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const char c = args[i];
    if (c == '"' || c == '\'' || c == '`') {
      i = skip_string(args, i) - 1;
    } else if (c == '(' || c == '{' || c == '[') {
      ++depth;
    } else if (c == ')' || c == '}' || c == ']') {
      --depth;
    } else if (c == ',' && depth == 0) {
      comma = i;
    }
  }
  if (comma == std::string_view::npos) return {};  // label_values(label): no metric
  return promql_metric_names(args.substr(0, comma));
}

}  // namespace ampscope::testing
