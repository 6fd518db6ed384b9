#include "spool.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "ampscope/testing/files.h"

namespace ampscope::agent {
namespace {

namespace fs = std::filesystem;
using ampscope::testing::TempDir;

std::unique_ptr<Spool> open_spool(const TempDir& dir, std::uint64_t max_bytes = 1 << 20,
                                  std::uint64_t segment_bytes = 4096,
                                  std::vector<std::string>* notices = nullptr) {
  SpoolOptions o;
  o.dir = (dir / "spool").string();
  o.max_bytes = max_bytes;
  o.segment_bytes = segment_bytes;
  std::string error;
  std::vector<std::string> local;
  auto s = Spool::open(o, &error, notices != nullptr ? notices : &local);
  EXPECT_TRUE(s) << error;
  return s;
}

// Every payload has the same size, so that caps count records.
std::string payload(int i) {
  char head[16];
  std::snprintf(head, sizeof(head), "report-%05d", i);
  return head + std::string(100, 'x');
}

std::vector<SpoolRecord> read_all(Spool& s, std::uint64_t from = 1) {
  std::vector<SpoolRecord> out;
  std::string error;
  s.read(from, 1 << 20, std::size_t{1} << 30, &out, &error);
  EXPECT_EQ(error, "");
  return out;
}

std::vector<fs::path> segments(const TempDir& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir / "spool")) {
    if (e.path().filename().string().rfind("seg-", 0) == 0) out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(SpoolTest, AppendsInSeqOrderAndReadsBack) {
  TempDir dir;
  auto s = open_spool(dir);
  std::string error;
  for (int i = 1; i <= 100; ++i) ASSERT_EQ(s->append(payload(i), 10 + i, &error), std::uint64_t(i));
  const auto all = read_all(*s);
  ASSERT_EQ(all.size(), 100u);
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(all[i].seq, std::uint64_t(i + 1));
    EXPECT_EQ(all[i].step, 11 + i);
    EXPECT_EQ(all[i].payload, payload(i + 1));
  }
  EXPECT_GT(segments(dir).size(), 2u) << "4 KiB segments roll over";
  EXPECT_EQ(read_all(*s, 95).size(), 6u);
  EXPECT_EQ(s->last_step(), 110);
}

TEST(SpoolTest, AckDeletesAcknowledgedSegmentsButKeepsTheNewest) {
  TempDir dir;
  auto s = open_spool(dir);
  std::string error;
  for (int i = 1; i <= 100; ++i) s->append(payload(i), i, &error);
  const auto before = s->bytes();
  s->ack(60);
  EXPECT_LT(s->bytes(), before);
  EXPECT_EQ(s->pending(), 40u);
  const auto rest = read_all(*s, 61);
  EXPECT_EQ(rest.front().seq, 61u);
  s->ack(100);
  EXPECT_EQ(segments(dir).size(), 1u);
  EXPECT_EQ(s->pending(), 0u);
}

TEST(SpoolTest, ReopenReplaysWhatIsNotAcknowledgedAndContinuesTheSeq) {
  TempDir dir;
  {
    auto s = open_spool(dir);
    std::string error;
    for (int i = 1; i <= 30; ++i) s->append(payload(i), i, &error);
    s->ack(20);
  }
  auto s = open_spool(dir);
  EXPECT_EQ(s->acked(), 20u);
  EXPECT_EQ(s->pending(), 10u);
  EXPECT_EQ(s->last_step(), 30);
  std::string error;
  EXPECT_EQ(s->append(payload(31), 31, &error), 31u);
}

TEST(SpoolTest, EmptiedSpoolKeepsNumberingAfterTheLastRecord) {
  TempDir dir;
  {
    auto s = open_spool(dir);
    std::string error;
    for (int i = 1; i <= 5; ++i) s->append(payload(i), i, &error);
    s->ack(5);
  }
  auto s = open_spool(dir);
  std::string error;
  EXPECT_EQ(s->append(payload(6), 6, &error), 6u);
}

TEST(SpoolTest, AnEmptySpoolAdoptsWhatTheServerHasAndNumbersAfterIt) {
  // The server has more than this spool (it was lost): continue after what the server has.
  TempDir dir;
  {
    auto s = open_spool(dir);
    EXPECT_TRUE(s->adopt(41));
    std::string error;
    EXPECT_EQ(s->append(payload(1), 0, &error), 42u);
  }
  auto s = open_spool(dir);
  EXPECT_EQ(s->acked(), 41u) << "the adopted mark survives a restart";
}

TEST(SpoolTest, AnAckBeyondEverySeqNumberedIsRefusedAndChangesNothing) {
  TempDir dir;
  auto s = open_spool(dir);
  std::string error;
  for (int i = 1; i <= 3; ++i) s->append(payload(i), i, &error);
  for (std::uint64_t absurd : {std::uint64_t{4}, std::uint64_t{1'000'000'000}, ~std::uint64_t{0}}) {
    EXPECT_FALSE(s->ack(absurd)) << absurd;
  }
  EXPECT_EQ(s->acked(), 0u);
  EXPECT_EQ(s->pending(), 3u);
  EXPECT_EQ(read_all(*s).size(), 3u);
  EXPECT_EQ(s->append(payload(4), 4, &error), 4u);
  EXPECT_TRUE(s->ack(2));
  EXPECT_EQ(s->acked(), 2u);
}

TEST(SpoolTest, AdoptIsRefusedWithRecordsUnacknowledgedOrWhereTheSeqWouldWrap) {
  TempDir dir;
  auto s = open_spool(dir);
  std::string error;
  s->append(payload(1), 1, &error);
  EXPECT_FALSE(s->adopt(1000)) << "the unacknowledged record would be renumbered into the past";
  EXPECT_FALSE(s->adopt(1)) << "not beyond the spool: an ordinary ack";
  EXPECT_TRUE(s->ack(1));
  EXPECT_FALSE(s->adopt(Spool::kMaxSeq));
  EXPECT_FALSE(s->adopt(~std::uint64_t{0}));
  EXPECT_EQ(s->last_seq(), 1u);
  EXPECT_TRUE(s->adopt(Spool::kMaxSeq - 2));
  EXPECT_EQ(s->append(payload(2), 2, &error), Spool::kMaxSeq - 1) << error;
  EXPECT_EQ(s->append(payload(3), 3, &error), 0u) << "the numbering ends instead of wrapping";
  EXPECT_NE(error.find("exhausted"), std::string::npos) << error;
}

TEST(SpoolTest, AnAcknowledgedMarkBeyondTheSeqSpaceIsIgnoredOnOpen) {
  TempDir dir;
  fs::create_directories(dir / "spool");
  {
    std::ofstream out(dir / "spool" / "acked");
    out << "18446744073709551615\n";
  }
  std::vector<std::string> notices;
  auto s = open_spool(dir, 1 << 20, 4096, &notices);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->acked(), 0u);
  std::string error;
  EXPECT_EQ(s->append(payload(1), 1, &error), 1u) << error;
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_NE(notices[0].find("beyond the seq space"), std::string::npos) << notices[0];
}

TEST(SpoolTest, TornTailIsCutAndReported) {
  TempDir dir;
  {
    auto s = open_spool(dir, 1 << 20, 1 << 20);
    std::string error;
    for (int i = 1; i <= 5; ++i) s->append(payload(i), i, &error);
  }
  const auto seg = segments(dir).back();
  const auto full = fs::file_size(seg);
  fs::resize_file(seg, full - 7);  // kill -9 in the middle of the last write
  std::vector<std::string> notices;
  auto s = open_spool(dir, 1 << 20, 1 << 20, &notices);
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_NE(notices[0].find("torn record"), std::string::npos) << notices[0];
  EXPECT_EQ(read_all(*s).size(), 4u);
  std::string error;
  EXPECT_EQ(s->append(payload(5), 5, &error), 5u);
  EXPECT_EQ(read_all(*s).size(), 5u);
}

TEST(SpoolTest, BadChecksumStopsTheSegmentThere) {
  TempDir dir;
  {
    auto s = open_spool(dir, 1 << 20, 1 << 20);
    std::string error;
    for (int i = 1; i <= 5; ++i) s->append(payload(i), i, &error);
  }
  const auto seg = segments(dir).back();
  {
    std::fstream f(seg, std::ios::in | std::ios::out | std::ios::binary);
    const std::size_t record = Spool::kHeaderBytes + payload(1).size();
    f.seekp(static_cast<std::streamoff>(2 * record + Spool::kHeaderBytes + 3));
    f.put('?');  // a flipped payload byte in record 3
  }
  std::vector<std::string> notices;
  auto s = open_spool(dir, 1 << 20, 1 << 20, &notices);
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_NE(notices[0].find("checksum"), std::string::npos) << notices[0];
  EXPECT_EQ(read_all(*s).size(), 2u);
}

TEST(SpoolTest, CapRefusesAppendsUntilAcksFreeSpace) {
  TempDir dir;
  const std::uint64_t record = Spool::kHeaderBytes + payload(1).size();
  auto s = open_spool(dir, 10 * record, 2 * record);
  std::string error;
  int accepted = 0;
  for (int i = 1; i <= 20; ++i) accepted += s->append(payload(i), i, &error) != 0 ? 1 : 0;
  EXPECT_EQ(accepted, 10);
  EXPECT_NE(error.find("full"), std::string::npos) << error;
  s->ack(4);
  error.clear();
  EXPECT_EQ(s->append(payload(11), 11, &error), 11u) << error;
}

TEST(SpoolTest, OneProcessAtATime) {
  TempDir dir;
  auto s = open_spool(dir);
  SpoolOptions o;
  o.dir = (dir / "spool").string();
  std::string error;
  std::vector<std::string> notices;
  // flock is per open file description: a second open in this process conflicts like a second
  // process would.
  EXPECT_FALSE(Spool::open(o, &error, &notices));
  EXPECT_NE(error.find("in use"), std::string::npos) << error;
}

fs::perms mode_of(const fs::path& p) { return fs::status(p).permissions() & fs::perms::all; }

// Reports hold tensor names and losses: under the usual umask 022 every directory the spool
// makes is 0700 and every file 0600, and files an earlier version left 0644 become 0600.
TEST(SpoolTest, OnlyItsOwnerMayReadIt) {
  const mode_t old_umask = ::umask(022);
  TempDir dir;
  SpoolOptions o;
  o.dir = (dir / "base" / "run-1" / "rank-0").string();
  {
    std::string error;
    std::vector<std::string> notices;
    auto s = Spool::open(o, &error, &notices);
    ASSERT_TRUE(s) << error;
    ASSERT_EQ(s->append(payload(1), 1, &error), 1u) << error;
    s->record_policy("7");
    s->ack(1);  // the mark is written when the spool closes
  }
  constexpr fs::perms kDir = fs::perms::owner_all;
  constexpr fs::perms kFile = fs::perms::owner_read | fs::perms::owner_write;
  for (const fs::path& d : {dir / "base", dir / "base" / "run-1", fs::path(o.dir)}) {
    EXPECT_EQ(mode_of(d), kDir) << d;
  }
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(o.dir)) {
    files.push_back(e.path().filename().string());
    EXPECT_EQ(mode_of(e.path()), kFile) << e.path();
  }
  EXPECT_GE(files.size(), 4u);  // lock, a segment, policies, acked

  // A spool an earlier version made readable to everyone is made private when opened.
  fs::permissions(o.dir, fs::perms::owner_all | fs::perms::group_read | fs::perms::others_read |
                             fs::perms::group_exec | fs::perms::others_exec);
  for (const auto& e : fs::directory_iterator(o.dir)) {
    fs::permissions(e.path(), kFile | fs::perms::group_read | fs::perms::others_read);
  }
  {
    std::string error;
    std::vector<std::string> notices;
    auto s = Spool::open(o, &error, &notices);
    ASSERT_TRUE(s) << error;
  }
  EXPECT_EQ(mode_of(o.dir), kDir);
  for (const auto& e : fs::directory_iterator(o.dir)) {
    const std::string name = e.path().filename().string();
    if (name == "lock" || name.rfind("seg-", 0) == 0) EXPECT_EQ(mode_of(e.path()), kFile) << name;
  }
  ::umask(old_umask);
}

TEST(SpoolTest, RemembersHandledPolicies) {
  TempDir dir;
  {
    auto s = open_spool(dir);
    s->record_policy("7");
    EXPECT_TRUE(s->policy_seen("7"));
  }
  auto s = open_spool(dir);
  EXPECT_TRUE(s->policy_seen("7"));
  EXPECT_FALSE(s->policy_seen("8"));
}

TEST(SpoolTest, WaitForWakesOnAppend) {
  TempDir dir;
  auto s = open_spool(dir);
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::string error;
    s->append(payload(1), 1, &error);
  });
  EXPECT_TRUE(s->wait_for(1, std::chrono::seconds(10)));
  t.join();
}

}  // namespace
}  // namespace ampscope::agent
