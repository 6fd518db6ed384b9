// Target: the agent's option parser (agent/src/config.cc, set_option), which the environment
// (AMPSCOPE_<KEY>) and ampscope-train's flags share.
// Input: text, one "key=value" per line (a line without '=' is a key with an empty value),
// applied in order to a default AgentConfig. The keys that name a file to read (token_file,
// tls_ca_file, tls_cert_file, tls_key_file) are skipped.
// Properties:
//   - a refused option leaves the configuration unchanged and says why in one line that names
//     the key;
//   - setting an option is idempotent (the same key and value again change nothing), and '-'
//     in a key means '_';
//   - every value the parser accepted round-trips: the configuration written back as options
//     (every key option_keys() lists) is accepted by a default configuration and gives the
//     same configuration, so nothing set_option stores lies outside what it accepts;
//   - validate() answers empty or one line.
#include <algorithm>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ampscope/agent/config.h"
#include "ampscope/vocabulary.h"
#include "support.h"

namespace ampscope::fuzz {
namespace {

using agent::AgentConfig;
using Options = std::vector<std::pair<std::string, std::string>>;

std::string recipes_text(const std::vector<Recipe>& recipes) {
  std::string out;
  for (const Recipe& r : recipes) out += (out.empty() ? "" : ",") + to_string(r);
  return out;
}

std::string roles_text(const std::vector<TensorRole>& roles) {
  if (roles.empty()) return "none";
  std::string out;
  for (TensorRole r : roles) {
    if (!out.empty()) out += ',';
    out += role_name(r);
  }
  return out;
}

std::string flag(bool b) { return b ? "true" : "false"; }

// Keys whose value names a file to read: not fuzzed, and not written back (the configuration
// holds the file's content).
bool names_a_file(std::string_view key) {
  return key == "token_file" || key == "tls_ca_file" || key == "tls_cert_file" ||
         key == "tls_key_file";
}
template <typename Rep, typename Period>
std::string ms(std::chrono::duration<Rep, Period> d) {
  return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
}

// The configuration as options, one per key set_option knows (those naming files aside).
Options as_options(const AgentConfig& c) {
  const auto& s = c.sampling;
  return {
      {"server", c.server},
      {"run_id", c.run_id},
      {"rank", std::to_string(c.rank)},
      {"world_size", std::to_string(c.world_size)},
      {"local_rank", c.local_rank < 0 ? "auto" : std::to_string(c.local_rank)},
      {"data_parallel_size", std::to_string(c.data_parallel_size)},
      {"gradients_sharded", flag(c.gradients_sharded)},
      {"policy_agreement", std::string(agent::agreement_name(c.policy_agreement))},
      {"policy_receive_delay_ms", ms(c.policy_receive_delay)},
      {"policy_lockstep", flag(c.policy_lockstep)},
      {"policy_lockstep_timeout_ms", ms(c.policy_lockstep_timeout)},
      {"token", c.token},
      {"tls", flag(c.tls)},
      {"spool_dir", c.spool_dir},
      {"spool_max_bytes", std::to_string(c.spool_max_bytes)},
      {"spool_segment_bytes", std::to_string(c.spool_segment_bytes)},
      {"queue_steps", std::to_string(c.queue_steps)},
      {"max_batch", std::to_string(c.max_batch)},
      {"max_in_flight", std::to_string(c.max_in_flight)},
      {"backoff_initial_ms", ms(c.backoff_initial)},
      {"backoff_max_ms", ms(c.backoff_max)},
      {"connect_timeout_ms", ms(c.connect_timeout)},
      {"keepalive_time_ms", ms(c.keepalive_time)},
      {"keepalive_timeout_ms", ms(c.keepalive_timeout)},
      {"flush_timeout_ms", ms(c.flush_timeout)},
      {"policy_fallback_after_ms", ms(c.policy_fallback_after)},
      {"stats_thread", c.stats_thread == agent::StatsThread::kWorker ? "worker" : "caller"},
      {"worker_max_bytes", std::to_string(c.worker_max_bytes)},
      {"nvtx", flag(c.nvtx)},
      {"recipe_targets", recipes_text(c.recipe_targets)},
      {"sample_counts", flag(s.counts)},
      {"sample_count_roles", roles_text(s.count_roles)},
      {"sample_full_every", std::to_string(s.full_every)},
      {"sample_full_on_nonfinite", flag(s.full_on_nonfinite)},
      {"sample_full_on_scale_change", flag(s.full_on_scale_change)},
      {"sample_full_roles", roles_text(s.full_roles)},
      {"sample_max_tensors", std::to_string(s.max_tensors_per_step)},
      {"cupti_every", std::to_string(s.cupti_every)},
      {"sample_full_ranks", agent::full_ranks_text(s.full_ranks)},
      {"flight_recorder_steps", std::to_string(c.flight_recorder_steps)},
      {"flight_recorder_bytes", std::to_string(c.flight_recorder_bytes)},
      {"flight_recorder_roles", roles_text(c.flight_recorder_roles)},
  };
}

// The configuration written back, or where that fails.
AgentConfig reparsed(const AgentConfig& c) {
  AgentConfig fresh;
  for (const auto& [key, value] : as_options(c)) {
    const std::string err = agent::set_option(fresh, key, value);
    FUZZ_CHECK(err.empty(), "a stored value is refused when set again: " + err);
  }
  return fresh;
}

bool same(const AgentConfig& a, const AgentConfig& b) { return as_options(a) == as_options(b); }

// The text set_option trims from strings it stores (std::isspace in the C locale).
bool trimmed(const std::string& s) {
  const auto space = [](char ch) {
    return std::string_view(" \t\n\v\f\r").find(ch) != std::string_view::npos;
  };
  return s.empty() || (!space(s.front()) && !space(s.back()));
}

}  // namespace
}  // namespace ampscope::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ampscope;
  using namespace ampscope::fuzz;
  static const bool keys_covered = [] {
    std::vector<std::string> listed;
    for (std::string_view k : agent::option_keys()) {
      if (!names_a_file(k)) listed.emplace_back(k);
    }
    std::vector<std::string> written;
    for (const auto& [k, v] : as_options(agent::AgentConfig{})) written.push_back(k);
    std::sort(listed.begin(), listed.end());
    std::sort(written.begin(), written.end());
    return listed == written;
  }();
  FUZZ_CHECK(keys_covered, "the target does not write back every key of option_keys()");

  const std::string_view text(reinterpret_cast<const char*>(data), size);
  agent::AgentConfig config;
  std::size_t start = 0;
  while (start < text.size()) {
    const std::size_t end = std::min(text.find('\n', start), text.size());
    const std::string_view line = text.substr(start, end - start);
    start = end + 1;
    const std::size_t eq = line.find('=');
    const std::string_view key = line.substr(0, eq);
    const std::string_view value = eq == std::string_view::npos ? "" : line.substr(eq + 1);
    std::string normal(key);
    std::replace(normal.begin(), normal.end(), '-', '_');
    std::transform(normal.begin(), normal.end(), normal.begin(),
                   [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
    if (names_a_file(normal)) continue;

    const agent::AgentConfig before = config;
    const std::string err = agent::set_option(config, key, value);
    if (!err.empty()) {
      FUZZ_CHECK(same(config, before), "a refused option changed the configuration: " + err);
      FUZZ_CHECK(one_line(err) || !one_line(value) || !one_line(key), err);
      FUZZ_CHECK(err.starts_with(normal + ":") || err.starts_with("unknown agent option"), err);
      continue;
    }
    agent::AgentConfig twice = config;
    FUZZ_CHECK(agent::set_option(twice, key, value).empty() && same(twice, config),
               "setting an option twice differs from once: " + std::string(key));
    agent::AgentConfig dashed = before;
    std::string dashed_key = normal;
    std::replace(dashed_key.begin(), dashed_key.end(), '_', '-');
    FUZZ_CHECK(agent::set_option(dashed, dashed_key, value).empty() && same(dashed, config),
               "'-' and '_' in a key differ: " + std::string(key));
  }
  for (const std::string* s : {&config.server, &config.run_id, &config.token, &config.spool_dir}) {
    FUZZ_CHECK(trimmed(*s), "a stored string keeps surrounding space: '" + *s + "'");
  }
  FUZZ_CHECK(same(reparsed(config), config), "the configuration does not round-trip");
  const std::string invalid = agent::validate(config);
  FUZZ_CHECK(one_line(invalid) || !one_line(text), invalid);
  return 0;
}
