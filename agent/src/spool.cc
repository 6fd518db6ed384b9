#include "spool.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace ampscope::agent {
namespace {

namespace fs = std::filesystem;

constexpr std::uint32_t kMagic = 0x31525341;  // "ASR1" read as little-endian bytes
constexpr std::chrono::milliseconds kAckWriteInterval{100};

std::string errno_text(const std::string& what) {
  return what + ": " + std::strerror(errno);
}

template <typename T>
void put(unsigned char* p, T v) {
  std::memcpy(p, &v, sizeof(T));  // x86-64 and aarch64 hosts are little-endian
}
template <typename T>
T get(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

std::uint32_t record_crc(std::uint64_t seq, std::int64_t step, const unsigned char* payload,
                         std::size_t len) {
  unsigned char head[16];
  put(head, seq);
  put(head + 8, step);
  uLong crc = crc32(0L, Z_NULL, 0);
  crc = crc32(crc, head, sizeof(head));
  // zlib takes uInt lengths; payloads are capped at kMaxPayloadBytes.
  crc = crc32(crc, payload, static_cast<uInt>(len));
  return static_cast<std::uint32_t>(crc);
}

std::string segment_name(std::uint64_t first_seq) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "seg-%020llu.log", static_cast<unsigned long long>(first_seq));
  return buf;
}

// Reports hold tensor names, losses and the run's configuration: only the user who trains may
// read them. Directories the spool creates are 0700 and its files 0600, whatever the umask;
// a directory that exists already is left as its owner made it, except the spool's own.
constexpr mode_t kDirMode = 0700;
constexpr mode_t kFileMode = 0600;

// create_directories with kDirMode for every level it creates.
bool make_private_dirs(const fs::path& dir, std::error_code& ec) {
  fs::path at;
  for (const fs::path& part : dir) {
    at /= part;
    if (::mkdir(at.c_str(), kDirMode) != 0 && errno != EEXIST) {
      const int err = errno;
      if (std::error_code ignored; fs::is_directory(at, ignored)) continue;
      ec = std::error_code(err, std::generic_category());
      return false;
    }
  }
  if (!fs::is_directory(dir, ec)) {
    if (!ec) ec = std::make_error_code(std::errc::not_a_directory);
    return false;
  }
  return true;
}

// Opens (creating with kFileMode) and makes sure a file made by an earlier version, with the
// umask's mode, is private too.
int open_private(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC, kFileMode);
  if (fd >= 0) (void)::fchmod(fd, kFileMode);
  return fd;
}

bool pread_all(int fd, void* buf, std::size_t len, std::uint64_t offset) {
  auto* p = static_cast<unsigned char*>(buf);
  while (len > 0) {
    const ssize_t n = ::pread(fd, p, len, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    len -= static_cast<std::size_t>(n);
    offset += static_cast<std::uint64_t>(n);
  }
  return true;
}

}  // namespace

Spool::Spool(const SpoolOptions& options) : options_(options) {}

