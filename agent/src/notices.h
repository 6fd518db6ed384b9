// One-line notices the agent reports once ("cupti: unavailable: no CUDA device"): kept in
// order, deduplicated by key, and handed to the next report(s) until each went out once.
// Thread safety: all members are thread-safe.
#pragma once

#include <cstddef>
#include <cstdio>
#include <deque>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "ampscope/text.h"

namespace ampscope::agent {

class Notices {
 public:
  // Raises `text` unless `key` was raised before. Returns true when it is new. A notice quotes
  // names and messages from the trainer: it is sent as text::clean_text makes it (valid UTF-8
  // without control characters, at most 512 bytes), so that it never costs its report.
  bool raise(const std::string& key, std::string text) {
    text = text::clean_text(text, kMaxBytes);
    std::lock_guard lock(mu_);
    if (!keys_.insert(key).second) return false;
    all_.push_back(text);
    pending_.push_back(std::move(text));
    return true;
  }
  bool raise(std::string text) {
    const std::string key = text;
    return raise(key, std::move(text));
  }
  // As raise(key, text), and when it is new also one line on stderr: for what the person
  // running the training must see before any report reaches a server (an unusable spool
  // directory, another process streaming as this run and rank).
  bool raise_loud(const std::string& key, const std::string& text) {
    if (!raise(key, text)) return false;
    std::fprintf(stderr, "ampscope agent: %s\n", text.c_str());
    return true;
  }
  // Moves at most `max` pending notices into *out.
  void take_pending(std::vector<std::string>* out, std::size_t max) {
    std::lock_guard lock(mu_);
    while (!pending_.empty() && out->size() < max) {
      out->push_back(std::move(pending_.front()));
      pending_.pop_front();
    }
  }
  // Puts notices taken by take_pending back in front (their report was not written).
  void requeue(const std::vector<std::string>& taken) {
    std::lock_guard lock(mu_);
    pending_.insert(pending_.begin(), taken.begin(), taken.end());
  }
  std::vector<std::string> all() const {
    std::lock_guard lock(mu_);
    return all_;
  }

  static constexpr std::size_t kMaxBytes = text::kNoticeMaxBytes;
  static constexpr std::size_t kMaxPerReport = 16;

 private:
  mutable std::mutex mu_;
  std::set<std::string> keys_;
  std::vector<std::string> all_;
  std::deque<std::string> pending_;
};

}  // namespace ampscope::agent
