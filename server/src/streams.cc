#include "streams.h"

#include <algorithm>

namespace ampscope::server {

void StreamTable::add(const std::string& run_id, std::uint32_t rank,
                      std::shared_ptr<StreamSink> sink) {
  std::lock_guard lock(mu_);
  by_run_[run_id].push_back(Entry{rank, std::move(sink)});
}

void StreamTable::remove(const std::string& run_id, const StreamSink* sink) {
  std::lock_guard lock(mu_);
  auto it = by_run_.find(run_id);
  if (it == by_run_.end()) return;
  std::erase_if(it->second, [&](const Entry& e) { return e.sink.get() == sink; });
  if (it->second.empty()) by_run_.erase(it);
}

std::vector<std::shared_ptr<StreamSink>> StreamTable::of_run(const std::string& run_id) const {
  std::lock_guard lock(mu_);
  std::vector<std::shared_ptr<StreamSink>> out;
  if (auto it = by_run_.find(run_id); it != by_run_.end()) {
    for (const Entry& e : it->second) out.push_back(e.sink);
  }
  return out;
}

std::vector<std::shared_ptr<StreamSink>> StreamTable::all() const {
  std::lock_guard lock(mu_);
  std::vector<std::shared_ptr<StreamSink>> out;
  for (const auto& [run, entries] : by_run_) {
    for (const Entry& e : entries) out.push_back(e.sink);
  }
  return out;
}

std::set<std::uint32_t> StreamTable::connected_ranks(const std::string& run_id) const {
  std::lock_guard lock(mu_);
  std::set<std::uint32_t> out;
  if (auto it = by_run_.find(run_id); it != by_run_.end()) {
    for (const Entry& e : it->second) out.insert(e.rank);
  }
  return out;
}

std::set<std::string> StreamTable::runs() const {
  std::lock_guard lock(mu_);
  std::set<std::string> out;
  for (const auto& [run, entries] : by_run_) out.insert(run);
  return out;
}

std::size_t StreamTable::size() const {
  std::lock_guard lock(mu_);
  std::size_t n = 0;
  for (const auto& [run, entries] : by_run_) n += entries.size();
  return n;
}

}  // namespace ampscope::server
