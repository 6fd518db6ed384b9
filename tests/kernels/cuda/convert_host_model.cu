// Host instantiation of the device element conversions (see convert_host_model.h). Host code
// only: no kernels, no CUDA runtime calls.
#include "convert_element.cuh"
#include "convert_host_model.h"

namespace ampscope::cuda::testing {

using detail::narrow_from_fp32;
using detail::narrow_to_fp32;
using detail::NarrowStorage;

std::uint32_t host_model_from_fp32(float x, Format f, OverflowMode mode) {
  switch (f) {
    case Format::kFP16:
      return narrow_from_fp32<Format::kFP16>(x, mode);
    case Format::kBF16:
      return narrow_from_fp32<Format::kBF16>(x, mode);
    case Format::kE4M3:
      return narrow_from_fp32<Format::kE4M3>(x, mode);
    case Format::kE5M2:
      return narrow_from_fp32<Format::kE5M2>(x, mode);
    case Format::kE2M1:
      return narrow_from_fp32<Format::kE2M1>(x, mode);
    case Format::kE3M2:
      return narrow_from_fp32<Format::kE3M2>(x, mode);
    case Format::kE2M3:
      return narrow_from_fp32<Format::kE2M3>(x, mode);
    case Format::kFP32:
      break;
  }
  return 0;
}

float host_model_to_fp32(std::uint32_t bits, Format f) {
  switch (f) {
    case Format::kFP16:
      return narrow_to_fp32<Format::kFP16>(static_cast<NarrowStorage<Format::kFP16>>(bits));
    case Format::kBF16:
      return narrow_to_fp32<Format::kBF16>(static_cast<NarrowStorage<Format::kBF16>>(bits));
    case Format::kE4M3:
      return narrow_to_fp32<Format::kE4M3>(static_cast<NarrowStorage<Format::kE4M3>>(bits));
    case Format::kE5M2:
      return narrow_to_fp32<Format::kE5M2>(static_cast<NarrowStorage<Format::kE5M2>>(bits));
    case Format::kE2M1:
      return narrow_to_fp32<Format::kE2M1>(static_cast<NarrowStorage<Format::kE2M1>>(bits));
    case Format::kE3M2:
      return narrow_to_fp32<Format::kE3M2>(static_cast<NarrowStorage<Format::kE3M2>>(bits));
    case Format::kE2M3:
      return narrow_to_fp32<Format::kE2M3>(static_cast<NarrowStorage<Format::kE2M3>>(bits));
    case Format::kFP32:
      break;
  }
  return 0.0f;
}

}  // namespace ampscope::cuda::testing
