// Target: the agent's spool reader (agent/src/spool.h): the input is written as the only segment
// file of a fresh spool directory, which is then opened (scanned and repaired), read, appended
// to, and opened again.
// Properties:
//   - a spool directory with any segment opens; what the scan repaired is reported as one-line
//     notices;
//   - the records read back have strictly increasing seqs up to last_seq(), the newest one's
//     step is last_step(), and their count is pending();
//   - an append after the scan gets seq last_seq() + 1 and reads back as written;
//   - the repair is complete: opening the spool again reports nothing and reads the same
//     records.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "spool.h"
#include "support.h"

namespace ampscope::fuzz {
namespace {

std::vector<agent::SpoolRecord> read_all(agent::Spool& spool) {
  std::vector<agent::SpoolRecord> out;
  std::string error;
  spool.read(1, SIZE_MAX, SIZE_MAX, &out, &error);
  FUZZ_CHECK(error.empty(), error);
  return out;
}

std::unique_ptr<agent::Spool> open_spool(const std::string& dir,
                                         std::vector<std::string>* notices) {
  std::string error;
  auto spool = agent::Spool::open(agent::SpoolOptions{.dir = dir}, &error, notices);
  FUZZ_CHECK(spool != nullptr, error);
  for (const std::string& n : *notices) FUZZ_CHECK(one_line(n), n);
  return spool;
}

bool same(const std::vector<agent::SpoolRecord>& a, const std::vector<agent::SpoolRecord>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].seq != b[i].seq || a[i].step != b[i].step || a[i].payload != b[i].payload) {
      return false;
    }
  }
  return true;
}

}  // namespace
}  // namespace ampscope::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ampscope;
  using namespace ampscope::fuzz;
  const std::filesystem::path dir = scratch_dir() / "spool";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  write_file(dir / "seg-00000000000000000001.log", data, size);

  std::vector<agent::SpoolRecord> records;
  {
    std::vector<std::string> notices;
    auto spool = open_spool(dir.string(), &notices);
    records = read_all(*spool);
    std::uint64_t prev = 0;
    for (const agent::SpoolRecord& r : records) {
      FUZZ_CHECK(r.seq > prev, "seqs do not increase: " + std::to_string(r.seq));
      prev = r.seq;
    }
    FUZZ_CHECK(prev <= spool->last_seq(), "a record above last_seq()");
    FUZZ_CHECK(records.size() == spool->pending(), "pending() is not the records read");
    if (!records.empty()) {
      FUZZ_CHECK(records.back().step == spool->last_step(), "last_step() is not the newest's");
    }
    const std::uint64_t last = spool->last_seq();
    std::string error;
    const std::string payload = "appended after the scan";
    const std::uint64_t seq = spool->append(payload, std::max<std::int64_t>(spool->last_step(), 0), &error);
    // A numbering at its end refuses appends; otherwise the next seq is taken.
    if (seq != 0) {
      FUZZ_CHECK(seq == last + 1, "append took seq " + std::to_string(seq));
      records = read_all(*spool);
      FUZZ_CHECK(!records.empty() && records.back().seq == seq && records.back().payload == payload,
                 "the appended record does not read back");
    }
  }
  std::vector<std::string> notices;
  auto again = open_spool(dir.string(), &notices);
  FUZZ_CHECK(notices.empty(), "a repaired spool needs repair again: " + notices.front());
  FUZZ_CHECK(same(read_all(*again), records), "the spool reads differently after a reopen");
  return 0;
}