std::unique_ptr<Spool> Spool::open(const SpoolOptions& options, std::string* error,
                                   std::vector<std::string>* notices) {
  if (options.dir.empty()) {
    *error = "spool: no directory";
    return nullptr;
  }
  std::error_code ec;
  if (!make_private_dirs(options.dir, ec)) {
    *error = "spool: cannot create '" + options.dir + "': " + ec.message();
    return nullptr;
  }
  // Ours alone (this run and rank's): made private even when an earlier version made it.
  (void)::chmod(options.dir.c_str(), kDirMode);
  std::unique_ptr<Spool> s(new Spool(options));
  const std::string lock_path = (fs::path(options.dir) / "lock").string();
  s->lock_fd_ = open_private(lock_path, O_RDWR | O_CREAT);
  if (s->lock_fd_ < 0) {
    *error = errno_text("spool: cannot open '" + lock_path + "'");
    return nullptr;
  }
  if (::flock(s->lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    *error = "spool: '" + options.dir + "' is in use by another process";
    return nullptr;
  }
  if (!s->scan(error, notices)) return nullptr;
  return s;
}

Spool::~Spool() {
  std::lock_guard lock(mu_);
  persist_ack_locked(true);
  for (auto& seg : segments_) close_segment(seg);
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the flock
}

void Spool::close_segment(Segment& seg) {
  if (seg.fd >= 0) ::close(seg.fd);
  seg.fd = -1;
}

bool Spool::scan(std::string* error, std::vector<std::string>* notices) {
  const fs::path dir(options_.dir);
  {
    std::ifstream in(dir / "acked");
    unsigned long long v = 0;
    if (in >> v) acked_ = v;
    if (acked_ >= kMaxSeq) {
      // Believed from a server by an older agent: numbering after it would wrap.
      notices->push_back("spool: the acknowledged mark " + std::to_string(acked_) +
                         " is beyond the seq space (2^63); ignored");
      acked_ = 0;
    }
    persisted_ack_ = acked_;
  }
  {
    std::ifstream in(dir / "policies");
    std::string id;
    while (std::getline(in, id)) {
      if (!id.empty()) policies_.insert(id);
    }
  }
  std::vector<Segment> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    unsigned long long first = 0;
    char tail[8] = {0};
    if (name.size() == 28 && std::sscanf(name.c_str(), "seg-%20llu.%3s", &first, tail) == 2 &&
        std::string(tail) == "log") {
      Segment seg;
      seg.first_seq = first;
      seg.path = entry.path().string();
      found.push_back(std::move(seg));
    }
  }
  if (ec) {
    *error = "spool: cannot list '" + options_.dir + "': " + ec.message();
    return false;
  }
  std::sort(found.begin(), found.end(),
            [](const Segment& a, const Segment& b) { return a.first_seq < b.first_seq; });
  for (std::size_t i = 0; i < found.size(); ++i) {
    Segment& seg = found[i];
    seg.fd = open_private(seg.path, O_RDWR);
    if (seg.fd < 0) {
      *error = errno_text("spool: cannot open '" + seg.path + "'");
      for (auto& s : found) close_segment(s);
      return false;
    }
    scan_segment(seg, i + 1 == found.size(), notices);
  }
  // Records must increase across segments too; a segment that starts at or below what came
  // before is the leftover of a crash in the middle of a roll-over: its duplicates are dropped.
  std::uint64_t last = 0;
  for (auto& seg : found) {
    auto& idx = seg.index;
    const auto keep = std::find_if(idx.begin(), idx.end(), [&](auto& r) { return r.first > last; });
    if (keep != idx.begin()) idx.erase(idx.begin(), keep);
    if (!idx.empty()) last = idx.back().first;
  }
  // Empty segments are deleted, except the newest (which is reused for appends).
  for (std::size_t i = 0; i < found.size(); ++i) {
    Segment& seg = found[i];
    if (seg.index.empty() && i + 1 != found.size()) {
      close_segment(seg);
      ::unlink(seg.path.c_str());
      continue;
    }
    bytes_ += seg.size;
    if (!seg.index.empty()) last_seq_ = std::max(last_seq_, seg.index.back().first);
    segments_.push_back(std::move(seg));
  }
  // The step of the newest record: read back its header.
  for (auto it = segments_.rbegin(); it != segments_.rend(); ++it) {
    if (it->index.empty()) continue;
    unsigned char head[kHeaderBytes];
    if (pread_all(it->fd, head, sizeof(head), it->index.back().second)) {
      last_step_ = get<std::int64_t>(head + 16);
    }
    break;
  }
  // An acknowledgement beyond every record: the spool was emptied (or lost); keep numbering
  // after what the server has.
  last_seq_ = std::max(last_seq_, acked_);
  trim_locked();
  return true;
}

bool Spool::scan_segment(Segment& seg, bool newest, std::vector<std::string>* notices) {
  struct stat st {};
  if (::fstat(seg.fd, &st) != 0) return false;
  const auto file_size = static_cast<std::uint64_t>(st.st_size);
  std::uint64_t off = 0, prev_seq = 0;
  std::vector<unsigned char> payload;
  std::string problem;
  while (off < file_size) {
    unsigned char head[kHeaderBytes];
    if (file_size - off < kHeaderBytes || !pread_all(seg.fd, head, sizeof(head), off)) {
      problem = "a torn record header";
      break;
    }
    const auto magic = get<std::uint32_t>(head);
    const auto len = get<std::uint32_t>(head + 4);
    const auto seq = get<std::uint64_t>(head + 8);
    const auto step = get<std::int64_t>(head + 16);
    const auto crc = get<std::uint32_t>(head + 24);
    if (magic != kMagic || len > kMaxPayloadBytes || seq <= prev_seq) {
      problem = "a damaged record header";
      break;
    }
    if (file_size - off - kHeaderBytes < len) {
      problem = "a torn record";
      break;
    }
    payload.resize(len);
    if (!pread_all(seg.fd, payload.data(), len, off + kHeaderBytes) ||
        record_crc(seq, step, payload.data(), len) != crc) {
      problem = "a record with a bad checksum";
      break;
    }
    seg.index.emplace_back(seq, off);
    prev_seq = seq;
    off += kHeaderBytes + len;
  }
  seg.size = off;
  if (off < file_size) {
    // Cut at the last intact record, so appends continue from a clean end. Past a damaged
    // record nothing can be trusted to be framed correctly.
    if (::ftruncate(seg.fd, static_cast<off_t>(off)) != 0) seg.size = file_size;
    notices->push_back("spool: " + std::to_string(file_size - off) + " bytes after " + problem +
                       " cut from " + fs::path(seg.path).filename().string() +
                       (newest ? " (the end of the newest segment: an interrupted write)"
                               : " (reports in it may be lost; the server counts the gap)"));
  }
  return true;
}

