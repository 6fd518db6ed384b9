#include "ingest_budget.h"

#include <algorithm>

namespace ampscope::server {

IngestBudget::IngestBudget(std::uint64_t max_bytes, Changed changed)
    : max_bytes_(std::max<std::uint64_t>(max_bytes, 1)),
      resume_bytes_(max_bytes_ - max_bytes_ / 4),
      changed_(std::move(changed)) {}

bool IngestBudget::admit(const std::shared_ptr<StreamSink>& sink) {
  std::lock_guard lock(mu_);
  if (queued_ < max_bytes_) return true;
  waiting_.push_back(sink);
  ++pauses_;
  report();
  return false;
}

void IngestBudget::charge(std::uint64_t bytes) {
  std::lock_guard lock(mu_);
  queued_ += bytes;
  report();
}

void IngestBudget::release(std::uint64_t bytes) {
  std::vector<std::weak_ptr<StreamSink>> resumed;
  {
    std::lock_guard lock(mu_);
    queued_ -= std::min(queued_, bytes);
    if (queued_ <= resume_bytes_) resumed.swap(waiting_);
    report();
  }
  // Outside the lock: a resumed stream reads again, and may be refused again (admit).
  for (const std::weak_ptr<StreamSink>& w : resumed) {
    if (std::shared_ptr<StreamSink> s = w.lock()) s->on_capacity();
  }
}

std::uint64_t IngestBudget::queued_bytes() const {
  std::lock_guard lock(mu_);
  return queued_;
}

std::uint64_t IngestBudget::pauses() const {
  std::lock_guard lock(mu_);
  return pauses_;
}

void IngestBudget::report() const {
  if (changed_) changed_(queued_, waiting_.size(), pauses_);
}

}  // namespace ampscope::server
