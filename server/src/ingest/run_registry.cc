#include "run_registry.h"

#include <algorithm>

#include "metrics.h"
#include "policy_host.h"

namespace ampscope::server {

RunState::RunState(std::string run_id, MergeOptions merge_options, std::size_t shard)
    : id(std::move(run_id)), shard(shard), merge(merge_options) {}

RunState::~RunState() = default;

RunRegistry::RunRegistry(std::size_t max_exported_runs, MergeOptions merge_options,
                         std::size_t shards)
    : max_exported_(max_exported_runs),
      merge_options_(merge_options),
      shards_(std::max<std::size_t>(shards, 1)) {}

RunRegistry::~RunRegistry() = default;

std::size_t RunRegistry::shard_of(std::string_view run_id) const {
  // FNV-1a: std::hash may differ between builds, and a run should keep its shard.
  std::uint64_t h = 14695981039346656037ull;
  for (const char c : run_id) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return static_cast<std::size_t>(h % shards_);
}

RunState* RunRegistry::find(const std::string& run_id) {
  std::lock_guard lock(mu_);
  auto it = runs_.find(run_id);
  return it == runs_.end() ? nullptr : it->second.get();
}

RunState& RunRegistry::get(const std::string& run_id) {
  if (RunState* run = find(run_id)) return *run;
  auto run = std::make_unique<RunState>(run_id, merge_options_, shard_of(run_id));
  std::lock_guard lock(mu_);
  return *runs_.emplace(run_id, std::move(run)).first->second;
}

std::size_t RunRegistry::size() const {
  std::lock_guard lock(mu_);
  return runs_.size();
}

std::vector<RunState*> RunRegistry::runs_of(std::size_t shard) const {
  std::vector<RunState*> out;
  std::lock_guard lock(mu_);
  for (const auto& [id, run] : runs_) {
    if (shard == kAllShards || run->shard == shard) out.push_back(run.get());
  }
  return out;
}

bool RunRegistry::forget(const std::string& run_id) {
  std::unique_ptr<RunState> gone;
  {
    std::lock_guard lock(mu_);
    auto it = runs_.find(run_id);
    if (it == runs_.end()) return false;
    gone = std::move(it->second);
    runs_.erase(it);
  }
  std::lock_guard series(series_mu_);
  if (gone->exported) exported_.erase(gone->exported_at_);
  // Removing the series takes the families' own locks (never the registry's).
  gone.reset();
  return true;
}

void RunRegistry::mark_active(RunState& run) {
  std::lock_guard lock(series_mu_);
  if (run.exported) {
    exported_.splice(exported_.begin(), exported_, run.exported_at_);
    return;
  }
  exported_.push_front(&run);
  run.exported_at_ = exported_.begin();
  run.exported = true;
  if (exported_.size() <= max_exported_) return;
  RunState* idle = exported_.back();
  exported_.pop_back();
  idle->exported = false;
  idle->series.reset();
}

std::uint64_t RunRegistry::duplicates(const std::string& run_id) const {
  std::lock_guard lock(mu_);
  auto it = runs_.find(run_id);
  return it == runs_.end() ? 0 : it->second->duplicates.load(std::memory_order_relaxed);
}

}  // namespace ampscope::server
