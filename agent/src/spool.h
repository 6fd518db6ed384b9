// The on-disk spool: every report the agent produced and the server has not acknowledged yet,
// in append-only segment files, so that a server outage or a restart of the training process
// loses nothing.
//
// Layout of a spool directory (one per run and rank):
//   lock                 flock()ed by the one process using it
//   acked                the highest acknowledged seq (decimal; written by rename)
//   policies             policy ids already handled, one per line (append-only)
//   seg-<first seq>.log  records, in seq order:
//     u32 magic "ASR1" | u32 payload length | u64 seq | i64 step | u32 crc32 | payload
//     crc32 (zlib) covers seq, step and the payload; integers are little-endian.
// Segments roll over at segment_bytes. A segment is deleted once every record in it is
// acknowledged, except the newest, which keeps the last seq and step across restarts. On open,
// a torn or corrupt tail (a write cut short by kill -9, a damaged file) is cut off at the last
// intact record and reported. Records survive the death of the process (the page cache); a
// power loss may take the last ones (no fsync: the server deduplicates replays anyway).
// The total size is capped at max_bytes: an append that does not fit is refused and the
// caller counts the drop.
//
// Thread safety: all members are thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace ampscope::agent {

struct SpoolOptions {
  std::string dir;
  std::uint64_t max_bytes = 256ull << 20;
  std::uint64_t segment_bytes = 4ull << 20;
};

struct SpoolRecord {
  std::uint64_t seq = 0;
  std::int64_t step = 0;
  std::string payload;
};

class Spool {
 public:
  // Creates the directory if needed, locks it and scans it. nullptr with a one-line reason when
  // it cannot be used; *notices receives what the scan repaired.
  static std::unique_ptr<Spool> open(const SpoolOptions& options, std::string* error,
                                     std::vector<std::string>* notices);
  ~Spool();
  Spool(const Spool&) = delete;
  Spool& operator=(const Spool&) = delete;

  static constexpr std::size_t kHeaderBytes = 28;
  static constexpr std::uint32_t kMaxPayloadBytes = 64u << 20;

  // Appends a record with seq last_seq() + 1 and returns the seq; 0 when it does not fit under
  // max_bytes or the write fails (*error says which).
  std::uint64_t append(std::string_view payload, std::int64_t step, std::string* error);
  // Copies the records with seq >= from, in order: at most max_records, and stops after the
  // record that reaches max_bytes. Returns how many were added to *out.
  std::size_t read(std::uint64_t from, std::size_t max_records, std::size_t max_bytes,
                   std::vector<SpoolRecord>* out, std::string* error);
  // Blocks until a record with seq >= from exists, wake() is called or the timeout passes.
  // Returns whether such a record exists.
  bool wait_for(std::uint64_t from, std::chrono::milliseconds timeout);
  void wake();

  // Everything up to seq is acknowledged: deletes the segments that hold nothing newer. False,
  // changing nothing, when seq is beyond last_seq() (an acknowledgement of a report this spool
  // never numbered).
  bool ack(std::uint64_t seq);
  // The server holds more than this spool ever numbered (the spool was lost or replaced): when
  // seq > last_seq(), nothing here is unacknowledged and seq < kMaxSeq, everything up to seq
  // counts as acknowledged and the numbering continues at seq + 1. False, changing nothing,
  // otherwise:
  // unacknowledged records would be renumbered into what the server already has, and a mark
  // near 2^64 would let the numbering wrap.
  bool adopt(std::uint64_t seq);
  // Seqs stay below this (the server refuses seqs above 2^63 - 1, its store's signed 64 bits):
  // append() refuses to number a record kMaxSeq.
  static constexpr std::uint64_t kMaxSeq = std::uint64_t{1} << 63;

  std::uint64_t acked() const;
  std::uint64_t last_seq() const;
  // Step of the newest record ever written here; -1 when there is none.
  std::int64_t last_step() const;
  std::uint64_t bytes() const;
  // Records with seq > acked() still in the spool.
  std::uint64_t pending() const;
  const std::string& dir() const { return options_.dir; }

  // Policy ids handled by any process that used this spool.
  bool policy_seen(const std::string& id) const;
  void record_policy(const std::string& id);

 private:
  struct Segment {
    std::uint64_t first_seq = 0;  // from the file name
    std::string path;
    int fd = -1;
    std::uint64_t size = 0;
    std::vector<std::pair<std::uint64_t, std::uint64_t>> index;  // (seq, offset)
    std::uint64_t last_seq() const { return index.empty() ? 0 : index.back().first; }
  };

  explicit Spool(const SpoolOptions& options);
  bool scan(std::string* error, std::vector<std::string>* notices);
  bool scan_segment(Segment& seg, bool newest, std::vector<std::string>* notices);
  bool roll_over(std::uint64_t first_seq, std::string* error);
  void trim_locked();
  void persist_ack_locked(bool force);
  void close_segment(Segment& seg);

  SpoolOptions options_;
  int lock_fd_ = -1;
  mutable std::mutex mu_;
  std::condition_variable appended_;
  std::vector<Segment> segments_;
  std::uint64_t acked_ = 0;
  std::uint64_t last_seq_ = 0;
  std::int64_t last_step_ = -1;
  std::uint64_t bytes_ = 0;
  std::uint64_t woken_ = 0;
  std::uint64_t persisted_ack_ = 0;
  std::chrono::steady_clock::time_point ack_written_{};
  std::set<std::string> policies_;
};

}  // namespace ampscope::agent
