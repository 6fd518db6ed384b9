#include "policy_host.h"

#include <google/protobuf/util/message_differencer.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "ampscope/proto/vocabulary_codec.h"
#include "log.h"
#include "policy_merge.h"
#include "policy_wire.h"

namespace ampscope::server {
policy::ScalerConfig to_engine_scaler(const v1::ScalerConfig& s) {
  policy::ScalerConfig c;
  c.kind = proto::from_proto(s.kind()).value_or(ScalerKind::kDynamic);
  if (s.init_scale() > 0) c.scale = s.init_scale();
  if (s.growth_factor() > 0) c.growth_factor = s.growth_factor();
  if (s.backoff_factor() > 0) c.backoff_factor = s.backoff_factor();
  if (s.growth_interval() > 0) c.growth_interval = s.growth_interval();
  c.hysteresis = static_cast<int>(s.hysteresis());
  c.min_scale = s.min_scale();
  c.max_scale = s.max_scale() > 0 ? s.max_scale() : policy::kFp32Max;
  return c;
}

namespace {

// The layers a Hello says the run can move to BF16.
std::vector<std::string> gemm_layers(const v1::Hello& hello) {
  return {hello.bf16_capable_gemms().begin(), hello.bf16_capable_gemms().end()};
}

}  // namespace

v1::PolicyUpdate to_policy_update(const policy::PolicyDecision& d, const std::string& run_id,
                                  v1::PolicyMode mode, ManagedSets sets,
                                  std::int64_t decided_at_step, std::int64_t now_ns) {
  v1::PolicyUpdate u;
  u.set_run_id(run_id);
  u.set_effective_from_step(d.effective_from_step);
  u.set_mode(mode);
  const policy::ScalerSettings& s = d.scaler;
  if (s.loss_scale) u.set_loss_scale(*s.loss_scale);
  if (s.growth_interval) {
    u.set_growth_interval(static_cast<std::uint32_t>(
        std::min<std::int64_t>(*s.growth_interval, std::numeric_limits<std::uint32_t>::max())));
  }
  if (s.growth_factor) u.set_growth_factor(*s.growth_factor);
  if (s.backoff_factor) u.set_backoff_factor(*s.backoff_factor);
  if (s.hysteresis) u.set_hysteresis(static_cast<std::uint32_t>(*s.hysteresis));
  if (s.min_scale) u.set_min_scale(*s.min_scale);
  if (s.max_scale) u.set_max_scale(*s.max_scale);
  if (sets.fp32_tensors) {
    u.set_fp32_tensors_set(true);
    for (const std::string& t : d.fp32_tensors) u.add_fp32_tensors(t);
  }
  if (sets.bf16_gemms) {
    u.set_bf16_gemms_set(true);
    for (const std::string& l : d.bf16_gemms) u.add_bf16_gemms(l);
  }
  if (d.amax_history_length) {
    u.set_amax_history_length(static_cast<std::uint32_t>(*d.amax_history_length));
  }
  if (d.amax_margin) u.set_amax_margin(static_cast<std::uint32_t>(*d.amax_margin));
  u.set_reason(d.reason);
  u.set_decided_at_step(decided_at_step);
  u.set_decided_unix_ns(now_ns);
  u.set_seq(d.policy_id);
  return u;
}

std::string_view decision_kind(const v1::PolicyUpdate& u, const v1::PolicyUpdate* before) {
  if (u.has_loss_scale()) return "scale";
  if (u.has_growth_interval() || u.has_growth_factor() || u.has_backoff_factor() ||
      u.has_hysteresis() || u.has_min_scale() || u.has_max_scale()) {
    return "params";
  }
  if (u.has_amax_history_length() || u.has_amax_margin()) return "gemm_precision";
  const bool bf16_changed =
      u.bf16_gemms_set() &&
      (before == nullptr || !before->bf16_gemms_set() ||
       !std::equal(u.bf16_gemms().begin(), u.bf16_gemms().end(), before->bf16_gemms().begin(),
                   before->bf16_gemms().end()));
  return bf16_changed ? "gemm_precision" : "fp32_fallback";
}

PolicyHost::PolicyHost(policy::EngineConfig config, std::chrono::milliseconds snapshot_interval,
                       RunRegistry& runs)
    : config_(std::move(config)), snapshot_interval_(snapshot_interval), runs_(runs) {}

v1::PolicyMode PolicyHost::mode() const { return mode_to_wire(config_.mode); }

RunPolicy& PolicyHost::policy_of(RunState& run) {
  if (!run.policy) run.policy = std::make_unique<RunPolicy>();
  return *run.policy;
}

bool PolicyHost::create_engine(const std::string& run_id, RunPolicy& rp, const v1::Hello& hello) {
  try {
    rp.engine.emplace(run_id, config_, to_engine_scaler(hello.scaler()));
    rp.engine->add_gemm_layers(gemm_layers(hello));
    rp.force_save = true;
    return true;
  } catch (const policy::PolicyError& e) {
    log_warning("policy: run '", run_id, "' runs without a policy engine: ", e.what());
    return false;
  }
}

void PolicyHost::restore_run(RunState& run, const RestoredRun& restored,
                             const RestoredPolicy* saved,
                             const std::optional<v1::PolicyUpdate>& current,
                             const ReplayAfter& replay) {
  RunPolicy& rp = policy_of(run);
  std::int64_t from_report = 0;
  std::int64_t from_merged = 0;
  if (saved != nullptr) {
    try {
      policy::PolicyEngine engine = policy::PolicyEngine::restore(saved->state);
      if (engine.config() == config_) {
        rp.engine.emplace(std::move(engine));
        from_report = saved->last_report_id;
        from_merged = saved->last_merged_id;
      } else {
        log_info("policy: run '", restored.run_id,
                 "': configuration changed since the saved state; starting a fresh engine");
      }
    } catch (const policy::PolicyError& e) {
      log_warning("policy: run '", restored.run_id, "': saved state unusable (", e.what(),
                  "); starting a fresh engine");
    }
  }
  if (restored.hello.has_scaler()) rp.hello_scaler = restored.hello.scaler();
  if (!rp.engine) {
    create_engine(restored.run_id, rp, restored.hello);
  } else if (rp.engine->add_gemm_layers(gemm_layers(restored.hello))) {
    rp.dirty = true;
  }
  rp.last_report_id = from_report;
  rp.last_merged_id = from_merged;
  // Decisions made while replaying were committed with the steps that caused them (or, with a
  // changed configuration, belong to the old one): only the engine's state is wanted.
  int errors = 0;
  std::size_t replayed = 0;
  auto feed = [&](const MergedStep& step) {
    rp.last_report_id = std::max(rp.last_report_id,
                                 *std::max_element(step.report_ids.begin(), step.report_ids.end()));
    if (!rp.engine) return;
    try {
      rp.engine->observe(step.input);
    } catch (const policy::PolicyError&) {
      ++errors;
    }
    ++replayed;
  };
  Replay r = replay(from_merged, from_report);
  std::map<std::int64_t, const v1::StepReport*> reports;
  for (const auto& [id, report] : r.reports) reports.emplace(id, &report);
  std::set<std::int64_t> merged_reports;
  for (const StoredMerge& m : r.merges) {
    merged_reports.insert(m.report_ids.begin(), m.report_ids.end());
    run.merge.remember(m.step, m.ranks);
    if (m.id <= from_merged) continue;
    std::vector<RankStep> ranks;
    for (std::int64_t id : m.report_ids) {
      if (auto it = reports.find(id); it != reports.end()) {
        ranks.push_back(
            rank_step(*it->second, id,
                      to_step_input(*it->second, reads_all_tensors(), reads_quantizers())));
      }
    }
    rp.last_merged_id = m.id;
    if (!ranks.empty())
      feed(merge_ranks(std::move(ranks), run.merge.gradients_sharded(), m.partial));
  }
  // Reports still waiting for their ranks wait again (from now, for the full deadline).
  const auto now = std::chrono::steady_clock::now();
  for (const auto& [id, report] : reports) {
    if (merged_reports.contains(id)) continue;
    policy::StepInput input = to_step_input(*report, reads_all_tensors(), reads_quantizers());
    for (const MergedStep& step :
         run.merge.add(rank_step(*report, id, std::move(input)), now, nullptr)) {
      feed(step);
    }
  }
  rp.dirty = replayed > 0;
  if (current) set_current(run, *current);
  if (replayed > 0) {
    log_info("policy: run '", restored.run_id, "': replayed ", replayed,
             " merged steps after the saved state", errors > 0 ? " (some refused)" : "");
  }
}

void PolicyHost::on_hello(RunState& run, const v1::Hello& hello) {
  RunPolicy& rp = policy_of(run);
  const bool new_config =
      hello.has_scaler() && !(rp.hello_scaler && google::protobuf::util::MessageDifferencer::Equals(
                                                     *rp.hello_scaler, hello.scaler()));
  if (hello.has_scaler()) rp.hello_scaler = hello.scaler();
  if (!rp.engine) {
    create_engine(hello.run_id(), rp, hello);
    return;
  }
  if (rp.engine->add_gemm_layers(gemm_layers(hello))) rp.dirty = true;
  // Every rank says the run's configured scaler in its Hello, again at each reconnect; only a
  // different configuration is news to the engine (which tracks the scale in use itself).
  if (!new_config) return;
  try {
    const policy::ScalerConfig scaler = to_engine_scaler(hello.scaler());
    if (!(scaler == rp.engine->run_scaler())) {
      rp.engine->set_run_scaler(scaler);
      rp.dirty = true;
    }
  } catch (const policy::PolicyError& e) {
    log_warning("policy: run '", hello.run_id(), "': scaler of rank ", hello.rank(),
                " ignored: ", e.what());
  }
}

std::vector<EngineUpdate> PolicyHost::observe(RunState& run, const MergedStep& step,
                                              std::int64_t merged_id, std::int64_t now_ns,
                                              int* errors) {
  std::vector<EngineUpdate> updates;
  if (!run.policy || !run.policy->engine) return updates;
  RunPolicy& rp = *run.policy;
  std::vector<policy::PolicyDecision> decisions;
  try {
    decisions = rp.engine->observe(step.input);
  } catch (const policy::PolicyError& e) {
    ++*errors;
    log_warning("policy: run '", run.id, "' step ", step.step,
                " refused by the engine: ", e.what());
  }
  rp.last_report_id = std::max(rp.last_report_id,
                               *std::max_element(step.report_ids.begin(), step.report_ids.end()));
  rp.last_merged_id = merged_id;
  rp.dirty = true;
  for (const policy::PolicyDecision& d : decisions) {
    const ManagedSets sets{config_.fp32_fallback.enabled, config_.gemm_precision.enabled};
    updates.push_back(EngineUpdate{
        d.policy_id, to_policy_update(d, run.id, mode(), sets, rp.engine->latest_step(), now_ns)});
    rp.force_save = true;
  }
  return updates;
}

bool PolicyHost::unsaved(const RunState& run) const {
  return run.policy && run.policy->engine && (run.policy->dirty || run.policy->force_save);
}

std::vector<PolicySnapshot> PolicyHost::snapshots(std::chrono::steady_clock::time_point now,
                                                  bool all, std::size_t shard) {
  std::vector<PolicySnapshot> out;
  runs_.for_each(
      [&](RunState& run) {
        if (!run.policy || !run.policy->engine) return;
        RunPolicy& rp = *run.policy;
        const bool due = rp.force_save || (rp.dirty && now - rp.saved_at >= snapshot_interval_);
        if (!due && !(all && rp.dirty)) return;
        // Reports waiting for their ranks are not in the state: a restore replays them.
        std::int64_t merged_through = rp.last_report_id;
        if (std::optional<std::int64_t> waiting = run.merge.first_waiting_report()) {
          merged_through = std::min(merged_through, *waiting - 1);
        }
        out.push_back(
            PolicySnapshot{run.id, rp.engine->save_state(), merged_through, rp.last_merged_id});
        rp.saved_at = now;
        rp.dirty = false;
        rp.force_save = false;
      },
      shard);
  return out;
}

void PolicyHost::set_current(RunState& run, const v1::PolicyUpdate& update) {
  std::optional<v1::PolicyUpdate>& current = policy_of(run).current;
  if (!current) current.emplace();
  merge_policy_update(&*current, update);
}

std::optional<v1::PolicyUpdate> PolicyHost::current(const RunState& run) const {
  return run.policy ? run.policy->current : std::nullopt;
}

std::optional<double> PolicyHost::target_scale(const RunState& run) const {
  if (!run.policy || !run.policy->engine) return std::nullopt;
  const std::optional<int>& t = run.policy->engine->last_evaluation().target_log2;
  if (!t) return std::nullopt;
  return std::ldexp(1.0, *t);
}

}  // namespace ampscope::server