bool Spool::roll_over(std::uint64_t first_seq, std::string* error) {
  Segment seg;
  seg.first_seq = first_seq;
  seg.path = (fs::path(options_.dir) / segment_name(first_seq)).string();
  seg.fd = open_private(seg.path, O_RDWR | O_CREAT | O_TRUNC);
  if (seg.fd < 0) {
    *error = errno_text("spool: cannot create '" + seg.path + "'");
    return false;
  }
  // The previous newest segment may now be deletable (it was kept only for being newest).
  segments_.push_back(std::move(seg));
  trim_locked();
  return true;
}

std::uint64_t Spool::append(std::string_view payload, std::int64_t step, std::string* error) {
  if (payload.size() > kMaxPayloadBytes) {
    *error = "spool: a report of " + std::to_string(payload.size()) + " bytes is too large";
    return 0;
  }
  const std::uint64_t rec_bytes = kHeaderBytes + payload.size();
  std::unique_lock lock(mu_);
  if (bytes_ + rec_bytes > options_.max_bytes) {
    *error = "spool: full (" + std::to_string(bytes_) + " of " +
             std::to_string(options_.max_bytes) + " bytes unacknowledged)";
    return 0;
  }
  if (last_seq_ >= kMaxSeq - 1) {
    *error = "spool: the seq numbering is exhausted (" + std::to_string(last_seq_) + ")";
    return 0;
  }
  const std::uint64_t seq = last_seq_ + 1;
  if (segments_.empty() || (!segments_.back().index.empty() &&
                            segments_.back().size + rec_bytes > options_.segment_bytes)) {
    if (!roll_over(seq, error)) return 0;
  }
  Segment& seg = segments_.back();
  unsigned char head[kHeaderBytes];
  put(head, kMagic);
  put(head + 4, static_cast<std::uint32_t>(payload.size()));
  put(head + 8, seq);
  put(head + 16, step);
  put(head + 24, record_crc(seq, step, reinterpret_cast<const unsigned char*>(payload.data()),
                            payload.size()));
  iovec iov[2] = {{head, sizeof(head)},
                  {const_cast<char*>(payload.data()), payload.size()}};
  std::uint64_t written = 0;
  while (written < rec_bytes) {
    // pwritev at the tracked end: a failed earlier write never leaves a gap.
    std::size_t skip = written;
    iovec rest[2];
    int n_iov = 0;
    for (auto& v : iov) {
      if (skip >= v.iov_len) {
        skip -= v.iov_len;
        continue;
      }
      rest[n_iov++] = {static_cast<char*>(v.iov_base) + skip, v.iov_len - skip};
      skip = 0;
    }
    const ssize_t n = ::pwritev(seg.fd, rest, n_iov, static_cast<off_t>(seg.size + written));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *error = errno_text("spool: cannot write '" + seg.path + "'");
      // Leave no partial record behind.
      if (::ftruncate(seg.fd, static_cast<off_t>(seg.size)) != 0) {
        // The next scan cuts it off instead.
      }
      return 0;
    }
    written += static_cast<std::uint64_t>(n);
  }
  seg.index.emplace_back(seq, seg.size);
  seg.size += rec_bytes;
  bytes_ += rec_bytes;
  last_seq_ = seq;
  last_step_ = step;
  lock.unlock();
  appended_.notify_all();
  return seq;
}

