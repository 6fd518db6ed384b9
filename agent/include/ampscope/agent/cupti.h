// Tensor-core utilisation through CUPTI: which metrics the agent collects on a chip, checked
// offline with the CUPTI Profiler Host API (cupti_profiler_host.h), which needs no GPU.
//
// The metric is chosen per chip from a candidate list, first that resolves wins:
//   sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active     (GA100, GH100:
//       HMMA, and on GH100 HGMMA/QGMMA too, so wgmma FP16/BF16/FP8 work counts)
//   sm__pipe_tensor_subpipe_hmma_cycles_active.avg.pct_of_peak_sustained_active (Blackwell)
//   sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active             (any tensor pipe)
// plus gpu__time_duration.sum for the GPU time of the range. Each name is validated on a fresh
// host object, because after one invalid name the object may refuse further additions.
//
// Thread safety: check_chip is re-entrant.
#pragma once

#include <string>
#include <vector>

namespace ampscope::agent {

struct CuptiMetricCheck {
  std::string name;
  bool resolves = false;
  std::string error;  // CUPTI's result name when it does not resolve
};

struct CuptiChipCheck {
  std::string chip;
  bool available = false;     // false: CUPTI not built in, or the chip is not supported
  std::string error;          // why not available
  std::vector<std::string> supported_chips;
  std::vector<CuptiMetricCheck> candidates;  // every candidate, in order, tried one by one
  std::string tensor_metric;  // the chosen tensor-pipe metric; empty when none resolves
  std::string time_metric;    // gpu__time_duration.sum when it resolves
  std::size_t config_image_bytes = 0;  // of the combined configuration
  int passes = 0;             // replay passes the combined configuration needs; 0 on failure
};

// The candidate list above, in order.
const std::vector<std::string>& tensor_metric_candidates();

// Runs the offline check for `chip` (GA100, GH100, GB100, ...). Never throws.
CuptiChipCheck check_chip(const std::string& chip);

// Whether this build has CUPTI (AMPSCOPE_ENABLE_CUDA with the toolkit's CUPTI).
bool cupti_built_in();

}  // namespace ampscope::agent
