#include "stats_internal.h"
namespace ampscope::detail {
void stats_kernel_avx512(const void* data, std::size_t n, Format dtype,
                       std::span<const TargetThresholds> th, StatsAccumulator& acc) {
  stats_kernel_scalar(data, n, dtype, th, acc);
}
}
