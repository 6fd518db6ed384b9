#include "ampscope/trainer/precision.h"

namespace ampscope::trainer {

std::string_view precision_name(PrecisionMode mode) {
  switch (mode) {
    case PrecisionMode::kFP32:
      return "fp32";
    case PrecisionMode::kFP16:
      return "fp16";
    case PrecisionMode::kAmpFP16:
      return "amp-fp16";
    case PrecisionMode::kAmpBF16:
      return "amp-bf16";
  }
  return "unknown";
}

std::optional<PrecisionMode> parse_precision(std::string_view name) {
  for (auto m : {PrecisionMode::kFP32, PrecisionMode::kFP16, PrecisionMode::kAmpFP16,
                 PrecisionMode::kAmpBF16}) {
    if (name == precision_name(m)) return m;
  }
  return std::nullopt;
}

PrecisionPolicy PrecisionPolicy::for_mode(PrecisionMode mode) {
  PrecisionPolicy p;
  switch (mode) {
    case PrecisionMode::kFP32:
      break;
    case PrecisionMode::kFP16:
      p.param = p.compute = p.residual = p.fp32_ops = Format::kFP16;
      break;
    case PrecisionMode::kAmpFP16:
      p.master_weights = true;
      p.compute = Format::kFP16;
      break;
    case PrecisionMode::kAmpBF16:
      p.master_weights = true;
      p.compute = Format::kBF16;
      break;
  }
  return p;
}

}  // namespace ampscope::trainer
