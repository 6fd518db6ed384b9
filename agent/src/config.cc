#include "ampscope/agent/config.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <string_view>

#include "ampscope/proto/target.h"

namespace ampscope::agent {
namespace {

std::string normalise_key(std::string_view key) {
  std::string k;
  for (char c : key) {
    k += c == '-' ? '_' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return k;
}

std::string trim(std::string_view v) {
  while (!v.empty() && std::isspace(static_cast<unsigned char>(v.front()))) v.remove_prefix(1);
  while (!v.empty() && std::isspace(static_cast<unsigned char>(v.back()))) v.remove_suffix(1);
  return std::string(v);
}

bool parse_bool(std::string_view text, bool* out) {
  std::string v = normalise_key(trim(text));
  if (v == "1" || v == "true" || v == "on" || v == "yes") {
    *out = true;
  } else if (v == "0" || v == "false" || v == "off" || v == "no") {
    *out = false;
  } else {
    return false;
  }
  return true;
}

// Integers, with K/M/G (binary) suffixes for sizes.
bool parse_int(std::string_view text, std::int64_t lo, std::int64_t hi, bool size_suffix,
               std::int64_t* out) {
  std::string v = trim(text);
  std::int64_t factor = 1;
  if (size_suffix && !v.empty()) {
    const char s = static_cast<char>(std::toupper(static_cast<unsigned char>(v.back())));
    if (s == 'K' || s == 'M' || s == 'G') {
      factor = s == 'K' ? (1 << 10) : s == 'M' ? (1 << 20) : (1 << 30);
      v.pop_back();
    }
  }
  std::int64_t n = 0;
  const auto r = std::from_chars(v.data(), v.data() + v.size(), n);
  if (r.ec != std::errc() || r.ptr != v.data() + v.size() || v.empty()) return false;
  if (n > std::numeric_limits<std::int64_t>::max() / factor ||
      n < std::numeric_limits<std::int64_t>::min() / factor) {
    return false;
  }
  n *= factor;
  if (n < lo || n > hi) return false;
  *out = n;
  return true;
}

bool parse_roles(std::string_view text, std::vector<TensorRole>* out) {
  std::string v = normalise_key(trim(text));
  std::vector<TensorRole> roles;
  if (v == "all") {
    for (int i = 0; i < kNumTensorRoles; ++i) roles.push_back(static_cast<TensorRole>(i));
  } else if (v != "none" && !v.empty()) {
    std::size_t start = 0;
    while (start <= v.size()) {
      const std::size_t comma = std::min(v.find(',', start), v.size());
      auto role = parse_role(trim(std::string_view(v).substr(start, comma - start)));
      if (!role) return false;
      if (std::find(roles.begin(), roles.end(), *role) == roles.end()) roles.push_back(*role);
      start = comma + 1;
    }
  }
  *out = std::move(roles);
  return true;
}

// sample_full_ranks (SamplingConfig::full_ranks): auto, all, node, every:K or a list of ranks.
bool parse_full_ranks(std::string_view text, FullRanks* out) {
  const std::string v = normalise_key(trim(text));
  FullRanks f;
  if (v == "auto" || v == "all" || v == "node") {
    f.kind = v == "auto"  ? FullRanks::Kind::kAuto
             : v == "all" ? FullRanks::Kind::kAll
                          : FullRanks::Kind::kNode;
  } else if (v.rfind("every:", 0) == 0) {
    std::int64_t k = 0;
    if (!parse_int(std::string_view(v).substr(6), 1, 65536, false, &k)) return false;
    f.kind = FullRanks::Kind::kEvery;
    f.every = static_cast<std::uint32_t>(k);
  } else {
    f.kind = FullRanks::Kind::kList;
    std::size_t start = 0;
    while (start <= v.size()) {
      const std::size_t comma = std::min(v.find(',', start), v.size());
      std::int64_t r = 0;
      if (!parse_int(std::string_view(v).substr(start, comma - start), 0, 65535, false, &r)) {
        return false;
      }
      f.ranks.push_back(static_cast<std::uint32_t>(r));
      start = comma + 1;
    }
    std::sort(f.ranks.begin(), f.ranks.end());
    f.ranks.erase(std::unique(f.ranks.begin(), f.ranks.end()), f.ranks.end());
  }
  *out = std::move(f);
  return true;
}

// local_rank: an index on the node, or auto (-1: the launcher's).
bool parse_local_rank(std::string_view text, std::int32_t* out) {
  if (normalise_key(trim(text)) == "auto") {
    *out = -1;
    return true;
  }
  std::int64_t n = 0;
  if (!parse_int(text, 0, 65535, false, &n)) return false;
  *out = static_cast<std::int32_t>(n);
  return true;
}

struct Option {
  std::string_view key;
  std::string_view expected;  // for the error message
  std::function<bool(AgentConfig&, std::string_view)> set;
  // Instead of `set`, for values whose error names the bad part: empty on success.
  std::function<std::string(AgentConfig&, std::string_view)> set_or_why = nullptr;
};

// recipe_targets: comma-separated recipe texts; each must read back as itself (what goes on
// the wire is its canonical text), none twice, at most kMaxRecipeTargets.
std::string parse_recipe_targets(AgentConfig& c, std::string_view v) {
  std::vector<Recipe> recipes;
  const std::string all = trim(v);
  std::size_t start = 0;
  while (!all.empty() && start <= all.size()) {
    const std::size_t comma = std::min(all.find(',', start), all.size());
    const std::string text = trim(std::string_view(all).substr(start, comma - start));
    start = comma + 1;
    if (text.empty()) return "an empty recipe in '" + all + "'";
    std::string error;
    const std::optional<Recipe> r = parse_recipe(text, &error);
    if (!r) return "'" + text + "' is not a recipe: " + error;
    if (parse_recipe(to_string(*r)) != r) {
      return "'" + text + "' does not read back as itself (" + to_string(*r) + ")";
    }
    if (std::find(recipes.begin(), recipes.end(), *r) != recipes.end()) {
      return "'" + text + "' is given twice";
    }
    if (recipes.size() == kMaxRecipeTargets) {
      return "at most " + std::to_string(kMaxRecipeTargets) + " recipes";
    }
    recipes.push_back(*r);
  }
  c.recipe_targets = std::move(recipes);
  return {};
}

template <typename T>
std::function<bool(AgentConfig&, std::string_view)> integer(T AgentConfig::*field, std::int64_t lo,
                                                            std::int64_t hi, bool sizes = false) {
  return [=](AgentConfig& c, std::string_view v) {
    std::int64_t n = 0;
    if (!parse_int(v, lo, hi, sizes, &n)) return false;
    c.*field = static_cast<T>(n);
    return true;
  };
}

std::function<bool(AgentConfig&, std::string_view)> millis(std::chrono::milliseconds AgentConfig::*f,
                                                           std::int64_t lo, std::int64_t hi) {
  return [=](AgentConfig& c, std::string_view v) {
    std::int64_t n = 0;
    if (!parse_int(v, lo, hi, false, &n)) return false;
    c.*f = std::chrono::milliseconds(n);
    return true;
  };
}

std::function<bool(AgentConfig&, std::string_view)> text(std::string AgentConfig::*field) {
  return [=](AgentConfig& c, std::string_view v) {
    c.*field = trim(v);
    return true;
  };
}

// The files options name (tokens, certificates) are small: reading stops here, so that a path
// like /dev/zero fails instead of growing memory without end.
constexpr std::size_t kMaxOptionFileBytes = 1 << 20;

// The whole of a regular-sized file; false when it cannot be read or exceeds the bound.
bool read_option_file(std::string_view path, std::string* out) {
  std::ifstream in{std::string(trim(path)), std::ios::binary};
  if (!in) return false;
  std::string text(kMaxOptionFileBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad() || static_cast<std::size_t>(in.gcount()) > kMaxOptionFileBytes) return false;
  text.resize(static_cast<std::size_t>(in.gcount()));
  *out = std::move(text);
  return true;
}

// A PEM file read whole into `field`; setting one turns TLS on.
std::function<bool(AgentConfig&, std::string_view)> pem_file(std::string AgentConfig::*field) {
  return [=](AgentConfig& c, std::string_view v) {
    std::string pem;
    if (!read_option_file(v, &pem) || pem.find("-----BEGIN ") == std::string::npos) {
      return false;
    }
    c.*field = std::move(pem);
    c.tls = true;
    return true;
  };
}

constexpr std::int64_t kDay = 86400000;
// The history one report carries stays well inside the server's limits (1024 steps; the
// default --max-message-bytes of 16M).
constexpr std::int64_t kMaxFlightRecorderSteps = 1024;
constexpr std::int64_t kMaxFlightRecorderBytes = 8 << 20;

const std::vector<Option>& options() {
  static const std::vector<Option> kOptions = {
      {"server", "host:port", text(&AgentConfig::server)},
      {"run_id", "a run id", text(&AgentConfig::run_id)},
      {"rank", "an integer in [0, 65535]", integer(&AgentConfig::rank, 0, 65535)},
      {"world_size", "an integer in [1, 65536]", integer(&AgentConfig::world_size, 1, 65536)},
      {"local_rank", "an integer in [0, 65535] or auto",
       [](AgentConfig& c, std::string_view v) { return parse_local_rank(v, &c.local_rank); }},
      {"data_parallel_size", "an integer in [0, 65536] (0: world_size)",
       integer(&AgentConfig::data_parallel_size, 0, 65536)},
      {"gradients_sharded", "a boolean",
       [](AgentConfig& c, std::string_view v) { return parse_bool(v, &c.gradients_sharded); }},
      {"policy_agreement", "auto, single, per_step, none or independent",
       [](AgentConfig& c, std::string_view v) {
         const std::string t = normalise_key(trim(v));
         for (auto m : {PolicyAgreementMode::kAuto, PolicyAgreementMode::kSingle,
                        PolicyAgreementMode::kPerStep, PolicyAgreementMode::kNone,
                        PolicyAgreementMode::kIndependent}) {
           if (t == agreement_name(m)) {
             c.policy_agreement = m;
             return true;
           }
         }
         return false;
       }},
      {"policy_receive_delay_ms", "milliseconds in [0, 86400000]",
       millis(&AgentConfig::policy_receive_delay, 0, kDay)},
      {"policy_lockstep", "a boolean",
       [](AgentConfig& c, std::string_view v) { return parse_bool(v, &c.policy_lockstep); }},
      {"policy_lockstep_timeout_ms", "milliseconds in [1, 86400000]",
       millis(&AgentConfig::policy_lockstep_timeout, 1, kDay)},
      {"token", "a token", text(&AgentConfig::token)},
      {"token_file", "a readable file (at most 1 MiB) whose first line is the token",
       [](AgentConfig& c, std::string_view v) {
         std::string text;
         if (!read_option_file(v, &text)) return false;
         c.token = trim(std::string_view(text).substr(0, text.find('\n')));
         return !c.token.empty();
       }},
      {"tls", "a boolean",
       [](AgentConfig& c, std::string_view v) { return parse_bool(v, &c.tls); }},
      {"tls_ca_file", "a readable PEM file (at most 1 MiB)", pem_file(&AgentConfig::tls_ca_pem)},
      {"tls_cert_file", "a readable PEM file (at most 1 MiB)",
       pem_file(&AgentConfig::tls_cert_pem)},
      {"tls_key_file", "a readable PEM file (at most 1 MiB)", pem_file(&AgentConfig::tls_key_pem)},
      {"spool_dir", "a directory", text(&AgentConfig::spool_dir)},
      {"spool_max_bytes", "a size in [64K, 1T]",
       integer(&AgentConfig::spool_max_bytes, 1 << 16, std::int64_t{1} << 40, true)},
      {"spool_segment_bytes", "a size in [4K, 1G]",
       integer(&AgentConfig::spool_segment_bytes, 1 << 12, 1 << 30, true)},
      {"queue_steps", "an integer in [1, 1000000]",
       integer(&AgentConfig::queue_steps, 1, 1000000)},
      {"max_batch", "an integer in [1, 4096]", integer(&AgentConfig::max_batch, 1, 4096)},
      {"max_in_flight", "an integer in [1, 65536]",
       integer(&AgentConfig::max_in_flight, 1, 65536)},
      {"backoff_initial_ms", "milliseconds in [1, 60000]",
       millis(&AgentConfig::backoff_initial, 1, 60000)},
      {"backoff_max_ms", "milliseconds in [1, 3600000]",
       millis(&AgentConfig::backoff_max, 1, 3600000)},
      {"connect_timeout_ms", "milliseconds in [10, 600000]",
       millis(&AgentConfig::connect_timeout, 10, 600000)},
      {"keepalive_time_ms", "milliseconds in [10000, 86400000] (the server's minimum is 10 s)",
       millis(&AgentConfig::keepalive_time, 10000, kDay)},
      {"keepalive_timeout_ms", "milliseconds in [1000, 600000]",
       millis(&AgentConfig::keepalive_timeout, 1000, 600000)},
      {"flush_timeout_ms", "milliseconds in [0, 86400000]",
       millis(&AgentConfig::flush_timeout, 0, kDay)},
      {"policy_fallback_after_ms", "milliseconds in [0, 86400000]",
       millis(&AgentConfig::policy_fallback_after, 0, kDay)},
      {"stats_thread", "caller or worker",
       [](AgentConfig& c, std::string_view v) {
         const std::string t = normalise_key(trim(v));
         if (t == "caller") {
           c.stats_thread = StatsThread::kCaller;
         } else if (t == "worker") {
           c.stats_thread = StatsThread::kWorker;
         } else {
           return false;
         }
         return true;
       }},
      {"worker_max_bytes", "a size in [0, 1T]",
       integer(&AgentConfig::worker_max_bytes, 0, std::int64_t{1} << 40, true)},
      {"nvtx", "a boolean", [](AgentConfig& c, std::string_view v) { return parse_bool(v, &c.nvtx); }},
      {"recipe_targets", "comma-separated recipes", nullptr, parse_recipe_targets},
      {"sample_counts", "a boolean",
       [](AgentConfig& c, std::string_view v) { return parse_bool(v, &c.sampling.counts); }},
      {"sample_count_roles", "comma-separated roles, all or none",
       [](AgentConfig& c, std::string_view v) { return parse_roles(v, &c.sampling.count_roles); }},
      {"sample_full_every", "an integer >= 0 (0: never)",
       [](AgentConfig& c, std::string_view v) {
         std::int64_t n = 0;
         if (!parse_int(v, 0, std::int64_t{1} << 40, false, &n)) return false;
         c.sampling.full_every = n;
         return true;
       }},
      {"sample_full_on_nonfinite", "a boolean",
       [](AgentConfig& c, std::string_view v) {
         return parse_bool(v, &c.sampling.full_on_nonfinite);
       }},
      {"sample_full_on_scale_change", "a boolean",
       [](AgentConfig& c, std::string_view v) {
         return parse_bool(v, &c.sampling.full_on_scale_change);
       }},
      {"sample_full_roles", "comma-separated roles, all or none",
       [](AgentConfig& c, std::string_view v) { return parse_roles(v, &c.sampling.full_roles); }},
      {"sample_max_tensors", "an integer in [0, 4096]",
       [](AgentConfig& c, std::string_view v) {
         std::int64_t n = 0;
         if (!parse_int(v, 0, 4096, false, &n)) return false;
         c.sampling.max_tensors_per_step = static_cast<int>(n);
         return true;
       }},
      {"sample_full_ranks",
       "auto, all, node, every:K (K in [1, 65536]) or comma-separated ranks in [0, 65535]",
       [](AgentConfig& c, std::string_view v) {
         return parse_full_ranks(v, &c.sampling.full_ranks);
       }},
      {"flight_recorder_steps", "an integer in [0, 1024] (0: off)",
       integer(&AgentConfig::flight_recorder_steps, 0, kMaxFlightRecorderSteps)},
      {"flight_recorder_bytes", "a size in [0, 8M]",
       integer(&AgentConfig::flight_recorder_bytes, 0, kMaxFlightRecorderBytes, true)},
      {"flight_recorder_roles", "comma-separated roles, all or none",
       [](AgentConfig& c, std::string_view v) {
         return parse_roles(v, &c.flight_recorder_roles);
       }},
      {"cupti_every", "an integer >= 0 (0: off)",
       [](AgentConfig& c, std::string_view v) {
         std::int64_t n = 0;
         if (!parse_int(v, 0, std::int64_t{1} << 40, false, &n)) return false;
         c.sampling.cupti_every = n;
         return true;
       }},
  };
  return kOptions;
}

bool valid_run_id(const std::string& id) {
  if (id.empty() || id.size() > 128) return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
}

}  // namespace

std::string set_option(AgentConfig& config, std::string_view key, std::string_view value) {
  const std::string k = normalise_key(key);
  for (const Option& o : options()) {
    if (o.key != k) continue;
    AgentConfig copy = config;
    if (o.set_or_why) {
      std::string why = o.set_or_why(copy, value);
      if (!why.empty()) return std::string(k) + ": " + why;
    } else if (!o.set(copy, value)) {
      return std::string(k) + ": expected " + std::string(o.expected) + ", got '" +
             std::string(value) + "'";
    }
    config = std::move(copy);
    return {};
  }
  return "unknown agent option '" + std::string(key) + "'";
}

const std::vector<std::string_view>& option_keys() {
  static const std::vector<std::string_view> kKeys = [] {
    std::vector<std::string_view> keys;
    for (const Option& o : options()) keys.push_back(o.key);
    return keys;
  }();
  return kKeys;
}

std::string apply_environment(AgentConfig& config) {
  for (std::string_view key : option_keys()) {
    std::string var = "AMPSCOPE_";
    for (char c : key) var += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    const char* value = std::getenv(var.c_str());
    if (value == nullptr) continue;
    if (std::string err = set_option(config, key, value); !err.empty()) return var + ": " + err;
  }
  return {};
}

std::string validate(const AgentConfig& c) {
  if (!valid_run_id(c.run_id)) {
    return "run_id: must be 1..128 characters of [A-Za-z0-9._-], got '" + c.run_id + "'";
  }
  if (c.rank >= c.world_size) {
    return "rank: " + std::to_string(c.rank) + " must be below world_size " +
           std::to_string(c.world_size);
  }
  if (c.local_rank >= 0 && static_cast<std::uint32_t>(c.local_rank) >= c.world_size) {
    return "local_rank: " + std::to_string(c.local_rank) + " must be below world_size " +
           std::to_string(c.world_size);
  }
  if (c.data_parallel_size > c.world_size) {
    return "data_parallel_size: " + std::to_string(c.data_parallel_size) +
           " must not exceed world_size " + std::to_string(c.world_size);
  }
  if (c.world_size > 1 && c.policy_agreement == PolicyAgreementMode::kSingle) {
    return "policy_agreement: single is for one rank; world_size is " +
           std::to_string(c.world_size) + " (per_step, none or independent)";
  }
  // Checked here, where every door (the C and C++ APIs, AMPSCOPE_SERVER, ampscope-train
  // --server, ampscope.torch) passes: a bad address would only have the agent retry forever.
  if (std::string why = proto::check_target_list(c.server); !why.empty()) return "server: " + why;
  if (c.tls_cert_pem.empty() != c.tls_key_pem.empty()) {
    return "tls_cert_file and tls_key_file go together: give both or neither";
  }
  if (c.keepalive_time < std::chrono::milliseconds(10000)) {
    return "keepalive_time_ms: the server accepts pings every 10000 ms or slower";
  }
  if (c.backoff_max < c.backoff_initial) return "backoff_max_ms: below backoff_initial_ms";
  if (c.queue_steps == 0 || c.max_batch == 0 || c.max_in_flight == 0) {
    return "queue_steps, max_batch and max_in_flight must be >= 1";
  }
  if (c.policy_lockstep_timeout.count() <= 0) {
    return "policy_lockstep_timeout_ms: must be >= 1 (a lockstep wait is always bounded)";
  }
  if ((c.sampling.full_ranks.kind == FullRanks::Kind::kEvery && c.sampling.full_ranks.every == 0) ||
      (c.sampling.full_ranks.kind == FullRanks::Kind::kList &&
       c.sampling.full_ranks.ranks.empty())) {
    return "sample_full_ranks: every:K needs K >= 1, and a list at least one rank";
  }
  if (c.sampling.full_every < 0 || c.sampling.cupti_every < 0) {
    return "sample_full_every and cupti_every must be >= 0";
  }
  if (c.recipe_targets.size() > kMaxRecipeTargets) {
    return "recipe_targets: at most " + std::to_string(kMaxRecipeTargets) + " recipes";
  }
  for (const Recipe& r : c.recipe_targets) {
    // What goes on the wire is the canonical text, which the server reads back.
    if (parse_recipe(to_string(r)) != r) {
      return "recipe_targets: '" + to_string(r) + "' does not read back as itself";
    }
  }
  if (c.flight_recorder_steps > static_cast<std::size_t>(kMaxFlightRecorderSteps) ||
      c.flight_recorder_bytes > static_cast<std::uint64_t>(kMaxFlightRecorderBytes)) {
    // Beyond them an event's report could exceed the server's limits and be rejected whole.
    return "flight_recorder_steps and flight_recorder_bytes: at most 1024 steps and 8M";
  }
  return {};
}

std::optional<std::uint32_t> local_rank_of(const AgentConfig& c) {
  if (c.local_rank >= 0) return static_cast<std::uint32_t>(c.local_rank);
  for (const char* var :
       {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}) {
    const char* value = std::getenv(var);
    if (value == nullptr) continue;
    std::int32_t local = -1;
    if (!parse_local_rank(value, &local) || local < 0) return std::nullopt;
    return static_cast<std::uint32_t>(local);
  }
  return std::nullopt;
}

bool sends_full_stats(const AgentConfig& c, std::optional<std::uint32_t> local_rank) {
  const FullRanks& f = c.sampling.full_ranks;
  switch (f.kind) {
    case FullRanks::Kind::kAll:
      return true;
    case FullRanks::Kind::kAuto:
      if (c.world_size <= kFullRanksAllUpTo) return true;
      [[fallthrough]];
    case FullRanks::Kind::kNode:
      return !local_rank || *local_rank == 0;
    case FullRanks::Kind::kEvery:
      return c.rank % f.every == 0;
    case FullRanks::Kind::kList:
      return std::find(f.ranks.begin(), f.ranks.end(), c.rank) != f.ranks.end();
  }
  return true;
}

std::string full_ranks_text(const FullRanks& f) {
  switch (f.kind) {
    case FullRanks::Kind::kAuto:
      return "auto";
    case FullRanks::Kind::kAll:
      return "all";
    case FullRanks::Kind::kNode:
      return "node";
    case FullRanks::Kind::kEvery:
      return "every:" + std::to_string(f.every);
    case FullRanks::Kind::kList:
      break;
  }
  std::string out;
  for (std::uint32_t r : f.ranks) out += (out.empty() ? "" : ",") + std::to_string(r);
  return out;
}

PolicyAgreementMode resolved_agreement(const AgentConfig& c) {
  if (c.policy_agreement != PolicyAgreementMode::kAuto) return c.policy_agreement;
  return c.world_size > 1 ? PolicyAgreementMode::kNone : PolicyAgreementMode::kSingle;
}

std::string_view agreement_name(PolicyAgreementMode mode) {
  switch (mode) {
    case PolicyAgreementMode::kAuto:
      return "auto";
    case PolicyAgreementMode::kSingle:
      return "single";
    case PolicyAgreementMode::kPerStep:
      return "per_step";
    case PolicyAgreementMode::kNone:
      return "none";
    case PolicyAgreementMode::kIndependent:
      return "independent";
  }
  return "auto";
}

}  // namespace ampscope::agent
