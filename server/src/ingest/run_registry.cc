#include "run_registry.h"

#include "metrics.h"
#include "policy_host.h"

namespace ampscope::server {

RunState::RunState(std::string run_id, MergeOptions merge_options)
    : id(std::move(run_id)), merge(merge_options) {}

RunState::~RunState() = default;

RunRegistry::RunRegistry(std::size_t max_exported_runs, MergeOptions merge_options)
    : max_exported_(max_exported_runs), merge_options_(merge_options) {}

RunRegistry::~RunRegistry() = default;

RunState* RunRegistry::find(const std::string& run_id) {
  auto it = runs_.find(run_id);
  return it == runs_.end() ? nullptr : it->second.get();
}

RunState& RunRegistry::get(const std::string& run_id) {
  if (RunState* run = find(run_id)) return *run;
  auto run = std::make_unique<RunState>(run_id, merge_options_);
  std::lock_guard lock(mu_);
  return *runs_.emplace(run_id, std::move(run)).first->second;
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
  if (gone->exported) exported_.erase(gone->exported_at_);
  // Destroyed outside the lock: removing the series takes the families' own locks.
  gone.reset();
  return true;
}

void RunRegistry::mark_active(RunState& run) {
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
