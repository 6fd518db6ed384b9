// Precision modes of the trainer and the per-tensor
// formats each implies. The mode is chosen in this one place; model code asks the policy.
// Thread safety: plain values.
#pragma once

#include <optional>
#include <string_view>

#include "ampscope/formats.h"

namespace ampscope::trainer {

enum class PrecisionMode {
  kFP32 = 0,     // everything FP32
  kFP16 = 1,     // everything FP16, no master weights: the known-bad baseline
  kAmpFP16 = 2,  // FP16 matmuls and activations, FP32 master weights, softmax, LayerNorm, loss
  kAmpBF16 = 3,  // the same with BF16
};

std::string_view precision_name(PrecisionMode mode);
// Accepts fp32, fp16, amp-fp16, amp-bf16. nullopt when unknown.
std::optional<PrecisionMode> parse_precision(std::string_view name);

struct PrecisionPolicy {
  // Storage of parameters, their gradients and the optimizer moments (the master copy in AMP).
  Format param = Format::kFP32;
  // Whether FP32 master weights exist next to a low-precision compute copy.
  bool master_weights = false;
  // Matmuls, attention products, GELU and their outputs.
  Format compute = Format::kFP32;
  // Residual stream (embeddings and residual adds): FP32 in AMP because an FP32 + FP16 add
  // promotes to FP32 under autocast.
  Format residual = Format::kFP32;
  // LayerNorm, softmax and cross-entropy (autocast's FP32 list).
  Format fp32_ops = Format::kFP32;

  static PrecisionPolicy for_mode(PrecisionMode mode);
};

}  // namespace ampscope::trainer
