// Without CUPTI (a build without AMPSCOPE_ENABLE_CUDA): the offline check and the collector say
// that they are not built in.
#include "ampscope/agent/cupti.h"
#include "cupti_collector.h"

namespace ampscope::agent {

bool cupti_built_in() { return false; }

CuptiChipCheck check_chip(const std::string& chip) {
  CuptiChipCheck c;
  c.chip = chip;
  c.error = "this build has no CUPTI (configure with AMPSCOPE_ENABLE_CUDA=ON and a CUDA toolkit)";
  return c;
}

std::unique_ptr<CuptiCollector> CuptiCollector::create(std::string* why_not) {
  *why_not = "this build has no CUPTI";
  return nullptr;
}

}  // namespace ampscope::agent
