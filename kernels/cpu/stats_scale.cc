// scale_and_compute_stats: a gradient unscale and its statistics in one call.
#include <algorithm>
#include <cstring>

#include "ampscope/check.h"
#include "ampscope/convert.h"
#include "ampscope/tensor_stats.h"
#include "convert_internal.h"

namespace ampscope {

TensorStats scale_and_compute_stats(void* data, std::size_t n, Format dtype, float factor,
                                    std::span<const TargetSpec> targets,
                                    const StatsOptions& options) {
  AMPSCOPE_CHECK(is_stats_storage_format(dtype), "statistics read fp32, fp16 or bf16 storage, ",
                 "not ", format_name(dtype));
  AMPSCOPE_CHECK(n == 0 || data != nullptr, "null data pointer for ", n, " elements");
  {
    const detail::ScopedDefaultMxcsr ieee;
    constexpr std::size_t kBlock = 4096;
    float buf[kBlock];
    const std::size_t elem = static_cast<std::size_t>(storage_bytes(dtype));
    auto* bytes = static_cast<unsigned char*>(data);
    for (std::size_t i = 0; i < n; i += kBlock) {
      const std::size_t len = std::min(kBlock, n - i);
      convert_to_fp32(bytes + i * elem, buf, len, dtype);
      for (std::size_t j = 0; j < len; ++j) buf[j] *= factor;
      convert_from_fp32(buf, bytes + i * elem, len, dtype);
    }
  }
  return compute_stats(data, n, dtype, targets, options);
}

}  // namespace ampscope