std::size_t Spool::read(std::uint64_t from, std::size_t max_records, std::size_t max_bytes,
                        std::vector<SpoolRecord>* out, std::string* error) {
  std::lock_guard lock(mu_);
  std::size_t added = 0, bytes = 0;
  for (auto& seg : segments_) {
    if (seg.index.empty() || seg.last_seq() < from) continue;
    auto it = std::lower_bound(seg.index.begin(), seg.index.end(), from,
                               [](const auto& r, std::uint64_t s) { return r.first < s; });
    for (; it != seg.index.end(); ++it) {
      if (added >= max_records || bytes >= max_bytes) return added;
      unsigned char head[kHeaderBytes];
      if (!pread_all(seg.fd, head, sizeof(head), it->second)) {
        *error = errno_text("spool: cannot read '" + seg.path + "'");
        return added;
      }
      SpoolRecord r;
      r.seq = get<std::uint64_t>(head + 8);
      r.step = get<std::int64_t>(head + 16);
      r.payload.resize(get<std::uint32_t>(head + 4));
      if (!pread_all(seg.fd, r.payload.data(), r.payload.size(), it->second + kHeaderBytes)) {
        *error = errno_text("spool: cannot read '" + seg.path + "'");
        return added;
      }
      bytes += r.payload.size();
      out->push_back(std::move(r));
      ++added;
    }
  }
  return added;
}

bool Spool::wait_for(std::uint64_t from, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  const std::uint64_t woken = woken_;
  appended_.wait_for(lock, timeout, [&] { return last_seq_ >= from || woken_ != woken; });
  return last_seq_ >= from;
}

void Spool::wake() {
  {
    std::lock_guard lock(mu_);
    ++woken_;
  }
  appended_.notify_all();
}

bool Spool::ack(std::uint64_t seq) {
  std::lock_guard lock(mu_);
  if (seq > last_seq_) return false;
  if (seq <= acked_) return true;
  acked_ = seq;
  trim_locked();
  persist_ack_locked(false);
  return true;
}

bool Spool::adopt(std::uint64_t seq) {
  std::lock_guard lock(mu_);
  if (seq <= last_seq_ || acked_ != last_seq_ || seq >= kMaxSeq) return false;
  // Number the next report after what the server has, or it would be dropped as a duplicate.
  acked_ = seq;
  last_seq_ = seq;
  trim_locked();
  persist_ack_locked(true);
  return true;
}

void Spool::trim_locked() {
  // Every segment but the newest goes once its last record is acknowledged.
  while (segments_.size() > 1 && segments_.front().last_seq() <= acked_) {
    Segment& seg = segments_.front();
    bytes_ -= std::min(bytes_, seg.size);
    close_segment(seg);
    ::unlink(seg.path.c_str());
    segments_.erase(segments_.begin());
  }
}

void Spool::persist_ack_locked(bool force) {
  if (acked_ == persisted_ack_) return;
  const auto now = std::chrono::steady_clock::now();
  if (!force && now - ack_written_ < kAckWriteInterval) return;
  // A stale mark only makes the next process replay more, which the server drops as
  // duplicates; so a failed write is not an error worth more than trying again later.
  const fs::path dir(options_.dir);
  const std::string tmp = (dir / "acked.tmp").string();
  const std::string path = (dir / "acked").string();
  if (const int fd = open_private(tmp, O_WRONLY | O_CREAT | O_TRUNC); fd >= 0) {
    const std::string text = std::to_string(acked_) + "\n";
    const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    if ((::close(fd) == 0 && ok) && std::rename(tmp.c_str(), path.c_str()) == 0) {
      persisted_ack_ = acked_;
    }
  }
  ack_written_ = now;
}

std::uint64_t Spool::acked() const {
  std::lock_guard lock(mu_);
  return acked_;
}
std::uint64_t Spool::last_seq() const {
  std::lock_guard lock(mu_);
  return last_seq_;
}
std::int64_t Spool::last_step() const {
  std::lock_guard lock(mu_);
  return last_step_;
}
std::uint64_t Spool::bytes() const {
  std::lock_guard lock(mu_);
  return bytes_;
}
std::uint64_t Spool::pending() const {
  std::lock_guard lock(mu_);
  std::uint64_t n = 0;
  for (const auto& seg : segments_) {
    for (const auto& r : seg.index) n += r.first > acked_ ? 1 : 0;
  }
  return n;
}

bool Spool::policy_seen(const std::string& id) const {
  std::lock_guard lock(mu_);
  return policies_.count(id) > 0;
}

void Spool::record_policy(const std::string& id) {
  std::lock_guard lock(mu_);
  if (!policies_.insert(id).second) return;
  const int fd = open_private((fs::path(options_.dir) / "policies").string(),
                              O_WRONLY | O_CREAT | O_APPEND);
  if (fd < 0) return;
  const std::string line = id + "\n";
  [[maybe_unused]] const ssize_t written = ::write(fd, line.data(), line.size());
  ::close(fd);
}

}  // namespace ampscope::agent
