#include "spool_reader.h"

#include <gtest/gtest.h>

#include "spool.h"

namespace ampscope::agent::testing {

std::vector<v1::StepReport> read_spool(const std::filesystem::path& spool_root,
                                       const std::string& run_id, int rank) {
  SpoolOptions o;
  o.dir = (spool_root / run_id / ("rank-" + std::to_string(rank))).string();
  std::string error;
  std::vector<std::string> notices;
  auto spool = Spool::open(o, &error, &notices);
  EXPECT_TRUE(spool) << error;
  std::vector<v1::StepReport> out;
  if (!spool) return out;
  std::vector<SpoolRecord> records;
  spool->read(1, 1 << 20, std::size_t{1} << 30, &records, &error);
  for (const auto& r : records) {
    v1::StepReport rep;
    EXPECT_TRUE(rep.ParseFromString(r.payload));
    rep.set_seq(r.seq);
    out.push_back(std::move(rep));
  }
  return out;
}

}  // namespace ampscope::agent::testing
