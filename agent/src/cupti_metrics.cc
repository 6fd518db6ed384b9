// The candidate metrics for tensor-core utilisation (cupti.h), shared by the builds with and
// without CUPTI.
#include "ampscope/agent/cupti.h"

namespace ampscope::agent {

const std::vector<std::string>& tensor_metric_candidates() {
  static const std::vector<std::string> kCandidates = {
      "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
      "sm__pipe_tensor_subpipe_hmma_cycles_active.avg.pct_of_peak_sustained_active",
      "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"};
  return kCandidates;
}

}  // namespace ampscope::agent
