#include "streams.h"

#include <algorithm>

namespace ampscope::server {

AgentProcess AgentProcess::of(const v1::Hello& hello) {
  return AgentProcess{hello.host(), hello.pid(), hello.process_start_unix_ns()};
}

bool AgentProcess::same_process(const AgentProcess& other) const {
  if (host != other.host) return false;
  if (pid != 0 && other.pid != 0 && pid != other.pid) return false;
  return start_unix_ns == 0 || other.start_unix_ns == 0 || start_unix_ns == other.start_unix_ns;
}

std::string AgentProcess::describe() const {
  std::string out = "host " + (host.empty() ? std::string("?") : host) + " pid ";
  out += pid == 0 ? std::string("?") : std::to_string(pid);
  return out;
}

std::optional<AgentProcess> StreamTable::claim(const std::string& run_id, std::uint32_t rank,
                                               const AgentProcess& process,
                                               std::shared_ptr<StreamSink> sink) {
  std::lock_guard lock(mu_);
  std::vector<Entry>& entries = by_run_[run_id];
  for (const Entry& e : entries) {
    if (e.rank == rank && !e.process.same_process(process)) return e.process;
  }
  entries.push_back(Entry{rank, process, std::move(sink)});
  return std::nullopt;
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
